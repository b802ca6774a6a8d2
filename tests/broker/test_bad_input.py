"""Malformed and hostile input: the broker answers with an error or closes that one connection,
logs it, keeps serving everybody else, and never appends anything from a bad request."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from tests.broker.rawclient import (
    RawClient,
    build_batch,
    fetch_request,
    list_offsets_request,
    produce_req,
)

pytestmark = pytest.mark.integration


def api_versions_ok(port: int) -> bool:
    c = RawClient(port)
    try:
        resp = c.call(ApiVersionsRequest[0]())
        return resp.error_code == 0
    finally:
        c.close()


def create(port: int, name: str) -> None:
    c = RawClient(port)
    req = CreateTopicsRequest[4](
        topics=[
            CreateTopicsRequest[4].CreatableTopic(
                name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[]
            )
        ],
        timeout_ms=5000,
        validate_only=False,
    )
    resp = c.call(req)
    assert resp.topics[0].error_code == 0, resp
    c.close()


def produce(port: int, topic: str, records: bytes | None, partition: int = 0):
    c = RawClient(port)
    try:
        resp = c.call(produce_req(topic, records, partition=partition))
        return resp.responses[0].partition_responses[0]
    finally:
        c.close()


def end_offset(port: int, topic: str) -> int:
    c = RawClient(port)
    resp = c.call(list_offsets_request(topic, {0: -1}))
    c.close()
    return resp.topics[0].partitions[0].offset


def fetch_all(port: int, topic: str) -> bytes:
    c = RawClient(port)
    resp = c.call(fetch_request(topic, max_bytes=50 << 20))
    c.close()
    return bytes(resp.responses[0].partitions[0].records or b"")


def test_frame_over_socket_request_max_bytes_closes_only_that_connection(broker_factory):
    b = broker_factory({"socket.request.max.bytes": "10000"})
    bystander = RawClient(b.port)
    bad = RawClient(b.port)
    bad.send_bytes(struct.pack(">i", 10001) + b"\0" * 100)
    assert bad.is_closed()
    assert bystander.call(ApiVersionsRequest[0]()).error_code == 0
    assert "exceeds socket.request.max.bytes" in b.log_text()


def test_truncated_frame_then_disconnect_is_harmless(broker):
    c = RawClient(broker.port)
    c.send_bytes(struct.pack(">i", 500) + b"\0\0\0\x01")
    c.close()
    c2 = RawClient(broker.port)
    c2.send_bytes(b"\0\0")  # not even a full size prefix
    c2.close()
    assert api_versions_ok(broker.port)


def test_negative_size_and_garbage_close_the_connection(broker):
    c = RawClient(broker.port)
    c.send_bytes(struct.pack(">i", -5))
    assert c.is_closed()
    c = RawClient(broker.port)
    c.send_frame(b"\x12")  # shorter than a header
    assert c.is_closed()
    assert api_versions_ok(broker.port)


def test_unknown_api_key_closes_connection(broker):
    c = RawClient(broker.port)
    c.send_frame(struct.pack(">hhi", 999, 0, 1) + b"\xff\xff")
    assert c.is_closed()
    assert "unknown api key 999" in broker.log_text()


def test_unsupported_api_versions_version_gets_error_35_and_table(broker):
    c = RawClient(broker.port)
    # ApiVersions v99: answered with UNSUPPORTED_VERSION and the v0 table, as Kafka does
    c.send_frame(struct.pack(">hhi", 18, 99, 7) + struct.pack(">h", 1) + b"x")
    frame = c.recv_frame()
    corr, err = struct.unpack_from(">ih", frame, 0)
    assert (corr, err) == (7, 35)
    # unsupported version of another API: connection closed
    c.send_frame(struct.pack(">hhi", 0, 1, 8) + struct.pack(">h", 1) + b"x")
    assert c.is_closed()


def test_bad_crc_bad_magic_and_unknown_topic(broker):
    create(broker.port, "guarded")
    good = build_batch([b"a", b"b"])
    assert produce(broker.port, "guarded", good).error_code == 0
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    r = produce(broker.port, "guarded", bytes(bad_crc))
    assert r.error_code == 2  # CORRUPT_MESSAGE
    bad_magic = bytearray(good)
    bad_magic[16] = 1
    r = produce(broker.port, "guarded", bytes(bad_magic))
    assert r.error_code == 87  # INVALID_RECORD
    assert r.error_message
    r = produce(broker.port, "guarded", good[:40])
    assert r.error_code in (2, 87)
    r = produce(broker.port, "guarded", None)
    assert r.error_code == 87
    two = build_batch([b"c"]) + build_batch([b"d"])
    assert produce(broker.port, "guarded", two).error_code == 87  # exactly one batch
    r = produce(broker.port, "no-such-topic", good)
    assert r.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    r = produce(broker.port, "guarded", good, partition=7)
    assert r.error_code == 3
    assert end_offset(broker.port, "guarded") == 2
    assert fetch_all(broker.port, "guarded")[12:] == good[12:]


def test_invalid_acks_and_message_too_large(broker_factory):
    b = broker_factory({"message.max.bytes": "2000"})
    create(b.port, "limits")
    c = RawClient(b.port)
    resp = c.call(produce_req("limits", build_batch([b"x"]), acks=2))
    assert resp.responses[0].partition_responses[0].error_code == 21
    big = build_batch([b"y" * 5000])
    resp = c.call(produce_req("limits", big))
    assert resp.responses[0].partition_responses[0].error_code == 10
    c.close()
    assert end_offset(b.port, "limits") == 0


def test_metadata_for_invalid_topic_name(broker):
    c = RawClient(broker.port)
    M = MetadataRequest[9]
    resp = c.call(
        M(
            topics=[M.MetadataRequestTopic(name="bad name!")],
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
    )
    assert resp.topics[0].error_code == 17
    c.close()


def _valid_frames() -> list[bytes]:
    c = RawClient.__new__(RawClient)
    c.correlation_id = 0
    M = MetadataRequest[9]
    return [
        RawClient.encode(
            c, ApiVersionsRequest[3](client_software_name="x", client_software_version="1")
        ),
        RawClient.encode(
            c,
            M(
                topics=[M.MetadataRequestTopic(name="fuzz")],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
        ),
        RawClient.encode(c, produce_req("fuzz", build_batch([b"p", b"q"]))),
    ]


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    from tests.broker.conftest import BrokerProcess, free_port

    b = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "logs", free_port())
    b.start()
    create(b.port, "fuzz")
    yield b
    b.stop()


FRAMES = _valid_frames()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.tuples(
            st.sampled_from(range(len(FRAMES))),
            st.lists(
                st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6
            ),
            st.integers(0, 400),
        ),
    )
)
def test_random_and_mutated_requests_never_hurt_the_broker(fuzz_broker, data):
    port = fuzz_broker.port
    if isinstance(data, bytes):
        payload = data
        framed = struct.pack(">i", len(payload)) + payload
    else:
        which, flips, cut = data
        payload = bytearray(FRAMES[which])
        for pos, val in flips:
            payload[pos % len(payload)] = val
        payload = (
            bytes(payload[: max(len(payload) - cut, 0)]) if cut < len(payload) else bytes(payload)
        )
        framed = struct.pack(">i", len(payload)) + payload
    c = RawClient(port, timeout=5)
    try:
        c.send_bytes(framed)
        c.sock.settimeout(1.0)
        try:
            c.sock.recv(65536)
        except (TimeoutError, ConnectionError):
            pass
    finally:
        c.close()
    # the broker still answers, and the log holds only whole, valid batches
    assert api_versions_ok(port)


def test_after_fuzzing_the_log_is_still_valid(fuzz_broker):
    from isrlab.broker.log.record_batch import validate

    assert "unexpected error" not in fuzz_broker.log_text()
    data = fetch_all(fuzz_broker.port, "fuzz")
    if data:
        headers = validate(data, strict_offsets=False)
        offsets = [h.base_offset for h in headers]
        assert offsets == sorted(offsets)
        assert headers[-1].next_offset == end_offset(fuzz_broker.port, "fuzz")


def test_null_where_the_schema_forbids_it_closes_the_connection(broker):
    # A -1 array length for ProduceRequest.TopicData / a null topic name: Kafka's generated
    # readers refuse both ("non-nullable field ... was serialized as null").
    P = ProduceRequest[8]
    bad = [
        P(transactional_id=None, acks=1, timeout_ms=5000, topic_data=None),
        P(
            transactional_id=None,
            acks=1,
            timeout_ms=5000,
            topic_data=[P.TopicProduceData(name=None, partition_data=[])],
        ),
    ]
    for request in bad:
        c = RawClient(broker.port, timeout=5)
        c.send_frame(c.encode(request))
        assert c.sock.recv(65536) == b"", "the broker closes the connection"
        c.close()
    text = broker.log_text()
    assert text.count("non-nullable field") == 2
    assert "unexpected error" not in text
    assert api_versions_ok(broker.port)
