"""Control records: transaction markers (Kafka's ControlRecordType and EndTransactionMarker).

A transaction marker is a RecordBatch v2 with the transactional and control attributes set,
the producer id and epoch of the transaction, base sequence -1, and exactly one record:

- key: ``version`` int16 (0) + ``type`` int16 (0 = ABORT, 1 = COMMIT);
- value: EndTransactionMarker ``version`` int16 (0) + ``coordinator epoch`` int32.

The partition leader stores the batch as it gets it from the transaction coordinator
(WriteTxnMarkers), stamping only its offset and leader epoch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from crc32c import crc32c

from isrlab.broker.log.errors import InvalidRecordError
from isrlab.broker.log.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_MASK,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    TRANSACTIONAL_MASK,
    BatchHeader,
    ByteBuffer,
)

CONTROL_KEY = struct.Struct(">hh")
END_TXN_MARKER = struct.Struct(">hi")
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """A decoded transaction marker."""

    commit: bool
    coordinator_epoch: int

    @property
    def type_name(self) -> str:
        return "COMMIT" if self.commit else "ABORT"


def _varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's ByteUtils.writeVarint/writeVarlong)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise InvalidRecordError("control record: varint cut short or too long")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), pos


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """One transaction-marker batch (offset 0, leader epoch -1: the log stamps both)."""
    key = CONTROL_KEY.pack(
        CONTROL_KEY_VERSION, ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    )
    value = END_TXN_MARKER.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    body = (
        b"\x00"  # record attributes
        + _varint(0)  # timestamp delta
        + _varint(0)  # offset delta
        + _varint(len(key))
        + key
        + _varint(len(value))
        + value
        + _varint(0)  # headers
    )
    record = _varint(len(body)) + body
    attributes = TRANSACTIONAL_MASK | CONTROL_MASK
    header = bytearray(
        HEADER.pack(
            0,  # base offset
            HEADER_SIZE - LOG_OVERHEAD + len(record),  # batch length
            -1,  # partition leader epoch
            MAGIC_V2,
            0,  # crc, filled below
            attributes,
            0,  # last offset delta
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            -1,  # base sequence
            1,  # records count
        )
    )
    batch = header + record
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[ATTRIBUTES_OFFSET:])))
    return bytes(batch)


def read_control_record(buf: ByteBuffer, header: BatchHeader) -> tuple[int, bytes, bytes]:
    """(control type, key, value) of the first record of the control batch at ``header``."""
    if not header.is_control:
        raise InvalidRecordError(f"batch at offset {header.base_offset} is not a control batch")
    if header.compression_type != 0:
        raise InvalidRecordError(
            f"control batch at offset {header.base_offset} is compressed; markers never are"
        )
    data = bytes(memoryview(buf)[header.position + HEADER_SIZE : header.end_position])
    _length, pos = _read_varint(data, 0)
    pos += 1  # attributes
    _ts, pos = _read_varint(data, pos)
    _od, pos = _read_varint(data, pos)
    klen, pos = _read_varint(data, pos)
    if klen < CONTROL_KEY.size or pos + klen > len(data):
        raise InvalidRecordError(
            f"control batch at offset {header.base_offset}: key of {klen} bytes is too short"
        )
    key = data[pos : pos + klen]
    pos += klen
    vlen, pos = _read_varint(data, pos)
    value = b"" if vlen < 0 else data[pos : pos + vlen]
    if vlen > 0 and pos + vlen > len(data):
        raise InvalidRecordError(f"control batch at offset {header.base_offset}: value cut short")
    _version, ctype = CONTROL_KEY.unpack_from(key)
    return ctype, key, value


def parse_end_txn_marker(buf: ByteBuffer, header: BatchHeader) -> EndTxnMarker | None:
    """The transaction marker of a control batch, or None for another control record type
    (Kafka skips unknown control types). InvalidRecordError if the record is malformed."""
    ctype, _key, value = read_control_record(buf, header)
    if ctype not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        return None
    if len(value) < END_TXN_MARKER.size:
        raise InvalidRecordError(
            f"transaction marker at offset {header.base_offset}: value of {len(value)} bytes "
            f"is shorter than the {END_TXN_MARKER.size}-byte EndTransactionMarker"
        )
    _version, coordinator_epoch = END_TXN_MARKER.unpack_from(value)
    return EndTxnMarker(ctype == ControlRecordType.COMMIT, coordinator_epoch)
