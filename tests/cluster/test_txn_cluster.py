"""Transactions on a 3-broker cluster, as users use them: the transaction coordinator is whichever
broker leads the transactional id's partition of __transaction_state (replication factor 3,
min ISR 2), the markers go to partition leaders on other brokers, and the coordinator is killed
in the middle of a transaction."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from isrlab.broker.coordinator.ownership import partition_for
from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.integration

TXN_PARTITIONS = 3
TXN_TOPIC = "__transaction_state"


@pytest.fixture(scope="module")
def cluster(zookeeper: Any, tmp_path_factory: Any) -> Iterator[Cluster]:
    c = Cluster(
        zookeeper,
        tmp_path_factory.mktemp("txn"),
        3,
        {
            "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
            "offsets.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "replica.fetch.wait.max.ms": "100",
        },
    )
    c.start()
    yield c
    c.stop()


def txn_leaders(c: Cluster) -> dict[int, int]:
    """{partition: leader} of __transaction_state once it exists with 3 in-sync replicas
    (the first InitProducerId's FindCoordinator creates it)."""
    probe = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "probe"})
    probe.init_transactions(60)

    def leaders() -> dict[int, int] | None:
        md = c.admin().list_topics(TXN_TOPIC, timeout=10).topics[TXN_TOPIC]
        if md.error is not None or len(md.partitions) != TXN_PARTITIONS:
            return None
        if any(p.leader < 0 or len(p.isrs) != 3 for p in md.partitions.values()):
            return None
        return {p: m.leader for p, m in md.partitions.items()}

    return c.wait_for(leaders, timeout=60, what="__transaction_state with 3 in-sync replicas")


def txn_id_away_from(c: Cluster, broker: int, prefix: str) -> tuple[str, int]:
    """A transactional id whose coordinator is not `broker`, and that coordinator."""
    leaders = txn_leaders(c)
    for i in range(1000):
        tid = f"{prefix}-{i}"
        leader = leaders[partition_for(tid, TXN_PARTITIONS)]
        if leader != broker:
            return tid, leader
    raise AssertionError(f"every partition of {TXN_TOPIC} is led by broker {broker}: {leaders}")


def read_committed(c: Cluster, topic: str, partitions: int, timeout: float = 60) -> list[bytes]:
    """Every value a read_committed consumer gets until it reaches the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": c.bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"stuck below the LSO: eof on {eof}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise KafkaException(m.error())
            out.append(m.value())
    finally:
        consumer.close()
    return out


def test_markers_reach_leaders_on_other_brokers(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("spread", 3, 3)
    tid, _coordinator = txn_id_away_from(c, 1, "spread")
    p = Producer(
        {"bootstrap.servers": c.brokers[1].bootstrap, "transactional.id": tid, "linger.ms": 5}
    )
    p.init_transactions(60)
    p.begin_transaction()
    for part in range(3):
        p.produce("spread", value=f"c{part}".encode(), partition=part)
    p.commit_transaction(60)
    p.begin_transaction()
    for part in range(3):
        p.produce("spread", value=f"a{part}".encode(), partition=part)
    p.flush(30)
    p.abort_transaction(60)
    assert sorted(read_committed(c, "spread", 3)) == [b"c0", b"c1", b"c2"]


def test_coordinator_killed_mid_transaction(cluster: Cluster) -> None:
    """kill -9 the coordinator with a transaction open on every partition: a new coordinator
    loads the transaction from __transaction_state and the producer commits through it. Each
    transaction is all or nothing for read_committed, and every committed one is there."""
    c = cluster
    c.create_topic("killed", 3, 3)
    tid, coordinator = txn_id_away_from(c, 1, "killed")
    p = Producer(
        {
            "bootstrap.servers": c.brokers[1].bootstrap,
            "transactional.id": tid,
            "linger.ms": 5,
            "transaction.timeout.ms": 60000,
        }
    )
    p.init_transactions(60)
    committed: list[list[bytes]] = []
    aborted: list[list[bytes]] = []
    for n in range(4):
        values = [f"t{n}-p{part}".encode() for part in range(3)]
        p.begin_transaction()
        for part, v in enumerate(values):
            p.produce("killed", value=v, partition=part)
        p.flush(30)
        if n == 1:
            c.brokers[coordinator].kill9()
        try:
            p.commit_transaction(90)
            committed.append(values)
        except KafkaException as e:
            err = e.args[0]
            assert err.txn_requires_abort(), err
            p.abort_transaction(90)
            aborted.append(values)
    c.brokers[coordinator].start()
    got = read_committed(c, "killed", 3)
    assert sorted(got) == sorted(v for t in committed for v in t)
    assert committed, "no transaction committed around the coordinator's death"


@pytest.mark.parametrize("marker_acks", ["-1", "1"])
def test_marker_acks_1_loses_a_committed_transaction_on_failover(
    cluster_factory: Any, marker_acks: str
) -> None:
    """The historic switch transaction.marker.required.acks=1: a partition leader answers
    WriteTxnMarkers before its follower has the marker, the coordinator completes the
    transaction, and the leader dies. The new leader holds the transaction's record without its
    marker: a transaction that stays open for ever, so read_committed never returns the
    committed record (nor anything after it). With -1 (Kafka's behaviour) the coordinator keeps
    sending the marker until the ISR has it, and the new leader gets it.

    Staging: `m-0` is replicated on L=1 and F=2 only; the coordinator is broker 3
    (__transaction_state with replication factor 1, so pausing F does not stall it); a long
    replica.lag.time.max.ms keeps F in the ISR while it is paused, so it can be elected."""
    c = cluster_factory(
        3,
        {
            "transaction.state.log.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.marker.required.acks": marker_acks,
            "replica.lag.time.max.ms": "30000",
            "replica.fetch.wait.max.ms": "100",
        },
    )
    from confluent_kafka.admin import NewTopic

    c.admin().create_topics([NewTopic("m", num_partitions=1, replica_assignment=[[1, 2]])])[
        "m"
    ].result(20)
    leaders = txn_leaders_rf1(c)
    tid = next(f"acks-{i}" for i in range(1000) if leaders[partition_for(f"acks-{i}", 3)] == 3)
    p = Producer({"bootstrap.servers": c.brokers[3].bootstrap, "transactional.id": tid})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("m", value=b"committed", partition=0)
    assert p.flush(30) == 0  # acks=all: F has the record
    c.brokers[2].signal(signal.SIGSTOP)
    time.sleep(0.5)  # F's parked fetch is answered before the pause takes it
    p.commit_transaction(30)  # answered once PrepareCommit is written (before the markers)
    time.sleep(0.5)
    c.brokers[1].kill9()
    c.brokers[2].signal(signal.SIGCONT)
    c.wait_for(lambda: c.partition("m").leader == 2, timeout=30, what="F leads m-0")
    time.sleep(3)  # with acks=-1 the coordinator's marker retry reaches the new leader
    got = read_committed(c, "m", 1, timeout=30)
    if marker_acks == "-1":
        assert got == [b"committed"]
    else:
        assert got == []


def txn_leaders_rf1(c: Cluster) -> dict[int, int]:
    probe = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "probe"})
    probe.init_transactions(60)

    def leaders() -> dict[int, int] | None:
        md = c.admin().list_topics(TXN_TOPIC, timeout=10).topics[TXN_TOPIC]
        if md.error is not None or len(md.partitions) != TXN_PARTITIONS:
            return None
        if any(p.leader < 0 for p in md.partitions.values()):
            return None
        return {p: m.leader for p, m in md.partitions.items()}

    return c.wait_for(leaders, timeout=60, what="__transaction_state with leaders")


# ----- kafka-python and aiokafka: the same coordinator kill -----------------------------------
#
# Each runs four transactions of one record per partition of a 3-partition topic (replication
# factor 3, so the partitions are led by all three brokers), kill -9s the coordinator between
# the sends of transaction 1 and its commit, and aborts transaction 2 on purpose (its markers
# come from the new coordinator). A commit that fails is handled as a user would: abort the
# transaction; if the producer refuses, close it and start a new one, whose InitProducerId
# fences the old one and ends whatever it left. Such a transaction's outcome is not known to
# the client (its commit may have been written), so it must be all or nothing; a transaction
# the client saw commit must be read exactly once, one it saw abort never. The transactions
# after the kill must end as asked, through the new coordinator.

TRANSACTIONS = 4
KILL_BEFORE_COMMIT_OF = 1
ABORTED_AFTER_FAILOVER = 2


class Outcomes:
    """What the client was told about each transaction."""

    def __init__(self) -> None:
        self.committed: list[list[bytes]] = []
        self.aborted: list[list[bytes]] = []
        self.unknown: list[list[bytes]] = []
        self.errors: list[str] = []

    def check(self, got: list[bytes]) -> None:
        assert len(got) == len(set(got)), f"a record read twice: {sorted(got)}"
        seen = set(got)
        for values in self.committed:
            assert seen >= set(values), f"committed {values} not all read: {sorted(got)}"
        for values in self.aborted:
            assert not seen & set(values), f"aborted {values} read: {sorted(got)}"
        for values in self.unknown:
            assert seen >= set(values) or not seen & set(values), f"{values} half read"
        known = {v for t in self.committed + self.aborted + self.unknown for v in t}
        assert seen <= known, f"records no transaction wrote: {seen - known}"
        after = range(KILL_BEFORE_COMMIT_OF + 1, TRANSACTIONS)
        wanted = [txn_values(n) for n in after if n != ABORTED_AFTER_FAILOVER]
        assert all(t in self.committed for t in wanted), (
            f"a transaction after the failover did not commit: {self.errors}"
        )
        assert txn_values(ABORTED_AFTER_FAILOVER) in self.aborted, self.errors


class Hung(Exception):
    """A client call that never returned."""


#: far above a commit through a failover (ZooKeeper's 4 s session expiry, then loading)
COMMIT_WATCHDOG_S = 15


def txn_values(n: int) -> list[bytes]:
    return [f"t{n}-p{part}".encode() for part in range(3)]


def test_kafka_python_coordinator_killed_mid_transaction(cluster: Cluster) -> None:
    """kafka-python 3.0.12 never returns from the commit after the kill: until ZooKeeper expires
    the dead broker's session, FindCoordinator rightly still names it (as Kafka's metadata
    cache does), the connection is refused, and the client's Sender then drops the EndTxn
    request (it re-enqueues a request only when no coordinator was known, unlike Java's Sender,
    which always retries it). abort_transaction is refused in COMMITTING_TRANSACTION, so the
    user's watchdog replaces the producer; the new one's InitProducerId goes to the new
    coordinator, which aborts the open transaction."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KpError

    c = cluster
    tid, coordinator = txn_id_away_from(c, 1, "kp-killed")
    c.create_topic("kp-killed", 3, 3)

    def new_producer() -> Any:
        p = KafkaProducer(
            bootstrap_servers=c.brokers[1].bootstrap,
            transactional_id=tid,
            linger_ms=5,
            transaction_timeout_ms=60000,
            max_block_ms=60000,
        )
        p.init_transactions()
        return p

    def bounded(call: Any, timeout: float) -> None:
        """kafka-python's commit and abort wait without a limit; a user's watchdog gives up."""
        failure: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as e:
                failure.append(e)

        t = threading.Thread(target=run, daemon=True)  # a daemon: a hang cannot block the exit
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise Hung(f"{call.__name__} still waiting after {timeout} s")
        if failure:
            raise failure[0]

    out = Outcomes()
    p = new_producer()
    try:
        for n in range(TRANSACTIONS):
            values = txn_values(n)
            p.begin_transaction()
            for part, v in enumerate(values):
                p.send("kp-killed", v, partition=part)
            p.flush(30)
            if n == KILL_BEFORE_COMMIT_OF:
                c.brokers[coordinator].kill9()
            try:
                if n == ABORTED_AFTER_FAILOVER:
                    bounded(p.abort_transaction, COMMIT_WATCHDOG_S)
                    out.aborted.append(values)
                    continue
                bounded(p.commit_transaction, COMMIT_WATCHDOG_S)
                out.committed.append(values)
                continue
            except (KpError, Hung) as e:
                out.errors.append(f"end: {type(e).__name__}: {e}")
            try:
                bounded(p.abort_transaction, COMMIT_WATCHDOG_S)
                out.aborted.append(values)
            except (KpError, Hung) as e:
                out.errors.append(f"abort: {type(e).__name__}: {e}")
                p.close(0)
                p = new_producer()  # fences the old producer and ends its transaction
                out.unknown.append(values)
    finally:
        p.close(5)
        c.brokers[coordinator].start()
    print("kafka-python errors:", out.errors)
    out.check(read_committed(c, "kp-killed", 3))


def test_aiokafka_coordinator_killed_mid_transaction(cluster: Cluster) -> None:
    """aiokafka retries the commit until the new coordinator has loaded the transaction and
    answers it: no error reaches the user."""
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.errors import KafkaError as AioError

    c = cluster
    tid, coordinator = txn_id_away_from(c, 1, "aio-killed")
    c.create_topic("aio-killed", 3, 3)

    async def new_producer() -> Any:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=c.brokers[1].bootstrap,
            transactional_id=tid,
            linger_ms=5,
            transaction_timeout_ms=60000,
        )
        await asyncio.wait_for(p.start(), 60)
        return p

    async def run(out: Outcomes) -> None:
        p = await new_producer()
        try:
            for n in range(TRANSACTIONS):
                values = txn_values(n)
                await p.begin_transaction()
                for part, v in enumerate(values):
                    await p.send("aio-killed", v, partition=part)
                await asyncio.wait_for(p.flush(), 30)
                if n == KILL_BEFORE_COMMIT_OF:
                    c.brokers[coordinator].kill9()
                try:
                    if n == ABORTED_AFTER_FAILOVER:
                        await asyncio.wait_for(p.abort_transaction(), COMMIT_WATCHDOG_S)
                        out.aborted.append(values)
                        continue
                    await asyncio.wait_for(p.commit_transaction(), COMMIT_WATCHDOG_S)
                    out.committed.append(values)
                    continue
                except (AioError, TimeoutError) as e:
                    out.errors.append(f"end: {type(e).__name__}: {e}")
                try:
                    await asyncio.wait_for(p.abort_transaction(), COMMIT_WATCHDOG_S)
                    out.aborted.append(values)
                except (AioError, TimeoutError) as e:
                    out.errors.append(f"abort: {type(e).__name__}: {e}")
                    await p.stop()
                    p = await new_producer()
                    out.unknown.append(values)
        finally:
            await p.stop()

    out = Outcomes()
    try:
        asyncio.run(run(out))
    finally:
        c.brokers[coordinator].start()
    print("aiokafka errors:", out.errors)
    out.check(read_committed(c, "aio-killed", 3))
