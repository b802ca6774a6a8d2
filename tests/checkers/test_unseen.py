"""checkers.unseen: every acknowledged write no client read is put in one class from what the
replicas hold and what their truncation journals cut (issue 17). Each class has a case that
lands in it and in no other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from isrlab.checkers.api import check
from isrlab.checkers.history import write_history
from isrlab.checkers.unseen import annotate, classify, classify_offsets, load_replicas
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


# -- values read (or acknowledged) at an offset that was later replaced or vanished ----------


def replaced_history() -> list[dict[str, Any]]:
    """Key t/0: 1..5 acknowledged at offsets 0..4 and read with a high watermark of 5 (all
    committed); a later poll returns 12, 13, 14 at offsets 2, 3, 4: committed-truncation of
    3, 4, 5 and inconsistent-offsets at 2, 3, 4."""
    h = H()
    for i, v in enumerate(range(1, 6)):
        h.send(0, "t/0", v, i)
    h.poll(1, {"t/0": [[o, o + 1] for o in range(5)]}, watermarks={"t/0": {"low": 0, "high": 5}})
    h.poll(2, {"t/0": [[0, 1], [1, 2], [2, 12], [3, 13], [4, 14]]})
    return h.ops


def journal(offset: int, value: int, kind: str = "truncate", epoch: int = 3) -> dict[str, Any]:
    return {
        "topic": "t",
        "partition": 0,
        "kind": kind,
        "log_end_offset": 5,
        "to_offset": offset,
        "leader_epoch": epoch,
        "time_ms": 7,
        "records": [[offset, 1, 1, str(value)]],
    }


def replaced_cluster(run: Path) -> None:
    # offset 2: n1 and n2 hold 12, n2's journal cut 3 there (3 replaced, 12 kept);
    # offset 3: n1 holds 13, n3 still holds 4 (both diverged);
    # offset 4: nobody; n2's power loss cut 5 there (truncated; n3 holds 5 at offset 6), no
    # journal has 14 (vanished).
    node(run, "n1", [(0, 1, 1), (1, 1, 2), (2, 2, 12), (3, 2, 13)], [])
    node(
        run, "n2", [(0, 1, 1), (1, 1, 2), (2, 2, 12)], [journal(2, 3), journal(4, 5, "power-loss")]
    )
    node(run, "n3", [(0, 1, 1), (1, 1, 2), (3, 1, 4), (6, 1, 5)], [])


def test_each_offset_class(tmp_path: Path) -> None:
    replaced_cluster(tmp_path)
    got = classify_offsets(replaced_history(), load_replicas(tmp_path))
    assert {k: e["class"] for k, e in got.items()} == {
        ("t/0", 2, "3"): "replaced",
        ("t/0", 2, "12"): "kept",
        ("t/0", 3, "4"): "diverged",
        ("t/0", 3, "13"): "diverged",
        ("t/0", 4, "5"): "truncated",
        ("t/0", 4, "14"): "vanished",
    }
    replaced = got[("t/0", 2, "3")]
    assert replaced["at_offset"] == [["n1", "12", 2], ["n2", "12", 2]]
    [cut] = replaced["truncations"]
    assert (cut["node"], cut["leader_epoch"], cut["to_offset"], cut["log_end_offset"]) == (
        "n2",
        3,
        2,
        5,
    )
    assert (cut["kind"], cut["value"]) == ("truncate", "3")
    assert replaced["anomalies"] == ["committed-truncation", "inconsistent-offsets"]
    assert got[("t/0", 2, "12")]["anomalies"] == ["inconsistent-offsets"]
    assert got[("t/0", 3, "4")]["at_offset"] == [["n1", "13", 2], ["n3", "4", 1]]
    truncated = got[("t/0", 4, "5")]
    assert [c["kind"] for c in truncated["truncations"]] == ["power-loss"]
    assert "at_offset" not in truncated and truncated["held_elsewhere"] == [["n3", 6, 1]]
    # the journal entry at offset 4 cut 5, not 14: 14 is in no journal
    assert got[("t/0", 4, "14")]["truncations"][0]["value"] == "5"


def test_a_cut_value_fetched_back_at_its_offset_is_kept(tmp_path: Path) -> None:
    """A follower that truncated a record and fetched the same record again (KIP-101's
    truncate-to-high-watermark) holds it: the journal entry does not make it replaced."""
    node(tmp_path, "n1", [(o, 1, o + 1) for o in range(5)], [journal(2, 3), journal(4, 5)])
    node(tmp_path, "n2", [(o, 1, o + 1) for o in range(5)], [])
    got = classify_offsets(replaced_history(), load_replicas(tmp_path))
    assert got[("t/0", 2, "3")]["class"] == "kept"
    assert got[("t/0", 4, "5")]["class"] == "kept"
    assert got[("t/0", 2, "12")]["class"] == "vanished"


def test_annotate_classes_committed_truncation_and_inconsistent_offsets(tmp_path: Path) -> None:
    replaced_cluster(tmp_path)
    ops = replaced_history()
    results = check(ops, "queue")
    assert {"committed-truncation", "inconsistent-offsets"} <= set(results["anomaly_types"])
    annotate(results, ops, tmp_path)
    contested = results["contested_values"]
    assert contested["nodes"] == ["n1", "n2", "n3"] and contested["count"] == 6
    assert contested["classes"] == {
        "kept": 1,
        "diverged": 2,
        "replaced": 1,
        "truncated": 1,
        "vanished": 1,
    }
    ct = results["anomalies"]["committed-truncation"]
    assert ct["classes"] == {"diverged": 1, "replaced": 1, "truncated": 1}
    by_offset = {ex["offset"]: ex for ex in ct["examples"]}
    assert {o: (ex["value"], ex["class"]) for o, ex in by_offset.items()} == {
        2: (3, "replaced"),
        3: (4, "diverged"),
        4: (5, "truncated"),
    }
    assert by_offset[2]["truncations"][0]["node"] == "n2"
    assert by_offset[3]["at_offset"] == [["n1", "13", 2], ["n3", "4", 1]]
    assert by_offset[4]["truncations"][0]["kind"] == "power-loss"
    io = results["anomalies"]["inconsistent-offsets"]
    assert io["classes"] == {"kept": 1, "diverged": 2, "replaced": 1, "truncated": 1, "vanished": 1}
    per_value = {
        (ex["offset"], c["value"]): c["class"] for ex in io["examples"] for c in ex["value_classes"]
    }
    assert per_value == {
        (2, 3): "replaced",
        (2, 12): "kept",
        (3, 4): "diverged",
        (3, 13): "diverged",
        (4, 5): "truncated",
        (4, 14): "vanished",
    }
    assert results["valid"] is False  # the classes explain; they never change the verdict

    from isrlab.harness.report import render_report

    (tmp_path / "test.json").write_text(json.dumps({"name": "c", "workload": "queue"}))
    write_history(ops, tmp_path / "history.jsonl")
    (tmp_path / "results.json").write_text(json.dumps(results))
    html = render_report(tmp_path).read_text()
    assert "<b>replaced</b> 1" in html and "<b>vanished</b> 1" in html
    assert "<i>diverged</i>: replicas" in html


def test_offset_classes_cover_every_case_not_only_the_examples(tmp_path: Path) -> None:
    """40 committed values replaced: the check keeps 32 examples, the classes count all 40
    (the same cases a check with room for every example finds)."""
    n = 40
    h = H()
    for o in range(n):
        h.send(0, "t/0", o, o)
    h.poll(1, {"t/0": [[o, o] for o in range(n)]}, watermarks={"t/0": {"low": 0, "high": n}})
    h.poll(2, {"t/0": [[o, 1000 + o] for o in range(n)]})
    node(tmp_path, "n1", [(o, 2, 1000 + o) for o in range(n)], [])
    node(tmp_path, "n2", [(o, 2, 1000 + o) for o in range(n)], [journal(o, o) for o in range(n)])
    ops = h.ops
    results = check(ops, "queue")
    ct = results["anomalies"]["committed-truncation"]
    assert ct["count"] == n and len(ct["examples"]) < n
    everything = check(ops, "queue", max_examples=1000)["anomalies"]
    annotate(results, ops, tmp_path)
    assert ct["classes"] == {"replaced": len(everything["committed-truncation"]["examples"])}
    io = results["anomalies"]["inconsistent-offsets"]
    assert io["classes"] == {"kept": n, "replaced": n}
    assert sum(len(ex["values"]) for ex in everything["inconsistent-offsets"]["examples"]) == 2 * n
    assert all(ex["class"] == "replaced" for ex in ct["examples"])
    assert results["contested_values"]["count"] == 2 * n


def test_offset_classes_leave_the_unread_write_classes_alone(tmp_path: Path) -> None:
    """A run with unread writes and no committed-truncation or inconsistent-offsets: results
    exactly as before (no contested_values, nothing added under other anomalies)."""
    cluster(tmp_path)
    ops = history()
    results = check(ops, "queue")
    annotate(results, ops, tmp_path)
    assert "contested_values" not in results
    assert set(results["anomalies"]["lost-write"]) == {"count", "examples", "classes"}


def test_the_pipeline_counts_offset_classes(tmp_path: Path) -> None:
    from isrlab.pipeline.aggregate import summarize
    from isrlab.pipeline.check import check_run
    from isrlab.pipeline.report import contested_by_acks, storage_rows
    from isrlab.pipeline.store import CONFIG_COLUMNS

    replaced_cluster(tmp_path)
    write_history(replaced_history(), tmp_path / "history.jsonl")
    row = check_run("r1", tmp_path, {"workload": "queue"})
    assert dict(row["contested_classes"]) == {
        "diverged": 2,
        "kept": 1,
        "replaced": 1,
        "truncated": 1,
        "vanished": 1,
    }
    cfg = {"acks": "1", "nemesis": "power", "consumer": "assign"}
    base = {col: cfg.get(col) for col in CONFIG_COLUMNS}
    configs = [dict(base, runs=1, valid=0, invalid=1, unknown=0, acked_writes=5)]
    classes = [dict(base, **{"class": k, "count": n}) for k, n in row["contested_classes"]]
    [summary] = summarize(configs, [], [], contested_classes=classes)
    assert summary["contested_classes"]["replaced"] == 1
    assert summary["unseen_classes"] == {}
    assert contested_by_acks([summary, dict(summary, acks="all", contested_classes={})]) == {
        "1": {"diverged": 2, "kept": 1, "replaced": 1, "truncated": 1, "vanished": 1}
    }
    [storage] = storage_rows([dict(summary, anomalies={})])
    assert storage["contested_classes"]["vanished"] == 1
