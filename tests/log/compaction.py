"""Helpers for the log cleaner tests: keyed batches, reading a log back record by record, and a
model of what compaction must keep."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.log.cleaner import CleanerConfig, LogCleaner
from isrlab.broker.log.cleaner_records import encode_varint
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.record_batch import HEADER, HEADER_SIZE, iter_batches

Record = tuple[bytes | None, bytes | None]  # (key, value); a None value is a tombstone


def keyed_batch(
    records: Iterable[Record],
    *,
    timestamp: int = 1_000,
    producer_id: int = -1,
    base_sequence: int = 0,
    compression: int = 0,
) -> bytes:
    """One v2 batch holding ``records`` (timestamps ``timestamp``, ``timestamp``+1, ...)."""
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=compression,
        batch_size=1 << 24,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence if producer_id >= 0 else -1,
    )
    for i, (key, value) in enumerate(records):
        assert builder.append(timestamp + i, key, value) is not None
    builder.close()
    return bytes(builder.buffer())


def compact_config(**overrides: object) -> LogConfig:
    """A small compacted log: 2 kB segments, indexes every 200 bytes, no file delete delay."""
    values: dict[str, object] = {
        "segment_bytes": 2_000,
        "index_interval_bytes": 200,
        "file_delete_delay_ms": 0,
        "cleanup_policy": ("compact",),
        "min_cleanable_dirty_ratio": 0.0,
        "delete_retention_ms": 1_000,
    }
    values.update(overrides)
    return LogConfig(**values)  # type: ignore[arg-type]


def read_all(
    log: Log, start: int | None = None
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record a consumer fetching from ``start`` (the
    log start offset by default) gets, as Log.read hands out batches, in fetch-sized steps."""
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        data = log.read(offset, 64 * 1024).read_bytes()
        assert data, f"a fetch at {offset} below the log end {log.log_end_offset} returned nothing"
        for header in iter_batches(data):
            batch = DefaultRecordBatch(data[header.position : header.end_position])
            for record in batch:
                if record.offset >= offset:
                    out.append((record.offset, record.key, record.value, record.timestamp))
            offset = max(offset, header.next_offset)
    return out


def cleaner_for(
    directory: Path, logs: dict[tuple[str, int], Log], clock: object, **kw: object
) -> LogCleaner:
    return LogCleaner(
        directory,
        CleanerConfig(dedupe_buffer_size=kw.pop("dedupe_buffer_size", 1 << 24)),  # type: ignore[arg-type]
        logs=lambda: logs,
        clock=clock,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def fast_keyed_batch(records: list[tuple[bytes, bytes | None]], timestamp: int = 1_000) -> bytes:
    """The same v2 batch as ``keyed_batch`` (no producer id, uncompressed), built directly: fast
    enough for the million-record topics of the acceptance test and the benchmark."""
    body = bytearray()
    for i, (key, value) in enumerate(records):
        record = bytearray(b"\x00")  # attributes
        record += encode_varint(i)  # timestampDelta
        record += encode_varint(i)  # offsetDelta
        record += encode_varint(len(key)) + key
        record += encode_varint(-1) if value is None else encode_varint(len(value)) + value
        record += b"\x00"  # no headers
        body += encode_varint(len(record)) + record
    count = len(records)
    batch = bytearray(HEADER_SIZE) + body
    HEADER.pack_into(
        batch, 0, 0, len(batch) - 12, -1, 2, 0, 0, count - 1, timestamp,
        timestamp + count - 1, -1, -1, -1, count,
    )  # fmt: skip
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def fill_keyed(
    log: Log, records: int, keys: int, *, value_size: int = 50, per_batch: int = 100
) -> dict[bytes, tuple[int, bytes]]:
    """Append ``records`` records cycling over ``keys`` keys (value ``<n>:`` padded to
    ``value_size`` bytes); returns the latest (offset, value) of every key."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for start in range(0, records, per_batch):
        batch = [
            (b"key-%08d" % (n % keys), (b"%d:" % n).ljust(value_size, b"v"))
            for n in range(start, min(start + per_batch, records))
        ]
        first = log.append_as_leader(fast_keyed_batch(batch), 0).first_offset
        for i, (key, value) in enumerate(batch):
            latest[key] = (first + i, value)
    return latest
