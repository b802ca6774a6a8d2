"""Verdict agreement with Porcupine's own test suite on its bench histories.

The jepsen etcd logs are checked with the cas-register model (initial value nil), the kv
histories with the kv model, with and without partitioning by key.  Skipped when the bench
data (``shared/bench-data/porcupine`` beside the repository) is absent.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.formats import load_edn, load_jepsen_log
from isrlab.checkers.linear import CAS_REGISTER, KV, KV_UNPARTITIONED, check
from isrlab.checkers.linear.api import check_workload

BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench-data" / "porcupine"

pytestmark = pytest.mark.skipif(not BENCH.exists(), reason="Porcupine bench data not present")


def verdicts(folder: str) -> dict[str, bool]:
    if not BENCH.exists():
        return {}
    found = {}
    for line in (BENCH / folder / "verdicts.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, verdict = line.split()
            found[name] = verdict == "true"
    return found


ETCD = verdicts("jepsen")
KV_VERDICTS = verdicts("kv")
ETCD_NUMBERS: list[str] = sorted(ETCD, key=lambda name: int(name))


@cache
def etcd(number: str) -> list[dict[str, Any]]:
    return load_jepsen_log(BENCH / "jepsen" / f"etcd_{int(number):03d}.log")


@cache
def kv(name: str) -> list[dict[str, Any]]:
    return load_edn(BENCH / "kv" / f"{name}.txt")


def test_all_etcd_histories_are_covered() -> None:
    assert len(ETCD) == 102 and "95" not in ETCD


@pytest.mark.parametrize("number", ETCD_NUMBERS)
def test_etcd_verdict(number: str) -> None:
    result = check(CAS_REGISTER, etcd(number))
    assert result.verdict == ("ok" if ETCD[number] else "illegal")


def test_etcd_095_has_an_answer() -> None:
    assert check(CAS_REGISTER, etcd("95")).verdict in ("ok", "illegal")


@pytest.mark.parametrize("name", sorted(KV_VERDICTS))
def test_kv_verdict(name: str) -> None:
    result = check(KV, kv(name))
    assert result.verdict == ("ok" if KV_VERDICTS[name] else "illegal")


@pytest.mark.parametrize("name", ["c01-ok", "c01-bad", "c10-ok", "c10-bad"])
def test_kv_verdict_without_partitioning(name: str) -> None:
    result = check(KV_UNPARTITIONED, kv(name))
    assert result.verdict == ("ok" if KV_VERDICTS[name] else "illegal")
    assert len(result.partitions) == 1


@pytest.mark.parametrize("name", ["c10-ok", "c10-bad", "c50-bad"])
def test_kv_verdict_with_partitions_in_parallel(name: str) -> None:
    result = check(KV, kv(name), workers=2)
    assert result.verdict == ("ok" if KV_VERDICTS[name] else "illegal")
    if result.verdict == "illegal":
        [illegal] = result.illegal
        assert illegal.blocked is not None and illegal.blocked.key == illegal.key
    else:
        assert all(p.checked and p.verdict == "ok" for p in result.partitions)


def test_counterexample_of_a_bad_kv_history(tmp_path: Path) -> None:
    results = check_workload(kv("c10-bad"), "kv", out_dir=tmp_path)
    assert results["valid"] is False
    [example] = results["anomalies"]["nonlinearizable"]["examples"]
    assert example["op"]["invoke"]["f"] in ("get", "put", "append")
    assert example["op"]["describe"] in (tmp_path / "linear.html").read_text().replace(
        "&#39;", "'"
    ).replace("&gt;", ">")
