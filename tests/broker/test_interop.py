"""Real clients (librdkafka via confluent-kafka, and kafka-python) against a real broker process."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration

TS0 = 1_700_000_000_000


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name]
    fut.result(10)


def produce_confluent(bootstrap: str, topic: str, values: list[tuple[int, bytes]], **conf):
    p = Producer({"bootstrap.servers": bootstrap, **conf})
    acked: list[tuple[int, int, bytes]] = []
    errors: list[object] = []

    def cb(err, msg):  # type: ignore[no-untyped-def]
        if err:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    for i, (partition, value) in enumerate(values):
        while True:
            try:
                p.produce(
                    topic, value=value, partition=partition, timestamp=TS0 + i, on_delivery=cb
                )
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(30) == 0
    assert not errors
    return acked


def consume_confluent(bootstrap: str, assignments: list[TopicPartition], expect: int, **conf):
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test", "enable.auto.commit": False, **conf}
    )
    c.assign(assignments)
    out: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + 30
    while len(out) < expect and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.value()))
    c.close()
    return out


def test_confluent_many_batches_several_partitions(broker):
    create_topic(broker.bootstrap, "multi", 4)
    values = [(i % 4, f"value-{i}".encode()) for i in range(20000)]
    acked = produce_confluent(broker.bootstrap, "multi", values, **{"linger.ms": 2})
    assert len(acked) == 20000
    got = consume_confluent(
        broker.bootstrap, [TopicPartition("multi", p, 0) for p in range(4)], 20000
    )
    assert sorted(got) == sorted(acked)
    # offsets are dense from 0 per partition, values in send order
    for p in range(4):
        part = sorted((o, v) for pp, o, v in got if pp == p)
        assert [o for o, _ in part] == list(range(5000))
        assert [v for _, v in part] == [f"value-{i}".encode() for i in range(p, 20000, 4)]


def test_confluent_seek_earliest_latest_and_time(broker):
    create_topic(broker.bootstrap, "seek", 1, {"segment.bytes": "20000"})
    acked = produce_confluent(
        broker.bootstrap, "seek", [(0, b"x" * 50) for _ in range(2000)], **{"batch.size": 8000}
    )
    assert len(acked) == 2000
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "s"})
    low, high = c.get_watermark_offsets(TopicPartition("seek", 0), timeout=10)
    assert (low, high) == (0, 2000)
    # by timestamp: the record produced with timestamp TS0 + 1234 is at offset 1234
    found = c.offsets_for_times([TopicPartition("seek", 0, TS0 + 1234)], timeout=10)
    assert found[0].offset == 1234
    # past the newest timestamp: the end (-1 from ListOffsets maps to the high watermark)
    past = c.offsets_for_times([TopicPartition("seek", 0, TS0 + 10**9)], timeout=10)
    assert past[0].offset in (-1, 2000)
    c.assign([TopicPartition("seek", 0, 1234)])
    m = c.consume(1, timeout=10)[0]
    assert m.offset() == 1234
    c.close()
    latest = consume_confluent(
        broker.bootstrap, [TopicPartition("seek", 0, -1)], 0, **{"auto.offset.reset": "latest"}
    )
    assert latest == []
    segs = list((broker.log_dir / "seek-0").glob("*.log"))
    assert len(segs) > 1  # the small segment.bytes made it roll


def test_kafka_python_default_producer_and_consumer(broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([KNewTopic("kp", 3, 1)])
    admin.close()
    p = KafkaProducer(bootstrap_servers=broker.bootstrap)  # defaults: idempotent, acks=all
    futs = [
        p.send("kp", value=f"v{i}".encode(), partition=i % 3, timestamp_ms=TS0 + i)
        for i in range(3000)
    ]
    p.flush()
    metas = [f.get(10) for f in futs]
    assert {(m.partition, m.offset) for m in metas} == {(i % 3, i // 3) for i in range(3000)}
    p.close()
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=3000)
    tps = [KTP("kp", i) for i in range(3)]
    c.assign(tps)
    c.seek_to_beginning()
    got = [(m.partition, m.offset, m.value) for m in c]
    assert len(got) == 3000
    assert c.end_offsets(tps) == {tp: 1000 for tp in tps}
    when = c.offsets_for_times({tps[0]: TS0 + 1500})
    assert when[tps[0]].offset == 500
    c.seek_to_end(tps[1])
    assert c.position(tps[1]) == 1000
    c.close()


def test_idempotent_producer_writes_no_duplicates(broker):
    create_topic(broker.bootstrap, "idem", 1)
    acked = produce_confluent(
        broker.bootstrap,
        "idem",
        [(0, str(i).encode()) for i in range(5000)],
        **{"enable.idempotence": True},
    )
    got = consume_confluent(broker.bootstrap, [TopicPartition("idem", 0, 0)], 5000)
    assert [v for _, _, v in got] == [str(i).encode() for i in range(5000)]
    assert len(acked) == 5000


def test_restart_keeps_data(broker_factory):
    b = broker_factory()
    create_topic(b.bootstrap, "keep", 2)
    acked = produce_confluent(b.bootstrap, "keep", [(i % 2, str(i).encode()) for i in range(4000)])
    b.stop()
    b.start()
    got = consume_confluent(b.bootstrap, [TopicPartition("keep", p, 0) for p in range(2)], 4000)
    assert sorted(got) == sorted(acked)
    assert "stopped cleanly" in b.log_text()


def test_kill9_during_writes_recovers_to_a_clean_prefix(broker_factory):
    b = broker_factory({"log.segment.bytes": "200000"})
    create_topic(b.bootstrap, "crash", 1)
    acked: list[tuple[int, bytes]] = []
    stop = threading.Event()

    def writer() -> None:
        p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "linger.ms": 1,
                "acks": 1,
                "message.timeout.ms": 3000,
            }
        )

        def cb(err, msg):  # type: ignore[no-untyped-def]
            if not err:
                acked.append((msg.offset(), msg.value()))

        i = 0
        while not stop.is_set():
            try:
                p.produce("crash", value=f"{i:08d}".encode(), partition=0, on_delivery=cb)
                i += 1
            except BufferError:
                pass
            p.poll(0)
        p.flush(5)

    t = threading.Thread(target=writer)
    t.start()
    deadline = time.monotonic() + 20
    while len(acked) < 20000 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.kill9()
    stop.set()
    t.join()
    assert len(acked) >= 1000
    b.start()
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "c"})
    _low, high = c.get_watermark_offsets(TopicPartition("crash", 0), timeout=10)
    c.close()
    got = consume_confluent(b.bootstrap, [TopicPartition("crash", 0, 0)], high)
    offsets = [o for _, o, _ in got]
    assert offsets == list(range(high)), "the recovered log is a dense prefix"
    values = [v for _, _, v in got]
    assert len(set(values)) == len(values)
    # kill -9 keeps the page cache: every acknowledged record survived, at its acked offset
    stored = dict((o, v) for _, o, v in got)
    for offset, value in acked:
        assert stored.get(offset) == value


def test_retention_advances_log_start_offset(broker_factory):
    b = broker_factory({"log.retention.check.interval.ms": "300"})
    create_topic(b.bootstrap, "short", 1, {"segment.bytes": "20000", "retention.bytes": "40000"})
    produce_confluent(
        b.bootstrap, "short", [(0, b"r" * 100) for _ in range(3000)], **{"batch.size": 8000}
    )
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ret"})
    deadline = time.monotonic() + 20
    low = high = 0
    while time.monotonic() < deadline:
        low, high = c.get_watermark_offsets(TopicPartition("short", 0), timeout=10)
        if low > 0:
            break
        time.sleep(0.3)
    c.close()
    assert high == 3000
    assert 0 < low < high, "old segments were deleted and the log start offset moved"
    # Retention may trim further meanwhile: reading from the earliest offset starts at or past
    # the start seen above, and what is read is dense up to the end.
    got = consume_confluent(b.bootstrap, [TopicPartition("short", 0, -2)], 1)
    assert got[0][1] >= low
    rest = consume_confluent(b.bootstrap, [TopicPartition("short", 0, got[0][1])], high - got[0][1])
    assert [o for _, o, _ in rest] == list(range(got[0][1], high))


def test_dump_log_cli_prints_batches_and_index(broker_factory):
    import subprocess
    import sys

    b = broker_factory({"log.index.interval.bytes": "1000"})
    create_topic(b.bootstrap, "dump", 1)
    produce_confluent(
        b.bootstrap, "dump", [(0, b"d" * 100) for _ in range(500)], **{"batch.size": 2000}
    )
    b.stop()
    seg = b.log_dir / "dump-0" / "00000000000000000000.log"
    idx = seg.with_suffix(".index")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "isrlab.broker",
            "dump-log",
            "--files",
            str(seg),
            "--files",
            str(idx),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "baseOffset: 0" in out and "isvalid: true" in out
    assert "offset:" in out and "position:" in out  # sparse index entries
    bad = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "dump-log", "--files", str(seg) + ".missing"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_unknown_config_key_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "server.properties"
    cfg.write_text("broker.id=1\nlog.retention.hourz=5\n")
    r = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "start", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "log.retention.hourz" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "start", "-o", "num.partitions=zero"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "num.partitions" in r.stderr
