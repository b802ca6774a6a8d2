"""The follower's side of Fetch v11: a hand-written request encoder and response decoder.

A follower sends one Fetch per leader broker each round (`ReplicaManager`'s fetcher) and reads
every partition's part of the answer. Building kafka-python's request object (one per topic and
partition, through the schema's generic constructor) and decoding its response into objects
cost a follower about as much as applying the records; these do the same from tuples.
tests/broker/test_replica_fetch_codec.py holds them to kafka-python's schemas: the request byte
for byte, the response field for field, on hypothesis-generated contents.

Request: header v1 (api key 1, version 11, correlation id, client id), then replica id, max
wait, min bytes, max bytes, isolation level 0 (followers read uncommitted), session id 0 and
epoch -1 (no fetch sessions), the topics and partitions (partition, current leader epoch, fetch
offset, log start offset, partition max bytes), no forgotten topics, rack id "".
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

API_KEY = 1
VERSION = 11

_HEADER = struct.Struct(">ihhih")  # size placeholder, api key, version, correlation, id length
_BODY = struct.Struct(">iiiibii")  # replica, max wait, min bytes, max bytes, isolation, session
_PARTITION = struct.Struct(">iiqqi")  # partition, leader epoch, offset, log start, max bytes
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_TOP = struct.Struct(">ihi")  # throttle time, error code, session id
_PART = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start
_TAIL = b"\x00\x00\x00\x00\x00\x00"  # no forgotten topics (int32 0), rack id "" (int16 0)


class FetchPart(NamedTuple):
    """One partition of a follower's Fetch."""

    topic: str
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int


class FetchedPart(NamedTuple):
    """One partition of the leader's answer."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes


def encode_fetch_request(
    correlation_id: int,
    client_id: str,
    replica_id: int,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    parts: Sequence[FetchPart],
) -> bytes:
    """The framed request (size prefix included); partitions of one topic are grouped under it
    in the order the topic first appears."""
    cid = client_id.encode()
    out = bytearray(_HEADER.pack(0, API_KEY, VERSION, correlation_id, len(cid)))
    out += cid
    out += _BODY.pack(replica_id, max_wait_ms, min_bytes, max_bytes, 0, 0, -1)
    topics: dict[str, list[FetchPart]] = {}
    for p in parts:
        topics.setdefault(p.topic, []).append(p)
    out += _I32.pack(len(topics))
    for topic, ps in topics.items():
        name = topic.encode()
        out += _I16.pack(len(name))
        out += name
        out += _I32.pack(len(ps))
        for p in ps:
            out += _PARTITION.pack(
                p.partition,
                p.current_leader_epoch,
                p.fetch_offset,
                p.log_start_offset,
                p.partition_max_bytes,
            )
    out += _TAIL
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


class MalformedResponse(ValueError):
    pass


def decode_fetch_response(frame: bytes | memoryview) -> tuple[int, int, list[FetchedPart]]:
    """A FetchResponse v11 frame (without its size prefix) -> (correlation id, top-level error
    code, the partitions). Raises MalformedResponse when the frame is cut short."""
    buf = memoryview(frame)
    try:
        (correlation_id,) = _I32.unpack_from(buf, 0)
        _, error, _ = _TOP.unpack_from(buf, 4)
        pos = 4 + _TOP.size
        (n_topics,) = _I32.unpack_from(buf, pos)
        pos += 4
        out: list[FetchedPart] = []
        for _ in range(n_topics):
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
            if n < 0 or pos + n > len(buf):
                raise MalformedResponse("a topic name runs past the end of the frame")
            topic = bytes(buf[pos : pos + n]).decode()
            pos += n
            (n_parts,) = _I32.unpack_from(buf, pos)
            pos += 4
            for _ in range(n_parts):
                index, perr, hw, _lso, log_start = _PART.unpack_from(buf, pos)
                pos += _PART.size
                (n_aborted,) = _I32.unpack_from(buf, pos)
                pos += 4 + max(n_aborted, 0) * 16
                pos += 4  # preferred read replica
                (n_records,) = _I32.unpack_from(buf, pos)
                pos += 4
                records = b""
                if n_records > 0:
                    if pos + n_records > len(buf):
                        raise MalformedResponse("records run past the end of the frame")
                    records = bytes(buf[pos : pos + n_records])
                    pos += n_records
                out.append(FetchedPart(topic, index, perr, hw, log_start, records))
    except (struct.error, UnicodeDecodeError) as e:
        raise MalformedResponse(f"fetch response cut short or garbled: {e}") from None
    return correlation_id, error, out
