"""A broker hosts no more partitions than its open-file limit can hold (max.broker.partitions).

Issue 12, point 6: one CreateTopics with num_partitions=100000 used to create partitions until the
process ran out of descriptors; the request was never answered, ApiVersions neither, SIGTERM did
nothing and the broker could not start again. These tests run a real broker with a lowered
`ulimit -n` and check that such requests are refused before anything is created, that the limit
counts every hosted partition (CreateTopics and auto-creation alike), and that a broker filled to
the limit, with many segments per partition, still serves, stops on SIGTERM and starts again.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from isrlab.broker.errors import ErrorCode
from isrlab.broker.partition_limit import derived_partition_limit
from tests.broker.conftest import BrokerProcess, free_port
from tests.broker.rawclient import RawClient, build_batch, fetch_records, produce_req

pytestmark = pytest.mark.integration

NOFILE = 256
LIMIT = derived_partition_limit(NOFILE)


def create(port: int, name: str, partitions: int, rf: int = 1, **configs: str):
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=[],
        configs=[
            C.CreatableTopic.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()
        ],
    )
    c = RawClient(port, timeout=30)
    try:
        return c.call(C(topics=[topic], timeout_ms=30000, validate_only=False)).topics[0]
    finally:
        c.close()


def metadata(port: int, topics: list[str] | None, auto_create: bool = False):
    c = RawClient(port)
    try:
        M = MetadataRequest[8]
        req = M(
            topics=None if topics is None else [M.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=auto_create,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        return c.call(req)
    finally:
        c.close()


def api_versions_ok(port: int) -> bool:
    c = RawClient(port)
    try:
        return c.call(ApiVersionsRequest[0]()).error_code == 0
    finally:
        c.close()


def produce(c: RawClient, topic: str, partition: int, value: bytes) -> int:
    req = produce_req(topic, build_batch([value]), partition=partition)
    resp = c.call(req).responses[0].partition_responses[0]
    assert resp.error_code == 0, resp
    return int(resp.base_offset)


def partition_dirs(b: BrokerProcess, topic: str) -> list[str]:
    return sorted(
        d.name for d in b.log_dir.iterdir() if d.is_dir() and d.name.rpartition("-")[0] == topic
    )


@pytest.fixture
def limited(tmp_path: Path):
    started: list[BrokerProcess] = []

    def make(**overrides: str) -> BrokerProcess:
        b = BrokerProcess(tmp_path / "logs", free_port(), overrides, nofile=NOFILE)
        b.start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def stop_with_sigterm(b: BrokerProcess) -> None:
    assert b.proc is not None
    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(20) == 0, b.log_text()[-3000:]
    b.proc = None


def test_huge_partition_count_is_refused_and_nothing_is_created(limited) -> None:
    b = limited()
    result = create(b.port, "huge", 100_000)
    assert result.error_code == ErrorCode.POLICY_VIOLATION, result
    assert "max.broker.partitions" in result.error_message
    assert "ulimit -n" in result.error_message
    assert partition_dirs(b, "huge") == []
    assert "huge" not in [t.name for t in metadata(b.port, None).topics]
    assert api_versions_ok(b.port)

    # a replication factor no set of live brokers can honour
    result = create(b.port, "wide", 1, rf=3)
    assert result.error_code == ErrorCode.INVALID_REPLICATION_FACTOR, result
    assert "3" in result.error_message
    assert partition_dirs(b, "wide") == []

    # just over the limit in one request: refused whole, not created up to the limit
    result = create(b.port, "over", LIMIT + 1)
    assert result.error_code == ErrorCode.POLICY_VIOLATION, result
    assert partition_dirs(b, "over") == []
    assert create(b.port, "fits", LIMIT).error_code == 0
    assert len(partition_dirs(b, "fits")) == LIMIT
    stop_with_sigterm(b)


def test_limit_counts_every_hosted_partition_and_the_full_broker_keeps_working(limited) -> None:
    per_topic = 3
    left = LIMIT % per_topic  # room after the topics below
    b = limited(**{"num.partitions": str(left + 1)})
    topics = [f"t{i}" for i in range(LIMIT // per_topic)]
    for name in topics:
        # small segments: every produced batch below rolls a new one
        result = create(b.port, name, per_topic, **{"segment.bytes": "1000"})
        assert result.error_code == 0, result

    # many topics approaching the limit: the next one is refused whole
    result = create(b.port, "next", per_topic)
    assert result.error_code == ErrorCode.POLICY_VIOLATION, result
    assert partition_dirs(b, "next") == []

    # auto-creation (num.partitions = one more than is left) takes the same path
    md = metadata(b.port, ["auto"], auto_create=True)
    assert md.topics[0].error_code == ErrorCode.POLICY_VIOLATION, md.topics[0]
    assert partition_dirs(b, "auto") == []
    assert "auto" not in [t.name for t in metadata(b.port, None).topics]
    assert api_versions_ok(b.port)

    # 6 segments per partition (every batch rolls): only the active ones keep their files open
    written: dict[tuple[str, int], list[tuple[int, bytes | None]]] = {}
    c = RawClient(b.port)
    for round_ in range(6):
        for name in topics:
            for p in range(per_topic):
                value = f"{name}-{p}-{round_}".encode() * 100
                written.setdefault((name, p), []).append((produce(c, name, p, value), value))
    for (name, p), expected in written.items():
        assert fetch_records(c, name, p) == expected
    c.close()
    segments = len(list((b.log_dir / "t0-0").glob("*.log")))
    assert segments >= 6
    assert b.proc is not None
    assert len(os.listdir(f"/proc/{b.proc.pid}/fd")) < NOFILE * 3 // 4
    assert api_versions_ok(b.port)

    stop_with_sigterm(b)
    b.start()  # same log dir, same ulimit -n
    c = RawClient(b.port)
    for (name, p), expected in written.items():
        assert fetch_records(c, name, p) == expected
    c.close()
    assert api_versions_ok(b.port)
    stop_with_sigterm(b)


def test_a_create_that_fails_half_way_leaves_no_topic_behind(broker) -> None:
    # A plain file where partition 3's directory must go: partitions 0-2 get made, 3 fails.
    (broker.log_dir / "half-3").write_text("in the way")
    result = create(broker.port, "half", 5)
    assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR, result
    assert "nothing was created" in result.error_message
    assert partition_dirs(broker, "half") == []
    assert "half" not in [t.name for t in metadata(broker.port, None).topics]
    assert api_versions_ok(broker.port)
    stop_with_sigterm(broker)
    broker.start()
    assert "half" not in [t.name for t in metadata(broker.port, None).topics]
    (broker.log_dir / "half-3").unlink()
    assert create(broker.port, "half", 5).error_code == 0
    assert len(partition_dirs(broker, "half")) == 5


def test_start_refuses_more_partitions_than_the_file_limit_holds(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "logs", free_port(), nofile=1024)
    b.start()
    try:
        assert create(b.port, "wide", LIMIT + 12).error_code == 0
        stop_with_sigterm(b)
        b.nofile = NOFILE  # the same log dir under a smaller ulimit -n
        with pytest.raises(RuntimeError) as failed:
            b.start()
        message = str(failed.value)
        assert f"holds {LIMIT + 12} partitions" in message
        assert "raise ulimit -n" in message
        assert "Traceback" not in message
        assert b.proc is not None and b.proc.wait(10) == 2
        b.proc = None
        b.nofile = 1024
        b.start()  # with the file limit back, everything is there
        assert len(partition_dirs(b, "wide")) == LIMIT + 12
    finally:
        b.stop()


def send_create(port: int, name: str, partitions: int) -> RawClient:
    """Send a CreateTopics without waiting for its answer."""
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
    )
    c = RawClient(port, timeout=120)
    c.send_frame(c.encode(C(topics=[topic], timeout_ms=120000, validate_only=False)))
    return c


def answered(c: RawClient) -> bool:
    readable, _, _ = select.select([c.sock], [], [], 0)
    return bool(readable)


def test_a_big_create_lets_other_requests_through(broker) -> None:
    big = send_create(broker.port, "big", 600)
    while not partition_dirs(broker, "big"):  # the create has started
        time.sleep(0.01)
    assert api_versions_ok(broker.port)
    assert not answered(big), "ApiVersions waited for the whole CreateTopics"
    resp = CreateTopicsResponse[4].decode(big.recv_frame(), header=True)
    assert resp.topics[0].error_code == 0, resp
    assert len(partition_dirs(broker, "big")) == 600
    big.close()


def test_sigterm_during_a_big_create_stops_and_leaves_no_topic(broker) -> None:
    big = send_create(broker.port, "big", 2000)
    while not partition_dirs(broker, "big"):
        time.sleep(0.01)
    stop_with_sigterm(broker)
    big.close()
    broker.start()
    assert "big" not in [t.name for t in metadata(broker.port, None).topics]
    assert partition_dirs(broker, "big") == []


def test_an_explicit_limit_applies_and_is_never_above_the_file_limit(limited) -> None:
    b = limited(**{"max.broker.partitions": "4"})
    assert create(b.port, "three", 3).error_code == 0
    result = create(b.port, "two", 2)
    assert result.error_code == ErrorCode.POLICY_VIOLATION, result
    assert "max.broker.partitions=4" in result.error_message
    assert create(b.port, "one", 1).error_code == 0
    stop_with_sigterm(b)

    b.overrides["max.broker.partitions"] = str(LIMIT * 10)  # more than ulimit -n 256 allows
    b.start()
    assert "is more than the open-file limit allows" in b.log_text()
    result = create(b.port, "many", LIMIT - 4 + 1)
    assert result.error_code == ErrorCode.POLICY_VIOLATION, result
    assert f"max.broker.partitions={LIMIT}, derived from the open-file limit" in (
        result.error_message
    )
    assert create(b.port, "rest", LIMIT - 4).error_code == 0
    stop_with_sigterm(b)
