"""Per-key checking (for the Spark pipeline): project_key, keys_of, merge_results."""

from __future__ import annotations

from isrlab.checkers.queue import check_queue, keys_of, merge_results, project_key
from tests.checkers.hist import H


def two_key_history() -> H:
    h = H()
    h.send(0, "a", 1, 0)
    h.send(0, "a", 2, 1)
    h.txn(1, [["send", "b", [0, 10]], ["send", "a", [2, 3]]])
    h.poll(2, {"a": [[0, 1], [2, 3]], "b": [[0, 10]]}, watermarks={"a": {"low": 0, "high": 3}})
    return h


def test_keys_and_projection() -> None:
    h = two_key_history()
    assert keys_of(h.ops) == ["a", "b"]
    b_ops = project_key(h.ops, "b")
    assert len(b_ops) == len(h.ops)
    poll = b_ops[-1]
    assert poll["value"] == [["poll", {"b": [[0, 10]]}]]
    assert poll["watermarks"] == {}
    txn = b_ops[5]
    assert txn["value"] == [["send", "b", [0, 10]]]


def test_per_key_results_merge_like_the_whole() -> None:
    h = two_key_history()
    whole = check_queue(h.ops)
    parts = {k: check_queue(project_key(h.ops, k)) for k in keys_of(h.ops)}
    assert parts["a"]["valid"] is False and "lost-write" in parts["a"]["anomaly_types"]
    assert parts["b"]["valid"] is True
    merged = merge_results(parts.values())
    assert merged["valid"] is False
    assert merged["anomaly_types"] == whole["anomaly_types"]
    for name in whole["anomaly_types"]:
        assert merged["anomalies"][name]["count"] == whole["anomalies"][name]["count"]
    assert merged["stats"]["sends"] == whole["stats"]["sends"]


def test_merge_unknown_and_example_cap() -> None:
    a = {"valid": True, "anomalies": {"unseen": {"count": 2, "examples": [{"x": 1}] * 2}}}
    b = {"valid": "unknown", "anomalies": {"unseen": {"count": 3, "examples": [{"x": 2}] * 3}}}
    m = merge_results([a, b], max_examples=4)
    assert m["valid"] == "unknown"
    assert m["anomalies"]["unseen"]["count"] == 5
    assert len(m["anomalies"]["unseen"]["examples"]) == 4
