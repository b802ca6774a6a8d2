"""The ``coordinator`` target (the broker coordinating the test's consumer group) for process
faults and partitions, without a cluster: the DB's answers are faked."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from isrlab import nemeses
from isrlab.nemeses.base import coordinator_node, resolve_targets
from isrlab.nemeses.partition import DEFAULT_SHAPES, PartitionFault, grudge
from isrlab.nemeses.process import KillFault, PauseFault
from tests.nemeses.conftest import RecordingDB


class GroupDB(RecordingDB):
    """RecordingDB with a consumer group whose coordinator it names (None: cannot tell)."""

    def __init__(self, coordinator: str | None = "n4", group: str | None = "g1") -> None:
        super().__init__()
        if group is not None:
            self.test["group"] = group
        self._coordinator = coordinator
        self.asked: list[str] = []

    def coordinator(self, group: str) -> str | None:
        self.asked.append(group)
        if self._coordinator == "error":
            raise RuntimeError("no broker answered FindCoordinator")
        return self._coordinator

    def kill(self, node: str) -> bool:
        self.calls.append(("kill", node))
        return True


def test_the_coordinator_target_is_the_groups_coordinator() -> None:
    db: Any = GroupDB()
    rng = random.Random(1)
    assert resolve_targets("coordinator", db, rng) == ["n4"]
    assert db.asked == ["g1"]
    # no answer (the coordinator is down, or no group): still one node, never none
    for unknown in (GroupDB(coordinator=None), GroupDB(coordinator="error"), GroupDB(group=None)):
        assert coordinator_node(unknown) is None  # type: ignore[arg-type]
        assert len(resolve_targets("coordinator", unknown, rng)) == 1  # type: ignore[arg-type]
    assert GroupDB(group=None).asked == []


def test_kill_and_pause_hit_the_coordinator() -> None:
    db: Any = GroupDB(coordinator="n2")
    kill = KillFault(db, random.Random(0))
    assert kill.start({"target": "coordinator"}) == {"target": "coordinator", "nodes": ["n2"]}
    pause = PauseFault(db, random.Random(0))
    assert pause.start({"target": "coordinator"}) == {"target": "coordinator", "nodes": ["n2"]}
    assert db.calls == [("kill", "n2"), ("pause", "n2")]


@dataclass
class _Result:
    ok: bool = True
    stdout: str = ""
    stderr: str = ""

    def check(self) -> _Result:
        return self


@dataclass
class _Node:
    name: str
    host: str


class _Shell:
    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.node = _Node(name, f"10.0.0.{name[1:]}")
        self._log = log

    def exec(self, cmd: str, *, check: bool = True) -> _Result:
        self._log.append((self.node.name, cmd))
        return _Result()


def test_isolate_coordinator_cuts_the_coordinator_off() -> None:
    g = grudge("isolate-coordinator", [f"n{i}" for i in range(1, 6)], random.Random(1), "n4")
    assert g["n4"] == ["n1", "n2", "n3", "n5"] and g["n1"] == ["n4"]
    db: Any = GroupDB(coordinator="n5")
    log: list[tuple[str, str]] = []
    db.remote = lambda name: _Shell(name, log)
    fault = PartitionFault(db, random.Random(0))
    done = fault.start({"shape": "isolate-coordinator"})
    assert done["n5"] == ["n1", "n2", "n3", "n4"]
    assert all(done[n] == ["n5"] for n in ("n1", "n2", "n3", "n4"))
    routes = [cmd for node, cmd in log if node == "n5" and "ip route replace" in cmd]
    assert routes and all("10.0.0.5" not in cmd for cmd in routes)


def _starts(targets: list[str] | None, kinds: list[str]) -> list[dict[str, Any]]:
    ops = itertools.islice(nemeses.schedule(kinds, 1, 3, targets=targets, keys=["t0/0"]), 2000)
    return [op for op in ops if op.get("f", "").startswith("start-")]


def test_schedules_aim_at_the_coordinator_only_when_asked() -> None:
    # by default (no group): neither the target nor the shape is drawn
    default = _starts(None, ["kill", "partition"])
    assert "coordinator" not in {op["value"].get("target") for op in default}
    shapes = {op["value"].get("shape") for op in default if op["f"] == "start-partition"}
    assert shapes == set(DEFAULT_SHAPES)
    # with the coordinator among the targets, partitions also isolate it
    mixed = _starts([*nemeses.DEFAULT_TARGETS, "coordinator"], ["kill", "partition"])
    assert "coordinator" in {op["value"].get("target") for op in mixed if op["f"] == "start-kill"}
    shapes = {op["value"].get("shape") for op in mixed if op["f"] == "start-partition"}
    assert shapes == {*DEFAULT_SHAPES, "isolate-coordinator"}
    # every fault at the coordinator: only it is cut off, killed or paused
    only = _starts(["coordinator"], ["kill", "pause", "partition"])
    assert {op["value"].get("target") for op in only if op["f"] != "start-partition"} == {
        "coordinator"
    }
    assert {op["value"]["shape"] for op in only if op["f"] == "start-partition"} == {
        "isolate-coordinator"
    }
