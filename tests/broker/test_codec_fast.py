"""The codec's fast paths against kafka-python's schemas (issue 16), on every version the broker
serves: requests of every API decoded by `decode_request` as by `decode_request_reference`
(kafka-python's generic decode and the schema walk of `null_violation`), whole, truncated, with
unknown tagged fields in the header and with nulls where the schema forbids them; responses of
the hot APIs encoded by `encode_response` and by the hand-written Produce and Fetch encoders byte
for byte as kafka-python encodes them. Messages are drawn by hypothesis from the JSON schemas."""

from __future__ import annotations

import os
import struct
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer import ProduceResponse

from isrlab.broker.network.codec import (
    SUPPORTED,
    FileRegion,
    FrameError,
    RecordsPlaceholder,
    _attr_name,
    _in_versions,
    decode_request,
    decode_request_reference,
    encode_response,
    encode_response_reference,
)
from isrlab.broker.network.hot_responses import encode_fetch_response, encode_produce_response

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_INTS = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}


def _scalar(kind: str) -> st.SearchStrategy[Any]:
    if kind in _INTS:
        lo, hi = _INTS[kind]
        return st.integers(lo, hi)
    if kind == "bool":
        return st.booleans()
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind == "string":
        return st.text(max_size=12)
    if kind in ("bytes", "records"):
        return st.binary(max_size=40)
    if kind == "uuid":
        return st.uuids().filter(lambda u: u.int != 0)
    if kind == "bitfield":
        return st.just(None)
    raise AssertionError(f"no strategy for {kind}")


def _field(f: dict[str, Any], owner: Any, version: int, nulls: bool) -> st.SearchStrategy[Any]:
    kind: str = f["type"]
    nullable = _in_versions(f.get("nullableVersions"), version)
    if "fields" in f:
        cls = getattr(owner, kind.removeprefix("[]"))
        item = _message(f, cls, version, nulls, top=False)
        value: st.SearchStrategy[Any] = (
            st.lists(item, max_size=3) if kind.startswith("[]") else item
        )
    elif kind.startswith("[]"):
        value = st.lists(_scalar(kind[2:]), max_size=3)
    else:
        value = _scalar(kind)
    can_be_null = kind.startswith("[]") or kind in ("string", "bytes", "records")
    if nullable or (nulls and can_be_null):
        # nulls=True: also where the version forbids them (the broker must refuse those)
        return st.one_of(value, st.none())
    return value


def _message(
    schema: dict[str, Any], cls: Any, version: int, nulls: bool, top: bool = True
) -> st.SearchStrategy[Any]:
    fields = {}
    for f in schema.get("fields", ()):
        if not _in_versions(f.get("versions"), version) or "taggedVersions" in f:
            continue
        fields[_attr_name(f["name"])] = _field(f, cls, version, nulls)
    if top:
        return st.fixed_dictionaries(fields).map(lambda kw: cls[version](**kw))
    return st.fixed_dictionaries(fields).map(lambda kw: cls(version=version, **kw))


def _served() -> list[tuple[int, int]]:
    return [
        (key, v) for key, (_cls, lo, hi) in sorted(SUPPORTED.items()) for v in range(lo, hi + 1)
    ]


def _frame(request: Any, client_id: str | None) -> bytes:
    request.with_header(correlation_id=7, client_id=client_id)
    try:
        return bytes(request.encode(header=True))
    except Exception:  # a null kafka-python cannot write in this version
        assume(False)
        raise


def _both(frame: bytes) -> tuple[Any, Any]:
    out = []
    for decode in (decode_request, decode_request_reference):
        try:
            r = decode(frame)
            out.append((r.api_key, r.api_version, r.correlation_id, r.client_id, r.body, r.size))
        except FrameError as e:
            out.append(("FrameError", "null" if "serialized as null" in str(e) else ""))
    return out[0], out[1]


@pytest.mark.parametrize(("api_key", "version"), _served())
@SETTINGS
@given(data=st.data())
def test_requests_decode_as_kafka_python_decodes_them(
    api_key: int, version: int, data: st.DataObject
) -> None:
    cls = SUPPORTED[api_key][0]
    nulls = data.draw(st.booleans())
    request = data.draw(_message(cls._json, cls, version, nulls))
    client_id = data.draw(st.none() | st.text(max_size=10))
    frame = _frame(request, client_id)
    fast, reference = _both(frame)
    assert fast == reference
    # cut anywhere: both refuse it or both read the same
    cut = data.draw(st.integers(8, len(frame)))
    fast, reference = _both(frame[:cut])
    assert fast == reference
    if cls.flexible_version_q(version):
        # unknown tagged fields in the request header (header v2) are skipped by both
        tags = data.draw(
            st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=5)), max_size=3)
        )
        at = 10 + (len(client_id.encode()) if client_id is not None else 0)
        assert frame[at] == 0
        section = _uvarint(len(tags)) + b"".join(
            _uvarint(t) + _uvarint(len(v)) + v for t, v in sorted(tags)
        )
        fast, reference = _both(frame[:at] + section + frame[at + 1 :])
        assert fast == reference


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


HOT_RESPONSES = [
    (ProduceResponse, 0, 9),
    (FetchResponse, 4, 12),
    (ListOffsetsResponse, 1, 6),
    (MetadataResponse, 0, 12),
]


@pytest.mark.parametrize(
    ("cls", "version"), [(c, v) for c, lo, hi in HOT_RESPONSES for v in range(lo, hi + 1)]
)
@SETTINGS
@given(data=st.data())
def test_responses_encode_as_kafka_python_encodes_them(
    cls: Any, version: int, data: st.DataObject
) -> None:
    response = data.draw(_message(cls._json, cls, version, nulls=False))
    correlation_id = data.draw(st.integers(-(1 << 31), (1 << 31) - 1))
    try:
        reference = encode_response_reference(response, version, correlation_id)
    except Exception:
        assume(False)
    assert encode_response(response, version, correlation_id) == reference


_produce_partition = st.tuples(
    st.integers(0, 1 << 20),
    st.integers(-1, 120),
    st.integers(-1, 1 << 62),
    st.integers(-1, 1 << 62),
    st.lists(st.tuples(st.integers(0, 1000), st.none() | st.text(max_size=20)), max_size=3),
    st.none() | st.text(max_size=30),
)


@pytest.mark.parametrize("version", range(3, 10))
@SETTINGS
@given(
    topics=st.lists(
        st.tuples(st.text(max_size=20), st.lists(_produce_partition, max_size=3)), max_size=3
    ),
    correlation_id=st.integers(0, (1 << 31) - 1),
)
def test_produce_responses_byte_for_byte(
    version: int, topics: list[Any], correlation_id: int
) -> None:
    cls = ProduceResponse[version]
    T = cls.TopicProduceResponse
    P = T.PartitionProduceResponse
    if version < 8:  # not in these versions: kafka-python does not write them either
        topics = [(n, [(*p[:4], [], None) for p in parts]) for n, parts in topics]
    response = cls(
        responses=[
            T(
                name=name,
                partition_responses=[
                    P(
                        index=index,
                        error_code=error,
                        base_offset=base,
                        log_append_time_ms=-1,
                        log_start_offset=start,
                        record_errors=[
                            P.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                            for i, m in errors
                        ],
                        error_message=message,
                    )
                    for index, error, base, start, errors, message in parts
                ],
            )
            for name, parts in topics
        ],
        throttle_time_ms=0,
    )
    assert encode_produce_response(version, correlation_id, topics) == encode_response_reference(
        response, version, correlation_id
    )


_fetch_partition = st.tuples(
    st.integers(0, 1 << 20),
    st.integers(-1, 120),
    st.integers(-1, 1 << 62),
    st.integers(-1, 1 << 62),
    st.integers(-1, 1 << 62),
    st.none() | st.lists(st.tuples(st.integers(-1, 1 << 62), st.integers(0, 1 << 62)), max_size=3),
    st.none() | st.binary(max_size=300),
)


def _fetch_reference(version: int, topics: list[Any]) -> Any:
    cls = FetchResponse[version]
    FT = cls.FetchableTopicResponse
    FP = FT.PartitionData
    return cls(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            FT(
                topic=name,
                partitions=[
                    FP(
                        partition_index=index,
                        error_code=error,
                        high_watermark=hw,
                        last_stable_offset=lso,
                        log_start_offset=start,
                        aborted_transactions=None
                        if aborted is None
                        else [
                            FP.AbortedTransaction(producer_id=pid, first_offset=first)
                            for pid, first in aborted
                        ],
                        preferred_read_replica=-1,
                        records=records,
                    )
                    for index, error, hw, lso, start, aborted, records in parts
                ],
            )
            for name, parts in topics
        ],
    )


@pytest.mark.parametrize("version", range(4, 13))
@SETTINGS
@given(
    topics=st.lists(
        st.tuples(st.text(max_size=20), st.lists(_fetch_partition, max_size=3)), max_size=3
    ),
    correlation_id=st.integers(0, (1 << 31) - 1),
)
def test_fetch_responses_byte_for_byte(
    version: int, topics: list[Any], correlation_id: int
) -> None:
    if version < 5:  # no log_start_offset before v5: kafka-python writes nothing for it
        topics = [(n, [(*p[:4], -1, *p[5:]) for p in parts]) for n, parts in topics]
    reference = encode_response_reference(
        _fetch_reference(version, topics), version, correlation_id
    )
    assert encode_fetch_response(version, correlation_id, topics) == reference


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_responses_with_file_regions(version: int) -> None:
    """Records sent with sendfile: the same bytes as kafka-python's encoding of the records."""
    with tempfile.TemporaryFile() as f:
        content = os.urandom(5000)
        f.write(content)
        f.flush()
        regions = [FileRegion(f, 10, 1000), FileRegion(f, 2000, 3000)]
        small = os.urandom(30)
        topics = [
            ("a", [(0, 0, 5, 5, 0, None, regions), (1, 0, 7, 7, 0, [(3, 4)], small)]),
            ("b", [(2, 0, 9, 9, 0, [], list(regions[:1]))]),
        ]

        def flatten(parts: list[Any]) -> bytes:
            out = b""
            for p in parts:
                if isinstance(p, FileRegion):
                    f.seek(p.position)
                    out += f.read(p.size)
                else:
                    out += p
            return out

        placeholders = [RecordsPlaceholder(regions), RecordsPlaceholder(list(regions[:1]))]
        ref_topics = [
            ("a", [(*topics[0][1][0][:6], bytes(placeholders[0].buffer())), topics[0][1][1]]),
            ("b", [(*topics[1][1][0][:6], bytes(placeholders[1].buffer()))]),
        ]
        reference = encode_response_reference(
            _fetch_reference(version, ref_topics), version, 11, placeholders
        )
        fast = encode_fetch_response(version, 11, topics)
        assert [type(p) for p in fast] == [type(p) for p in reference]
        assert flatten(fast) == flatten(reference)
        assert struct.unpack(">i", flatten(fast)[:4])[0] == len(flatten(fast)) - 4
