"""Stuck consumers (Bufstream's Jepsen analysis): a process whose polls keep coming back empty
while records past its position on a key it is assigned are readable (checkers/availability.py,
issue 15). Each case below is one way a detector could be wrong: it must find the starved
consumer, and must not call a caught-up consumer, a lost write, a revoked key or a write nobody
could read yet "stuck"."""

from __future__ import annotations

from typing import Any

from isrlab.checkers.availability import availability

NS = 1_000_000_000


class Hist:
    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def op(self, t: float, p: Any, f: str, value: Any, done: Any = None, **extra: Any) -> None:
        self.ops.append(
            {"time": int(t * NS), "process": p, "type": "invoke", "f": f, "value": value}
        )
        self.ops.append(
            {
                "time": int((t + 0.01) * NS),
                "process": p,
                "type": extra.pop("typ", "ok"),
                "f": f,
                "value": value if done is None else done,
                **extra,
            }
        )

    def send(self, t: float, p: Any, k: str, off: int | None, v: int) -> None:
        self.op(t, p, "send", [["send", k, v]], [["send", k, [off, v]]])

    def poll(self, t: float, p: Any, got: dict[str, list[list[int]]], **extra: Any) -> None:
        self.op(t, p, "poll", [["poll"]], [["poll", got]], **extra)

    def done(self) -> list[dict[str, Any]]:
        self.ops.sort(key=lambda o: o["time"])
        for i, o in enumerate(self.ops):
            o["index"] = i
        return self.ops


def writer_and_reader(h: Hist, until: float = 30.0) -> None:
    """Process 0 sends to k every second (offset = second); process 2, assigned k, reads each
    record a quarter second later."""
    h.op(0.0, 2, "assign", ["k"])
    for s in range(int(until)):
        h.send(s + 0.1, 0, "k", s, s)
        h.poll(s + 0.25, 2, {"k": [[s, s]]})


def test_a_consumer_polling_empty_while_others_read_is_stuck() -> None:
    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "assign", ["k"])
    h.poll(1.5, 1, {"k": [[0, 0], [1, 1]]})
    for i in range(20):  # from 3 s on, process 1's polls come back empty
        h.poll(3.0 + i, 1, {})
    [st] = availability(h.done(), stuck_s=10.0)["stuck_consumers"]
    assert st["process"] == 1 and st["empty_polls"] == 20
    assert st["from_s"] == 3.01 and st["to_s"] == 22.01
    assert st["behind"] == {"k": {"position": 2, "readable_up_to": 21}}  # by 22.01 s
    assert st["in_fault"] is False


def test_empty_polls_of_a_caught_up_consumer_are_not_stuck() -> None:
    h = Hist()
    writer_and_reader(h, until=3)
    h.op(0.0, 1, "assign", ["k"])
    h.poll(4.0, 1, {"k": [[0, 0], [1, 1], [2, 2]]})
    for i in range(20):
        h.poll(5.0 + i, 1, {})  # nothing more was ever written
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []


def test_an_acknowledged_write_nobody_ever_reads_is_not_a_stuck_consumer() -> None:
    """A lost write (acknowledged, never readable) is the safety checker's business."""
    h = Hist()
    h.op(0.0, 1, "assign", ["k"])
    h.send(1.0, 0, "k", 0, 0)
    for i in range(20):
        h.poll(2.0 + i, 1, {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []
    # ... but once a later poll reads past it, the record was there to be read
    h.poll(30.0, 2, {"k": [[0, 0], [1, 1]]})
    [st] = availability(h.done(), stuck_s=10.0)["stuck_consumers"]
    assert st["process"] == 1 and st["from_s"] == 2.01


def test_a_key_revoked_by_a_rebalance_or_reassigned_away_is_not_waited_for() -> None:
    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "subscribe", ["k"], rebalance={"generation": 1, "assigned": ["k"], "revoked": []})
    h.poll(2.0, 1, {}, rebalance={"generation": 2, "assigned": [], "revoked": ["k"]})
    for i in range(20):
        h.poll(3.0 + i, 1, {})
    h.op(0.0, 3, "assign", ["k"])
    h.op(1.0, 3, "assign", ["other"])
    for i in range(20):
        h.poll(3.0 + i, 3, {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []


def test_a_rebalance_starts_the_key_at_its_committed_offset() -> None:
    h = Hist()
    writer_and_reader(h)
    h.op(
        0.0,
        1,
        "subscribe",
        ["k"],
        rebalance={"generation": 1, "assigned": ["k"], "revoked": [], "committed": {"k": 25}},
    )
    for i in range(10):  # offsets 25.. are not readable before ~25 s: caught up until then
        h.poll(3.0 + 2 * i, 1, {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []


def test_polls_that_read_anything_are_progress_and_faults_are_flagged() -> None:
    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "assign", ["k", "j"])
    h.send(0.5, 0, "j", 0, 100)
    for i in range(20):  # every other poll reads k: behind on j only, but not stuck
        h.poll(1.0 + i, 1, {"k": [[i, i]]} if i % 2 else {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []
    h2 = Hist()
    writer_and_reader(h2)
    h2.op(0.0, 1, "assign", ["k"])
    h2.ops.append({"time": 2 * NS, "process": "nemesis", "type": "info", "f": "start-partition"})
    h2.ops.append({"time": 2 * NS, "process": "nemesis", "type": "info", "f": "start-partition"})
    for i in range(15):
        h2.poll(3.0 + i, 1, {})
    h2.ops.append({"time": 25 * NS, "process": "nemesis", "type": "info", "f": "stop-partition"})
    h2.ops.append({"time": 25 * NS, "process": "nemesis", "type": "info", "f": "stop-partition"})
    [st] = availability(h2.done(), stuck_s=10.0)["stuck_consumers"]
    assert st["in_fault"] is True


def test_an_assign_that_was_not_ok_silences_the_process_until_the_next() -> None:
    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "assign", ["k"], typ="fail")
    for i in range(20):
        h.poll(3.0 + i, 1, {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []


def test_the_report_and_results_json_show_stuck_consumers(tmp_path) -> None:
    import json

    from isrlab.checkers.history import write_history
    from isrlab.harness.runner import check_run

    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "assign", ["k"])
    for i in range(20):
        h.poll(3.0 + i, 1, {})
    test = {"name": "stuck", "workload": "queue", "acks": "all"}
    (tmp_path / "test.json").write_text(json.dumps(test))
    write_history(h.done(), tmp_path / "history.jsonl")
    results = check_run(tmp_path, test)
    assert results["availability"]["stuck_consumer_count"] == 1
    assert (
        json.loads((tmp_path / "results.json").read_text())["availability"]
        == results["availability"]
    )
    html = (tmp_path / "report.html").read_text()
    section = html[html.index("<h3>Stuck consumers</h3>") :]
    assert "<code>k</code> 0 → 21" in section.split("</table>")[0]


def test_a_failed_transaction_that_read_records_is_not_starvation() -> None:
    """An aborted transaction's polls read records (then the client seeks back): the consumer
    was fetching, so the stretch of empty polls ends there (seen in a no-verification run)."""
    h = Hist()
    writer_and_reader(h)
    h.op(0.0, 1, "assign", ["k"])
    for i in range(8):
        h.poll(3.0 + i, 1, {})
    h.op(11.5, 1, "txn", [["poll"]], [["poll", {"k": [[0, 0], [1, 1]]}]], typ="fail")
    for i in range(8):
        h.poll(12.0 + i, 1, {})
    assert availability(h.done(), stuck_s=10.0)["stuck_consumers"] == []
