"""The log cleaner's record-level work: reading keys out of a batch's records and filtering them.

A v2 batch's records follow its 61-byte header (decompressed first if the batch is
compressed), each one::

    length          varint   bytes after this field
    attributes      int8     unused
    timestampDelta  varlong  from the batch's baseTimestamp
    offsetDelta     varint   from the batch's baseOffset
    keyLength       varint   -1: no key
    key             bytes
    valueLength     varint   -1: null value, a tombstone
    value           bytes
    headers         varint count, then the headers

The cleaner needs only a record's extent, key, offset and whether its value is null, so records
are copied byte for byte: a kept record is the very bytes the producer sent. ``OffsetMap``,
``map_records`` and ``filter_records`` have a compiled twin (``_cleaner_scan.pyx``, built like
the queue checker's screen) that this module uses when it is built;
tests/log/test_cleaner_records.py holds both to the same answers. Malformed records raise ValueError; the cleaner then keeps the
batch as it is.
"""

from __future__ import annotations

import struct
from collections.abc import Callable


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (or varlong) at ``pos``: (value, position after it)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes before position {pos}")


def encode_varint(value: int) -> bytes:
    """Zig-zag encode a signed 64-bit value as Kafka's varlong."""
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _record(buf: bytes, pos: int, end: int) -> tuple[int, int, int, bytes | None, bool, int]:
    """(record end, offsetDelta, timestampDelta, key, value is null, position of the
    timestampDelta) of the record at ``pos``."""
    try:
        length, p = _varint(buf, pos)
        record_end = p + length
        if length < 6 or record_end > end:
            raise ValueError(f"record at position {pos} has length {length} past the batch end")
        ts_position = p + 1  # after the attributes byte
        ts_delta, p = _varint(buf, ts_position)
        offset_delta, p = _varint(buf, p)
        key_length, p = _varint(buf, p)
        key: bytes | None = None
        if key_length >= 0:
            key = buf[p : p + key_length]
            p += key_length
        elif key_length != -1:
            raise ValueError(f"record at position {pos} has key length {key_length}")
        value_length, p = _varint(buf, p)
        if p > record_end or value_length < -1 or p + max(value_length, 0) > record_end:
            raise ValueError(f"record at position {pos} overruns its length {length}")
    except IndexError:
        raise ValueError(f"record at position {pos} is cut short") from None
    return record_end, offset_delta, ts_delta, key, value_length < 0, ts_position


class PyOffsetMap:
    """Key -> offset of its latest record, and whether that record is a tombstone (Kafka's
    OffsetMap). This one holds the keys themselves; the compiled twin holds a 64-bit hash of
    each key (Python's own, SipHash, seeded per process) as Kafka's SkimpyOffsetMap holds an
    MD5: two keys with the same hash would count as one, a chance of about n^2 / 2^65 for n
    keys."""

    def __init__(self) -> None:
        self._offsets: dict[bytes, int] = {}
        self._tombstones: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._offsets)

    def put(self, key: bytes, offset: int, tombstone: bool) -> None:
        self._offsets[key] = offset
        if tombstone:
            self._tombstones.add(key)
        else:
            self._tombstones.discard(key)

    def get(self, key: bytes) -> int | None:
        """The offset of ``key``'s latest record, or None."""
        return self._offsets.get(key)

    def is_tombstone(self, key: bytes) -> bool:
        """Is ``key``'s latest mapped record a tombstone?"""
        return key in self._tombstones


def py_map_records(buf: bytes, start: int, end: int, base_offset: int, offsets: PyOffsetMap) -> int:
    """Put every keyed record of ``buf[start:end]`` into ``offsets`` (later records win);
    returns how many records there were."""
    pos = start
    count = 0
    while pos < end:
        record_end, offset_delta, _, key, null_value, _ = _record(buf, pos, end)
        if key is not None:
            offsets.put(key, base_offset + offset_delta, null_value)
        count += 1
        pos = record_end
    return count


def py_filter_records(
    buf: bytes,
    start: int,
    end: int,
    base_offset: int,
    offsets: PyOffsetMap,
    drop_tombstones: bool,
) -> tuple[bytes, int, int]:
    """The records of ``buf[start:end]`` the cleaner keeps: (their bytes, how many, how many of
    them are tombstones).

    A record goes when the map holds a later offset for its key, or when it is a tombstone and
    ``drop_tombstones`` (its batch's delete horizon passed) and no later record replaced it.
    Records without a key are kept (a compacted topic's producers always send keys; the
    cleaner never drops what it cannot place).
    """
    kept: list[bytes] = []
    kept_count = 0
    tombstones = 0
    pos = start
    run_start = start  # a run of consecutive kept records is copied in one slice
    while pos < end:
        record_end, offset_delta, _, key, null_value, _ = _record(buf, pos, end)
        keep = True
        if key is not None:
            latest = offsets.get(key)
            offset = base_offset + offset_delta
            if (latest is not None and latest > offset) or (null_value and drop_tombstones):
                keep = False
        if keep:
            kept_count += 1
            if null_value:
                tombstones += 1
        else:
            if run_start < pos:
                kept.append(buf[run_start:pos])
            run_start = record_end
        pos = record_end
    if run_start < end:
        kept.append(buf[run_start:end])
    return b"".join(kept), kept_count, tombstones


_BATCH = struct.Struct(">qi4xbIhi16xq6xi")  # baseOffset, batchLength, magic, crc, attributes,
# lastOffsetDelta, producerId, recordsCount: the header fields the map pass reads


def py_map_batches(
    data: bytes, offsets: PyOffsetMap, last_batches: dict[int, int]
) -> tuple[int, int]:
    """The offset-map pass over the whole batches at the start of ``data`` (a segment read):
    maps the records of every uncompressed data batch and notes the last offset of each
    producer id's last batch. Stops before a batch that is cut short, malformed or compressed
    (the caller takes it); returns (bytes consumed, records mapped)."""
    pos = 0
    end = len(data)
    mapped = 0
    while pos + 61 <= end:
        base_offset, batch_length, magic, _, attributes, last_delta, producer_id, count = (
            _BATCH.unpack_from(data, pos)
        )
        size = batch_length + 12
        if batch_length < 49 or pos + size > end or magic != 2:
            break
        if count < 1 or last_delta < 0 or attributes & 0x07:
            break
        if producer_id >= 0:
            last_batches[producer_id] = base_offset + last_delta
        if not attributes & 0x20:
            try:
                mapped += py_map_records(data, pos + 61, pos + size, base_offset, offsets)
            except ValueError:
                pass  # malformed records: the rewrite keeps this batch whole
        pos += size
    return pos, mapped


_FILTER = struct.Struct(">qi4xbIhiq8xq6xi")  # ... baseTimestamp too


def py_filter_batches(
    data: bytes,
    offsets: PyOffsetMap,
    last_batches: dict[int, int],
    now_ms: int,
    crc: Callable[[memoryview], int],
) -> tuple[int, bytes, int, int, int]:
    """The rewrite pass over the whole batches at the start of ``data`` (a segment read):
    (bytes consumed, the batches kept, records read, records kept, batches rewritten).

    A batch whose records all stay is copied; one that loses some is rewritten with the same
    header but its batchLength, recordsCount and CRC; one that loses all goes, except the last
    batch of a producer (``last_batches``: producer id -> last offset of its last batch) none
    of whose keys ends in a tombstone, kept whole. Tombstones go when the batch's delete
    horizon (KIP-534) passed. Stops before a batch the caller must take: cut short, malformed
    (structure, CRC per ``crc``, records), compressed, control, or keeping a tombstone with no
    delete horizon yet (the caller stamps one).
    """
    pos = 0
    end = len(data)
    out = bytearray()
    records_read = records_kept = rewritten = 0
    view = memoryview(data)
    while pos + 61 <= end:
        fields = _FILTER.unpack_from(data, pos)
        base_offset, batch_length, magic, stored_crc, attributes, last_delta = fields[:6]
        base_timestamp, producer_id, count = fields[6:]
        size = batch_length + 12
        if batch_length < 49 or pos + size > end or magic != 2:
            break
        if count < 1 or last_delta < 0 or attributes & 0x27:
            break
        if crc(view[pos + 21 : pos + size]) != stored_crc:
            break
        drop = bool(attributes & 0x40) and now_ms >= base_timestamp
        try:
            kept, kept_count, tombstones = py_filter_records(
                data, pos + 61, pos + size, base_offset, offsets, drop
            )
            tombstoned = any_key_tombstoned(data, pos + 61, pos + size, offsets)
        except ValueError:
            break
        if tombstones and not attributes & 0x40:
            break
        records_read += count
        last_offset = base_offset + last_delta
        if kept_count == count:
            out += view[pos : pos + size]
            records_kept += count
        elif kept_count == 0:
            if (
                producer_id >= 0
                and last_batches.get(producer_id, last_offset) == last_offset
                and not tombstoned
            ):
                out += view[pos : pos + size]
                records_kept += count
        else:
            batch = bytearray(view[pos : pos + 61]) + kept
            struct.pack_into(">i", batch, 8, len(batch) - 12)
            struct.pack_into(">i", batch, 57, kept_count)
            struct.pack_into(">I", batch, 17, crc(memoryview(batch)[21:]))
            out += batch
            records_kept += kept_count
            rewritten += 1
        pos += size
    view.release()
    return pos, bytes(out), records_read, records_kept, rewritten


def py_first_keyless(buf: bytes, start: int, end: int) -> int:
    """The offset delta of the first record of ``buf[start:end]`` without a key, or -1."""
    pos = start
    while pos < end:
        record_end, offset_delta, _, key, _, _ = _record(buf, pos, end)
        if key is None:
            return offset_delta
        pos = record_end
    return -1


def any_key_tombstoned(buf: bytes, start: int, end: int, offsets: PyOffsetMap) -> bool:
    """Does a record of ``buf[start:end]`` have a key whose latest mapped record is a tombstone?"""
    pos = start
    while pos < end:
        record_end, _, _, key, _, _ = _record(buf, pos, end)
        if key is not None and offsets.is_tombstone(key):
            return True
        pos = record_end
    return False


def rebase_timestamps(buf: bytes, old_base: int, new_base: int) -> bytes:
    """Re-encode every record of ``buf`` (records only) so its timestampDelta is relative to
    ``new_base`` instead of ``old_base``: its absolute timestamp stays the same. Used when the
    cleaner stores a delete horizon in a batch's baseTimestamp (KIP-534)."""
    out = bytearray()
    pos = 0
    end = len(buf)
    while pos < end:
        record_end, _, ts_delta, _, _, ts_position = _record(buf, pos, end)
        _, after_ts = _varint(buf, ts_position)
        body = (
            buf[ts_position - 1 : ts_position]
            + encode_varint(old_base + ts_delta - new_base)
            + buf[after_ts:record_end]
        )
        out += encode_varint(len(body))
        out += body
        pos = record_end
    return bytes(out)


OffsetMap = PyOffsetMap
map_records = py_map_records
map_batches = py_map_batches
filter_batches = py_filter_batches
filter_records = py_filter_records
first_keyless = py_first_keyless
NATIVE = False
try:
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        OffsetMap as _NativeOffsetMap,
    )
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        filter_batches as _native_filter_batches,
    )
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        filter_records as _native_filter,
    )
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        first_keyless as _native_first_keyless,
    )
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        map_batches as _native_map_batches,
    )
    from isrlab.broker.log._cleaner_scan import (  # type: ignore[import-not-found,unused-ignore]
        map_records as _native_map,
    )
except ImportError:  # not built (no compiler, or the node wheel): the Python twins above
    pass
else:
    OffsetMap = _NativeOffsetMap  # type: ignore[misc,assignment,unused-ignore]
    map_records = _native_map  # type: ignore[assignment,unused-ignore]
    filter_records = _native_filter  # type: ignore[assignment,unused-ignore]
    first_keyless = _native_first_keyless  # type: ignore[assignment,unused-ignore]
    map_batches = _native_map_batches  # type: ignore[assignment,unused-ignore]
    filter_batches = _native_filter_batches  # type: ignore[assignment,unused-ignore]
    NATIVE = True


__all__ = [
    "NATIVE",
    "OffsetMap",
    "PyOffsetMap",
    "any_key_tombstoned",
    "encode_varint",
    "filter_batches",
    "filter_records",
    "first_keyless",
    "map_batches",
    "map_records",
    "py_filter_batches",
    "py_filter_records",
    "py_first_keyless",
    "py_map_batches",
    "py_map_records",
    "rebase_timestamps",
]
