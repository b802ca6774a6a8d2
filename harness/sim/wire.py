"""The simulated client's hot requests, encoded and decoded by hand (issue 18's speed).

`harness/sim/client.py` sends a Produce v8 per batch and a Fetch v11 per poll and leader, and
reads the records of every fetched batch. Built and read through kafka-python's generic
schemas (an object per topic and partition, a generated decoder per version, a record object
per record) they cost the simulator about a tenth of its CPU; these do the same from tuples,
as the broker's own `broker/network/hot_responses.py` and `replica_fetch.py` do on its side.
ListOffsets (a consumer's log start lookups and the sampled watermarks: after Produce and
Fetch the most frequent) is done here too; the rarer requests (Metadata, InitProducerId, the
groups' and transactions') stay on kafka-python's classes.

tests/sim/test_client_wire.py holds every function here to kafka-python: the requests byte for
byte (`ProduceRequest[8]`, `FetchRequest[11]` with their v1 headers, framed), the responses
field for field (`ProduceResponse[8]`, `FetchResponse[11]` as kafka-python encodes them), the
records as kafka-python's `DefaultRecordBatch` iterates them, on hypothesis-generated contents.

- `encode_batch(values, timestamp, producer_id, producer_epoch, base_sequence)`: the record
  batch kafka-python's `MemoryRecordsBuilder` (magic 2, no compression) builds of records
  with no key and no headers, all at `timestamp` (the client's only shape);
- `encode_produce_request(correlation, client_id, acks, timeout_ms, topic, partition,
  records)`: one topic, one partition, no transactional id (the client's only shape);
- `decode_produce_response(frame)` -> [`ProducedPart`]: every partition of every topic;
- `encode_fetch_request(correlation, client_id, max_wait_ms, min_bytes, max_bytes, topics)`:
  a consumer's fetch (replica -1, read uncommitted, no fetch session, leader epoch and log
  start -1, no forgotten topics, rack ""); `topics` is [(topic, [(partition, fetch offset,
  partition max bytes)])] in the order given;
- `decode_fetch_response(frame)` -> (top-level error code, [`FetchedPart`]);
- `encode_list_offsets_request(correlation, client_id, timestamp, topics)`: a consumer's
  ListOffsets v4 (replica -1, read uncommitted, current leader epoch -1); `topics` is
  [(topic, [partition])] in the order given; `decode_list_offsets_response(frame)` ->
  [`ListedPart`] (topic, partition, error code, offset);
- `decode_records(data)` -> [(offset, value bytes or None)] of the data records of the whole
  v2 batches in `data` (a batch cut short at the end is left out, control batches skipped); a
  batch that is compressed or not of magic 2 is read by kafka-python's `DefaultRecordBatch`.

A frame here is a response without its 4-byte size prefix (what the client reads after it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import calc_crc32c

from isrlab.broker.network import replica_fetch
from isrlab.broker.network.replica_fetch import FetchedPart, MalformedResponse

PRODUCE_KEY, PRODUCE_VERSION = 0, 8
FETCH_KEY, FETCH_VERSION = 1, 11
LIST_OFFSETS_KEY, LIST_OFFSETS_VERSION = 2, 4

_HEADER = struct.Struct(">ihhih")  # size placeholder, api key, version, correlation, id length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PRODUCE_BODY = struct.Struct(">hhiih")  # no txn id, acks, timeout, 1 topic, name length
_PRODUCE_PART = struct.Struct(">iii")  # 1 partition, index, records length
_PRODUCED = struct.Struct(">ihqqq")  # index, error, base offset, log append time, log start
_FETCH_BODY = struct.Struct(">iiiibiii")  # replica, wait, min, max, isolation, session, epoch, n
_FETCH_PART = struct.Struct(">iiqqi")  # partition, leader epoch, offset, log start, max bytes
_FETCH_TAIL = b"\x00\x00\x00\x00\x00\x00"  # no forgotten topics (int32 0), rack id "" (int16 0)
_BATCH_HEAD = struct.Struct(">qiibIhiqqqhii")  # a v2 record batch's 61-byte header
_CRC = struct.Struct(">I")
_LIST_BODY = struct.Struct(">ibi")  # replica id, isolation level, topics count
_LIST_PART = struct.Struct(">iiq")  # partition, current leader epoch, timestamp
_LISTED = struct.Struct(">ihqqi")  # partition, error, timestamp, offset, leader epoch


class ListedPart(NamedTuple):
    topic: str
    partition: int
    error_code: int
    offset: int


class ProducedPart(NamedTuple):
    topic: str
    partition: int
    error_code: int
    base_offset: int
    log_start_offset: int


def _put_varint(value: int, out: bytearray) -> None:
    """`value` as a zigzag varint at the end of `out`."""
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def encode_batch(
    values: Sequence[bytes],
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """A v2 record batch of `values` (no keys, no headers, one timestamp; see the module
    doc). Needs at least one value."""
    if not values:
        raise ValueError("a record batch needs at least one record")
    out = bytearray(_BATCH_HEAD.size)
    for i, value in enumerate(values):
        # attributes 0, timestamp delta 0, the offset delta, key null (zigzag -1), the value,
        # no headers
        record = bytearray(b"\x00\x00")
        _put_varint(i, record)
        record.append(1)
        _put_varint(len(value), record)
        record += value
        record.append(0)
        _put_varint(len(record), out)
        out += record
    n = len(values)
    _BATCH_HEAD.pack_into(
        out,
        0,
        0,  # base offset (the broker's)
        len(out) - 12,
        0,  # partition leader epoch (the broker's)
        2,  # magic
        0,  # the CRC, below
        0,  # attributes: no compression, not transactional, not control
        n - 1,
        timestamp,
        timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    _CRC.pack_into(out, 17, calc_crc32c(memoryview(out)[21:]))  # over attributes .. end
    return bytes(out)


def _head(api_key: int, version: int, correlation_id: int, client_id: str) -> bytearray:
    cid = client_id.encode()
    out = bytearray(_HEADER.pack(0, api_key, version, correlation_id, len(cid)))
    out += cid
    return out


def encode_produce_request(
    correlation_id: int,
    client_id: str,
    acks: int,
    timeout_ms: int,
    topic: str,
    partition: int,
    records: bytes,
) -> bytes:
    """ProduceRequest v8 of one batch to one partition, framed (size prefix included)."""
    out = _head(PRODUCE_KEY, PRODUCE_VERSION, correlation_id, client_id)
    name = topic.encode()
    out += _PRODUCE_BODY.pack(-1, acks, timeout_ms, 1, len(name))
    out += name
    out += _PRODUCE_PART.pack(1, partition, len(records))
    out += records
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _string(buf: memoryview, pos: int) -> tuple[str | None, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise MalformedResponse("a string runs past the end of the frame")
    return bytes(buf[pos : pos + n]).decode(), pos + n


def decode_produce_response(frame: bytes | memoryview) -> list[ProducedPart]:
    """A ProduceResponse v8 frame -> its partitions, topic by topic."""
    buf = memoryview(frame)
    out: list[ProducedPart] = []
    try:
        pos = 4  # correlation id
        (n_topics,) = _I32.unpack_from(buf, pos)
        pos += 4
        for _ in range(n_topics):
            topic, pos = _string(buf, pos)
            (n_parts,) = _I32.unpack_from(buf, pos)
            pos += 4
            for _ in range(n_parts):
                index, error, base, _append_time, log_start = _PRODUCED.unpack_from(buf, pos)
                pos += _PRODUCED.size
                (n_errors,) = _I32.unpack_from(buf, pos)
                pos += 4
                for _ in range(max(n_errors, 0)):
                    _, pos = _string(buf, pos + 4)  # batch index, its message
                _, pos = _string(buf, pos)  # error message
                out.append(ProducedPart(topic or "", index, error, base, log_start))
        _I32.unpack_from(buf, pos)  # throttle time
    except (struct.error, UnicodeDecodeError) as e:
        raise MalformedResponse(f"produce response cut short or garbled: {e}") from None
    return out


def encode_fetch_request(
    correlation_id: int,
    client_id: str,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, int, int]]]],
) -> bytes:
    """A consumer's FetchRequest v11, framed (see the module doc)."""
    out = _head(FETCH_KEY, FETCH_VERSION, correlation_id, client_id)
    out += _FETCH_BODY.pack(-1, max_wait_ms, min_bytes, max_bytes, 0, 0, -1, len(topics))
    pack = _FETCH_PART.pack
    for topic, parts in topics:
        name = topic.encode()
        out += _I16.pack(len(name))
        out += name
        out += _I32.pack(len(parts))
        for partition, offset, partition_max in parts:
            out += pack(partition, -1, offset, -1, partition_max)
    out += _FETCH_TAIL
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def decode_fetch_response(frame: bytes | memoryview) -> tuple[int, list[FetchedPart]]:
    """A FetchResponse v11 frame -> (top-level error code, the partitions): the follower's
    decoder (`broker.network.replica_fetch`; the consumer's and the follower's requests get
    the same response version) without the correlation id."""
    _, error, parts = replica_fetch.decode_fetch_response(frame)
    return error, parts


def encode_list_offsets_request(
    correlation_id: int,
    client_id: str,
    timestamp: int,
    topics: Sequence[tuple[str, Sequence[int]]],
) -> bytes:
    """A consumer's ListOffsetsRequest v4 of `timestamp` (-2 earliest, -1 latest) for every
    partition of `topics` ([(topic, [partition])], in the order given), framed: replica -1,
    read uncommitted, current leader epoch -1."""
    out = _head(LIST_OFFSETS_KEY, LIST_OFFSETS_VERSION, correlation_id, client_id)
    out += _LIST_BODY.pack(-1, 0, len(topics))
    pack = _LIST_PART.pack
    for topic, parts in topics:
        name = topic.encode()
        out += _I16.pack(len(name))
        out += name
        out += _I32.pack(len(parts))
        for partition in parts:
            out += pack(partition, -1, timestamp)
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def decode_list_offsets_response(frame: bytes | memoryview) -> list[ListedPart]:
    """A ListOffsetsResponse v4 frame -> its partitions, topic by topic."""
    buf = memoryview(frame)
    out: list[ListedPart] = []
    try:
        pos = 8  # correlation id, throttle time
        (n_topics,) = _I32.unpack_from(buf, pos)
        pos += 4
        for _ in range(n_topics):
            topic, pos = _string(buf, pos)
            (n_parts,) = _I32.unpack_from(buf, pos)
            pos += 4
            for _ in range(n_parts):
                index, error, _timestamp, offset, _epoch = _LISTED.unpack_from(buf, pos)
                pos += _LISTED.size
                out.append(ListedPart(topic or "", index, error, offset))
    except (struct.error, UnicodeDecodeError) as e:
        raise MalformedResponse(f"list offsets response cut short or garbled: {e}") from None
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at `pos` -> (value, position after it)."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    value = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = data[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7


def decode_records(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, value) of the data records of the whole batches in `data` (module doc)."""
    out: list[tuple[int, bytes | None]] = []
    pos = 0
    end_all = len(data)
    while pos + 12 <= end_all:
        (length,) = _I32.unpack_from(data, pos + 8)
        end = pos + 12 + length
        if end > end_all:
            break
        if length < _BATCH_HEAD.size - 12:
            raise MalformedResponse("a record batch shorter than its header")
        head = _BATCH_HEAD.unpack_from(data, pos)
        base, magic, attributes, count = head[0], head[3], head[5], head[12]
        if magic != 2 or attributes & 0x07:
            batch = DefaultRecordBatch(data[pos:end])
            if not batch.is_control_batch:
                for r in batch:
                    out.append((r.offset, None if r.value is None else bytes(r.value)))
            pos = end
            continue
        if attributes & 0x20:  # a control batch
            pos = end
            continue
        p = pos + _BATCH_HEAD.size
        for _ in range(count):
            # (a one-byte varint read in line: the common case)
            if data[p] < 0x80:  # the record's length
                p += 1
            else:
                _, p = _varint(data, p)
            p += 1  # attributes
            if data[p] < 0x80:  # timestamp delta
                p += 1
            else:
                _, p = _varint(data, p)
            b = data[p]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                delta, p = _varint(data, p)
            b = data[p]  # the key's length (-1: a null key, one byte)
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                n, p = _varint(data, p)
            if n > 0:
                p += n
            b = data[p]  # the value's length
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                n, p = _varint(data, p)
            if n < 0:
                value = None
            else:
                value = data[p : p + n]
                p += n
            if data[p] == 0:  # no headers
                p += 1
            else:
                headers, p = _varint(data, p)
                for _ in range(headers):
                    n, p = _varint(data, p)
                    p += max(n, 0)
                    n, p = _varint(data, p)
                    p += max(n, 0)
            out.append((base + delta, value))
        if p > end:
            raise MalformedResponse("records run past the end of their batch")
        pos = end
    return out


__all__ = [
    "FetchedPart",
    "ListedPart",
    "MalformedResponse",
    "ProducedPart",
    "decode_fetch_response",
    "decode_list_offsets_response",
    "decode_produce_response",
    "decode_records",
    "encode_batch",
    "encode_fetch_request",
    "encode_list_offsets_request",
    "encode_produce_request",
]
