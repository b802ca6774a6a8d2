"""The ``txn-coordinator`` target (the transaction coordinator of one of the test's
transactional ids) for process faults and partitions, without a cluster: the DB's
FindCoordinator answers are faked; and KafkaDB's FindCoordinator with key type TRANSACTION."""

from __future__ import annotations

import itertools
import random
import struct
from typing import Any

import pytest

from isrlab import nemeses
from isrlab.harness import db as dbmod
from isrlab.harness.db import KEY_TYPE_TRANSACTION, KafkaDB, find_coordinator
from isrlab.nemeses.base import resolve_targets, txn_coordinator_node
from isrlab.nemeses.partition import DEFAULT_SHAPES, SHAPES, PartitionFault, grudge
from isrlab.nemeses.process import KillFault, PauseFault
from tests.harness.test_db_unit import _fake_broker, inventory
from tests.nemeses.conftest import RecordingDB
from tests.nemeses.test_coordinator_target import _Shell


class TxnDB(RecordingDB):
    """RecordingDB whose transactional ids have coordinators (id -> node; "error": none answers)."""

    def __init__(self, coordinators: dict[str, str | None] | None = None) -> None:
        super().__init__()
        self.coordinators = (
            {"isrlab-t-1-0": "n4", "isrlab-t-1-1": "n1"} if coordinators is None else coordinators
        )
        if self.coordinators:
            self.test["transactional_ids"] = list(self.coordinators)
        self.asked: list[str] = []

    def txn_coordinator(self, transactional_id: str) -> str | None:
        self.asked.append(transactional_id)
        node = self.coordinators[transactional_id]
        if node == "error":
            raise RuntimeError("no broker answered FindCoordinator")
        return node

    def coordinator(self, group: str) -> str | None:
        raise AssertionError("the group coordinator is not the transaction coordinator")

    def kill(self, node: str) -> bool:
        self.calls.append(("kill", node))
        return True


def test_the_target_is_the_coordinator_of_one_of_the_tests_transactional_ids() -> None:
    db: Any = TxnDB()
    seen = {tuple(resolve_targets("txn-coordinator", db, random.Random(s))) for s in range(20)}
    # drawn among the ids with the seeded random: both coordinators come up, nothing else
    assert seen == {("n4",), ("n1",)}
    assert set(db.asked) == {"isrlab-t-1-0", "isrlab-t-1-1"}
    # the same seed, the same id
    a, b = TxnDB(), TxnDB()
    resolve_targets("txn-coordinator", a, random.Random(7))  # type: ignore[arg-type]
    resolve_targets("txn-coordinator", b, random.Random(7))  # type: ignore[arg-type]
    assert a.asked == b.asked
    # without an rng the first id's
    assert txn_coordinator_node(TxnDB()) == "n4"  # type: ignore[arg-type]


def test_no_answer_or_no_transactional_ids_still_gives_one_node() -> None:
    rng = random.Random(1)
    for unknown in (TxnDB({"x": None}), TxnDB({"x": "error"}), TxnDB({})):
        assert txn_coordinator_node(unknown, rng) is None  # type: ignore[arg-type]
        assert len(resolve_targets("txn-coordinator", unknown, rng)) == 1  # type: ignore[arg-type]
    assert TxnDB({}).asked == []


def test_kill_and_pause_hit_the_transaction_coordinator() -> None:
    db: Any = TxnDB({"only": "n2"})
    kill = KillFault(db, random.Random(0))
    assert kill.start({"target": "txn-coordinator"}) == {
        "target": "txn-coordinator",
        "nodes": ["n2"],
    }
    pause = PauseFault(db, random.Random(0))
    assert pause.start({"target": "txn-coordinator"})["nodes"] == ["n2"]
    assert db.calls == [("kill", "n2"), ("pause", "n2")]


def test_isolate_txn_coordinator_cuts_it_off() -> None:
    assert "isolate-txn-coordinator" in SHAPES
    g = grudge("isolate-txn-coordinator", [f"n{i}" for i in range(1, 6)], random.Random(1), "n3")
    assert g["n3"] == ["n1", "n2", "n4", "n5"] and g["n5"] == ["n3"]
    db: Any = TxnDB({"only": "n5"})
    log: list[tuple[str, str]] = []
    db.remote = lambda name: _Shell(name, log)
    done = PartitionFault(db, random.Random(0)).start({"shape": "isolate-txn-coordinator"})
    assert done["n5"] == ["n1", "n2", "n3", "n4"]
    assert all(done[n] == ["n5"] for n in ("n1", "n2", "n3", "n4"))
    assert db.asked == ["only"]


def _starts(targets: list[str] | None, kinds: list[str]) -> list[dict[str, Any]]:
    ops = itertools.islice(nemeses.schedule(kinds, 1, 3, targets=targets, keys=["t0/0"]), 2000)
    return [op for op in ops if op.get("f", "").startswith("start-")]


def test_schedules_aim_at_the_transaction_coordinator_only_when_asked() -> None:
    default = _starts(None, ["kill", "partition"])
    assert "txn-coordinator" not in {op["value"].get("target") for op in default}
    shapes = {op["value"].get("shape") for op in default if op["f"] == "start-partition"}
    assert shapes == set(DEFAULT_SHAPES)
    mixed = _starts([*nemeses.DEFAULT_TARGETS, "txn-coordinator"], ["kill", "partition"])
    kills = {op["value"].get("target") for op in mixed if op["f"] == "start-kill"}
    assert "txn-coordinator" in kills
    shapes = {op["value"].get("shape") for op in mixed if op["f"] == "start-partition"}
    assert shapes == {*DEFAULT_SHAPES, "isolate-txn-coordinator"}
    only = _starts(["txn-coordinator"], ["kill", "partition"])
    assert {op["value"].get("target") for op in only if op["f"] == "start-kill"} == {
        "txn-coordinator"
    }
    assert {op["value"]["shape"] for op in only if op["f"] == "start-partition"} == {
        "isolate-txn-coordinator"
    }


def test_find_coordinator_asks_with_key_type_transaction() -> None:
    host = b"10.0.0.2"
    ok = struct.pack(">iihh", 1, 0, 0, -1) + struct.pack(">ih", 2, len(host)) + host
    ok += struct.pack(">i", 9092)
    port, got, t = _fake_broker(ok)
    assert find_coordinator("127.0.0.1", port, "tid-0", key_type=KEY_TYPE_TRANSACTION) == 2
    t.join(5)
    # the key, then key type 1 (TRANSACTION)
    assert got[0].endswith(struct.pack(">h", 5) + b"tid-0" + b"\x01")


def test_kafkadb_txn_coordinator_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str, int]] = []
    answers = iter([OSError("refused"), None, 3])

    def fake(host: str, port: int, key: str, timeout: float = 5.0, key_type: int = 0) -> Any:
        asked.append((host, key, key_type))
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(dbmod, "find_coordinator", fake)
    d = KafkaDB({"keys": ["t0/0"]}, inventory(), "/tmp/run")
    d.broker_ids = {f"n{i}": i for i in range(1, 6)}
    # an unreachable broker and one without an answer are skipped; the third names broker 3
    assert d.txn_coordinator("tid-0") == "n3"
    assert [a[1:] for a in asked] == [("tid-0", KEY_TYPE_TRANSACTION)] * 3
    assert [a[0] for a in asked] == ["10.0.0.11", "10.0.0.12", "10.0.0.13"]
