"""The lagging-failover fault's sequence, against a recording DB (no cluster): followers paused
before the lag, the leader killed after it, the followers resumed whatever happens; and the
schedule's values for it. The sequence on real brokers is exercised by `isrlab test --nemesis
lagging-failover` runs (docs/transactions.md)."""

from __future__ import annotations

import random

import pytest

from isrlab.nemeses.compose import KINDS, build, schedule
from isrlab.nemeses.process import LaggingFailoverFault
from tests.nemeses.conftest import RecordingDB


def lagging_db(leader: str | None = "n2", followers: tuple[str, ...] = ("n3", "n4")) -> RecordingDB:
    return RecordingDB(leader=leader, followers=followers, keys=("t0/0", "t1/0"))


def fault(db: RecordingDB) -> tuple[LaggingFailoverFault, list[float]]:
    slept: list[float] = []

    def sleep(s: float) -> None:
        db.calls.append(("sleep", str(s)))
        slept.append(s)

    return LaggingFailoverFault(db, random.Random(0), sleep=sleep), slept  # type: ignore[arg-type]


def test_followers_lag_then_the_leader_dies_then_the_followers_come_back() -> None:
    db = lagging_db()
    f, slept = fault(db)
    done = f.start({"key": "t1/0", "lag_ms": 1500})
    assert done == {"key": "t1/0", "lag_ms": 1500, "leader": "n2", "followers": ["n3", "n4"]}
    assert slept == [1.5]
    order = [c for c in db.calls if c[0] != "replicas_of"]
    assert order[:2] == [("pause", "n3"), ("pause", "n4")] or order[:2] == [
        ("pause", "n4"),
        ("pause", "n3"),
    ]
    assert order[2:4] == [("sleep", "1.5"), ("kill", "n2")]
    assert sorted(order[4:]) == [("resume", "n3"), ("resume", "n4")]
    assert f.stop() == {"nodes": ["n2"]} and db.calls[-1] == ("start", "n2")
    assert f.stop() == {"nodes": []}


def test_the_followers_are_resumed_even_when_the_kill_fails() -> None:
    db = lagging_db()
    db.kill_fails = True
    f, _ = fault(db)
    with pytest.raises(RuntimeError):
        f.start({"key": "t0/0", "lag_ms": 10})
    assert sorted(c for c in db.calls if c[0] == "resume") == [("resume", "n3"), ("resume", "n4")]


@pytest.mark.parametrize(("leader", "followers"), [(None, ()), ("n2", ())])
def test_a_key_without_a_leader_or_in_sync_followers_is_left_alone(
    leader: str | None, followers: tuple[str, ...]
) -> None:
    db = lagging_db(leader, followers)
    f, slept = fault(db)
    done = f.start({"key": "t0/0"})
    assert "error" in done and not slept
    assert [c[0] for c in db.calls] == ["replicas_of"]


def test_heal_resumes_everyone_and_starts_the_dead() -> None:
    db = lagging_db()
    f, _ = fault(db)
    f.start({"key": "t0/0", "lag_ms": 1})
    healed = f.heal()
    assert "n2" in healed
    assert ("start", "n2") in db.calls and not db.down
    assert {n for op, n in db.calls if op == "resume"} == set(db.names)


def test_the_schedule_draws_a_key_and_a_lag() -> None:
    assert "lagging-failover" in KINDS
    ops = schedule("lagging-failover", 5.0, seed=3, keys=["t0/0", "t1/0"])
    starts = []
    for op in ops:
        if op.get("f") == "start-lagging-failover":
            starts.append(op["value"])
            if len(starts) == 20:
                break
    assert {s["key"] for s in starts} == {"t0/0", "t1/0"}
    assert {s["lag_ms"] for s in starts} <= {1000, 2000, 3000}
    assert set(starts[0]) == {"key", "lag_ms"}


def test_build_gives_the_fault() -> None:
    nem = build("lagging-failover", lagging_db(), {"seed": 1})  # type: ignore[arg-type]
    assert isinstance(nem.faults["lagging-failover"], LaggingFailoverFault)
