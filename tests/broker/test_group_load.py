"""A coordinator loading a damaged __consumer_offsets partition serves what it can read."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_a_corrupt_batch_in_the_middle_takes_the_log_dir_offline_with_one_line(
    broker_factory, tmp_path
):
    """A batch of __consumer_offsets damaged below the tail that start-up checks: the first
    read of it (the partition's producer-state replay at load) CRC-checks it and, as for any
    partition (issue 17: Kafka's KafkaStorageException path), the log dir goes offline with one
    line naming the file; the group state is never loaded from it. (Before the read-time checks
    the coordinator skipped the batch and lost only g0's commit.)"""
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
    # Inside g0's record, far below the segment's tail that start-up checks.
    data[headers[0].end_position - 3] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="broker exited") as exited:
        b.start()
    text = str(exited.value)
    assert "have failed: corrupt record batch in" in text
    assert str(first) in text


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
