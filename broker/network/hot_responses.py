"""Hand-written encoders of the two hottest responses, Produce (v3-v9) and Fetch (v4-v12).

Building kafka-python's response objects (one per topic and partition, each through the
schema's generic constructor) costs more than the rest of an empty fetch. These write the same
bytes straight from tuples; tests/broker/test_codec_fast.py holds them byte for byte to
kafka-python's encoding of the same response (`encode_response_reference`) on every version the
broker advertises, with hypothesis-generated contents. Fields the broker never sets are written
as kafka-python writes their defaults (no tagged fields, log_append_time_ms -1,
preferred_read_replica -1). Both return the parts `encode_response` returns: the size prefix and
header included, a Fetch's records either bytes or the file regions to send with sendfile.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from isrlab.broker.network.codec import FileRegion

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ii")
_I32_I16_I32 = struct.Struct(">ihi")
_PART_PRODUCE = struct.Struct(">ihqq")  # index, error, base offset, log append time
_PART_FETCH = struct.Struct(">ihq")  # index, error, high watermark
_I64 = struct.Struct(">q")
_I64_I64 = struct.Struct(">qq")

#: (index, error code, base offset, log start offset, record errors, error message)
ProducePartition = tuple[int, int, int, int, Sequence[tuple[int, str | None]], str | None]
#: (index, error code, high watermark, last stable offset, log start offset,
#:  aborted transactions (producer id, first offset) or None, records)
FetchPartition = tuple[
    int,
    int,
    int,
    int,
    int,
    Sequence[tuple[int, int]] | None,
    bytes | bytearray | memoryview | list[FileRegion] | None,
]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_UVARINTS = [_uvarint(i) for i in range(128)]


def _varlen(n: int) -> bytes:
    return _SMALL_UVARINTS[n] if n < 128 else _uvarint(n)


def _string(out: bytearray, value: str, flexible: bool) -> None:
    raw = value.encode()
    out += _varlen(len(raw) + 1) if flexible else _I16.pack(len(raw))
    out += raw


def _nullable_string(out: bytearray, value: str | None, flexible: bool) -> None:
    if value is None:
        out += b"\x00" if flexible else b"\xff\xff"
    else:
        _string(out, value, flexible)


def _array_len(out: bytearray, n: int, flexible: bool) -> None:
    out += _varlen(n + 1) if flexible else _I32.pack(n)


def encode_produce_response(
    version: int, correlation_id: int, topics: Sequence[tuple[str, Sequence[ProducePartition]]]
) -> list[bytes | FileRegion]:
    """ProduceResponse v3-v9 (flexible from v9), throttle time 0."""
    flexible = version >= 9
    out = bytearray(_HEAD.pack(0, correlation_id))
    if flexible:
        out.append(0)
    _array_len(out, len(topics), flexible)
    for name, parts in topics:
        _string(out, name, flexible)
        _array_len(out, len(parts), flexible)
        for index, error, base_offset, log_start, record_errors, message in parts:
            out += _PART_PRODUCE.pack(index, error, base_offset, -1)
            if version >= 5:
                out += _I64.pack(log_start)
            if version >= 8:
                _array_len(out, len(record_errors), flexible)
                for batch_index, batch_message in record_errors:
                    out += _I32.pack(batch_index)
                    _nullable_string(out, batch_message, flexible)
                    if flexible:
                        out.append(0)
                _nullable_string(out, message, flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += b"\x00\x00\x00\x00"  # throttle_time_ms
    if flexible:
        out.append(0)
    _I32.pack_into(out, 0, len(out) - 4)
    return [bytes(out)]


def encode_fetch_response(
    version: int, correlation_id: int, topics: Sequence[tuple[str, Sequence[FetchPartition]]]
) -> list[bytes | FileRegion]:
    """FetchResponse v4-v12 (flexible from v12), throttle time 0, error 0, session 0 (no
    fetch sessions). A partition's records are bytes, None (null) or a list of file regions
    sent with sendfile (the length prefix is their total)."""
    flexible = version >= 12
    parts: list[bytes | FileRegion] = []
    out = bytearray(_HEAD.pack(0, correlation_id))
    if flexible:
        out.append(0)
    out += b"\x00\x00\x00\x00"  # throttle_time_ms
    if version >= 7:
        out += _I16.pack(0) + _I32.pack(0)  # error_code, session_id
    _array_len(out, len(topics), flexible)
    size = 0  # bytes of the response before `out`, file regions included
    for name, partitions in topics:
        _string(out, name, flexible)
        _array_len(out, len(partitions), flexible)
        for index, error, hw, lso, log_start, aborted, records in partitions:
            out += _PART_FETCH.pack(index, error, hw)
            out += _I64_I64.pack(lso, log_start) if version >= 5 else _I64.pack(lso)
            if aborted is None:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                _array_len(out, len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    out += _I64_I64.pack(producer_id, first_offset)
                    if flexible:
                        out.append(0)
            if version >= 11:
                out += b"\xff\xff\xff\xff"  # preferred_read_replica
            if records is None:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            elif isinstance(records, list):
                n = sum(r.size for r in records)
                out += _varlen(n + 1) if flexible else _I32.pack(n)
                parts.append(bytes(out))
                parts.extend(records)
                size += len(out) + n
                out = bytearray()
            else:
                n = len(records)
                out += _varlen(n + 1) if flexible else _I32.pack(n)
                out += records
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    if flexible:
        out.append(0)
    total = size + len(out) - 4
    if parts:
        first = parts[0]
        assert isinstance(first, bytes)
        parts[0] = _I32.pack(total) + first[4:]
        parts.append(bytes(out))
        return parts
    _I32.pack_into(out, 0, total)
    return [bytes(out)]
