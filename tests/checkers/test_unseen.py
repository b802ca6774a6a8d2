"""checkers.unseen: every acknowledged write no client read is put in one class from what the
replicas hold and what their truncation journals cut (issue 17). Each class has a case that
lands in it and in no other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from isrlab.checkers.api import check
from isrlab.checkers.history import write_history
from isrlab.checkers.unseen import annotate, classify, load_replicas
from tests.checkers.hist import H


def history() -> list[dict[str, Any]]:
    """Key t/0: values 1..6 acknowledged at offsets 0..5; the polls read 1, 2 and 4 (so 3 is
    a lost write below offset 3) and nothing past offset 3."""
    h = H()
    for i, v in enumerate(range(1, 7)):
        h.send(0, "t/0", v, i)
    h.poll(1, {"t/0": [[0, 1], [1, 2], [3, 4]]})
    return h.ops


def node(run: Path, name: str, held: list[tuple[int, int, int]], cut: list[dict[str, Any]]) -> None:
    d = run / name
    d.mkdir(parents=True)
    rows = [
        {
            "topic": "t",
            "partition": 0,
            "offset": o,
            "leader_epoch": e,
            "producer_id": 1,
            "value": str(v),
        }
        for o, e, v in held
    ]
    (d / "replica-records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "truncations.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cut))


def cluster(run: Path) -> None:
    # n1 (leader): 1, 2, 4 at 0, 1, 3, and 6 at offset 5 (past every read); value 3 was at
    # offset 2 on n2, which truncated it under epoch 4; value 5 is on no replica.
    node(run, "n1", [(0, 1, 1), (1, 1, 2), (3, 2, 4), (5, 2, 6)], [])
    node(
        run,
        "n2",
        [(0, 1, 1), (1, 1, 2)],
        [
            {
                "topic": "t",
                "partition": 0,
                "kind": "truncate",
                "log_end_offset": 3,
                "to_offset": 2,
                "leader_epoch": 4,
                "time_ms": 5,
                "records": [[2, 1, 1, "3"]],
            }
        ],
    )


def test_each_class(tmp_path: Path) -> None:
    cluster(tmp_path)
    got = {w["value"]: w for w in classify(history(), load_replicas(tmp_path))}
    assert set(got) == {3, 5, 6}
    assert got[6]["class"] == "not-yet-read" and got[6]["held"] == [["n1", 5, 2]]
    assert got[3]["class"] == "truncated"
    [cut] = got[3]["truncations"]
    assert (cut["node"], cut["to_offset"], cut["leader_epoch"], cut["offset"]) == ("n2", 2, 4, 2)
    assert got[5]["class"] == "never-reached-a-replica"


def test_a_value_on_a_replica_below_what_was_read_is_present_not_served(tmp_path: Path) -> None:
    node(tmp_path, "n1", [(0, 1, 1), (1, 1, 2), (3, 2, 4)], [])
    node(tmp_path, "n2", [(2, 1, 3)], [])  # a diverged replica kept 3 at offset 2
    got = {w["value"]: w for w in classify(history(), load_replicas(tmp_path))}
    assert got[3]["class"] == "present-not-served" and got[3]["held"] == [["n2", 2, 1]]


def test_annotate_puts_classes_under_the_anomalies_and_report_shows_them(tmp_path: Path) -> None:
    cluster(tmp_path)
    ops = history()
    results = check(ops, "queue")
    assert {"lost-write", "unseen"} <= set(results["anomaly_types"])
    annotate(results, ops, tmp_path)
    assert results["unseen_writes"]["classes"] == {
        "truncated": 1,
        "never-reached-a-replica": 1,
        "not-yet-read": 1,
    }
    lost = results["anomalies"]["lost-write"]
    assert lost["classes"] == {"truncated": 1}  # 3 at offset 2 < 3; 5 and 6 are past the read
    [ex] = lost["examples"]
    assert ex["value"] == 3 and ex["class"] == "truncated" and ex["truncations"][0]["node"] == "n2"
    assert results["anomalies"]["unseen"]["classes"]["never-reached-a-replica"] == 1

    from isrlab.harness.report import render_report

    (tmp_path / "test.json").write_text(json.dumps({"name": "u", "workload": "queue"}))
    write_history(ops, tmp_path / "history.jsonl")
    (tmp_path / "results.json").write_text(json.dumps(results))
    html = render_report(tmp_path).read_text()
    assert "<b>truncated</b> 1" in html


def test_no_collected_replicas_leaves_results_alone(tmp_path: Path) -> None:
    ops = history()
    results = check(ops, "queue")
    before = json.dumps(results, sort_keys=True)
    annotate(results, ops, tmp_path)
    assert json.dumps(results, sort_keys=True) == before


def test_the_pipeline_counts_classes_per_acks_setting(tmp_path: Path) -> None:
    """pipeline.check.check_run carries the classes of a run with collected replica records;
    summarize sums them per configuration and the report per acks setting."""
    from isrlab.pipeline.aggregate import summarize
    from isrlab.pipeline.check import check_run
    from isrlab.pipeline.report import unseen_by_acks

    cluster(tmp_path)
    write_history(history(), tmp_path / "history.jsonl")
    row = check_run("r1", tmp_path, {"workload": "queue"})
    assert dict(row["unseen_classes"]) == {
        "never-reached-a-replica": 1,
        "not-yet-read": 1,
        "truncated": 1,
    }
    cfg = {"acks": "1", "nemesis": "kill", "consumer": "assign"}
    from isrlab.pipeline.store import CONFIG_COLUMNS

    base = {col: cfg.get(col) for col in CONFIG_COLUMNS}
    configs = [dict(base, runs=1, valid=0, invalid=1, unknown=0, acked_writes=6)]
    classes = [dict(base, **{"class": k, "count": n}) for k, n in row["unseen_classes"]]
    [summary] = summarize(configs, [], [], unseen_classes=classes)
    assert summary["unseen_classes"]["truncated"] == 1
    assert unseen_by_acks([summary, dict(summary, acks="all", unseen_classes={})]) == {
        "1": {"never-reached-a-replica": 1, "not-yet-read": 1, "truncated": 1}
    }


def test_the_published_report_has_a_storage_fault_section() -> None:
    from isrlab.pipeline.report import storage_rows

    base = {"acks": "all", "runs": 2, "runs_invalid": 1, "acked_writes": 100, "unseen_classes": {}}
    configs = [
        dict(base, nemesis="partition", anomalies={}),
        dict(
            base,
            nemesis="power",
            flush_policy="never",
            anomalies={"lost-write": {"count": 4}},
            unseen_classes={"truncated": 4},
        ),
        dict(base, nemesis="kill+corrupt", flush_policy="every-append", anomalies={}),
    ]
    rows = storage_rows(configs)
    assert [(r["nemesis"], r["flush_policy"], r["lost_writes"]) for r in rows] == [
        ("power", "never", 4),
        ("kill+corrupt", "every-append", 0),
    ]
    assert rows[0]["unseen_classes"] == {"truncated": 4}
