"""Record batches for the log tests, built with kafka-python's own v2 batch builder."""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecordsBuilder


def make_batch(
    count: int = 3,
    *,
    timestamp: int = 1_000,
    value_size: int = 10,
    tag: int = 0,
    producer_id: int = -1,
    transactional: bool = False,
) -> bytes:
    """One v2 batch of ``count`` records with timestamps ``timestamp .. timestamp+count-1``.

    ``tag`` goes into every value so batches with the same shape have different bytes.
    """
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 24,
        transactional=transactional,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
    )
    for i in range(count):
        value = f"{tag}:{i}:".encode().ljust(value_size, b"v")
        assert builder.append(timestamp + i, f"k{i}".encode(), value) is not None
    builder.close()
    return bytes(builder.buffer())


def decode_values(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a buffer of batches."""
    from isrlab.broker.log.record_batch import iter_batches

    out: list[tuple[int, bytes]] = []
    for header in iter_batches(data):
        batch = DefaultRecordBatch(data[header.position : header.end_position])
        for record in batch:
            assert record.value is not None
            out.append((record.offset, record.value))
    return out
