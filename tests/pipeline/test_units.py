"""Pure parts of the pipeline: store discovery, flattening, intervals, summaries."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from isrlab.pipeline.aggregate import rate_interval, summarize
from isrlab.pipeline.check import check_run
from isrlab.pipeline.fixtures.synthetic import make_test, write_run
from isrlab.pipeline.ingest import records_of
from isrlab.pipeline.report import switch_tables
from isrlab.pipeline.spark import SparkUnavailable, check_java
from isrlab.pipeline.store import StoreError, config_name, config_of, discover_runs
from tests.checkers.hist import H


def test_config_of_fills_kafka_defaults_and_labels_faults() -> None:
    c = config_of({"acks": "all", "nemesis": ["kill", "partition", "pause", "clock"]})
    assert c == {
        "workload": "queue",  # a test.json without a workload ran the queue workload
        "mode": "real",  # a test.json without a mode is a real run's (not `isrlab sim`'s)
        "acks": "all",
        "consumer": "assign",  # a test.json from before consumer groups
        "nemesis": "combined",
        "idempotence": False,
        "txn": False,
        "isolation_level": "read_uncommitted",  # (librdkafka's default)
        "min_insync_replicas": 1,
        "unclean_leader_election": False,
        "truncation_mode": "leader-epoch",
        "eligible_leader_replicas": False,  # runs from before KIP-966 here ran without it
        "txn_verification": True,  # runs from before the transaction switches ran with them on
        "txn_epoch_fencing": True,
        "txn_marker_acks": "all",
        "flush_policy": "never",  # runs from before the flush-policy switch: Kafka's default
        "replica_lag_time_max_ms": 10000,
        "zk_session_timeout_ms": 6000,
    }
    # Other compositions keep their kinds: partition+kill is not the combined schedule.
    assert config_of({"nemesis": ["partition", "kill", "kill"]})["nemesis"] == "kill+partition"
    timed = config_of({"replica_lag_time_max_ms": 4000, "zk_session_timeout_ms": "4000"})
    assert (timed["replica_lag_time_max_ms"], timed["zk_session_timeout_ms"]) == (4000, 4000)
    assert config_of({"acks": 1, "nemesis": []})["nemesis"] == "none"
    assert config_of({"acks": "-1", "nemesis": "pause"})["acks"] == "all"
    assert config_of({"nemesis": ["none"]})["nemesis"] == "none"


def test_config_name_is_file_safe_and_distinguishes_switches() -> None:
    a = config_name({"acks": "all", "nemesis": ["partition"], "unclean_leader_election": True})
    b = config_name({"acks": "all", "nemesis": ["partition"]})
    assert a != b and "/" not in a and " " not in a
    timed = config_name(
        {"acks": "all", "nemesis": ["partition", "kill"], "replica_lag_time_max_ms": 4000}
    )
    assert timed == "acks-all_kill+partition_lag4000"
    # a timing equal to the harness default does not change the name
    assert (
        config_name(dict(b=1, acks="all", nemesis=["partition"], zk_session_timeout_ms=6000)) == b
    )


def test_discover_runs_separates_malformed(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a directory"):
        discover_runs(tmp_path / "missing")
    with pytest.raises(StoreError, match="no runs"):
        discover_runs(tmp_path)
    good = write_run(tmp_path, make_test(acks="1", seed=1), 300)
    (tmp_path / "x" / "1").mkdir(parents=True)
    (tmp_path / "x" / "1" / "test.json").write_text("[1, 2]")
    runs, bad = discover_runs(tmp_path)
    assert [r.path for r in runs] == [good.resolve()]
    assert [b.run_id for b in bad] == ["x/1"] and "not a JSON object" in bad[0].reason


def test_records_of_flattens_sends_and_reads() -> None:
    h = H()
    h.send(0, "a", 1, 0)
    h.poll(1, {"a": [[0, 1]], "b": []})
    # A failed send without an offset, and an invoke that never completes.
    h.ops.append(
        {
            "index": len(h.ops),
            "time": 90_000,
            "process": 2,
            "type": "invoke",
            "f": "send",
            "value": [["send", "a", 7]],
        }
    )
    h.ops.append(
        {
            "index": len(h.ops),
            "time": 91_000,
            "process": 2,
            "type": "fail",
            "f": "send",
            "value": [["send", "a", 7]],
        }
    )
    h.ops.append(
        {
            "index": len(h.ops),
            "time": 92_000,
            "process": 3,
            "type": "invoke",
            "f": "send",
            "value": [["send", "b", 8]],
        }
    )
    rows = records_of("r/1", h.ops).to_pylist()
    assert [(r["kind"], r["type"], r["key"], r["offset"], r["value"]) for r in rows] == [
        ("send", "ok", "a", 0, "1"),
        ("read", "ok", "a", 0, "1"),
        ("send", "fail", "a", None, "7"),
        ("send", "info", "b", None, "8"),
    ]
    first = rows[0]
    assert first["run_id"] == "r/1" and first["invoke_index"] == 0 and first["index"] == 1
    assert first["invoke_time"] < first["complete_time"]
    assert rows[-1]["complete_time"] is None and rows[-1]["index"] == rows[-1]["invoke_index"]


def test_check_run_reports_bad_input_as_a_row(tmp_path: Path) -> None:
    (tmp_path / "history.jsonl").write_text("not json\n")
    row = check_run("r", tmp_path, {"workload": "queue"})
    assert row["status"] == "malformed" and "malformed JSON" in row["error"]
    row = check_run("r", tmp_path, {"workload": "bank"})
    assert row["status"] == "malformed" and "bank" in row["error"]


def test_wilson_interval_known_values() -> None:
    # 0 of 100: upper bound z^2 / (n + z^2).
    rate, low, high = rate_interval(0, 100) or (0.0, 0.0, 0.0)
    assert rate == 0 and low == 0
    assert math.isclose(high, 1.959963984540054**2 / (100 + 1.959963984540054**2) * 10_000)
    rate, low, high = rate_interval(50, 100) or (0.0, 0.0, 0.0)
    assert rate == 5000 and math.isclose(low + high, 10_000) and 4000 < low < 4100
    assert rate_interval(3, 0) is None
    rate, low, high = rate_interval(400, 100) or (0.0, 0.0, 0.0)  # more cases than writes
    assert rate == 40_000 and low < rate < high


def _cfg(**kw: Any) -> dict[str, Any]:
    base = config_of({"acks": "1", "nemesis": ["kill"]})
    base.update(kw)
    return base


def test_summarize_rates_worst_runs_and_switch_tables() -> None:
    a, b = _cfg(), _cfg(acks="all")
    configs = [
        dict(a, runs=2, valid=1, invalid=1, unknown=0, acked_writes=2000),
        dict(b, runs=1, valid=1, invalid=0, unknown=0, acked_writes=500),
    ]
    types = [
        dict(a, type="lost-write", count=10, runs_with=1),
        dict(a, type="G0", count=4, runs_with=2),
        dict(b, type="G0", count=1, runs_with=1),
    ]
    runs = [
        dict(a, run_id="a/1", path="/s/a/1", valid="false", acked_writes=1000, invalid_count=10),
        dict(a, run_id="a/2", path="/s/a/2", valid="true", acked_writes=1000, invalid_count=0),
        dict(b, run_id="b/1", path="/s/b/1", valid="true", acked_writes=500, invalid_count=0),
    ]
    out = summarize(configs, types, runs)
    by_acks = {c["acks"]: c for c in out}
    one = by_acks["1"]
    assert one["invalid"]["count"] == 10  # G0 is allowed by default
    assert one["invalid"]["rate"] == 50.0
    assert one["anomalies"]["lost-write"]["rate"] == 50.0
    assert one["anomalies"]["G0"]["allowed_by_default"] is True
    assert [w["run_id"] for w in one["worst"]] == ["a/1"]
    assert by_acks["all"]["invalid"]["count"] == 0 and by_acks["all"]["worst"] == []
    tables = switch_tables(out)
    row = tables["min_insync_replicas"]["rows"][0]
    assert row["cells"]["1"]["rate"] == 50.0 and row["cells"]["all"]["rate"] == 0.0


def test_java_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkUnavailable, match="Java was not found"):
        check_java()


def test_the_consumer_mode_is_a_grouping_column() -> None:
    from isrlab.pipeline.ingest import RUNS_SCHEMA
    from isrlab.pipeline.report import _setting
    from isrlab.pipeline.store import CONFIG_COLUMNS

    assert "consumer" in CONFIG_COLUMNS and RUNS_SCHEMA.field("consumer").type == "string"
    assert config_of({"acks": "all"})["consumer"] == "assign"
    assert config_of({"subscribe": True})["consumer"] == "subscribe"
    assert config_of({"sub_p": 0.5})["consumer"] == "mixed"
    assert config_of({"sub_via": ["subscribe"]})["consumer"] == "subscribe"
    assert config_of({"sub_p": 0})["consumer"] == "assign"
    # the heatmaps and tables tell subscribe runs apart from assign ones
    assert _setting(_cfg()) == "min.insync=1"
    assert _setting(_cfg(consumer="subscribe")) == "subscribe, min.insync=1"
    a, s = _cfg(), _cfg(consumer="subscribe")
    configs = [
        dict(a, runs=1, valid=1, invalid=0, unknown=0, acked_writes=1000),
        dict(s, runs=1, valid=0, invalid=1, unknown=0, acked_writes=1000),
    ]
    types = [dict(s, type="committed-offset-regression", count=3, runs_with=1)]
    runs = [
        dict(a, run_id="a/1", path="/s/a/1", valid="true", acked_writes=1000, invalid_count=0),
        dict(s, run_id="s/1", path="/s/s/1", valid="false", acked_writes=1000, invalid_count=3),
    ]
    table = switch_tables(summarize(configs, types, runs))["consumer"]
    assert [row["value"] for row in table["rows"]] == ["assign", "subscribe"]
    rates = {row["value"]: row["cells"]["1"]["rate"] for row in table["rows"]}
    assert rates == {"assign": 0.0, "subscribe": 30.0}


def test_workload_and_isolation_level_are_grouping_columns() -> None:
    from isrlab.pipeline.ingest import RUNS_SCHEMA
    from isrlab.pipeline.report import _setting
    from isrlab.pipeline.store import CONFIG_COLUMNS

    assert CONFIG_COLUMNS[0] == "workload" and "isolation_level" in CONFIG_COLUMNS
    assert RUNS_SCHEMA.names[:4] == ["run_id", "path", "name", "workload"]
    assert RUNS_SCHEMA.field("isolation_level").type == "string"
    eos = config_of({"workload": "eos", "txn": True, "isolation_level": "read_committed"})
    assert (eos["workload"], eos["consumer"], eos["isolation_level"]) == (
        "eos",
        "subscribe",  # the copiers are one consumer group
        "read_committed",
    )
    assert config_of({"workload": {"name": "queue"}})["workload"] == "queue"
    assert _setting(_cfg(workload="eos", consumer="subscribe", txn=True)) == (
        "eos, min.insync=1, txn"
    )
    assert _setting(_cfg(isolation_level="read_committed")) == "min.insync=1, read_committed"
    q, e = _cfg(), _cfg(workload="eos", consumer="subscribe", txn=True)
    configs = [
        dict(q, runs=1, valid=1, invalid=0, unknown=0, acked_writes=1000),
        dict(e, runs=1, valid=0, invalid=1, unknown=0, acked_writes=1000),
    ]
    types = [dict(e, type="eos-duplicate", count=5, runs_with=1)]
    runs = [
        dict(q, run_id="q/1", path="/s/q/1", valid="true", acked_writes=1000, invalid_count=0),
        dict(e, run_id="e/1", path="/s/e/1", valid="false", acked_writes=1000, invalid_count=5),
    ]
    tables = switch_tables(summarize(configs, types, runs))
    assert [row["value"] for row in tables["workload"]["rows"]] == ["queue", "eos"]
    rates = {row["value"]: row["cells"]["1"]["rate"] for row in tables["workload"]["rows"]}
    assert rates == {"queue": 0.0, "eos": 50.0}
    assert "isolation_level" in tables


def test_storage_rows_keep_power_faults_with_flush_policy_and_eligible_leader_replicas() -> None:
    from isrlab.pipeline.report import storage_rows

    base = {"acks": "all", "runs": 1, "runs_invalid": 0, "acked_writes": 10, "anomalies": {}}
    rows = storage_rows(
        [
            {**base, "nemesis": "power", "flush_policy": "never"},
            {**base, "nemesis": "power", "eligible_leader_replicas": False, "runs_invalid": 1},
            {**base, "nemesis": "partition+corrupt", "flush_policy": "every-append"},
            {**base, "nemesis": "kill"},
        ]
    )
    assert [(r["nemesis"], r["flush_policy"], r["eligible_leader_replicas"]) for r in rows] == [
        ("power", "never", True),
        ("power", "never", False),
        ("partition+corrupt", "every-append", True),
    ]
