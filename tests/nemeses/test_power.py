"""The power fault's order of operations (a fake cluster), and its place in the composer."""

from __future__ import annotations

import itertools
import random
from typing import Any

from isrlab.harness.db import KafkaDB
from isrlab.nemeses.compose import KINDS, build, schedule
from isrlab.nemeses.power import PowerFault, node_torn_seed


class FakeDB:
    def __init__(self) -> None:
        self.test: dict[str, Any] = {}
        self.events: list[tuple[str, str]] = []
        self.down: set[str] = set()
        self.zk_down: set[str] = set()
        self.torn_seeds: dict[str, int | None] = {}

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

    def power_loss(self, node: str, torn_seed: int | None = None) -> str:
        assert node in self.down, "a power loss is applied to a dead broker only"
        self.events.append(("power_loss", node))
        self.torn_seeds[node] = torn_seed
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


def test_power_torn_tears_each_node_with_its_own_seed_from_the_start_value() -> None:
    db = FakeDB()
    fault = PowerFault(db, random.Random(1), torn=True)  # type: ignore[arg-type]
    assert fault.kind == "power-torn"
    done = fault.start({"target": "all", "torn_seed": 42})
    assert done["torn_seed"] == 42
    assert db.torn_seeds == {n: node_torn_seed(42, n) for n in db.names}
    assert len(set(db.torn_seeds.values())) == 3, "nodes tear differently"
    assert fault.stop() == {"nodes": ["n1", "n2", "n3"]}
    plain = FakeDB()
    PowerFault(plain, random.Random(1)).start({"target": "all", "torn_seed": 42})  # type: ignore[arg-type]
    assert plain.torn_seeds == {"n1": None, "n2": None, "n3": None}, "power does not tear"


def test_power_torn_is_a_kind_whose_schedule_draws_a_seed() -> None:
    assert "power-torn" in KINDS

    def first_ops(n: int) -> list[dict[str, Any]]:
        ops = (op for op in schedule("power-torn", 1.0, 3, targets=["all"]) if op.get("f"))
        return list(itertools.islice(ops, n))

    ops = first_ops(6)
    starts = [op for op in ops if op["f"] == "start-power-torn"]
    assert len(starts) == 3 and all(isinstance(op["value"]["torn_seed"], int) for op in starts)
    assert len({op["value"]["torn_seed"] for op in starts}) == 3
    assert first_ops(6) == ops, "the run's seed decides the tears"
    db = FakeDB()
    done = build("power-torn", db, {"seed": 3}).invoke(starts[0])  # type: ignore[arg-type]
    assert done["value"]["torn_seed"] == starts[0]["value"]["torn_seed"]
    assert all(seed is not None for seed in db.torn_seeds.values())


def test_a_node_is_told_its_tear_seed_on_the_command_line() -> None:
    commands: list[str] = []

    class Result:
        ok, stdout, stderr = True, "n1: torn", ""

    class Remote:
        def exec(self, command: str, check: bool = True) -> Result:
            commands.append(command)
            return Result()

    db = KafkaDB.__new__(KafkaDB)
    db.remote = lambda node: Remote()  # type: ignore[method-assign,assignment,return-value]
    db.path = lambda node, *parts: "/".join(("/opt", *parts))  # type: ignore[method-assign]
    assert db.power_loss("n1", 7) == "n1: torn"
    assert db.power_loss("n1") == "n1: torn"
    assert commands[0].endswith("power-loss --log-dirs /opt/broker/data --torn-seed 7")
    assert commands[1].endswith("power-loss --log-dirs /opt/broker/data")
