"""The late-produce schedule (nemeses/targeted.py) against a real 3-node embedded cluster: a
transactional producer's produce request to the partition leader is held back by the fault,
the producer aborts, and the held request reaches the leader after the abort marker.

Without KIP-890 verification (``transaction.partition.verification.enable=false``, the historic
switch) the late batch is appended and opens a transaction no coordinator will end: the
partition's last stable offset stays below it, and a transaction committed after it is never
readable with read_committed. With verification (the default: a second
deploy) the late batch is refused and the later transaction is read.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from isrlab.harness.cluster import EmbeddedCluster, embedded_cluster
from isrlab.harness.db import KafkaDB
from isrlab.nemeses.targeted import LATE_CHAIN, LateProduceFault

# behind slow (make soak): a 3-node embedded cluster and a minute of faults; make test keeps the
# schedule's unit tests (tests/nemeses/test_targeted.py) and the broker-level hang
# (tests/broker/test_txn_bad_input.py) within its 20-minute budget
pytestmark = [
    pytest.mark.root,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

TOPIC = "t0"
MESSAGE_TIMEOUT_MS = 4000


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with embedded_cluster(3, "latetest") as c:
        yield c


def _producer(bootstrap: str, tid: str) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "request.timeout.ms": 2000,
            "socket.connection.setup.timeout.ms": 2000,
            "reconnect.backoff.max.ms": 1000,
            "log_level": 2,
        }
    )
    p.init_transactions(30)
    return p


def _commit(p: Producer, value: bytes) -> None:
    p.begin_transaction()
    p.produce(TOPIC, value, partition=0)
    p.commit_transaction(30)


def _read(bootstrap: str, isolation: str, quiet_s: float) -> list[bytes]:
    """Every record of the partition a consumer with `isolation` gets (until `quiet_s` pass
    with nothing new)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "log_level": 2,
        }
    )
    c.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[bytes] = []
    last = time.monotonic()
    while time.monotonic() - last < quiet_s:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
            last = time.monotonic()
    c.close()
    return got


def _producer_away_from(db: KafkaDB, leader: str) -> tuple[str, Producer]:
    """A transactional producer whose coordinator is not `leader` (the fault cuts the clients
    off from the leader: its abort must reach a coordinator that can write the marker)."""
    for _ in range(20):
        tid = f"late-{uuid.uuid4().hex[:6]}"
        p = _producer(db.bootstrap_servers(), tid)
        if db.txn_coordinator(tid) not in (None, leader):
            return tid, p
    raise AssertionError(f"every transactional id tried had its coordinator on {leader}")


@pytest.mark.parametrize("verification", [False, True])
def test_a_produce_held_past_its_abort_hangs_the_partition_without_verification(
    cluster: EmbeddedCluster, tmp_path: Path, verification: bool
) -> None:
    test = {
        "name": "latetest",
        "seed": 1,
        "keys": [f"{TOPIC}/0"],
        "txn": True,
        "txn_verification": verification,
        "replication_factor": 3,
        "op_timeout_ms": MESSAGE_TIMEOUT_MS,
    }
    db = KafkaDB(test, cluster.inventory, tmp_path / "run", workdirs=cluster.workdirs)
    db.setup()
    try:
        db.create_topics(test["keys"], rf=3, min_insync=2)
        bootstrap = db.bootstrap_servers()
        leader = db.partition_state(TOPIC, 0)[0]
        assert leader is not None
        _, p = _producer_away_from(db, leader)
        _commit(p, b"first")  # the producer now has a connection to the leader
        fault = LateProduceFault(db, random.Random(1))
        done: dict[str, Any] = {}
        strike = threading.Thread(target=lambda: done.update(fault.start({"key": "t0/0"})))
        strike.start()
        time.sleep(0.5)  # the hold is on: the produce below stays in the client's kernel
        reports: list[Any] = []
        p.begin_transaction()
        p.produce(TOPIC, b"late", partition=0, on_delivery=lambda err, msg: reports.append(err))
        deadline = time.monotonic() + MESSAGE_TIMEOUT_MS / 1000 + 10
        while not reports and time.monotonic() < deadline:
            p.poll(0.1)
        assert reports and reports[0] is not None, "the held produce was acknowledged"
        p.abort_transaction(30)
        strike.join(60)
        assert not strike.is_alive() and "error" not in done, done
        assert done["leader"] == leader and done["held_s"] > MESSAGE_TIMEOUT_MS / 1000
        # nothing left of the fault on the leader
        rules = db.remote(leader).exec(f"iptables -w -S {LATE_CHAIN}", check=False)
        assert not rules.ok
        # the producer goes on elsewhere; another producer commits to the partition
        _commit(_producer(bootstrap, f"later-{uuid.uuid4().hex[:6]}"), b"later")
        everything = _read(bootstrap, "read_uncommitted", quiet_s=3)
        committed = _read(bootstrap, "read_committed", quiet_s=5)
    finally:
        db.teardown()
    if verification:
        # the partition asked the coordinator and refused the late batch
        assert b"late" not in everything
        assert committed == [b"first", b"later"]
    else:
        # appended after its own abort marker: the LSO stays below it, "later" is never read
        assert everything[-2:] == [b"late", b"later"], everything
        assert committed == [b"first"]
