"""Helpers for the log cleaner tests: keyed batches, reading a log back record by record, and a
model of what compaction must keep."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.log.cleaner import CleanerConfig, LogCleaner
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.record_batch import iter_batches

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
