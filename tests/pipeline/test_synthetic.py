"""The synthetic replicated log: valid histories, deterministic, and the expected physics."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from isrlab.checkers.api import check, policy_from_test
from isrlab.checkers.history import load_history, validate
from isrlab.pipeline.check import acked_writes
from isrlab.pipeline.fixtures.synthetic import default_grid, make_test, simulate_run, write_run


def _check(test: dict[str, object], n: int = 3000) -> dict[str, object]:
    ops = simulate_run(test, n)
    validate(ops)
    policy = policy_from_test(test)
    return check(ops, str(policy.pop("workload")), **policy)


@pytest.mark.parametrize("nemesis", ["none", "partition", "kill", "pause", "clock", "combined"])
def test_acks_all_with_two_in_sync_replicas_loses_nothing(nemesis: str) -> None:
    for seed in range(2):
        results = _check(make_test(acks="all", nemesis=nemesis, seed=seed))
        assert results["valid"] is True, results["anomaly_types"]


@pytest.mark.parametrize("nemesis", ["partition", "kill"])
def test_acks_1_loses_acknowledged_writes_under_faults(nemesis: str) -> None:
    found = []
    for seed in range(3):
        found.append(
            "lost-write"
            in _check(make_test(acks="1", nemesis=nemesis, seed=seed), 6000)["anomalies"]
        )
        if found[-1]:
            break
    assert any(found)


def test_acks_0_loses_under_partitions_and_min_insync_1_loses_at_acks_all() -> None:
    r0 = _check(make_test(acks="0", nemesis="partition", seed=1))
    assert r0["valid"] is False and "unseen" in r0["anomaly_types"]
    r1 = _check(make_test(acks="all", nemesis="partition", seed=1, min_insync_replicas=1))
    assert "lost-write" in r1["anomaly_types"]


def test_no_faults_no_anomalies_at_any_acks() -> None:
    for acks in ("0", "1", "all"):
        assert _check(make_test(acks=acks, nemesis="none", seed=3))["anomaly_types"] == []


def test_deterministic_in_the_seed_and_sized_as_asked() -> None:
    t = make_test(acks="1", nemesis="combined", seed=9)
    a = simulate_run(t, 3000)
    assert a == simulate_run(t, 3000)
    assert a != simulate_run(dict(t, seed=10), 3000)
    assert 2900 <= len(a) <= 3100
    assert acked_writes(a) > 300


def test_run_directory_layout(tmp_path: Path) -> None:
    t = make_test(acks="all", nemesis="kill", seed=2, idempotence=True)
    run_dir = write_run(tmp_path, t, 1000, timestamp="20260102T030405")
    assert run_dir == tmp_path / t["name"] / "20260102T030405"
    saved = orjson.loads((run_dir / "test.json").read_bytes())
    assert saved["acks"] == "all" and saved["nemesis"] == ["kill"] and saved["idempotence"]
    ops = load_history(run_dir / "history.jsonl")
    assert ops == simulate_run(t, 1000)
    assert any(op.get("producer", {}).get("idempotent") for op in ops)


def test_default_grid_names_are_unique() -> None:
    tests = list(default_grid(2))
    names = [t["name"] for t in tests]
    assert len(names) == len(set(names))
    assert {t["acks"] for t in tests} == {"0", "1", "all"}
