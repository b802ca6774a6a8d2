"""The simulated client's hand-written codecs (harness/sim/wire.py) against kafka-python: the
requests (Produce, Fetch, ListOffsets) byte for byte, the responses field for field, the
records as `DefaultRecordBatch` iterates them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.harness.sim import wire

i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(min_size=1, max_size=12)
topic_names = st.sampled_from(["t", "__consumer_offsets", "ü-x", "t1"])
nullable = st.one_of(st.none(), st.text(max_size=10))


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    client=names,
    acks=st.sampled_from([-1, 0, 1]),
    timeout=i32,
    topic=topic_names,
    partition=i32,
    records=st.binary(max_size=80),
)
def test_produce_requests_encode_as_kafka_python(
    correlation: int,
    client: str,
    acks: int,
    timeout: int,
    topic: str,
    partition: int,
    records: bytes,
) -> None:
    P = ProduceRequest[wire.PRODUCE_VERSION]
    ref = P(
        transactional_id=None,
        acks=acks,
        timeout_ms=timeout,
        topic_data=[
            P.TopicProduceData(
                name=topic,
                partition_data=[
                    P.TopicProduceData.PartitionProduceData(index=partition, records=records)
                ],
            )
        ],
    )
    ref.with_header(correlation_id=correlation, client_id=client)
    expected = ref.encode(header=True, framed=True)
    assert (
        wire.encode_produce_request(correlation, client, acks, timeout, topic, partition, records)
        == expected
    )


produced = st.tuples(
    i32, i16, i64, i64, i64, st.lists(st.tuples(i32, nullable), max_size=2), nullable
)


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    topics=st.lists(st.tuples(names, st.lists(produced, max_size=3)), max_size=3),
    throttle=i32,
)
def test_produce_responses_decode_as_kafka_python_encodes_them(
    correlation: int, topics: list[tuple[str, list[Any]]], throttle: int
) -> None:
    R = ProduceResponse[wire.PRODUCE_VERSION]
    T = R.TopicProduceResponse
    resp = R(
        responses=[
            T(
                name=name,
                partition_responses=[
                    T.PartitionProduceResponse(
                        index=index,
                        error_code=err,
                        base_offset=base,
                        log_append_time_ms=append,
                        log_start_offset=start,
                        record_errors=[
                            T.PartitionProduceResponse.BatchIndexAndErrorMessage(
                                batch_index=i, batch_index_error_message=m
                            )
                            for i, m in errors
                        ],
                        error_message=message,
                    )
                    for index, err, base, append, start, errors, message in parts
                ],
            )
            for name, parts in topics
        ],
        throttle_time_ms=throttle,
    )
    resp.with_header(correlation_id=correlation)
    frame = resp.encode(header=True, framed=True)[4:]
    assert wire.decode_produce_response(frame) == [
        wire.ProducedPart(name, index, err, base, start)
        for name, parts in topics
        for index, err, base, _, start, _, _ in parts
    ]
    with pytest.raises(wire.MalformedResponse):
        wire.decode_produce_response(frame[:-1])


fetch_topics = st.lists(
    st.tuples(topic_names, st.lists(st.tuples(i32, i64, i32), min_size=1, max_size=4)),
    max_size=4,
)


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    client=names,
    wait=i32,
    min_bytes=i32,
    max_bytes=i32,
    topics=fetch_topics,
)
def test_fetch_requests_encode_as_kafka_python(
    correlation: int,
    client: str,
    wait: int,
    min_bytes: int,
    max_bytes: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
) -> None:
    F = FetchRequest[wire.FETCH_VERSION]
    ref = F(
        replica_id=-1,
        max_wait_ms=wait,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            F.FetchTopic(
                topic=t,
                partitions=[
                    F.FetchTopic.FetchPartition(
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=off,
                        log_start_offset=-1,
                        partition_max_bytes=most,
                    )
                    for p, off, most in ps
                ],
            )
            for t, ps in topics
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    ref.with_header(correlation_id=correlation, client_id=client)
    expected = ref.encode(header=True, framed=True)
    ours = wire.encode_fetch_request(correlation, client, wait, min_bytes, max_bytes, topics)
    assert ours == expected


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    client=names,
    timestamp=st.one_of(st.sampled_from([-2, -1]), i64),
    topics=st.lists(st.tuples(topic_names, st.lists(i32, min_size=1, max_size=4)), max_size=4),
)
def test_list_offsets_requests_encode_as_kafka_python(
    correlation: int, client: str, timestamp: int, topics: list[tuple[str, list[int]]]
) -> None:
    L = ListOffsetsRequest[wire.LIST_OFFSETS_VERSION]
    ref = L(
        replica_id=-1,
        isolation_level=0,
        topics=[
            L.ListOffsetsTopic(
                name=t,
                partitions=[
                    L.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=p, current_leader_epoch=-1, timestamp=timestamp
                    )
                    for p in ps
                ],
            )
            for t, ps in topics
        ],
    )
    ref.with_header(correlation_id=correlation, client_id=client)
    expected = ref.encode(header=True, framed=True)
    assert wire.encode_list_offsets_request(correlation, client, timestamp, topics) == expected


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    throttle=i32,
    topics=st.lists(
        st.tuples(names, st.lists(st.tuples(i32, i16, i64, i64, i32), max_size=3)), max_size=3
    ),
)
def test_list_offsets_responses_decode_as_kafka_python_encodes_them(
    correlation: int, throttle: int, topics: list[tuple[str, list[Any]]]
) -> None:
    R = ListOffsetsResponse[wire.LIST_OFFSETS_VERSION]
    T = R.ListOffsetsTopicResponse
    resp = R(
        throttle_time_ms=throttle,
        topics=[
            T(
                name=name,
                partitions=[
                    T.ListOffsetsPartitionResponse(
                        partition_index=index,
                        error_code=err,
                        timestamp=ts,
                        offset=off,
                        leader_epoch=epoch,
                    )
                    for index, err, ts, off, epoch in parts
                ],
            )
            for name, parts in topics
        ],
    )
    resp.with_header(correlation_id=correlation)
    frame = resp.encode(header=True, framed=True)[4:]
    assert wire.decode_list_offsets_response(frame) == [
        wire.ListedPart(name, index, err, off)
        for name, parts in topics
        for index, err, _, off, _ in parts
    ]
    with pytest.raises(wire.MalformedResponse):
        wire.decode_list_offsets_response(frame[:-1])


aborted = st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=3))
partition_data = st.tuples(
    i32, i16, i64, i64, i64, aborted, i32, st.one_of(st.none(), st.binary(max_size=64))
)


@settings(max_examples=100, deadline=None)
@given(
    correlation=i32,
    error=i16,
    session=i32,
    topics=st.lists(st.tuples(names, st.lists(partition_data, max_size=4)), max_size=4),
)
def test_fetch_responses_decode_as_kafka_python_encodes_them(
    correlation: int, error: int, session: int, topics: list[tuple[str, list[Any]]]
) -> None:
    R = FetchResponse[wire.FETCH_VERSION]
    P = R.FetchableTopicResponse.PartitionData
    resp = R(
        throttle_time_ms=0,
        error_code=error,
        session_id=session,
        responses=[
            R.FetchableTopicResponse(
                topic=name,
                partitions=[
                    P(
                        partition_index=index,
                        error_code=perr,
                        high_watermark=hw,
                        last_stable_offset=lso,
                        log_start_offset=start,
                        aborted_transactions=None
                        if ab is None
                        else [
                            P.AbortedTransaction(producer_id=pid, first_offset=first)
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
    # the client reads what kafka-python decodes
    decoded = R.decode(frame, header=True)
    assert wire.decode_fetch_response(frame) == (
        decoded.error_code,
        [
            wire.FetchedPart(
                t.topic,
                p.partition_index,
                p.error_code,
                p.high_watermark,
                p.log_start_offset,
                bytes(p.records or b""),
            )
            for t in decoded.responses
            for p in t.partitions
        ],
    )


record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),  # key
    st.one_of(st.none(), st.binary(max_size=300)),  # value (long ones: multi-byte varints)
    st.lists(
        st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=2
    ),
    st.integers(0, 2**40),  # timestamp
)
batch = st.tuples(
    st.integers(0, 2**40),  # base offset
    st.lists(record, min_size=1, max_size=6),
    st.sampled_from([0, 0, 0, 1]),  # compression: mostly none, gzip through kafka-python
    st.booleans(),  # control batch
    st.integers(-1, 2**31 - 1),  # producer id
)


def _batch_bytes(base: int, records: list[Any], compression: int, control: bool, pid: int) -> bytes:
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=compression,
        batch_size=1 << 20,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
    )
    for key, value, headers, ts in records:
        builder.append(timestamp=ts, key=key, value=value, headers=headers)
    builder.close()
    data = bytearray(builder.buffer())
    data[0:8] = base.to_bytes(8, "big")
    if control:
        data[22] |= 0x20  # attributes' low byte (CRC not checked when iterating)
    return bytes(data)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(batch, max_size=4), cut=st.integers(0, 40))
def test_records_decode_as_kafka_python_iterates_them(batches: list[Any], cut: int) -> None:
    data = b"".join(_batch_bytes(*b) for b in batches)
    expected: list[tuple[int, bytes | None]] = []
    pos = 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        b = DefaultRecordBatch(data[pos : pos + 12 + length])
        pos += 12 + length
        if not b.is_control_batch:
            expected += [(r.offset, None if r.value is None else bytes(r.value)) for r in b]
    assert wire.decode_records(data) == expected
    # a fetch's last batch can be cut short: it is left out
    if batches and cut:
        last = _batch_bytes(*batches[-1])
        head = data[: len(data) - len(last)]
        assert wire.decode_records(data[: len(data) - min(cut, len(last))]) == wire.decode_records(
            head
        )


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    timestamp=st.integers(0, 2**50),
    # an idempotent producer's (id, epoch, sequence), or none (-1s), as the client sends them
    producer=st.one_of(
        st.just((-1, -1, -1)),
        st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)),
    ),
)
def test_batches_encode_as_kafka_pythons_builder_builds_them(
    values: list[bytes], timestamp: int, producer: tuple[int, int, int]
) -> None:
    pid, epoch, seq = producer
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 20,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    for v in values:
        builder.append(timestamp=timestamp, key=None, value=v, headers=[])
    builder.close()
    assert wire.encode_batch(values, timestamp, pid, epoch, seq) == bytes(builder.buffer())
