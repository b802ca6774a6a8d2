"""Consumer-group requests built by hand (kafka-python's schemas), for tests that need to send
exactly one request and read its error code: see tests/broker/rawclient.py for the socket."""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from tests.broker.rawclient import RawClient

MEMBER_ID_REQUIRED = 79


def find_coordinator(client: RawClient, group: str, timeout: float = 20) -> Any:
    """FindCoordinator v3 until it answers without error (the first one creates
    __consumer_offsets; COORDINATOR_NOT_AVAILABLE until its partitions have leaders)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = client.call(FindCoordinatorRequest[3](key=group, key_type=0))
        if resp.error_code == 0 or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def join_request(
    group: str,
    member_id: str = "",
    *,
    session_timeout_ms: int = 60_000,  # a loaded machine must not expire a test member
    rebalance_timeout_ms: int = 10_000,
    protocol_type: str = "consumer",
    protocols: list[tuple[str, bytes]] | None = None,
    instance_id: str | None = None,
    version: int = 5,
) -> Any:
    J = JoinGroupRequest[version]
    return J(
        group_id=group,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=[
            J.JoinGroupRequestProtocol(name=n, metadata=md)
            for n, md in (protocols if protocols is not None else [("range", b"sub")])
        ],
        reason=None,
    )


def join(client: RawClient, group: str, **kw: Any) -> Any:
    """JoinGroup v5 with KIP-394's member id handshake: the second answer, or the first if it
    is an error other than MEMBER_ID_REQUIRED."""
    resp = client.call(join_request(group, **kw))
    if resp.error_code != MEMBER_ID_REQUIRED:
        return resp
    kw.pop("member_id", None)
    return client.call(join_request(group, member_id=resp.member_id, **kw))


def sync_request(
    group: str, generation: int, member_id: str, assignments: dict[str, bytes] | None = None
) -> Any:
    S = SyncGroupRequest[3]
    return S(
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=None,
        assignments=[
            S.SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in (assignments or {}).items()
        ],
    )


def sync(
    client: RawClient,
    group: str,
    generation: int,
    member_id: str,
    assignments: dict[str, bytes] | None = None,
) -> Any:
    return client.call(sync_request(group, generation, member_id, assignments))


def heartbeat(client: RawClient, group: str, generation: int, member_id: str) -> Any:
    return client.call(
        HeartbeatRequest[3](
            group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None
        )
    )


def leave(client: RawClient, group: str, member_id: str) -> Any:
    L = LeaveGroupRequest[3]
    return client.call(
        L(group_id=group, members=[L.MemberIdentity(member_id=member_id, group_instance_id=None)])
    )


def commit_request(
    group: str,
    offsets: dict[tuple[str, int], int | tuple[int, str | None]],
    generation: int = -1,
    member_id: str = "",
) -> Any:
    """OffsetCommit v8: {(topic, partition): offset or (offset, metadata)}."""
    C = OffsetCommitRequest[8]
    T = C.OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), v in offsets.items():
        offset, metadata = v if isinstance(v, tuple) else (v, "")
        by_topic.setdefault(topic, []).append(
            P(
                partition_index=p,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata=metadata,
            )
        )
    return C(
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        topics=[T(name=n, partitions=ps) for n, ps in by_topic.items()],
    )


def commit(
    client: RawClient,
    group: str,
    offsets: dict[tuple[str, int], int | tuple[int, str | None]],
    generation: int = -1,
    member_id: str = "",
) -> dict[tuple[str, int], int]:
    """{(topic, partition): error code} of an OffsetCommit v8."""
    resp = client.call(commit_request(group, offsets, generation, member_id))
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch_offsets(
    client: RawClient, group: str, partitions: list[tuple[str, int]] | None = None
) -> tuple[int, dict[tuple[str, int], tuple[int, str | None, int]]]:
    """(group error, {(topic, partition): (offset, metadata, error)}) of an OffsetFetch v7;
    `partitions=None` asks for all of the group's offsets."""
    F = OffsetFetchRequest[7]
    topics = None
    if partitions is not None:
        names: dict[str, list[int]] = {}
        for t, p in partitions:
            names.setdefault(t, []).append(p)
        topics = [
            F.OffsetFetchRequestTopic(name=n, partition_indexes=ps) for n, ps in names.items()
        ]
    resp = client.call(F(group_id=group, topics=topics, require_stable=False))
    return resp.error_code, {
        (t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
        for t in resp.topics
        for p in t.partitions
    }


def describe(client: RawClient, group: str) -> Any:
    resp = client.call(
        DescribeGroupsRequest[5](groups=[group], include_authorized_operations=False)
    )
    return resp.groups[0]


class Member:
    """One group member driven by hand: joined, synced as leader with an assignment."""

    def __init__(self, client: RawClient, group: str, **join_kw: Any):
        self.client = client
        self.group = group
        resp = join(client, group, **join_kw)
        assert resp.error_code == 0, resp
        self.member_id: str = resp.member_id
        self.generation: int = resp.generation_id
        self.leader: bool = resp.leader == resp.member_id
        self.members = resp.members

    def sync(self, assignments: dict[str, bytes] | None = None) -> Any:
        return sync(self.client, self.group, self.generation, self.member_id, assignments)

    def commit(
        self, offsets: dict[tuple[str, int], int | tuple[int, str | None]]
    ) -> dict[tuple[str, int], int]:
        return commit(self.client, self.group, offsets, self.generation, self.member_id)
