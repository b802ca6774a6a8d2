"""The Spark job on a small synthetic store (local[1]): tables, verdicts, sums, report files."""

from __future__ import annotations

import csv
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from isrlab.checkers.api import check, policy_from_test
from isrlab.checkers.history import load_history
from isrlab.checkers.queue.policy import DEFAULT_ALLOWED
from isrlab.pipeline.check import RESULTS_SCHEMA, acked_writes
from isrlab.pipeline.ingest import RECORDS_SCHEMA, RUNS_SCHEMA, records_of
from isrlab.pipeline.store import CONFIG_COLUMNS, config_of
from tests.pipeline.conftest import small_store_tests

# pyspark 4.3 warns that it does not fully support pandas 3 (the pipeline uses Arrow).
pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


def _good_runs(store: Path) -> list[Path]:
    return sorted(p.parent for p in store.glob("acks-*/*/history.jsonl"))


def test_ingest_tables_have_the_explicit_schemas(analysis: Any) -> None:
    parquet = analysis.out / "parquet"
    records = pq.read_table(parquet / "records")
    assert records.schema.names == RECORDS_SCHEMA.names
    for name in ("index", "offset", "process", "invoke_time", "complete_time"):
        assert records.schema.field(name).type == RECORDS_SCHEMA.field(name).type
    runs = pq.read_table(parquet / "runs")
    assert set(runs.schema.names) == set(RUNS_SCHEMA.names) - {"test_json"}
    assert runs.num_rows == len(small_store_tests()) + 1  # + the run with a broken history
    results = pq.read_table(parquet / "results")
    assert results.schema.names == RESULTS_SCHEMA.names


def test_records_are_every_send_and_read_of_every_run(analysis: Any, store: Path) -> None:
    records = pq.read_table(analysis.out / "parquet" / "records").to_pylist()
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_run.setdefault(r["run_id"], []).append(r)
    runs = _good_runs(store)
    assert set(by_run) == {p.relative_to(store).as_posix() for p in runs}
    for run_dir in runs:
        run_id = run_dir.relative_to(store).as_posix()
        expected = records_of(run_id, load_history(run_dir / "history.jsonl")).to_pylist()
        key = lambda r: (r["index"], r["mop"], r["kind"], r["key"], r["offset"] or -1)  # noqa: E731
        assert sorted(by_run[run_id], key=key) == sorted(expected, key=key)
        ok_sends = [r for r in by_run[run_id] if r["kind"] == "send" and r["type"] == "ok"]
        assert len(ok_sends) == acked_writes(load_history(run_dir / "history.jsonl"))


def test_verdicts_equal_the_in_process_checker(analysis: Any, store: Path) -> None:
    results = {
        r["run_id"]: r for r in pq.read_table(analysis.out / "parquet" / "results").to_pylist()
    }
    runs = _good_runs(store)
    assert runs
    for run_dir in runs:
        test = orjson.loads((run_dir / "test.json").read_bytes())
        policy = policy_from_test(test)
        workload = policy.pop("workload")
        expected = check(load_history(run_dir / "history.jsonl"), workload, **policy)
        row = results[run_dir.relative_to(store).as_posix()]
        assert row["status"] == "checked"
        got = orjson.loads(row["results_json"])
        assert got == orjson.loads(orjson.dumps(expected, option=orjson.OPT_NON_STR_KEYS))
        assert row["valid"] == {True: "true", False: "false"}.get(expected["valid"], "unknown")
    # The store holds both verdicts, so equality above is not vacuous.
    assert {r["valid"] for r in results.values() if r["status"] == "checked"} == {"true", "false"}


def test_malformed_runs_are_reported_and_skipped(analysis: Any) -> None:
    reasons = {m["run_id"]: m["reason"] for m in analysis.malformed}
    assert set(reasons) == {"bad-json/1", "no-history/1", "broken-history/1"}
    assert "test.json" in reasons["bad-json/1"]
    assert "history.jsonl" in reasons["no-history/1"]
    assert "missing required field" in reasons["broken-history/1"]
    assert analysis.runs == len(small_store_tests()) + 3
    assert analysis.checked == len(small_store_tests())


def test_aggregates_are_the_sums_of_the_runs(analysis: Any, store: Path) -> None:
    expected: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run_dir in _good_runs(store):
        test = orjson.loads((run_dir / "test.json").read_bytes())
        key = tuple(config_of(test)[c] for c in CONFIG_COLUMNS)
        ops = load_history(run_dir / "history.jsonl")
        res = check(ops, "queue")
        e = expected.setdefault(key, {"runs": 0, "acked": 0, "counts": {}, "invalid_runs": 0})
        e["runs"] += 1
        e["acked"] += acked_writes(ops)
        e["invalid_runs"] += res["valid"] is False
        for name, a in res["anomalies"].items():
            e["counts"][name] = e["counts"].get(name, 0) + a["count"]
    got = {tuple(c[col] for col in CONFIG_COLUMNS): c for c in analysis.configs}
    assert set(got) == set(expected)
    for key, e in expected.items():
        c = got[key]
        assert c["runs"] == e["runs"]
        assert c["acked_writes"] == e["acked"]
        assert c["runs_invalid"] == e["invalid_runs"]
        assert {n: a["count"] for n, a in c["anomalies"].items()} == e["counts"]
        invalid = sum(n for t, n in e["counts"].items() if t not in DEFAULT_ALLOWED)
        assert c["invalid"]["count"] == invalid
        assert abs(c["invalid"]["rate"] - invalid / e["acked"] * 10_000) < 1e-9
        assert c["invalid"]["low"] <= c["invalid"]["rate"] <= c["invalid"]["high"]
    # The pooled acks=1 partition cell has two runs.
    assert any(c["runs"] == 2 for c in analysis.configs)


def test_physics_of_the_synthetic_store(analysis: Any) -> None:
    cells = {(c["acks"], c["nemesis"], c["min_insync_replicas"]): c for c in analysis.configs}
    assert cells[("1", "partition", 2)]["anomalies"]["lost-write"]["count"] > 0
    assert cells[("all", "partition", 2)]["invalid"]["count"] == 0
    assert cells[("all", "kill", 2)]["invalid"]["count"] == 0
    assert cells[("all", "partition", 1)]["invalid"]["count"] > 0
    assert cells[("1", "clock", 2)]["invalid"]["count"] == 0


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.imgs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        d = dict(attrs)
        if tag == "a" and d.get("href"):
            self.hrefs.append(str(d["href"]))
        if tag == "img" and d.get("src"):
            self.imgs.append(str(d["src"]))


def test_report_files(analysis: Any, store: Path) -> None:
    out: Path = analysis.out
    html = (out / "index.html").read_text()
    parser = _Links()
    parser.feed(html)
    assert parser.imgs and all((out / src).is_file() for src in parser.imgs)
    assert all((out / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for src in parser.imgs)
    run_links = [h for h in parser.hrefs if h not in ("summary.csv", "summary.json")]
    # The one run with a report.html is linked to its copy inside the report (which carries
    # what it links to); the others are listed without a link.
    [with_report] = set(run_links)
    assert with_report.startswith("runs/") and (out / with_report).read_text() == (
        "<html>run report</html>"
    )
    assert all((out / h).is_file() for h in parser.hrefs)
    assert html.count("(no report.html)") == len(analysis.per_run) - 1
    for name in ("lost-write", "unclean_leader_election", "min_insync_replicas", "bad-json/1"):
        assert name in html

    with (out / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(analysis.configs)
    for row, c in zip(rows, analysis.configs, strict=True):
        assert int(row["acked_writes"]) == c["acked_writes"]
        assert int(row["invalid_count"]) == c["invalid"]["count"]

    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["checked"] == analysis.checked
    assert len(summary["per_run"]) == analysis.checked + 1

    anomalies = pq.read_table(out / "anomalies.parquet").to_pylist()
    total = sum(sum(a["count"] for a in c["anomalies"].values()) for c in analysis.configs)
    assert sum(a["count"] for a in anomalies) == total
    assert {a["type"] for a in anomalies} >= {"lost-write"}
    assert all(a["example"] for a in anomalies)


def test_the_consumer_mode_reaches_the_report(analysis: Any) -> None:
    runs = pq.read_table(analysis.out / "parquet" / "runs").to_pylist()
    modes = {r["name"]: r["consumer"] for r in runs if r["name"]}
    assert modes["acks-all_kill_sub_commit0.1_isr2_r0"] == "subscribe"
    assert modes["acks-all_kill_isr2_r0"] == "assign"
    configs = {(c["acks"], c["nemesis"], c["consumer"]) for c in analysis.configs}
    assert {("all", "kill", "assign"), ("all", "kill", "subscribe")} <= configs
    with (analysis.out / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["consumer"] for r in rows} == {"assign", "subscribe"}
    html = (analysis.out / "index.html").read_text()
    assert '<th class="l">consumer</th>' in html and "subscribe, min.insync=2" in html
