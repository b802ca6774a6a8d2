"""The power fault's order of operations (a fake cluster), and its place in the composer."""

from __future__ import annotations

import itertools
import random
from typing import Any

from isrlab.nemeses.compose import KINDS, build, schedule
from isrlab.nemeses.power import PowerFault


class FakeDB:
    def __init__(self) -> None:
        self.test: dict[str, Any] = {}
        self.events: list[tuple[str, str]] = []
        self.down: set[str] = set()
        self.zk_down: set[str] = set()

    @property
    def names(self) -> list[str]:
        return ["n1", "n2", "n3"]

    def kill(self, node: str) -> bool:
        self.events.append(("kill", node))
        was_up = node not in self.down
        self.down.add(node)
        return was_up

    def start(self, node: str) -> int:
        self.events.append(("start", node))
        self.down.discard(node)
        return 1

    def broker_state(self, node: str) -> str:
        return "down" if node in self.down else "running"

    def power_loss(self, node: str) -> str:
        assert node in self.down, "a power loss is applied to a dead broker only"
        self.events.append(("power_loss", node))
        return f"{node}: 1 file(s) cut back (10 bytes), 0 emptied, 0 deleted"

    def zookeeper_nodes(self) -> list[str]:
        return ["n1", "n2"]

    def kill_zookeeper(self, node: str) -> bool:
        self.events.append(("kill_zookeeper", node))
        self.zk_down.add(node)
        return True

    def start_zookeeper_on(self, node: str) -> int:
        self.events.append(("start_zookeeper", node))
        self.zk_down.discard(node)
        return 1


def test_kill_then_cut_back_then_restart_on_stop() -> None:
    db = FakeDB()
    fault = PowerFault(db, random.Random(1))  # type: ignore[arg-type]
    done = fault.start({"target": "all"})
    assert done["nodes"] == ["n1", "n2", "n3"]
    assert sorted(done["power_loss"]) == ["n1", "n2", "n3"]
    for node in db.names:
        assert db.events.index(("kill", node)) < db.events.index(("power_loss", node))
    assert db.down == {"n1", "n2", "n3"}
    assert fault.stop() == {"nodes": ["n1", "n2", "n3"]}
    assert db.down == set()


def test_a_broker_already_dead_loses_its_power_too() -> None:
    db = FakeDB()
    db.down.add("n2")  # killed by another fault: its page cache dies with the node
    fault = PowerFault(db, random.Random(1))  # type: ignore[arg-type]
    done = fault.start({"target": "all"})
    assert "n2" in done["power_loss"] and "n2" not in done["nodes"]
    assert fault.heal() == ["n1", "n2", "n3"]


def test_a_failed_cut_is_reported() -> None:
    db = FakeDB()

    def broken(node: str) -> str:
        raise RuntimeError("no journal")

    db.power_loss = broken  # type: ignore[method-assign]
    done = PowerFault(db, random.Random(1)).start({"target": "one"})  # type: ignore[arg-type]
    assert "no journal" in done["error"] and done["power_loss"] == {}


def test_zookeeper_power_loss_kills_only_ensemble_members_and_restarts_them() -> None:
    db = FakeDB()
    fault = PowerFault(db, random.Random(1), zookeeper=True)  # type: ignore[arg-type]
    assert fault.kind == "power-zookeeper"
    done = fault.start({"target": "all"})
    assert done == {"target": "all", "zookeeper": ["n1", "n2"]}
    assert not db.down and not any(e[0] == "power_loss" for e in db.events)
    assert fault.stop()["zookeeper"] == ["n1", "n2"]
    assert db.zk_down == set()


def test_power_is_a_nemesis_kind_with_targets() -> None:
    assert "power" in KINDS and "power-zookeeper" in KINDS
    nemesis = build("power", FakeDB(), {"seed": 3})  # type: ignore[arg-type]
    ops = list(
        itertools.islice(
            (op for op in schedule("power", 1.0, 3, targets=["all"]) if op.get("f")), 2
        )
    )
    assert [op["f"] for op in ops] == ["start-power", "stop-power"]
    assert ops[0]["value"] == {"target": "all"}
    done = nemesis.invoke(ops[0])
    assert done["value"]["nodes"] == ["n1", "n2", "n3"]
