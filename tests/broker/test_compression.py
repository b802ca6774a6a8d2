"""Compressed batches from real clients are stored as the client compressed them and read back.

librdkafka decides per broker whether it may compress: librdkafka before 2.11 disables gzip,
snappy and lz4 unless the broker's ApiVersions lists Produce version 0 (it checks the range 0..0,
KAFKA-18659), so a broker advertising Produce 3+ silently receives those codecs uncompressed.
The broker advertises Produce from version 0, as Kafka 4.0 does, while it still decodes only v3+.
kcat here links librdkafka 2.0.2 (the older rule); confluent-kafka bundles a newer one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from isrlab.broker.log.record_batch import COMPRESSION_NAMES, check_crc, iter_batches
from tests.broker.rawclient import RawClient, fetch_request
from tests.broker.test_compaction_live import wait_for_cleaning

pytestmark = pytest.mark.integration

CODECS = ["gzip", "snappy", "lz4", "zstd"]
# compressible values, so no client falls back to an uncompressed batch for size
VALUES = [(f"value-{i:04d} " * 20).encode() for i in range(50)]


def stored_batches(log_dir: Path, topic: str) -> bytes:
    segments = sorted((log_dir / f"{topic}-0").glob("*.log"))
    return b"".join(s.read_bytes() for s in segments)


def codecs_of(data: bytes) -> list[str]:
    out = []
    for header in iter_batches(data):
        check_crc(data, header)
        out.append(COMPRESSION_NAMES[header.compression_type])
    return out


def fetched_bytes(port: int, topic: str) -> bytes:
    client = RawClient(port)
    try:
        p = client.call(fetch_request(topic)).responses[0].partitions[0]
        assert p.error_code == 0
        return bytes(p.records or b"")
    finally:
        client.close()


def consume_values(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    try:
        for _ in range(60):
            for m in c.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                out.append(m.value())
            if len(out) >= expect:
                break
    finally:
        c.close()
    return out


def check_stored_verbatim(broker, topic: str, codec: str) -> None:  # type: ignore[no-untyped-def]
    stored = stored_batches(broker.log_dir, topic)
    assert stored, "nothing was stored"
    assert set(codecs_of(stored)) == {codec}
    # a fetch returns the batches exactly as stored (no decompression, no recompression)
    assert fetched_bytes(broker.port, topic) == stored
    assert consume_values(broker.bootstrap, topic, len(VALUES)) == VALUES


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_batches_are_stored_compressed_and_read_back(broker, codec) -> None:  # type: ignore[no-untyped-def]
    topic = f"c-{codec}"
    p = Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 50}
    )
    for v in VALUES:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    check_stored_verbatim(broker, topic, codec)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_batches_are_stored_compressed_and_read_back(broker, codec) -> None:  # type: ignore[no-untyped-def]
    topic = f"k-{codec}"
    run = subprocess.run(
        [
            "kcat",
            "-P",
            "-b",
            broker.bootstrap,
            "-t",
            topic,
            "-p",
            "0",
            "-z",
            codec,
            "-X",
            "linger.ms=200",
        ],
        input=b"\n".join(VALUES) + b"\n",
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert b"does not support compression" not in run.stderr
    check_stored_verbatim(broker, topic, codec)


def test_api_versions_lists_produce_from_version_0_but_v0_to_v2_are_refused(broker) -> None:  # type: ignore[no-untyped-def]
    from kafka.protocol.metadata import ApiVersionsRequest

    client = RawClient(broker.port)
    try:
        resp = client.call(ApiVersionsRequest[0]())
        produce = next(k for k in resp.api_keys if k.api_key == 0)
        assert produce.min_version == 0
        assert produce.max_version >= 9
        # a Produce v2 frame (removed in Kafka 4.0 as here): the connection is closed
        client.send_frame(b"\x00\x00\x00\x02\x00\x00\x00\x07\xff\xff\x00\x01\x00\x00\x03\xe8")
        assert client.is_closed()
    finally:
        client.close()
    assert "Produce v2" in broker.log_text()


@pytest.mark.parametrize("codec", CODECS)
def test_dump_log_prints_the_records_of_every_codec(broker, codec) -> None:  # type: ignore[no-untyped-def]
    topic = f"d-{codec}"
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec})
    for v in VALUES[:5]:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    segments = sorted(str(s) for s in (broker.log_dir / f"{topic}-0").glob("*.log"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "isrlab.broker",
            "dump-log",
            "--print-data-log",
            "--files",
            *segments,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert f"compresscodec: {codec}" in run.stdout
    assert "cannot decode" not in run.stdout
    assert VALUES[4].decode() in run.stdout


@pytest.mark.parametrize("codec", CODECS)
def test_the_cleaner_compacts_compressed_batches_and_keeps_their_codec(  # type: ignore[no-untyped-def]
    broker_factory, codec
) -> None:
    broker = broker_factory({"log.cleaner.backoff.ms": "100"})
    topic = f"compact-{codec}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "4096",
        "min.cleanable.dirty.ratio": "0.01",
    }
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5})
    latest: dict[bytes, bytes] = {}
    for n in range(2000):
        key, value = b"key-%d" % (n % 10), b"value-%05d " % n * 4
        p.produce(topic, value, key, partition=0)
        latest[key] = value
        if n % 100 == 99:
            p.flush(30)
    assert p.flush(30) == 0
    wait_for_cleaning(broker.log_dir, at_least=1000, tp=(topic, 0))
    stored = stored_batches(broker.log_dir, topic)
    assert set(codecs_of(stored)) == {codec}  # rewritten batches keep the producer's codec
    c = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[bytes, bytes]] = []
    for _ in range(60):
        batch = c.consume(1000, timeout=0.5)
        got += [(m.key(), m.value()) for m in batch if m.error() is None]
        if not batch and got:
            break
    c.close()
    assert len(got) < 2000  # compacted
    seen = dict(got)
    assert seen == latest
