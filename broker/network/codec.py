"""Kafka request/response framing on top of kafka-python's protocol schemas.

The wire format itself is not written here: kafka-python ships Kafka's JSON message schemas and a
generic codec. This module only decides which APIs and versions the broker speaks (`SUPPORTED`,
advertised in ApiVersions, with Produce listed from v0 as Kafka 4.0 lists it), decodes a request frame into the schema object, and encodes a
response, with one twist for Fetch: record data can be sent zero-copy.

Zero-copy responses: the codec needs the records bytes in hand, but the broker wants to hand file
regions to `sendfile`. `encode_response` therefore accepts `RecordsPlaceholder` objects in place of
records; each is a zero-filled buffer of the region's exact length (so the codec writes the correct
length prefix) that starts with a random 16-byte marker. After encoding, the markers are found in the
output and the response is cut into `bytes | FileRegion` parts: the file bytes themselves never pass
through Python.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka.protocol.admin import (
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteTopicsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)

# api_key -> (request class, min version, max version). Exactly what the broker implements.
SUPPORTED: dict[int, tuple[Any, int, int]] = {
    0: (ProduceRequest, 3, 9),
    1: (FetchRequest, 4, 12),
    2: (ListOffsetsRequest, 1, 6),
    3: (MetadataRequest, 0, 12),
    8: (OffsetCommitRequest, 2, 8),
    9: (OffsetFetchRequest, 1, 8),
    10: (FindCoordinatorRequest, 0, 4),
    11: (JoinGroupRequest, 0, 9),
    12: (HeartbeatRequest, 0, 4),
    13: (LeaveGroupRequest, 0, 5),
    14: (SyncGroupRequest, 0, 5),
    15: (DescribeGroupsRequest, 0, 5),
    16: (ListGroupsRequest, 0, 4),
    18: (ApiVersionsRequest, 0, 3),
    19: (CreateTopicsRequest, 2, 5),
    20: (DeleteTopicsRequest, 1, 5),
    22: (InitProducerIdRequest, 0, 4),
    23: (OffsetForLeaderEpochRequest, 2, 4),
    24: (AddPartitionsToTxnRequest, 0, 4),
    25: (AddOffsetsToTxnRequest, 0, 3),
    26: (EndTxnRequest, 0, 3),
    27: (WriteTxnMarkersRequest, 1, 1),
    28: (TxnOffsetCommitRequest, 0, 3),
    42: (DeleteGroupsRequest, 0, 2),
    47: (OffsetDeleteRequest, 0, 0),
    61: (DescribeProducersRequest, 0, 0),
    65: (DescribeTransactionsRequest, 0, 0),
    66: (ListTransactionsRequest, 0, 1),
}

# Versions listed in ApiVersions below what the broker decodes. Produce from v0, as Kafka 4.0 does
# (KAFKA-18659): librdkafka before 2.11 compresses with gzip, snappy or lz4 only if the broker's
# Produce range includes version 0, so a range starting at 3 gets those codecs uncompressed. A
# Produce v0-v2 request is still refused (the connection is closed, as for any unsupported version).
ADVERTISED_MIN_VERSION: dict[int, int] = {0: 0}

API_NAMES: dict[int, str] = {k: v[0].__name__.removesuffix("Request") for k, v in SUPPORTED.items()}

_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id


class FrameError(Exception):
    """The frame cannot be understood; the connection must be closed."""


class UnsupportedVersion(Exception):
    def __init__(self, api_key: int, api_version: int, correlation_id: int):
        entry = SUPPORTED.get(api_key)
        name = API_NAMES.get(api_key, f"api {api_key}")
        served = f" (this broker serves v{entry[1]}-{entry[2]})" if entry else ""
        super().__init__(f"{name} v{api_version} is not supported{served}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int
    client_host: str = ""  # the peer's address, set by the server (JoinGroup records it)
    listener: str = ""  # the listener it arrived on, set by the server ("": not over a socket)

    @property
    def name(self) -> str:
        return API_NAMES.get(self.api_key, str(self.api_key))


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    if len(frame) < _HEADER.size:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than a request header")
    return _HEADER.unpack_from(frame, 0)


def decode_request(frame: bytes | memoryview) -> Request:
    """Decode one request frame (without its 4-byte size prefix).

    The fast path of every API: the request header is read here (api key, version,
    correlation id, client id and, in a flexible header, its tagged fields, which no request
    header defines and which are skipped), the body by kafka-python's own compiled decoder
    for the version, and the schema's null rules by a plan compiled per version
    (`_null_plan`). `decode_request_reference` is the same through kafka-python's
    `Request[v].decode(header=True)`; tests/broker/test_codec_fast.py holds the two equal on
    every advertised version."""
    api_key, api_version, correlation_id = peek_header(frame)
    entry = SUPPORTED.get(api_key)
    if entry is None:
        raise FrameError(f"unknown api key {api_key}")
    cls, lo, hi = entry
    if not lo <= api_version <= hi:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    decode, plan = _body_decoder(api_key, api_version)
    try:
        data = frame if isinstance(frame, memoryview) else memoryview(frame)
        (n,) = _INT16.unpack_from(data, 8)
        pos = 10
        if n < 0:
            client_id = None
        else:
            if pos + n > len(data):
                raise ValueError("client id past the end of the frame")
            client_id = str(data[pos : pos + n], "utf-8")
            pos += n
        if plan.flexible:
            pos = _skip_tagged_fields(data, pos)
        body, _ = decode(data, pos)
    except Exception as e:  # the codec raises a variety of errors on malformed input
        raise FrameError(f"malformed {cls.__name__} v{api_version}: {e!r}") from None
    problem = _null_check(plan.fields, body)
    if problem is not None:
        raise FrameError(f"malformed {cls.__name__} v{api_version}: {problem}")
    return Request(api_key, api_version, correlation_id, client_id, body, len(frame))


def decode_request_reference(frame: bytes | memoryview) -> Request:
    """`decode_request` through kafka-python's generic path (header object, BytesIO) and
    the schema walk of `null_violation`: the reference the fast path is tested against."""
    api_key, api_version, correlation_id = peek_header(frame)
    entry = SUPPORTED.get(api_key)
    if entry is None:
        raise FrameError(f"unknown api key {api_key}")
    cls, lo, hi = entry
    if not lo <= api_version <= hi:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    try:
        body = cls[api_version].decode(frame, header=True)
    except Exception as e:  # the codec raises a variety of errors on malformed input
        raise FrameError(f"malformed {cls.__name__} v{api_version}: {e!r}") from None
    problem = null_violation(cls[api_version]._json, body, api_version)
    if problem is not None:
        raise FrameError(f"malformed {cls.__name__} v{api_version}: {problem}")
    header = body.header
    return Request(
        api_key, api_version, correlation_id, getattr(header, "client_id", None), body, len(frame)
    )


_INT16 = struct.Struct(">h")


def _uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("varint longer than 5 bytes")


def _skip_tagged_fields(data: memoryview, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _tag, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise ValueError("tagged field past the end of the frame")
    return pos


@dataclass(frozen=True)
class _NullPlan:
    flexible: bool
    #: (attribute, schema name, null refused in this version, plan of its items or ())
    fields: tuple[tuple[str, str, bool, tuple[Any, ...]], ...]


def _null_plan(schema: dict[str, Any], version: int) -> tuple[tuple[str, str, bool, Any], ...]:
    """`null_violation`'s walk of ``schema`` for one version, compiled: only the fields that
    can be null on the wire or hold such fields, each with whether null is refused."""
    out = []
    for f in schema.get("fields", ()):
        if not _in_versions(f.get("versions"), version) or "taggedVersions" in f:
            continue
        nullable_type = f["type"].startswith("[]") or f["type"] in _NULLABLE_TYPES
        refused = nullable_type and not _in_versions(f.get("nullableVersions"), version)
        sub = _null_plan(f, version) if "fields" in f else ()
        if nullable_type or sub:
            out.append((_attr_name(f["name"]), f["name"], refused, sub))
    return tuple(out)


def _null_check(plan: tuple[tuple[str, str, bool, Any], ...], message: Any) -> str | None:
    """`null_violation` by a compiled plan: the first non-nullable field sent as null."""
    for attr, name, refused, sub in plan:
        value = getattr(message, attr, _MISSING)
        if value is _MISSING:
            continue
        if value is None:
            if refused:
                return f"non-nullable field {name} was serialized as null"
            continue
        if sub:
            for item in value if isinstance(value, list) else (value,):
                problem = _null_check(sub, item)
                if problem is not None:
                    return problem
    return None


@functools.cache
def _body_decoder(api_key: int, version: int) -> tuple[Any, _NullPlan]:
    """kafka-python's compiled body decoder for one request version, and its null plan."""
    cls = SUPPORTED[api_key][0]
    flexible = bool(cls.flexible_version_q(version))
    decode = cls._struct.compiled_decode_from(
        version, compact=flexible, tagged=flexible, data_class=cls[None]
    )
    return decode, _NullPlan(flexible, _null_plan(cls._json, version))


@functools.cache
def _in_versions(spec: str | None, version: int) -> bool:
    """Kafka's schema version ranges: "3+", "0-12", "5", "none"."""
    if not spec or spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    lo, _, hi = spec.partition("-")
    return int(lo) <= version <= int(hi or lo)


@functools.cache
def _attr_name(field_name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", field_name).lower()


def null_violation(schema: dict[str, Any], message: Any, version: int) -> str | None:
    """The first field the schema says cannot be null in ``version`` but was sent as null
    (a -1 length), as Kafka's generated readers refuse it; None if there is none.

    kafka-python's decoder accepts such nulls and the handlers would trip over them.
    """
    for f in schema.get("fields", ()):
        if not _in_versions(f.get("versions"), version) or "taggedVersions" in f:
            continue
        value = getattr(message, _attr_name(f["name"]), _MISSING)
        if value is _MISSING:
            continue
        if value is None:
            # Only these types have a wire null (-1 length); kafka-python also reads the zero
            # UUID and absent tagged structs as None.
            nullable_type = f["type"].startswith("[]") or f["type"] in _NULLABLE_TYPES
            if nullable_type and not _in_versions(f.get("nullableVersions"), version):
                return f"non-nullable field {f['name']} was serialized as null"
            continue
        if "fields" in f:
            items = value if isinstance(value, list) else [value]
            for item in items:
                problem = null_violation(f, item, version)
                if problem is not None:
                    return problem
    return None


_MISSING = object()
_NULLABLE_TYPES = frozenset({"string", "bytes", "records"})


class FileLike(Protocol):
    def fileno(self) -> int: ...


@dataclass
class FileRegion:
    """A byte range of an open file, written to the socket with sendfile."""

    file: Any  # object with fileno()
    position: int
    size: int


@dataclass
class RecordsPlaceholder:
    """Stands for records that live in files; see the module docstring."""

    regions: list[FileRegion]
    marker: bytes = field(default_factory=lambda: os.urandom(16))

    @property
    def size(self) -> int:
        return sum(r.size for r in self.regions)

    def buffer(self) -> bytearray:
        buf = bytearray(self.size)
        buf[: len(self.marker)] = self.marker
        return buf


def encode_response(
    response: Any,
    version: int,
    correlation_id: int,
    placeholders: list[RecordsPlaceholder] | None = None,
) -> list[bytes | FileRegion]:
    """Encode a response with its header and size prefix, as a list of parts to write in order.

    The body by kafka-python's compiled encoder, the response header here (the correlation id,
    and an empty tagged-field section in a flexible version, never in ApiVersions, whose
    response header stays v0); `encode_response_reference` is kafka-python's whole path."""
    # The version is the one the response object was built with (`Response[v](...)`); passing it
    # again would make kafka-python try to stamp it into the (response) header.
    assert version == response.API_VERSION
    body = response.encode()
    if response.flexible_version_q(version) and response.API_KEY != 18:
        data = b"".join((_FLEX_HEAD.pack(len(body) + 5, correlation_id, 0), body))
    else:
        data = b"".join((_HEAD.pack(len(body) + 4, correlation_id), body))
    return _cut(data, placeholders)


def encode_response_reference(
    response: Any,
    version: int,
    correlation_id: int,
    placeholders: list[RecordsPlaceholder] | None = None,
) -> list[bytes | FileRegion]:
    """`encode_response` through kafka-python's generic path (header object and all)."""
    response.with_header(correlation_id=correlation_id)
    assert version == response.API_VERSION
    return _cut(bytes(response.encode(header=True, framed=True)), placeholders)


_HEAD = struct.Struct(">ii")  # size, correlation id
_FLEX_HEAD = struct.Struct(">iiB")  # size, correlation id, no tagged fields


def _cut(data: bytes, placeholders: list[RecordsPlaceholder] | None) -> list[bytes | FileRegion]:
    if not placeholders:
        return [data]
    parts: list[bytes | FileRegion] = []
    pos = 0
    view = memoryview(data)
    for ph in placeholders:
        at = data.find(ph.marker, pos)
        if at < 0:  # pragma: no cover - would be a bug in the codec or here
            raise RuntimeError("records placeholder not found in the encoded response")
        parts.append(bytes(view[pos:at]))
        parts.extend(ph.regions)
        pos = at + ph.size
    parts.append(bytes(view[pos:]))
    return parts


def api_versions_table() -> list[tuple[int, int, int]]:
    """The (api key, min, max) versions listed in ApiVersions."""
    return [
        (key, ADVERTISED_MIN_VERSION.get(key, lo), hi)
        for key, (_cls, lo, hi) in sorted(SUPPORTED.items())
    ]
