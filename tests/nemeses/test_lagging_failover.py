"""The lagging-failover fault's sequence, against a recording DB (no cluster): followers paused
(or, ``how: cut``, their broker connections to the leader's node dropped) before the lag, the
leader killed after it, the followers let go whatever happens; and the schedule's values for
it. The sequence on real brokers is exercised by `isrlab test --nemesis
lagging-failover` runs (docs/transactions.md)."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest

from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.compose import KINDS, build, heal_all, schedule
from isrlab.nemeses.process import LAG_CHAIN, LaggingFailoverFault, _cut_command
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


def test_heal_starts_the_leader_it_killed_and_only_that() -> None:
    db = lagging_db()
    f, _ = fault(db)
    f.start({"key": "t0/0", "lag_ms": 1})
    healed = f.heal()
    assert "n2" in healed
    assert ("start", "n2") in db.calls and not db.down
    # the followers were resumed by the start itself; nobody else is touched
    assert {n for op, n in db.calls if op == "resume"} == {"n3", "n4"}


def test_a_fresh_fault_heals_no_broker_it_did_not_stop() -> None:
    """heal_all heals from a fresh fault of every kind, before the kill and pause faults'
    own heals: restarting a crashed broker here would hide it from the kill heal's report."""
    db = lagging_db()
    db.kill("n5")
    db.calls.clear()
    f, _ = fault(db)
    f.heal()
    assert not [c for c in db.calls if c[0] in ("start", "resume")]


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


# -- how: cut (the followers' broker connections to the leader dropped on its node only) --


class CutShell:
    """A node's shell for the cut tests: iptables commands of our chain change the fake
    node's rules and jumps (in the command's order); nothing runs on this machine."""

    def __init__(self, db: CuttingDB, name: str) -> None:
        self.db = db
        self.node = SimpleNamespace(name=name, host="10.0.0." + name.removeprefix("n"))

    def exec(self, cmd: str, *, check: bool = True) -> Any:
        name = self.node.name
        self.db.calls.append(("exec", name))
        if cmd.startswith("getent ahostsv4 "):
            host = cmd.split()[2]
            return SimpleNamespace(ok=True, stdout=f"{host} STREAM {host}\n", stderr="")
        if f"-X {LAG_CHAIN}" in cmd:  # the uncut
            had = self.db.chains.pop(name, None) is not None
            self.db.jumps.pop(name, None)
            if had:
                self.db.calls.append(("uncut", name))
            return SimpleNamespace(ok=True, stdout="removed\n" if had else "", stderr="")
        for part in cmd.split("; "):
            if part.startswith(f"iptables -w -N {LAG_CHAIN}"):
                self.db.chains.setdefault(name, [])
            for hook in ("INPUT", "OUTPUT"):
                if part.endswith(f"iptables -w -I {hook} -j {LAG_CHAIN}"):
                    self.db.jumps.setdefault(name, set()).add(hook)
            if part.startswith(f"iptables -w -A {LAG_CHAIN} "):
                rule = part.removeprefix(f"iptables -w -A {LAG_CHAIN} ")
                self.db.chains[name].append(rule)
                self.db.calls.append(("rule+", f"{name}: {rule}"))
        return SimpleNamespace(ok=True, stdout="", stderr="")


class CuttingDB(RecordingDB):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chains: dict[str, list[str]] = {}  # node -> the rules of our chain
        self.jumps: dict[str, set[str]] = {}  # node -> the hooks jumping to it

    def remote(self, name: str) -> CutShell:  # type: ignore[override]
        return CutShell(self, name)

    # (what heal_all's fresh clock fault asks; its commands are not run)
    def clock_via_file(self, node: str) -> bool:
        return True

    def clock_offset_file(self, node: str) -> str:
        return f"/nonexistent/{node}/clock-offset"


def cutting_db() -> CuttingDB:
    return CuttingDB(leader="n2", followers=("n3", "n4"), keys=("t0/0", "t1/0"))


def cut_fault(db: CuttingDB) -> tuple[LaggingFailoverFault, list[tuple[str, Any]]]:
    """The fault, and what the leader's node held at each sleep (its rules and jumps)."""
    seen: list[tuple[str, Any]] = []

    def sleep(s: float) -> None:
        db.calls.append(("sleep", str(s)))
        seen.append((str(s), (list(db.chains.get("n2", [])), set(db.jumps.get("n2", set())))))

    return LaggingFailoverFault(db, random.Random(0), sleep=sleep), seen  # type: ignore[arg-type]


def test_cut_drops_the_followers_traffic_to_the_leader_then_kills_it_then_removes_the_cut() -> None:
    db = cutting_db()
    f, seen = cut_fault(db)
    done = f.start({"key": "t1/0", "lag_ms": 2000, "how": "cut"})
    assert done == {
        "key": "t1/0",
        "lag_ms": 2000,
        "how": "cut",
        "leader": "n2",
        "followers": ["n3", "n4"],
        "cut": ["10.0.0.3", "10.0.0.4"],
    }
    rules = [
        "-p tcp -s 10.0.0.3 --dport 9092 -j DROP",  # the follower's fetches do not arrive
        "-p tcp -d 10.0.0.3 --sport 9092 -j DROP",  # nor a parked fetch's answer
        "-p tcp -s 10.0.0.4 --dport 9092 -j DROP",
        "-p tcp -d 10.0.0.4 --sport 9092 -j DROP",
    ]
    # during the lag the chain is on the leader's node, jumped to from INPUT and OUTPUT
    assert seen == [("2.0", (rules, {"INPUT", "OUTPUT"}))]
    order = [c for c in db.calls if c[0] in ("rule+", "sleep", "kill", "uncut")]
    assert order == [
        *[("rule+", f"n2: {r}") for r in rules],  # 1. cut
        ("sleep", "2.0"),  # 2. the lag
        ("kill", "n2"),  # 3. the leader dies
        ("uncut", "n2"),  # 4. then the followers reach its node again
    ]
    # the followers keep running, only the leader's node is touched, nothing is left
    assert not any(op in ("pause", "resume") for op, _ in db.calls)
    assert {n for op, n in db.calls if op == "exec"} == {"n2"}
    assert not db.chains and not db.jumps
    assert f.stop() == {"nodes": ["n2"]} and db.calls[-1] == ("start", "n2")


def test_the_cut_is_removed_even_when_the_kill_fails() -> None:
    db = cutting_db()
    db.kill_fails = True
    f, _ = cut_fault(db)
    with pytest.raises(RuntimeError):
        f.start({"key": "t0/0", "lag_ms": 10, "how": "cut"})
    assert not db.chains and ("uncut", "n2") in db.calls
    assert f.stop() == {"nodes": []}


def test_heal_removes_a_chain_left_behind_on_any_node() -> None:
    db = cutting_db()
    db.remote("n4").exec(_cut_command(["10.0.0.1"]))  # a harness that died mid-lag
    assert db.chains == {
        "n4": ["-p tcp -s 10.0.0.1 --dport 9092 -j DROP", "-p tcp -d 10.0.0.1 --sport 9092 -j DROP"]
    }
    f, _ = cut_fault(db)
    assert "n4" in f.heal() and not db.chains and not db.jumps
    # and heal_all, from fresh faults (a harness that lost its nemesis), finds it too
    db.remote("n1").exec(_cut_command(["10.0.0.5"]))
    healed = heal_all(db)  # type: ignore[arg-type]
    assert "n1" in healed["lagging-failover"] and not db.chains


def test_an_unknown_way_does_nothing() -> None:
    db = cutting_db()
    f, seen = cut_fault(db)
    done = f.start({"key": "t0/0", "how": "melt"})
    assert "unknown how" in done["error"] and not seen and db.calls == []


def test_schedules_draw_the_ways_asked_for_and_none_unless_told() -> None:
    def values(lagging_how: list[str] | None) -> list[dict[str, Any]]:
        stream = schedule(
            "lagging-failover", 1.0, seed=3, keys=["t0/0", "t1/0"], lagging_how=lagging_how
        )
        ops = itertools.islice((o for o in stream if o.get("f") == "start-lagging-failover"), 40)
        return [o["value"] for o in ops]

    # unset: no draw, so a seed gives the schedule it gave before the option existed (the
    # draws of seed 3 before it did)
    assert values(None)[:5] == [
        {"lag_ms": 1000, "key": "t0/0"},
        {"lag_ms": 1000, "key": "t1/0"},
        {"lag_ms": 1000, "key": "t0/0"},
        {"lag_ms": 3000, "key": "t0/0"},
        {"lag_ms": 1000, "key": "t0/0"},
    ]
    assert all("how" not in v for v in values(None))
    assert {v["how"] for v in values(["cut"])} == {"cut"}
    assert {v["how"] for v in values(["pause", "cut"])} == {"pause", "cut"}
    with pytest.raises(NemesisError, match="unknown lagging-failover way"):
        next(schedule("lagging-failover", 1.0, seed=3, lagging_how=["melt"]))


def test_the_lagging_how_option_reaches_the_schedule() -> None:
    from tests.harness.test_runner_unit import drawn

    # unset: the value names none, the followers are paused
    assert drawn("lagging-failover", "how") == {"None"}
    assert drawn("lagging-failover", "how", lagging_how="cut") == {"cut"}
