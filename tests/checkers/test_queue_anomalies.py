"""One hand-written history per queue anomaly: each must be flagged, its twin must not."""

from __future__ import annotations

from typing import Any

from isrlab.checkers.history import validate
from isrlab.checkers.queue import check_queue
from tests.checkers.hist import H


def check(h: H, **kw: Any) -> dict[str, Any]:
    """The results, which must be the same with the native screen and without it."""
    validate(h.ops)
    screened = check_queue(h.ops, **kw)
    assert screened == check_queue(h.ops, screen=False, **kw)
    return screened


def types(h: H, **kw: Any) -> set[str]:
    return set(check(h, **kw)["anomaly_types"])


def sent(h: H, k: str, values: list[Any], process: int = 0, start: int = 0) -> None:
    for i, v in enumerate(values):
        h.send(process, k, v, start + i)


def test_clean_history_is_valid() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.poll(1, {"k": [[0, 1], [1, 2]]})
    h.poll(1, {"k": [[2, 3]]})
    h.poll(1, {"k": []})
    r = check(h)
    assert r["valid"] is True
    assert r["anomaly_types"] == []
    assert r["stats"]["keys"] == 1


def test_inconsistent_offsets() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1], [1, 2]]})
    h.send(2, "k", 3, 1)  # acked at an offset another record holds
    r = check(h)
    assert "inconsistent-offsets" in r["anomaly_types"]
    ex = r["anomalies"]["inconsistent-offsets"]["examples"][0]
    assert ex["offset"] == 1 and sorted(ex["values"]) == [2, 3]
    assert "offset 1" in ex["explanation"]
    h2 = H()
    sent(h2, "k", [1, 2])
    h2.poll(1, {"k": [[0, 1], [1, 2]]})
    assert "inconsistent-offsets" not in types(h2)


def test_duplicate_and_idempotence_duplicate() -> None:
    h = H()
    h.send(0, "k", 1, 0, producer={"id": 7, "epoch": 0, "idempotent": True})
    h.poll(1, {"k": [[0, 1], [1, 1]]})
    t = types(h)
    assert {"duplicate", "idempotence-duplicate"} <= t
    h2 = H()
    h2.send(0, "k", 1, 0, producer={"id": 7, "epoch": 0, "idempotent": False})
    h2.poll(1, {"k": [[0, 1], [1, 1]]})
    t2 = types(h2)
    assert "duplicate" in t2 and "idempotence-duplicate" not in t2


def test_lost_write() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.poll(1, {"k": [[0, 1], [2, 3]]})
    r = check(h)
    assert "lost-write" in r["anomaly_types"]
    ex = r["anomalies"]["lost-write"]["examples"][0]
    assert ex["value"] == 2 and ex["offset"] == 1 and ex["max_read_offset"] == 2
    assert r["valid"] is False


def test_info_send_nobody_read_is_not_lost_nor_unseen() -> None:
    h = H()
    h.send(0, "k", 1, 0)
    h.send(1, "k", 2, 1, typ="info")  # reports an offset but is never proven
    h.send(2, "k", 3, 2)
    h.poll(3, {"k": [[0, 1], [2, 3]]})
    t = types(h)
    assert "lost-write" not in t and "unseen" not in t


def test_proven_info_send_can_be_lost() -> None:
    h = H()
    h.txn(1, [["send", "k", [0, 1]], ["send", "j", [0, 9]]], typ="info")
    h.send(2, "k", 3, 1)
    h.poll(3, {"j": [[0, 9]]})  # proves the info txn committed
    h.poll(4, {"k": [[1, 3]]})
    assert "lost-write" in types(h)


def test_unseen() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1]]})
    r = check(h)
    assert r["anomalies"]["unseen"]["count"] == 1
    assert r["anomalies"]["unseen"]["examples"][0]["values"] == [2]
    h2 = H()
    h2.send(0, "k", 1, None, typ="info")
    h2.invoke(5, "send", [["send", "k", 2]])  # never completes: counts as info
    assert "unseen" not in types(h2)


def test_g1a_aborted_read() -> None:
    h = H()
    h.send(0, "k", 1, 0, typ="fail")
    h.poll(1, {"k": [[0, 1]]})
    r = check(h)
    assert "G1a" in r["anomaly_types"]
    h2 = H()
    h2.send(0, "k", 1, 0, typ="fail")
    h2.poll(1, {"k": [[0, 1]]}, typ="fail")  # a failed poll reading it is no G1a
    assert "G1a" not in types(h2)


def test_precommitted_read() -> None:
    h = H()
    h.txn(0, [["send", "k", [0, 1]], ["poll", {"k": [[0, 1]]}]])
    assert "precommitted-read" in types(h)
    h2 = H()
    h2.send(1, "k", 1, 0)
    h2.txn(0, [["send", "j", [0, 2]], ["poll", {"k": [[0, 1]]}]])
    h2.poll(2, {"j": [[0, 2]]})
    assert "precommitted-read" not in types(h2)


def test_poll_skip_and_assign_reset() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.poll(9, {"k": [[0, 1], [1, 2], [2, 3]]})
    h.poll(1, {"k": [[0, 1]]})
    h.poll(1, {"k": [[2, 3]]})
    r = check(h)
    assert "poll-skip" in r["anomaly_types"] and r["valid"] is False
    # in subscribe mode poll-skip is reported but allowed
    assert check(h, subscribe=True)["valid"] is True
    h2 = H()
    sent(h2, "k", [1, 2, 3])
    h2.poll(9, {"k": [[0, 1], [1, 2], [2, 3]]})
    h2.poll(1, {"k": [[0, 1]]})
    h2.assign(1, ["j"])
    h2.assign(1, ["k"])
    h2.poll(1, {"k": [[2, 3]]})
    assert "poll-skip" not in types(h2)


def test_failed_assign_keeps_tracking() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.poll(9, {"k": [[0, 1], [1, 2], [2, 3]]})
    h.poll(1, {"k": [[0, 1]]})
    h.assign(1, ["j"], typ="fail")
    h.poll(1, {"k": [[2, 3]]})
    assert "poll-skip" in types(h)


def test_nonmonotonic_poll_and_failed_polls() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1], [1, 2]]})
    h.poll(1, {"k": [[1, 2]]})
    assert "nonmonotonic-poll" in types(h)
    # a failed poll does not move the position, so re-reading after it is fine
    h2 = H()
    sent(h2, "k", [1, 2])
    h2.poll(1, {"k": [[0, 1]]})
    h2.poll(1, {"k": [[1, 2]]}, typ="fail")
    h2.poll(1, {"k": [[1, 2]]})
    assert "nonmonotonic-poll" not in types(h2)
    # ... but it is checked against the position
    h3 = H()
    sent(h3, "k", [1, 2])
    h3.poll(1, {"k": [[0, 1], [1, 2]]})
    h3.poll(1, {"k": [[0, 1]]}, typ="fail")
    assert "nonmonotonic-poll" in types(h3)


def test_failed_poll_reads_count_for_the_version_order() -> None:
    h = H()
    h.send(0, "k", 1, 0)
    h.send(0, "k", 2, None, typ="info")
    h.send(2, "k", 3, 2)
    h.poll(1, {"k": [[0, 1], [1, 2], [2, 3]]}, typ="fail")
    h.poll(3, {"k": [[0, 1], [2, 3]]})
    assert "int-poll-skip" in types(h)


def test_nonmonotonic_send() -> None:
    h = H()
    h.send(0, "k", 1, 1)
    h.send(0, "k", 2, 0)
    h.poll(1, {"k": [[0, 2], [1, 1]]})
    r = check(h)
    assert "nonmonotonic-send" in r["anomaly_types"]
    h2 = H()
    h2.send(0, "k", 1, 1)
    h2.assign(0, ["j"])
    h2.send(0, "k", 2, 0)
    h2.poll(1, {"k": [[0, 2], [1, 1]]})
    assert "nonmonotonic-send" not in types(h2)


def test_internal_poll_anomalies() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.poll(9, {"k": [[0, 1], [1, 2], [2, 3]]})
    h.poll(1, {"k": [[0, 1], [2, 3]]})
    h.poll(2, {"k": [[1, 2], [0, 1]]})
    t = types(h)
    assert {"int-poll-skip", "int-nonmonotonic-poll"} <= t
    h2 = H()
    sent(h2, "k", [1, 2])
    h2.txn(1, [["poll", {"k": [[0, 1]]}], ["poll", {"k": [[1, 2]]}]])
    t2 = types(h2)
    assert not {"int-poll-skip", "int-nonmonotonic-poll"} & t2


def test_internal_send_anomalies() -> None:
    h = H()
    h.invoke(1, "send", [["send", "k", 2]])  # concurrent with the txn
    h.txn(0, [["send", "k", [0, 1]], ["send", "k", [2, 3]]])
    h.complete(1, "ok", "send", [["send", "k", [1, 2]]])
    h.poll(2, {"k": [[0, 1], [1, 2], [2, 3]]})
    r = check(h)
    assert r["anomaly_types"] == ["G0", "int-send-skip"]  # the interleaving is a ww cycle too
    assert r["valid"] is True  # int-send-skip is allowed by default
    h2 = H()
    h2.txn(0, [["send", "k", [1, 1]], ["send", "k", [0, 2]]])
    h2.poll(2, {"k": [[0, 2], [1, 1]]})
    assert "int-nonmonotonic-send" in types(h2)


def test_g0_write_cycle_is_allowed() -> None:
    h = H()
    h.invoke(0, "txn", [["send", "x", 1], ["send", "y", 2]])
    h.invoke(1, "txn", [["send", "x", 3], ["send", "y", 4]])
    h.complete(0, "ok", "txn", [["send", "x", [0, 1]], ["send", "y", [1, 2]]])
    h.complete(1, "ok", "txn", [["send", "x", [1, 3]], ["send", "y", [0, 4]]])
    h.poll(2, {"x": [[0, 1], [1, 3]], "y": [[0, 4], [1, 2]]})
    r = check(h)
    assert "G0" in r["anomaly_types"] and r["valid"] is True
    ex = r["anomalies"]["G0"]["examples"][0]
    assert sorted(ex["cycle"]) == [2, 3]
    assert all(s["type"] == "ww" for s in ex["steps"])
    assert "G0" in check(h, ww_deps=True)["anomaly_types"]
    assert "G0" not in check(h, ww_deps=False)["anomaly_types"]


def test_g1c_circular_information_flow() -> None:
    h = H()
    h.invoke(0, "txn", [["send", "x", 1], ["poll"]])
    h.invoke(1, "txn", [["send", "y", 2], ["poll"]])
    h.complete(0, "ok", "txn", [["send", "x", [0, 1]], ["poll", {"y": [[0, 2]]}]])
    h.complete(1, "ok", "txn", [["send", "y", [0, 2]], ["poll", {"x": [[0, 1]]}]])
    r = check(h)
    assert "G1c" in r["anomaly_types"] and r["valid"] is False
    steps = r["anomalies"]["G1c"]["examples"][0]["steps"]
    assert {s["type"] for s in steps} == {"wr"}
    assert "which" in r["anomalies"]["G1c"]["examples"][0]["explanation"]


def test_g1c_ww_mixed_cycle() -> None:
    h = H()
    h.invoke(0, "txn", [["send", "x", 1], ["poll"]])
    h.invoke(1, "txn", [["send", "x", 3], ["send", "y", 2]])
    h.complete(1, "ok", "txn", [["send", "x", [1, 3]], ["send", "y", [0, 2]]])
    h.complete(0, "ok", "txn", [["send", "x", [0, 1]], ["poll", {"y": [[0, 2]]}]])
    h.poll(2, {"x": [[0, 1], [1, 3]]})
    r = check(h)
    assert "G1c-ww" in r["anomaly_types"]
    assert "G1c" not in r["anomaly_types"] and "G0" not in r["anomaly_types"]
    assert r["valid"] is True


def test_g1c_process_and_g0_realtime() -> None:
    h = H()
    # process 0 reads y=2 in its first op, then sends y=2 in its next op
    h.poll(0, {"y": [[0, 2]]})
    h.send(0, "y", 2, 0)
    r = check(h)
    assert "G1c-process" in r["anomaly_types"] and r["valid"] is False
    assert "G1c-realtime" not in r["anomaly_types"]  # same cycle, already explained
    h2 = H()
    h2.send(0, "x", 1, 1)
    h2.send(1, "x", 2, 0)  # invoked after the first completed, yet lands earlier
    h2.poll(2, {"x": [[0, 2], [1, 1]]})
    t2 = types(h2)
    assert {"G0-realtime", "realtime-send-order"} <= t2
    h3 = H()
    h3.invoke(0, "send", [["send", "x", 1]])
    h3.invoke(1, "send", [["send", "x", 2]])
    h3.complete(0, "ok", "send", [["send", "x", [1, 1]]])
    h3.complete(1, "ok", "send", [["send", "x", [0, 2]]])
    h3.poll(2, {"x": [[0, 2], [1, 1]]})
    assert not {"G0-realtime", "realtime-send-order"} & types(h3)


def test_hw_regression() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1]]}, watermarks={"k": {"low": 0, "high": 2}})
    h.poll(1, {"k": [[1, 2]]}, watermarks={"k": {"low": 0, "high": 1}})
    t = types(h)
    assert {"hw-regression", "hw-regression-realtime"} <= t
    # two concurrent sessions may observe different HWs
    h2 = H()
    sent(h2, "k", [1, 2])
    h2.invoke(1, "poll", [["poll"]])
    h2.invoke(2, "poll", [["poll"]])
    h2.complete(
        1,
        "ok",
        "poll",
        [["poll", {"k": [[0, 1], [1, 2]]}]],
        watermarks={"k": {"low": 0, "high": 2}},
    )
    h2.complete(
        2, "ok", "poll", [["poll", {"k": [[0, 1]]}]], watermarks={"k": {"low": 0, "high": 1}}
    )
    assert not {"hw-regression", "hw-regression-realtime"} & types(h2)
    # a later op of another process is a realtime regression but not a session one
    h3 = H()
    sent(h3, "k", [1, 2])
    h3.poll(1, {"k": [[0, 1], [1, 2]]}, watermarks={"k": {"low": 0, "high": 2}})
    h3.poll(2, {"k": [[0, 1]]}, watermarks={"k": {"low": 0, "high": 1}})
    t3 = types(h3)
    assert "hw-regression-realtime" in t3 and "hw-regression" not in t3


def test_committed_truncation_replaced() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1], [1, 2]]}, watermarks={"k": {"low": 0, "high": 2}})
    h.send(0, "k", 3, 1)
    h.poll(2, {"k": [[0, 1], [1, 3]]})
    r = check(h)
    assert "committed-truncation" in r["anomaly_types"]
    ex = r["anomalies"]["committed-truncation"]["examples"][0]
    assert ex["offset"] == 1 and ex["value"] == 2


def test_committed_truncation_vanished_and_exclusions() -> None:
    def run(high: int, low: int) -> set[str]:
        h = H()
        sent(h, "k", [1, 2, 3])
        h.poll(1, {"k": [[0, 1], [1, 2]]}, watermarks={"k": {"low": 0, "high": high}})
        h.poll(3, {"k": [[2, 3]]}, watermarks={"k": {"low": low, "high": 3}})
        h.poll(2, {"k": [[0, 1], [2, 3]]})
        return types(h)

    assert "committed-truncation" in run(high=2, low=0)
    assert "committed-truncation" not in run(high=1, low=0)  # offset 1 was not committed
    assert "committed-truncation" not in run(high=2, low=2)  # retention removed it


def test_realtime_send_order_negative_for_concurrent() -> None:
    h = H()
    h.send(0, "k", 1, 5)
    h.send(1, "k", 2, 3)
    assert "realtime-send-order" in types(h)


def test_garbage_read() -> None:
    h = H()
    h.send(0, "k", 1, 0)
    h.poll(1, {"k": [[0, 1], [1, 99]]})
    r = check(h)
    assert "garbage-read" in r["anomaly_types"]
    assert r["anomalies"]["garbage-read"]["examples"][0]["value"] == 99
    h2 = H()
    h2.invoke(0, "send", [["send", "k", 99]])  # never completed, but it was tried
    h2.poll(1, {"k": [[0, 99]]})
    assert "garbage-read" not in types(h2)


def test_eos_duplicate_and_missing() -> None:
    h = H()
    sent(h, "in", [1, 2, 3, 4])
    h.txn(1, [["poll", {"in": [[0, 1], [1, 2]]}], ["send", "out", [0, 1]], ["send", "out", [1, 2]]])
    h.txn(1, [["poll", {"in": [[2, 3]]}], ["send", "out", [2, 3]]])
    h.txn(2, [["poll", {"in": [[2, 3], [3, 4]]}], ["send", "out", [3, 3]], ["send", "out", [4, 4]]])
    h.poll(3, {"out": [[0, 1], [1, 2], [2, 3], [3, 3], [4, 4]]})
    eos = {"input": ["in"], "output": ["out"]}
    r = check(h, eos=eos)
    assert "eos-duplicate" in r["anomaly_types"] and "eos-missing" not in r["anomaly_types"]
    assert r["anomalies"]["eos-duplicate"]["examples"][0]["value"] == 3
    h2 = H()
    sent(h2, "in", [1, 2, 3])
    h2.txn(
        1,
        [
            ["poll", {"in": [[0, 1], [1, 2], [2, 3]]}],
            ["send", "out", [0, 1]],
            ["send", "out", [1, 3]],
        ],
    )
    h2.poll(3, {"out": [[0, 1], [1, 3]]})
    r2 = check(h2, eos=eos)
    assert "eos-missing" in r2["anomaly_types"] and "eos-duplicate" not in r2["anomaly_types"]
    assert r2["anomalies"]["eos-missing"]["examples"][0]["value"] == 2
    assert "eos-missing" not in check(h2)["anomaly_types"]  # only checked when asked


def test_allow_and_disallow_override_policy() -> None:
    h = H()
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1]]})
    assert check(h)["valid"] is False
    assert check(h, allow={"unseen"})["valid"] is True
    h2 = H()
    h2.txn(0, [["send", "k", [0, 1]], ["send", "k", [2, 3]]])
    h2.send(1, "k", 2, 1)
    h2.poll(2, {"k": [[0, 1], [1, 2], [2, 3]]})
    assert check(h2, disallow={"int-send-skip"})["valid"] is False


def test_every_example_has_an_explanation() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.send(5, "k", 9, 0, typ="fail")
    h.poll(1, {"k": [[0, 1], [2, 3], [7, 77]]}, watermarks={"k": {"low": 0, "high": 3}})
    h.poll(1, {"k": [[0, 9]]}, watermarks={"k": {"low": 0, "high": 2}})
    r = check(h)
    assert len(r["anomaly_types"]) >= 5
    for a in r["anomalies"].values():
        for ex in a["examples"]:
            assert isinstance(ex["explanation"], str) and len(ex["explanation"]) > 20


def test_committed_truncation_of_an_acked_send() -> None:
    h = H()
    h.send(0, "k", 1, 0)
    h.send(0, "k", 2, 1, watermarks={"k": {"low": 0, "high": 2}})  # acked and committed
    h.send(1, "k", 3, 1)  # after a bad failover, offset 1 is reused
    h.poll(2, {"k": [[0, 1], [1, 3]]})
    r = check(h)
    assert "committed-truncation" in r["anomaly_types"]
    ex = r["anomalies"]["committed-truncation"]["examples"][0]
    assert ex["value"] == 2 and ex["offset"] == 1 and ex["ops"][0] == 3
    # the same reuse while the ack still reported a high watermark at 1 is not committed
    h2 = H()
    h2.send(0, "k", 1, 0)
    h2.send(0, "k", 2, 1, watermarks={"k": {"low": 0, "high": 1}})
    h2.send(1, "k", 3, 1)
    h2.poll(2, {"k": [[0, 1], [1, 3]]})
    assert "committed-truncation" not in types(h2)


def test_subscribe_mode_is_inferred_from_the_history() -> None:
    h = H()
    sent(h, "k", [1, 2, 3])
    h.assign(1, ["k"], f="subscribe")
    h.poll(9, {"k": [[0, 1], [1, 2], [2, 3]]})
    h.poll(1, {"k": [[0, 1]]})
    h.poll(1, {"k": [[2, 3]]})
    r = check(h)
    assert "poll-skip" in r["anomaly_types"]
    assert r["valid"] is True and r["stats"]["subscribe_mode"] is True
    assert check(h, subscribe=False)["valid"] is False


def test_g0_through_a_duplicated_value_is_explained_by_the_copies() -> None:
    # Two concurrent info sends, each retried by the client: both values are stored twice,
    # interleaved (1 2 1 2), so each precedes the other at some pair of offsets.
    h = H()
    h.invoke(0, "send", [["send", "k", 1]])
    h.invoke(1, "send", [["send", "k", 2]])
    h.complete(0, "info", "send", [["send", "k", 1]])
    h.complete(1, "info", "send", [["send", "k", 2]])
    h.poll(2, {"k": [[0, 1], [1, 2], [2, 1], [3, 2]]})
    r = check(h)
    assert {"duplicate", "G0"} <= set(r["anomaly_types"])
    steps = r["anomalies"]["G0"]["examples"][0]["steps"]
    assert all(s["type"] == "ww" for s in steps)
    texts = " / ".join(s["explanation"] for s in steps)
    assert "completed before" not in texts
    assert "is at offsets [0, 2]" in texts or "is at offsets [1, 3]" in texts
