"""Transactions as users use them: real transactional clients (librdkafka via confluent-kafka,
kafka-python, aiokafka) against one broker process, which is its own transaction coordinator,
group coordinator and partition leader."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.conftest import BrokerProcess

pytestmark = pytest.mark.integration

#: small internal topics and a quick abort of timed-out transactions keep the tests short
TXN_BROKER = {
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.num.partitions": "3",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "group.initial.rebalance.delay.ms": "0",
}


def txn_broker(broker_factory: Any, **overrides: str) -> BrokerProcess:
    return broker_factory({**TXN_BROKER, **overrides})


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


def txn_producer(bootstrap: str, txn_id: str, **conf: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "linger.ms": 5,
            **conf,
        }
    )


def read_all(bootstrap: str, topic: str, isolation: str, partitions: int = 1) -> list[bytes]:
    """Every value a consumer with `isolation` gets from the start until it is caught up."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 20
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise KafkaException(m.error())
            values.append(m.value())
    finally:
        c.close()
    assert len(eof) == partitions, "the consumer never reached the end of the log"
    return values


def produce_txn(
    p: Producer, topic: str, values: list[bytes], commit: bool, partition: int = 0
) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v, partition=partition)
    p.flush(10)
    if commit:
        p.commit_transaction(20)
    else:
        p.abort_transaction(20)


def test_confluent_commit_and_abort_read_committed(broker_factory: Any) -> None:
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    p = txn_producer(b.bootstrap, "txn-a")
    p.init_transactions(20)
    produce_txn(p, "t", [b"c1", b"c2"], commit=True)
    produce_txn(p, "t", [b"a1", b"a2", b"a3"], commit=False)
    produce_txn(p, "t", [b"c3"], commit=True)
    assert read_all(b.bootstrap, "t", "read_committed") == [b"c1", b"c2", b"c3"]
    # read_uncommitted sees the aborted records too, never the markers
    assert read_all(b.bootstrap, "t", "read_uncommitted") == [
        b"c1",
        b"c2",
        b"a1",
        b"a2",
        b"a3",
        b"c3",
    ]


def test_open_transaction_holds_back_read_committed(broker_factory: Any) -> None:
    """The LSO stops at an open transaction's first record: a read_committed consumer sees
    nothing past it (not even later non-transactional records) until it ends."""
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    p = txn_producer(b.bootstrap, "txn-open")
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("t", value=b"open")
    p.flush(10)
    plain = Producer({"bootstrap.servers": b.bootstrap})
    plain.produce("t", value=b"plain")
    assert plain.flush(10) == 0
    assert read_all(b.bootstrap, "t", "read_committed") == []
    assert read_all(b.bootstrap, "t", "read_uncommitted") == [b"open", b"plain"]
    p.commit_transaction(20)
    assert read_all(b.bootstrap, "t", "read_committed") == [b"open", b"plain"]


def test_new_producer_fences_zombie(broker_factory: Any) -> None:
    """A second producer with the same transactional.id bumps the epoch: the first one's open
    transaction is aborted and it is fenced (a fatal error), its records never visible."""
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    zombie = txn_producer(b.bootstrap, "txn-z")
    zombie.init_transactions(20)
    zombie.begin_transaction()
    zombie.produce("t", value=b"zombie")
    zombie.flush(10)
    fresh = txn_producer(b.bootstrap, "txn-z")
    fresh.init_transactions(30)
    produce_txn(fresh, "t", [b"fresh"], commit=True)
    with pytest.raises(KafkaException) as e:
        zombie.produce("t", value=b"zombie-2")
        zombie.flush(10)
        zombie.commit_transaction(10)
    assert e.value.args[0].fatal() or e.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )
    assert read_all(b.bootstrap, "t", "read_committed") == [b"fresh"]


def test_coordinator_aborts_a_transaction_past_its_timeout(broker_factory: Any) -> None:
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    p = txn_producer(b.bootstrap, "txn-slow", **{"transaction.timeout.ms": 2000})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("t", value=b"too-slow")
    p.flush(10)
    plain = Producer({"bootstrap.servers": b.bootstrap})
    plain.produce("t", value=b"after")
    assert plain.flush(10) == 0
    time.sleep(4)  # the transaction times out and the coordinator aborts it
    assert read_all(b.bootstrap, "t", "read_committed") == [b"after"]
    with pytest.raises(KafkaException):
        p.commit_transaction(10)


def test_send_offsets_to_transaction(broker_factory: Any) -> None:
    """Consume-transform-produce: offsets sent to a committed transaction are committed with it,
    those of an aborted one are not."""
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "in")
    create_topic(b.bootstrap, "out")
    plain = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(10):
        plain.produce("in", value=f"v{i}".encode())
    assert plain.flush(10) == 0
    c = Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "group.id": "copier",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    c.assign([TopicPartition("in", 0, 0)])
    p = txn_producer(b.bootstrap, "txn-copier")
    p.init_transactions(20)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 10 and time.monotonic() < deadline:
        got += [m for m in c.consume(10, 0.5) if not m.error()]
    assert len(got) == 10
    meta = c.consumer_group_metadata()

    def copy(msgs: list[Any], commit: bool) -> None:
        p.begin_transaction()
        for m in msgs:
            p.produce("out", value=m.value())
        p.send_offsets_to_transaction([TopicPartition("in", 0, msgs[-1].offset() + 1)], meta, 20)
        if commit:
            p.commit_transaction(20)
        else:
            p.abort_transaction(20)

    copy(got[:5], commit=True)
    copy(got[5:], commit=False)
    committed = c.committed([TopicPartition("in", 0)], 10)
    assert committed[0].offset == 5
    assert read_all(b.bootstrap, "out", "read_committed") == [f"v{i}".encode() for i in range(5)]
    c.close()


def test_committed_transaction_survives_restart(broker_factory: Any) -> None:
    """kill -9 after a commit and during an open transaction: after the restart the coordinator
    loads its state; the committed records stay visible, the open transaction is aborted when
    it times out, and the producer id's epoch is fenced for the old producer."""
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    p = txn_producer(b.bootstrap, "txn-r", **{"transaction.timeout.ms": 3000})
    p.init_transactions(20)
    produce_txn(p, "t", [b"kept"], commit=True)
    p.begin_transaction()
    p.produce("t", value=b"in-flight")
    p.flush(10)
    b.kill9()
    b.start()
    deadline = time.monotonic() + 30
    values: list[bytes] = []
    while time.monotonic() < deadline:
        values = read_all(b.bootstrap, "t", "read_committed")
        if values == [b"kept"] and _lso_past_in_flight(b):
            break
        time.sleep(0.5)
    assert values == [b"kept"]
    fresh = txn_producer(b.bootstrap, "txn-r")
    fresh.init_transactions(30)
    produce_txn(fresh, "t", [b"next"], commit=True)
    assert read_all(b.bootstrap, "t", "read_committed") == [b"kept", b"next"]


def _lso_past_in_flight(b: BrokerProcess) -> bool:
    """The read_committed end offset is past the in-flight record (its abort marker written)."""
    c = Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "group.id": "lso-probe",
            "isolation.level": "read_committed",
        }
    )
    try:
        _low, high = c.get_watermark_offsets(TopicPartition("t", 0), 5)
        return bool(high >= 4)  # kept, commit marker, in-flight, abort marker
    finally:
        c.close()


def test_kafka_python_transactional_producer(broker_factory: Any) -> None:
    from kafka import KafkaProducer

    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")
    p = KafkaProducer(bootstrap_servers=b.bootstrap, transactional_id="kp-txn")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"kp-commit")
    p.commit_transaction()
    p.begin_transaction()
    p.send("t", b"kp-abort")
    p.flush()
    p.abort_transaction()
    p.close()
    assert read_all(b.bootstrap, "t", "read_committed") == [b"kp-commit"]


def test_aiokafka_transactional_producer(broker_factory: Any) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t")

    async def run() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=b.bootstrap, transactional_id="aio-txn")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait("t", b"aio-commit")
            await p.begin_transaction()
            await p.send_and_wait("t", b"aio-abort")
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())
    assert read_all(b.bootstrap, "t", "read_committed") == [b"aio-commit"]
