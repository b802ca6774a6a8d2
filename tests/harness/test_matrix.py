"""`isrlab matrix` with a fake run function: grid, resumability, progress, summary, CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from isrlab.harness.matrix import (
    HISTORIC_SWITCHES,
    base_test,
    finished_run,
    grid,
    matrix_command,
    nemesis_kinds,
    parse_settings,
    parse_switches,
    run_matrix,
)
from tests.typer_app import subcommand_app


class FakeRunner:
    """Writes a run directory like harness.runner.run_test; verdict from acks."""

    def __init__(self, fail_names: set[str] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_names = fail_names or set()

    def __call__(self, test: dict[str, Any]) -> Path:
        self.calls.append(test)
        if test["name"] in self.fail_names:
            raise RuntimeError("cluster did not come up")
        run_dir = Path(test["store"]) / test["name"] / f"2026{len(self.calls):04d}"
        run_dir.mkdir(parents=True)
        (run_dir / "test.json").write_bytes(orjson.dumps(test))
        valid = test["acks"] == "all"
        results = {"valid": valid, "anomaly_types": [] if valid else ["lost-write"]}
        (run_dir / "results.json").write_bytes(orjson.dumps(results))
        return run_dir


def _console() -> tuple[Console, Any]:
    import io

    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def test_grid_is_the_product_with_stable_names_and_seeds() -> None:
    tests = grid(base_test(30), variants=[{}, *HISTORIC_SWITCHES], repeats=2)
    assert len(tests) == 3 * 5 * 4 * 2
    names = [t["name"] for t in tests]
    assert len(set(names)) == len(names)
    assert [t["seed"] for t in tests] == list(range(len(tests)))
    combined = next(t for t in tests if t["name"].startswith("acks-1_combined"))
    assert combined["nemesis"] == ["partition", "kill", "pause", "clock"]
    assert all(t["time_limit"] == 30 for t in tests)
    unclean = [t for t in tests if t.get("unclean_leader_election")]
    assert unclean and all("unclean" in t["name"] for t in unclean)
    assert grid(base_test(), nemeses=["none"], acks=["1"])[0]["nemesis"] == []


def test_parse_switches() -> None:
    assert parse_switches("unclean.leader.election=true, min.insync=1") == {
        "unclean_leader_election": True,
        "min_insync_replicas": 1,
    }
    assert parse_switches("idempotence") == {"idempotence": True}
    for bad in ("colour=red", "txn=maybe", "min_insync_replicas=x", "truncation_mode=sloppy"):
        with pytest.raises(ValueError):
            parse_switches(bad)


def test_nemesis_compositions_and_settings() -> None:
    assert nemesis_kinds("partition+kill") == ["partition", "kill"]
    assert nemesis_kinds("combined") == ["partition", "kill", "pause", "clock"]
    assert nemesis_kinds("none") == [] and nemesis_kinds("pause") == ["pause"]
    with pytest.raises(ValueError, match="'flood'"):
        nemesis_kinds("partition+flood")
    assert parse_settings(["replica.lag.time.max.ms=4000", "key_count=4"]) == {
        "replica_lag_time_max_ms": 4000,
        "key_count": 4,
    }
    for bad in (["colour=red"], ["key_count"], ["key_count=many"], ["zk_session_timeout_ms=5"]):
        with pytest.raises(ValueError):
            parse_settings(bad)
    base = base_test(150, **parse_settings(["replica_lag_time_max_ms=4000"]))
    tests = grid(base, acks=["all"], nemeses=["partition+kill"], variants=HISTORIC_SWITCHES)
    assert [t["name"] for t in tests] == [
        "acks-all_kill+partition_idem_isr2_unclean_lag4000_r0",
        "acks-all_kill+partition_idem_isr2_high-watermark_lag4000_r0",
        "acks-all_kill+partition_idem_isr1_lag4000_r0",
    ]
    assert all(t["nemesis"] == ["partition", "kill"] for t in tests)
    assert all(t["replica_lag_time_max_ms"] == 4000 for t in tests)


def test_run_matrix_resumes_and_reports(tmp_path: Path) -> None:
    tests = grid(base_test(5), nemeses=["partition", "kill"])
    fake = FakeRunner(fail_names={tests[0]["name"]})
    console, buf = _console()
    summary = run_matrix(tests, tmp_path, run_test=fake, console=console)
    assert len(fake.calls) == 6
    assert all(c["store"] == str(tmp_path) for c in fake.calls)
    assert summary.count("valid") == 2 and summary.count("invalid") == 3
    assert summary.count("error") == 1 and not summary.ok
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("[")]
    assert len(lines) == 6 and lines[0].startswith("[1/6]")
    assert "cluster did not come up" in buf.getvalue() and "matrix summary" in buf.getvalue()

    # Second pass: only the failed cell runs again.
    fake2 = FakeRunner()
    console, buf = _console()
    summary = run_matrix(tests, tmp_path, run_test=fake2, console=console)
    assert [c["name"] for c in fake2.calls] == [tests[0]["name"]]
    assert summary.count("skipped") == 5 and summary.ok
    assert finished_run(tmp_path, tests[1]["name"]) is not None
    assert finished_run(tmp_path, "nothing-here") is None


def test_a_run_without_results_is_not_finished(tmp_path: Path) -> None:
    tests = grid(base_test(5), nemeses=["kill"], acks=["1"])
    (tmp_path / tests[0]["name"] / "20260101").mkdir(parents=True)  # crashed mid-run
    fake = FakeRunner()
    run_matrix(tests, tmp_path, run_test=fake, console=_console()[0])
    assert len(fake.calls) == 1


def _app() -> typer.Typer:
    return subcommand_app("matrix", matrix_command)


def test_cli_dry_run_and_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(_app(), ["matrix", "--dry-run", "--historic", "--repeats", "2"])
    assert r.exit_code == 0, r.output
    assert "120 cells" in r.output
    r = runner.invoke(_app(), ["matrix", "--dry-run", "--switch", "txn=true,idempotence=true"])
    # 15 baseline cells and the variant's acks=all ones (Kafka refuses txn with acks 0 or 1)
    assert r.exit_code == 0 and "20 cells" in r.output and "idem_txn" in r.output
    r = runner.invoke(_app(), ["matrix", "--acks", "2"])
    assert r.exit_code == 2 and "acks" in r.output
    r = runner.invoke(_app(), ["matrix", "--switch", "colour=red"])
    assert r.exit_code == 2 and "unknown switch" in r.output
    args = "matrix --dry-run --acks all --nemesis partition+kill,kill"
    args += " --set zk_session_timeout_ms=4000 --set key_count=4"
    r = runner.invoke(_app(), args.split())
    assert r.exit_code == 0, r.output
    assert "acks-all_kill+partition_idem_isr2_zk4000_r0" in r.output and "2 cells" in r.output
    r = runner.invoke(_app(), ["matrix", "--nemesis", "partition+flood"])
    assert r.exit_code == 2 and "flood" in r.output
    r = runner.invoke(_app(), ["matrix", "--set", "key_count=0"])
    assert r.exit_code == 2 and "at least" in r.output


def test_the_consumer_mode_is_a_dimension_of_the_grid() -> None:
    plain = grid(base_test(30), acks=["all"], nemeses=["kill"], repeats=2)
    both = grid(
        base_test(30),
        acks=["all"],
        nemeses=["kill"],
        repeats=2,
        consumers=[
            "assign",
            "subscribe",
        ],
    )
    # the assign cells are the cells a matrix always ran (names, seeds, test maps)
    assert both[: len(plain)] == plain and len(both) == 2 * len(plain)
    sub = both[len(plain) :]
    assert all(t["subscribe"] is True and "_sub_" in t["name"] for t in sub)
    assert not any("subscribe" in t for t in plain)
    # a cell is a test configuration: it validates, names its group and subscribes
    from isrlab.harness.testconfig import TestConfig, consumer_mode

    config = TestConfig.from_mapping(sub[0]).to_test()
    assert consumer_mode(config) == "subscribe" and config["group"].startswith("isrlab-acks-all")
    with pytest.raises(ValueError, match="unknown consumer mode 'seek'"):
        grid(base_test(30), consumers=["seek"])
    runner = CliRunner()
    r = runner.invoke(
        _app(),
        [
            "matrix",
            "--dry-run",
            "--acks",
            "all",
            "--nemesis",
            "kill",
            "--consumer",
            "assign,subscribe",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "acks-all_kill_idem_isr2_r0" in r.output and "acks-all_kill_idem_sub_isr2_r0" in r.output
    assert "2 cells" in r.output
    r = runner.invoke(_app(), ["matrix", "--dry-run", "--consumer", "mixed"])
    assert r.exit_code == 2 and "unknown consumer mode" in r.output


def test_workload_and_transaction_dimensions() -> None:
    from isrlab.harness.testconfig import TestConfig

    plain = grid(base_test(30), acks=["all"], nemeses=["kill"], consumers=["assign", "subscribe"])
    # no transaction dimension given: the cells a matrix always ran
    assert grid(
        base_test(30), acks=["all"], nemeses=["kill"], consumers=["assign", "subscribe"]
    ) == grid(
        base_test(30),
        acks=["all"],
        nemeses=["kill"],
        consumers=["assign", "subscribe"],
        workloads=["queue"],
    )
    assert all(t["isolation_level"] is None for t in plain)
    cells = grid(
        base_test(30),
        acks=["all"],
        nemeses=["kill"],
        consumers=["assign", "subscribe"],
        workloads=["queue", "eos"],
        idempotence=[False, True],
        txn=[False, True],
        isolation_levels=["read_uncommitted", "read_committed"],
    )
    names = [t["name"] for t in cells]
    assert len(set(names)) == len(names)
    assert [t["seed"] for t in cells] == list(range(len(cells)))
    # queue: 2 consumer modes x (none, idem, idem+txn) x 2 levels; eos: no consumer mode
    queue = [t for t in cells if t.get("workload") != "eos"]
    eos = [t for t in cells if t.get("workload") == "eos"]
    assert len(queue) == 2 * 3 * 2 and len(eos) == 3 * 2
    assert all(t["idempotence"] for t in cells if t["txn"])
    assert {(t["idempotence"], t["txn"]) for t in eos} == {
        (False, False),
        (True, False),
        (True, True),
    }
    assert not any("subscribe" in t for t in eos)
    assert all(t["name"].startswith("eos_") for t in eos)
    assert {t["isolation_level"] for t in eos} == {"read_uncommitted", "read_committed"}
    assert any("_rc_" in t["name"] for t in queue) and any("_rc_" not in t["name"] for t in queue)
    for t in cells:  # every cell is a test configuration
        TestConfig.from_mapping(t)
    with pytest.raises(ValueError, match="unknown workload 'bank'"):
        grid(base_test(30), workloads=["bank"])
    with pytest.raises(ValueError, match="unknown isolation level"):
        grid(base_test(30), isolation_levels=["serializable"])
    r = CliRunner().invoke(
        _app(),
        [
            "matrix",
            "--dry-run",
            "--acks",
            "all",
            "--nemesis",
            "kill",
            "--workload",
            "queue,eos",
            "--txn",
            "false,true",
            "--isolation-level",
            "read_committed",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "eos_acks-all_kill_idem_txn_rc_isr2_r0" in r.output
    assert "acks-all_kill_idem_rc_isr2_r0" in r.output and "4 cells" in r.output
    r = CliRunner().invoke(_app(), ["matrix", "--dry-run", "--txn", "perhaps"])
    assert r.exit_code == 2 and "txn" in r.output


def test_each_transaction_switch_variant_is_a_cell_of_its_own() -> None:
    """The transaction switches name their cells: a variant named like the baseline would be
    dropped as a duplicate, and the matrix would silently not run it."""
    variants = [
        {},
        parse_switches("txn_verification=false"),
        parse_switches("txn_epoch_fencing=false"),
        parse_switches("txn_marker_acks=1"),
    ]
    tests = grid(base_test(5), acks=["all"], nemeses=["kill"], variants=variants, txn=[True])
    assert [t["name"] for t in tests] == [
        "acks-all_kill_idem_txn_isr2_r0",
        "acks-all_kill_idem_txn_isr2_no-txn-verification_r0",
        "acks-all_kill_idem_txn_isr2_no-txn-epoch-fencing_r0",
        "acks-all_kill_idem_txn_isr2_marker-acks1_r0",
    ]
    assert [t["txn_marker_acks"] for t in tests] == ["all", "all", "all", "1"]
