"""A coordinator loading a damaged __consumer_offsets partition serves what it can read."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from isrlab.broker.log.record_batch import iter_batches

OVERRIDES = {
    "offsets.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.segment.bytes": "8000",
}
GROUPS = [f"g{i}" for i in range(10)]


def _consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )


def test_a_corrupt_batch_in_the_middle_loses_only_its_own_records(broker_factory, tmp_path):
    log_dir = tmp_path / "logs"
    b = broker_factory(OVERRIDES, log_dir=log_dir)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # futures die with their client
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(20)
    for i, group in enumerate(GROUPS):  # ~1.1 kB per commit: 7 in the first segment
        c = _consumer(b.bootstrap, group)
        c.commit(offsets=[TopicPartition("t", 0, 100 + i, metadata="m" * 1000)], asynchronous=False)
        c.close()
    b.stop()
    first = sorted(Path(log_dir, "__consumer_offsets-0").glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    headers = list(iter_batches(bytes(data)))
    assert len(headers) >= 5, headers
    # Inside g0's record, far below the segment's tail that start-up checks: its CRC no longer
    # matches, and only a reader of the whole log (the coordinator loading it) sees that.
    data[headers[0].end_position - 3] ^= 0xFF
    first.write_bytes(bytes(data))
    b.start()
    seen = {}
    for group in GROUPS:
        c = _consumer(b.bootstrap, group)
        seen[group] = c.committed([TopicPartition("t", 0)], timeout=20)[0].offset
        c.close()
    assert seen == {"g0": -1001, **{g: 100 + i for i, g in enumerate(GROUPS) if i}}
    assert "skipping a batch" in b.log_text()


def test_clients_cannot_write_the_offsets_topic(broker_factory):
    """Only the coordinator appends to __consumer_offsets (Kafka refuses producers with
    INVALID_TOPIC_EXCEPTION): a stray record there would be loaded as group state."""
    from confluent_kafka import KafkaError, Producer

    b = broker_factory(OVERRIDES)
    c = _consumer(b.bootstrap, "g")  # creates the topic through FindCoordinator
    c.commit(offsets=[TopicPartition("__consumer_offsets", 0, 1)], asynchronous=False)
    c.close()
    errors: list[KafkaError] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 10000})
    p.produce(
        "__consumer_offsets", b"v", key=b"k", partition=0, on_delivery=lambda e, m: errors.append(e)
    )
    p.flush(15)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors
