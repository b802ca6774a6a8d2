"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete, and
TxnOffsetCommit (offsets sent to a transaction).

Each handler turns the request schema into the coordinator core's request, asks the shell
(`GroupCoordinatorService.call`), and encodes the answer for the request's version. The decisions
are the core's (broker/coordinator/group/coordinator.py); what is checked here is only what
needs the broker's metadata (does the topic partition exist), and Kafka's rule on the empty group
id: SyncGroup, Heartbeat and LeaveGroup refuse it with INVALID_GROUP_ID (JoinGroup's core does),
OffsetCommit/OffsetFetch/DescribeGroups/DeleteGroups accept it, as Kafka does for old clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    DeleteGroupsResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse
from kafka.protocol.producer.transaction import TxnOffsetCommitResponse

from isrlab.broker.apis.grouping import by_topic
from isrlab.broker.coordinator.group.coordinator import (
    CommitRequest,
    CommitResult,
    HeartbeatRequest,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
    TxnCommitRequest,
)
from isrlab.broker.coordinator.group.service import OFFSETS_TOPIC
from isrlab.broker.coordinator.shell import coordinator_address
from isrlab.broker.coordinator.transaction.service import TRANSACTION_TOPIC
from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.codec import FileRegion, Request, encode_response

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer

Response = list[bytes | FileRegion]
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


# ----- FindCoordinator ---------------------------------------------------------------------


async def _find_one(
    server: KafkaServer, key: str, key_type: int, listener: str = ""
) -> tuple[int, str, int, int, str | None]:
    """(node id, host, port, error, message) of the coordinator of `key`: the leader of the
    internal topic's partition for it (created on first use, as Kafka does)."""
    if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        return (
            -1,
            "",
            -1,
            int(ErrorCode.INVALID_REQUEST),
            f"unknown coordinator key type {key_type}",
        )
    what = "group id" if key_type == KEY_TYPE_GROUP else "transactional id"
    if not key:
        return -1, "", -1, int(ErrorCode.INVALID_REQUEST), f"the {what} is empty"
    if key_type == KEY_TYPE_GROUP:
        topic = OFFSETS_TOPIC
        err = await server.group_coordinator.ensure_offsets_topic()
        p = server.group_coordinator.core.partition_for(key)
    else:
        topic = TRANSACTION_TOPIC
        err = await server.txn_coordinator.ensure_transaction_topic()
        p = server.txn_coordinator.core.partition_for(key)
    if err:
        return -1, "", -1, int(err), f"{topic} is not available yet"
    address = coordinator_address(server, topic, p, listener or None)
    if address is None:
        return (
            -1,
            "",
            -1,
            int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
            f"{topic}-{p} has no leader",
        )
    return address[0], address[1], address[2], 0, None


async def handle_find_coordinator(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = FindCoordinatorResponse[v]
    key_type = getattr(req, "key_type", KEY_TYPE_GROUP) or KEY_TYPE_GROUP
    if v >= 4:
        C = cls.Coordinator
        coordinators = []
        for key in req.coordinator_keys:
            node, host, port, err, msg = await _find_one(server, key, key_type, request.listener)
            coordinators.append(
                C(key=key, node_id=node, host=host, port=port, error_code=err, error_message=msg)
            )
        resp = cls(throttle_time_ms=0, coordinators=coordinators)
    else:
        node, host, port, err, msg = await _find_one(server, req.key, key_type, request.listener)
        resp = cls(
            throttle_time_ms=0,
            error_code=err,
            error_message=msg,
            node_id=node,
            host=host,
            port=port,
        )
    return encode_response(resp, v, request.correlation_id)


# ----- membership --------------------------------------------------------------------------


async def handle_join_group(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    session = req.session_timeout_ms
    rebalance = getattr(req, "rebalance_timeout_ms", -1)
    core_req = JoinRequest(
        group_id=req.group_id,
        member_id=req.member_id or "",
        group_instance_id=getattr(req, "group_instance_id", None),
        client_id=request.client_id or "",
        client_host=request.client_host,
        session_timeout_ms=session,
        rebalance_timeout_ms=session if v == 0 or rebalance is None or rebalance < 0 else rebalance,
        protocol_type=req.protocol_type or "",
        protocols=[(p.name, bytes(p.metadata or b"")) for p in req.protocols],
        require_known_member_id=v >= 4,
        supports_skip_assignment=v >= 9,
    )
    service = server.group_coordinator
    res: JoinResult = await service.call(service.core.join_group, core_req)
    cls = JoinGroupResponse[v]
    M = cls.JoinGroupResponseMember
    resp = cls(
        throttle_time_ms=0,
        error_code=int(res.error),
        generation_id=res.generation,
        protocol_type=res.protocol_type,
        protocol_name=res.protocol if (res.protocol is not None or v >= 7) else "",
        leader=res.leader,
        skip_assignment=res.skip_assignment,
        member_id=res.member_id,
        members=[M(member_id=m, group_instance_id=i, metadata=md) for m, i, md in res.members],
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_sync_group(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    core_req = SyncRequest(
        group_id=req.group_id,
        generation=req.generation_id,
        member_id=req.member_id,
        group_instance_id=getattr(req, "group_instance_id", None),
        protocol_type=getattr(req, "protocol_type", None),
        protocol=getattr(req, "protocol_name", None),
        assignments={a.member_id: bytes(a.assignment or b"") for a in req.assignments},
    )
    service = server.group_coordinator
    if not req.group_id:
        res = SyncResult(ErrorCode.INVALID_GROUP_ID)
    else:
        res = await service.call(service.core.sync_group, core_req)
    cls = SyncGroupResponse[v]
    resp = cls(
        throttle_time_ms=0,
        error_code=int(res.error),
        protocol_type=res.protocol_type,
        protocol_name=res.protocol,
        assignment=res.assignment,
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_heartbeat(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    core_req = HeartbeatRequest(
        req.group_id, req.generation_id, req.member_id, getattr(req, "group_instance_id", None)
    )
    service = server.group_coordinator
    err: ErrorCode = ErrorCode.INVALID_GROUP_ID
    if req.group_id:
        err = await service.call(service.core.heartbeat, core_req)
    resp = HeartbeatResponse[v](throttle_time_ms=0, error_code=int(err))
    return encode_response(resp, v, request.correlation_id)


async def handle_leave_group(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    if v >= 3:
        members = [(m.member_id, m.group_instance_id) for m in req.members]
    else:
        members = [(req.member_id, None)]
    service = server.group_coordinator
    if not req.group_id:
        res = LeaveResult(ErrorCode.INVALID_GROUP_ID)
    else:
        res = await service.call(service.core.leave_group, LeaveRequest(req.group_id, members))
    cls = LeaveGroupResponse[v]
    if v >= 3:
        R = cls.MemberResponse
        resp = cls(
            throttle_time_ms=0,
            error_code=int(res.error),
            members=[
                R(member_id=m, group_instance_id=i, error_code=int(e)) for m, i, e in res.members
            ],
        )
    else:
        err = res.error or (res.members[0][2] if res.members else ErrorCode.NONE)
        resp = cls(throttle_time_ms=0, error_code=int(err))
    return encode_response(resp, v, request.correlation_id)


# ----- offsets -----------------------------------------------------------------------------


def _partition_exists(server: KafkaServer, topic: str, partition: int) -> bool:
    info = server.topics_snapshot().get(topic)
    return info is not None and partition in info.assignment


def _requested_offsets(
    server: KafkaServer, topics: list[Any], leader_epochs: bool
) -> tuple[
    list[tuple[str, int]],
    dict[tuple[str, int], ErrorCode],
    dict[tuple[str, int], tuple[int, int, str | None]],
]:
    """An (Txn)OffsetCommit request's partitions in the request's order,
    UNKNOWN_TOPIC_OR_PARTITION for those that do not exist, and (offset, leader epoch, metadata)
    for the others; the leader epoch is -1 unless `leader_epochs` (the version carries it)."""
    errors: dict[tuple[str, int], ErrorCode] = {}
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    order: list[tuple[str, int]] = []
    for t in topics:
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            order.append(tp)
            if not _partition_exists(server, t.name, p.partition_index):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                epoch = getattr(p, "committed_leader_epoch", -1) if leader_epochs else -1
                offsets[tp] = (
                    p.committed_offset,
                    -1 if epoch is None else epoch,
                    p.committed_metadata,
                )
    return order, errors, offsets


async def handle_offset_commit(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    order, errors, offsets = _requested_offsets(server, req.topics, leader_epochs=True)
    if offsets:
        core_req = CommitRequest(
            group_id=req.group_id,
            generation=req.generation_id_or_member_epoch,
            member_id=req.member_id or "",
            group_instance_id=getattr(req, "group_instance_id", None),
            offsets=offsets,
            retention_ms=_retention(getattr(req, "retention_time_ms", -1)),
        )
        service = server.group_coordinator
        res: CommitResult = await service.call(service.core.commit_offsets, core_req)
        errors.update(res.errors)
    cls = OffsetCommitResponse[v]
    T = cls.OffsetCommitResponseTopic
    return _commit_response(request, cls, T, T.OffsetCommitResponsePartition, order, errors)


def _retention(value: int | None) -> int:
    return -1 if value is None or value < 0 else value


async def _fetch_group(
    server: KafkaServer, group_id: str, topics: list[Any] | None, require_stable: bool
) -> tuple[ErrorCode, list[tuple[str, int, int, int, str | None, ErrorCode]]]:
    partitions = (
        None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    )
    service = server.group_coordinator
    res: OffsetFetchResult = await service.call(
        service.core.fetch_offsets, group_id, partitions, require_stable
    )
    if res.error:
        return res.error, []
    rows: list[tuple[str, int, int, int, str | None, ErrorCode]] = []
    for (topic, p), c in res.offsets.items():
        if c is None:
            err = res.errors.get((topic, p), ErrorCode.NONE)
            rows.append((topic, p, -1, -1, "", err))
        else:
            rows.append((topic, p, c.offset, c.leader_epoch, c.metadata, ErrorCode.NONE))
    return ErrorCode.NONE, rows


async def handle_offset_fetch(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = OffsetFetchResponse[v]
    # v7+ (KIP-447): UNSTABLE_OFFSET_COMMIT for a partition with a commit in flight or a
    # transactional commit whose transaction has not ended
    require_stable = bool(getattr(req, "require_stable", False)) if v >= 7 else False
    if v >= 8:
        G = cls.OffsetFetchResponseGroup
        T = G.OffsetFetchResponseTopics
        P = T.OffsetFetchResponsePartitions
        groups = []
        for g in req.groups:
            err, rows = await _fetch_group(server, g.group_id, g.topics, require_stable)
            by_topic: dict[str, list[Any]] = {}
            for topic, p, off, ep, md, e in rows:
                by_topic.setdefault(topic, []).append(
                    P(
                        partition_index=p,
                        committed_offset=off,
                        committed_leader_epoch=ep,
                        metadata=md,
                        error_code=int(e),
                    )
                )
            groups.append(
                G(
                    group_id=g.group_id,
                    topics=[T(name=n, partitions=ps) for n, ps in by_topic.items()],
                    error_code=int(err),
                )
            )
        resp = cls(throttle_time_ms=0, groups=groups)
    else:
        T1 = cls.OffsetFetchResponseTopic
        P1 = T1.OffsetFetchResponsePartition
        err, rows = await _fetch_group(server, req.group_id, req.topics, require_stable)
        by_topic1: dict[str, list[Any]] = {}
        for topic, p, off, ep, md, e in rows:
            by_topic1.setdefault(topic, []).append(
                P1(
                    partition_index=p,
                    committed_offset=off,
                    committed_leader_epoch=ep,
                    metadata=md,
                    error_code=int(e if v >= 2 or not err else err),
                )
            )
        resp = cls(
            throttle_time_ms=0,
            topics=[T1(name=n, partitions=ps) for n, ps in by_topic1.items()],
            error_code=int(err),
        )
    return encode_response(resp, v, request.correlation_id)


async def handle_txn_offset_commit(server: KafkaServer, request: Request) -> Response:
    """TxnOffsetCommit v0-3: offsets a transactional producer sends to its transaction
    (Kafka's handleTxnOffsetCommitRequest). Unknown topics or partitions are answered
    UNKNOWN_TOPIC_OR_PARTITION here; the rest goes to the coordinator, whose transactional
    append lets the partition check the producer (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, and
    with verification that the producer added the offsets partition to its transaction)."""
    v = request.api_version
    req = request.body
    order, errors, offsets = _requested_offsets(server, req.topics, leader_epochs=v >= 2)
    if offsets:
        generation = getattr(req, "generation_id", -1) if v >= 3 else -1
        core_req = TxnCommitRequest(
            transactional_id=req.transactional_id or "",
            producer_id=req.producer_id,
            producer_epoch=req.producer_epoch,
            group_id=req.group_id or "",
            generation=-1 if generation is None else generation,
            member_id=(getattr(req, "member_id", "") or "") if v >= 3 else "",
            group_instance_id=getattr(req, "group_instance_id", None) if v >= 3 else None,
            offsets=offsets,
        )
        service = server.group_coordinator
        res: CommitResult = await service.call(service.core.txn_offset_commit, core_req)
        errors.update(res.errors)
    if v < 2:
        # Kafka: clients before 2.3 (TxnOffsetCommit < v2) do not retry a loading coordinator
        errors = {
            tp: ErrorCode.COORDINATOR_NOT_AVAILABLE
            if e == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            else e
            for tp, e in errors.items()
        }
    cls = TxnOffsetCommitResponse[v]
    T = cls.TxnOffsetCommitResponseTopic
    return _commit_response(request, cls, T, T.TxnOffsetCommitResponsePartition, order, errors)


def _commit_response(
    request: Request,
    cls: Any,
    topic_cls: Any,
    partition_cls: Any,
    order: list[tuple[str, int]],
    errors: dict[tuple[str, int], ErrorCode],
) -> Response:
    """An (Txn)OffsetCommit response: the error of every partition, in the request's order."""
    topics = by_topic(
        ((tp, errors.get(tp, ErrorCode.NONE)) for tp in order),
        lambda p, e: partition_cls(partition_index=p, error_code=int(e)),
    )
    resp = cls(
        throttle_time_ms=0,
        topics=[topic_cls(name=name, partitions=parts) for name, parts in topics.items()],
    )
    return encode_response(resp, request.api_version, request.correlation_id)


async def handle_offset_delete(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    wanted: list[tuple[str, int]] = []
    unknown: dict[tuple[str, int], ErrorCode] = {}
    for t in req.topics:
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if _partition_exists(server, *tp):
                wanted.append(tp)
            else:
                unknown[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    service = server.group_coordinator
    top, errors = await service.call(service.core.delete_offsets, req.group_id, wanted)
    errors = {**errors, **unknown}
    cls = OffsetDeleteResponse[v]
    T = cls.OffsetDeleteResponseTopic
    P = T.OffsetDeleteResponsePartition
    topics = (
        {}
        if top
        else by_topic(errors.items(), lambda p, e: P(partition_index=p, error_code=int(e)))
    )
    resp = cls(
        error_code=int(top),
        throttle_time_ms=0,
        topics=[T(name=n, partitions=ps) for n, ps in topics.items()],
    )
    return encode_response(resp, v, request.correlation_id)


# ----- administration ----------------------------------------------------------------------


async def handle_list_groups(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    states = set(getattr(req, "states_filter", None) or [])
    err, listings = server.group_coordinator.core.list_groups(states or None)
    cls = ListGroupsResponse[v]
    G = cls.ListedGroup
    resp = cls(
        throttle_time_ms=0,
        error_code=int(err),
        groups=[
            G(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state)
            for g in listings
        ],
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_describe_groups(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = DescribeGroupsResponse[v]
    G = cls.DescribedGroup
    M = G.DescribedGroupMember
    core = server.group_coordinator.core
    groups = []
    for group_id in req.groups:
        d = core.describe_group(group_id)
        groups.append(
            G(
                error_code=int(d.error),
                error_message=None,
                group_id=group_id,
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol,
                members=[
                    M(
                        member_id=m,
                        group_instance_id=i,
                        client_id=c,
                        client_host=h,
                        member_metadata=md,
                        member_assignment=a,
                    )
                    for m, i, c, h, md, a in d.members
                ],
                authorized_operations=None,  # Kafka's -2^31: not requested / unknown
            )
        )
    resp = cls(throttle_time_ms=0, groups=groups)
    return encode_response(resp, v, request.correlation_id)


async def handle_delete_groups(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    service = server.group_coordinator
    names = list(req.groups_names)
    results: dict[str, ErrorCode] = await service.call(service.core.delete_groups, names)
    cls = DeleteGroupsResponse[v]
    R = cls.DeletableGroupResult
    resp = cls(
        throttle_time_ms=0,
        results=[R(group_id=g, error_code=int(results.get(g, ErrorCode.NONE))) for g in names],
    )
    return encode_response(resp, v, request.correlation_id)
