"""The follower's hand-written Fetch v11 codec (broker/network/replica_fetch.py) against
kafka-python's schemas: the request byte for byte, the response field for field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, FetchResponse

from isrlab.broker.network.replica_fetch import (
    VERSION,
    FetchedPart,
    FetchPart,
    MalformedResponse,
    decode_fetch_response,
    encode_fetch_request,
)

Q = FetchRequest[VERSION]
R = FetchResponse[VERSION]

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(min_size=1, max_size=12)
parts = st.lists(
    st.builds(
        FetchPart, st.sampled_from(["t", "__consumer_offsets", "ü-x"]), i32, i32, i64, i64, i32
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(
    correlation=i32,
    client=names,
    replica=i32,
    wait=i32,
    min_bytes=i32,
    max_bytes=i32,
    ps=parts,
)
def test_requests_encode_as_kafka_python_encodes_them(
    correlation: int,
    client: str,
    replica: int,
    wait: int,
    min_bytes: int,
    max_bytes: int,
    ps: list[FetchPart],
) -> None:
    topics: dict[str, list[FetchPart]] = {}
    for p in ps:
        topics.setdefault(p.topic, []).append(p)
    reference = Q(
        replica_id=replica,
        max_wait_ms=wait,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            Q.FetchTopic(
                topic=topic,
                partitions=[
                    Q.FetchTopic.FetchPartition(
                        partition=p.partition,
                        current_leader_epoch=p.current_leader_epoch,
                        fetch_offset=p.fetch_offset,
                        log_start_offset=p.log_start_offset,
                        partition_max_bytes=p.partition_max_bytes,
                    )
                    for p in group
                ],
            )
            for topic, group in topics.items()
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    reference.with_header(correlation_id=correlation, client_id=client)
    expected = reference.encode(header=True, framed=True)
    ours = encode_fetch_request(correlation, client, replica, wait, min_bytes, max_bytes, ps)
    assert ours == expected


aborted = st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=3))
records = st.one_of(st.none(), st.binary(max_size=64))
partition_data = st.tuples(i32, st.integers(-1, 120), i64, i64, i64, aborted, i32, records)
topics_data = st.lists(st.tuples(names, st.lists(partition_data, max_size=4)), max_size=4)


@settings(max_examples=150, deadline=None)
@given(correlation=i32, error=st.integers(-1, 120), session=i32, topics=topics_data)
def test_responses_decode_as_kafka_python_encodes_them(
    correlation: int, error: int, session: int, topics: list[tuple[str, list[Any]]]
) -> None:
    resp = R(
        throttle_time_ms=0,
        error_code=error,
        session_id=session,
        responses=[
            R.FetchableTopicResponse(
                topic=name,
                partitions=[
                    R.FetchableTopicResponse.PartitionData(
                        partition_index=index,
                        error_code=perr,
                        high_watermark=hw,
                        last_stable_offset=lso,
                        log_start_offset=start,
                        aborted_transactions=None
                        if ab is None
                        else [
                            R.FetchableTopicResponse.PartitionData.AbortedTransaction(
                                producer_id=pid, first_offset=first
                            )
                            for pid, first in ab
                        ],
                        preferred_read_replica=pref,
                        records=recs,
                    )
                    for index, perr, hw, lso, start, ab, pref, recs in parts
                ],
            )
            for name, parts in topics
        ],
    )
    resp.with_header(correlation_id=correlation)
    frame = resp.encode(header=True, framed=True)[4:]
    got = decode_fetch_response(frame)
    assert got == (
        correlation,
        error,
        [
            FetchedPart(name, index, perr, hw, start, recs or b"")
            for name, parts in topics
            for index, perr, hw, lso, start, ab, pref, recs in parts
        ],
    )
    for cut in (len(frame) - 1, len(frame) // 2, 3):
        if cut < len(frame) and topics and any(parts for _, parts in topics):
            with pytest.raises(MalformedResponse):
                decode_fetch_response(frame[:cut])
