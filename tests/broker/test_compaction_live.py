"""Log compaction on a real broker process with a real client (confluent-kafka)."""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.cleaner import CLEANER_OFFSET_CHECKPOINT
from isrlab.broker.log.log import Log, LogConfig

pytestmark = pytest.mark.integration

TOPIC = "compacted"


def produce_keyed(bootstrap: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 2048})
    errors: list[object] = []
    for key, value in records:
        while True:
            try:
                producer.produce(
                    TOPIC,
                    key=key,
                    value=value,
                    partition=0,
                    on_delivery=lambda err, _msg: errors.append(err) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(30) == 0
    assert not errors


def consume_all(bootstrap: str) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "compaction-test", "enable.auto.commit": False}
    )
    _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 30
    while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
        for message in consumer.consume(500, timeout=0.5):
            assert message.error() is None, message.error()
            out.append((message.offset(), message.key(), message.value()))
    consumer.close()
    assert out and out[-1][0] == high - 1, "did not read up to the high watermark"
    return out


def wait_for_cleaning(
    log_dir: Path, at_least: int, timeout: float = 30, tp: tuple[str, int] = (TOPIC, 0)
) -> int:
    checkpoint = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if checkpoint.path.exists():
            cleaned = checkpoint.read().get(tp, 0)
            if cleaned >= at_least:
                return cleaned
        time.sleep(0.1)
    raise AssertionError(f"the cleaner did not clean {tp} up to {at_least} in {timeout} s")


def test_a_compacted_topic_keeps_the_latest_value_of_every_key(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory({"log.cleaner.backoff.ms": "100", "offsets.topic.num.partitions": "1"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "16384",
        "min.cleanable.dirty.ratio": "0.01",
    }
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(10)
    bad = admin.create_topics([NewTopic("bad", 1, 1, config={"cleanup.policy": "shrink"})])["bad"]
    with pytest.raises(Exception, match=r"cleanup\.policy"):
        bad.result(10)

    latest: dict[bytes, bytes | None] = {}
    records: list[tuple[bytes, bytes | None]] = []
    for n in range(3_000):
        key = b"key-%d" % (n % 40)
        value = None if n % 97 == 0 else b"value-%d" % n
        records.append((key, value))
        latest[key] = value
    produce_keyed(broker.bootstrap, records)
    # Keep appending while the cleaner works: the compacted topic takes continuous appends.
    more = [(b"key-%d" % (n % 40), b"more-%d" % n) for n in range(3_000, 3_400)]
    produce_keyed(broker.bootstrap, more)
    latest.update(more)
    wait_for_cleaning(broker.log_dir, at_least=2_000)

    got = consume_all(broker.bootstrap)
    assert len(got) < 3_400  # compacted
    offsets = [offset for offset, _, _ in got]
    assert offsets == sorted(set(offsets))
    seen: dict[bytes, bytes | None] = {}
    for _, key, value in got:
        assert key is not None
        seen[key] = value
    assert seen == {key: value for key, value in latest.items() if key in seen}
    assert all(value is not None for key, value in latest.items() if key not in seen)
    assert {key for key, value in latest.items() if value is not None} <= set(seen)

    # Kafka's rule: a compacted topic refuses a record without a key.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    failed: list[object] = []
    producer.produce(
        TOPIC, value=b"no key", partition=0, on_delivery=lambda e, _m: failed.append(e)
    )
    producer.flush(10)
    assert failed and failed[0] is not None and "INVALID_RECORD" in str(failed[0].name())  # type: ignore[attr-defined]

    # A restart reopens the cleaned segments; a consumer from offset 0 reads the same.
    broker.stop()
    broker.start()
    assert consume_all(broker.bootstrap) == got


def test_kill_9_while_the_cleaner_runs_loses_no_acknowledged_latest_value(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """The broker is killed (SIGKILL) while producers append and the cleaner (woken every 10 ms)
    rewrites segments; after each restart every key shows its latest acknowledged value (or a
    later one) from offset 0."""
    rng = random.Random(13)
    broker = broker_factory({"log.cleaner.backoff.ms": "10", "offsets.topic.num.partitions": "1"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "8192",
        "min.cleanable.dirty.ratio": "0.01",
    }
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(10)
    acked: dict[bytes, tuple[int, bytes]] = {}  # key -> (offset, value) of its latest ack
    n = 0
    for _round in range(4):
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "batch.size": 2048,
                "linger.ms": 2,
                "acks": "all",
            }
        )

        def on_delivery(err: object, msg: Any) -> None:
            if err is None and acked.get(msg.key(), (-1, b""))[0] < msg.offset():
                acked[msg.key()] = (msg.offset(), msg.value())

        deadline = time.monotonic() + rng.uniform(0.5, 1.5)
        while time.monotonic() < deadline:
            for _ in range(200):
                n += 1
                with contextlib.suppress(BufferError):
                    producer.produce(
                        TOPIC, key=b"key-%d" % (n % 30), value=b"v%d" % n, partition=0,
                        on_delivery=on_delivery,
                    )  # fmt: skip
            producer.poll(0.01)
        broker.kill9()
        producer.poll(0.5)  # delivery reports that arrived before the kill
        del producer
        broker.start()
        got = consume_all(broker.bootstrap)
        offsets = [offset for offset, _, _ in got]
        assert offsets == sorted(set(offsets))
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, key, value in got:
            assert key is not None
            latest[key] = (offset, value)
        for key, (offset, value) in acked.items():
            assert key in latest, f"{key!r} acknowledged at {offset} is gone"
            found_offset, found_value = latest[key]
            assert found_offset >= offset, (key, offset, found_offset)
            if found_offset == offset:
                assert found_value == value
    assert "Cleaned compacted-0" in broker.log_text()


def test_consumer_offsets_is_compacted_and_the_committed_offset_survives(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """The group coordinator's __consumer_offsets is a compacted topic: 1,500 commits of one
    group clean down to a handful of records, and the last commit is what a restart loads."""
    broker = broker_factory(
        {
            "log.cleaner.backoff.ms": "100",
            "offsets.topic.num.partitions": "1",
            "offsets.topic.segment.bytes": "4096",
        }
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(10)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False}
    )
    for i in range(1_500):
        consumer.commit(offsets=[TopicPartition("t", 0, i)], asynchronous=False)
    consumer.close()
    cleaned = wait_for_cleaning(broker.log_dir, at_least=1_000, tp=("__consumer_offsets", 0))
    broker.stop()
    directory = broker.log_dir / "__consumer_offsets-0"
    log = Log.open(directory, LogConfig(cleanup_policy=("compact",)))
    try:
        below = [h for s in log.segments if s.base_offset < cleaned for h in s.batches()]
        assert sum(h.records_count for h in below) < 10
    finally:
        log.close()
    broker.start()
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False}
    )
    [committed] = consumer.committed([TopicPartition("t", 0)], timeout=20)
    consumer.close()
    assert committed.offset == 1_499
