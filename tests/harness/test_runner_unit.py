"""The runner's pure parts: test configuration and the merged nemesis schedule."""

from __future__ import annotations

import pytest

from isrlab.harness.generator import Context, Pending
from isrlab.harness.runner import ScheduleGenerator, SetupError, make_test


def drive(gen: ScheduleGenerator, n_ops: int) -> list[tuple[int, str]]:
    now, out = 0, []
    while len(out) < n_ops:
        r = gen.op(Context(time=now, thread="nemesis", process="nemesis", threads=[]))
        if isinstance(r, Pending):
            assert r.at is not None and r.at > now
            now = r.at
            continue
        assert r is not None
        out.append((now, r["f"]))
    return out


def test_each_kind_alternates_and_kinds_overlap():
    test = make_test({"nemesis": "partition+kill", "nemesis_interval": 10, "seed": 3})
    ops = drive(ScheduleGenerator.for_test(test), 40)
    times = [t for t, _ in ops]
    assert times == sorted(times)
    for kind in ("partition", "kill"):
        fs = [f for _, f in ops if f.endswith(kind)]
        assert fs[:4] == [f"start-{kind}", f"stop-{kind}"] * 2  # strict alternation per kind
    active: set[str] = set()
    overlapped = False
    for _, f in ops:
        verb, kind = f.split("-", 1)
        if verb == "start":
            active.add(kind)
            overlapped |= len(active) > 1
        else:
            active.discard(kind)
    assert overlapped, "faults of different kinds must be able to overlap"


def test_schedule_is_deterministic_for_a_seed():
    a = make_test({"nemesis": "partition+kill+pause", "nemesis_interval": 5, "seed": 11})
    b = make_test({"nemesis": "partition+kill+pause", "nemesis_interval": 5, "seed": 11})
    assert drive(ScheduleGenerator.for_test(a), 30) == drive(ScheduleGenerator.for_test(b), 30)


def test_make_test_validates_and_fills_defaults():
    t = make_test({"acks": "-1", "txn": True, "nemesis": "none"})
    assert t.acks == "all" and t.idempotence is True and t.nemesis == ()
    assert isinstance(t.seed, int) and t.keys == tuple(f"t{i}/0" for i in range(8))
    with pytest.raises(SetupError, match="acks"):
        make_test({"acks": "2"})
    with pytest.raises(SetupError, match="time-limit"):
        make_test({"time_limit": 0})


def test_a_run_that_acknowledged_and_read_nothing_is_called_out():
    from isrlab.checkers.queue import check_queue
    from isrlab.harness.runner import idle_warning
    from tests.checkers.hist import H

    dead = H()
    dead.invoke(0, "send", [["send", "t0/0", 1]])
    dead.complete(0, "info", "send", [["send", "t0/0", 1]], error="timeout")
    dead.poll(1, {})
    assert "nothing about the system" in (idle_warning(check_queue(dead.ops)) or "")
    alive = H()
    alive.send(0, "t0/0", 1, 0)
    assert idle_warning(check_queue(alive.ops)) is None
    acks0 = H()  # acks=0: no offsets, but records were read back
    acks0.invoke(0, "send", [["send", "t0/0", 1]])
    acks0.complete(0, "ok", "send", [["send", "t0/0", [None, 1]]])
    acks0.poll(1, {"t0/0": [[0, 1]]})
    assert idle_warning(check_queue(acks0.ops)) is None


def _targets(test) -> set[str]:
    ops = []
    gen = ScheduleGenerator.for_test(test)
    now = 0
    while len(ops) < 60:
        r = gen.op(Context(time=now, thread="nemesis", process="nemesis", threads=[]))
        if isinstance(r, Pending):
            now = r.at or now + 1
            continue
        ops.append(r)
    return {
        str((op.get("value") or {}).get("target") or (op.get("value") or {}).get("shape"))
        for op in ops
        if op["f"].startswith("start-")
    }


def test_a_test_with_a_group_also_aims_faults_at_its_coordinator():
    plain = make_test({"nemesis": "kill+partition", "nemesis_interval": 5, "seed": 4})
    assert not {"coordinator", "isolate-coordinator"} & _targets(plain)
    sub = make_test(
        {"nemesis": "kill+partition", "nemesis_interval": 5, "seed": 4, "subscribe": True}
    )
    assert {"coordinator", "isolate-coordinator"} <= _targets(sub)
    # targets given: exactly those
    only = make_test(
        {"nemesis": "kill", "nemesis_interval": 5, "subscribe": True, "nemesis_targets": "one"}
    )
    assert _targets(only) == {"one"}


def test_a_run_that_checked_nothing_exits_unknown_not_valid():
    from isrlab.checkers.queue import check_queue
    from isrlab.harness.runner import exit_code
    from tests.checkers.hist import H

    dead = H()  # an ok poll that read nothing, a send that timed out: valid, but idle
    dead.invoke(0, "send", [["send", "t0/0", 1]])
    dead.complete(0, "info", "send", [["send", "t0/0", 1]], error="timeout")
    dead.poll(1, {})
    assert check_queue(dead.ops)["valid"] is True and exit_code(check_queue(dead.ops)) == 2
    empty = check_queue([])  # nothing-checked: "unknown" from the checker itself
    assert empty["valid"] == "unknown" and exit_code(empty) == 2
    alive = H()
    alive.send(0, "t0/0", 1, 0)
    alive.poll(1, {"t0/0": [[0, 1]]})
    assert exit_code(check_queue(alive.ops)) == 0


def test_an_idle_run_is_recorded_unknown_in_results_and_report(tmp_path) -> None:
    """`isrlab test` on a cluster that acknowledged and served nothing: the history's checker
    calls an ok empty poll something checked (the spec's rule), but the run as a whole checked
    nothing, so results.json, the report and the exit code say "unknown", never valid."""
    import json

    from isrlab.checkers.history import write_history
    from isrlab.harness.runner import check_run, exit_code
    from tests.checkers.hist import H

    dead = H()
    dead.invoke(0, "send", [["send", "t0/0", 1]])
    dead.complete(0, "info", "send", [["send", "t0/0", 1]], error="timeout")
    dead.poll(1, {"t0/0": []})
    test = {"name": "idle", "workload": "queue", "acks": "all"}
    (tmp_path / "test.json").write_text(json.dumps(test))
    write_history(dead.ops, tmp_path / "history.jsonl")
    check_run(tmp_path, test)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["valid"] == "unknown" and exit_code(results) == 2
    assert "none was read" in results["stats"]["nothing-checked"]
    assert "UNKNOWN: nothing checked" in (tmp_path / "report.html").read_text()

    alive = H()
    alive.send(0, "t0/0", 1, 0)
    alive.poll(1, {"t0/0": [[0, 1]]})
    write_history(alive.ops, tmp_path / "history.jsonl")
    assert check_run(tmp_path, test)["valid"] is True
    assert "VALID</div>" in (tmp_path / "report.html").read_text()


def test_topic_creation_retries_while_a_broker_has_not_seen_every_registration() -> None:
    """A broker just started may answer CreateTopics from a partial view of /brokers/ids
    (INVALID_REPLICATION_FACTOR "... larger than 2 available broker(s)") while the harness has
    seen all five registered: that is retried until the deadline, not a setup failure."""
    from isrlab.harness.db import _retriable

    assert _retriable(
        'KafkaException: KafkaError{code=INVALID_REPLICATION_FACTOR,val=38,str="replication '
        'factor 3 larger than 2 available broker(s)"}'
    )
    assert not _retriable("KafkaException: KafkaError{code=POLICY_VIOLATION,val=44}")


def drawn(kind: str, field: str, **extra: object) -> set[str]:
    """The ``field`` of the first ten ``start-<kind>`` values the runner's schedule draws for
    a test with ``extra`` options ("None" where the value names none)."""
    test = make_test({"nemesis": kind, "nemesis_interval": 5, "seed": 4, **extra})
    gen, now, out = ScheduleGenerator.for_test(test), 0, []
    while len(out) < 10:
        r = gen.op(Context(time=now, thread="nemesis", process="nemesis", threads=[]))
        if isinstance(r, Pending):
            now = r.at or now + 1
            continue
        if r["f"] == f"start-{kind}":
            out.append(str(r["value"].get(field)))
    return set(out)


def test_the_leader_flap_follower_option_reaches_the_schedule():
    # unset: the value names none, leader-flap restarts one
    assert drawn("leader-flap", "follower") == {"None"}
    assert drawn("leader-flap", "follower", flap_follower="cut") == {"cut"}


def test_a_progress_line_shows_the_rate_since_the_line_before() -> None:
    """The demo's log showed '0 ops/s' for 10 s in which 5,600 ops completed: the last second's
    rate, at a moment a kill had stalled the clients. A line gives the rate since the last."""
    from isrlab.harness.runner import progress_line

    first = {"elapsed_s": 10.5, "ok": 17338, "fail": 0, "info": 0, "ops_per_s": 1971}
    second = {
        "elapsed_s": 20.5,
        "ok": 19792,
        "fail": 4,
        "info": 2,
        "ops_per_s": 0,
        "active_faults": ["partition", "kill"],
    }
    assert progress_line(first, {}).split()[:3] == ["10.5s", "1651", "ops/s"]
    line = progress_line(second, first)
    assert line.split()[:3] == ["20.5s", "246", "ops/s"]  # (19798 - 17338) / 10 s
    assert line.endswith("ok 19792 fail 4 info 2  faults: kill, partition")
    assert progress_line(first, first).split()[1] == "0"  # no time between: no rate
