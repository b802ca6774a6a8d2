"""Bad consumer-group requests, sent raw: each gets Kafka's error code (never a traceback, never a
hang), and nothing the group committed before is lost."""

from __future__ import annotations

import select
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import JoinGroupResponse, SyncGroupResponse
from kafka.protocol.metadata import ApiVersionsRequest

from isrlab.broker.errors import ErrorCode as E
from tests.broker.rawclient import RawClient
from tests.broker.rawgroup import (
    MEMBER_ID_REQUIRED,
    Member,
    commit,
    commit_request,
    describe,
    fetch_offsets,
    find_coordinator,
    heartbeat,
    join,
    join_request,
    leave,
    sync,
    sync_request,
)
from tests.broker.test_group_clients import GROUP_BROKER

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


def group_with_commits(broker: Any, client: RawClient) -> Member:
    """Group "g": one member (leader, synced), offsets t-0=5 and t-1=7 ("meta") committed."""
    create_topic(broker.bootstrap, "t", 2)
    assert find_coordinator(client, "g").error_code == 0
    m = Member(client, "g")
    assert m.leader and m.generation == 1
    assert m.sync({m.member_id: b"t:0,1"}).error_code == 0
    assert m.commit({("t", 0): 5, ("t", 1): (7, "meta")}) == {("t", 0): 0, ("t", 1): 0}
    return m


def assert_still_committed(client: RawClient, extra: dict[tuple[str, int], int] | None = None):
    err, offsets = fetch_offsets(client, "g")
    assert err == 0
    want = {("t", 0): 5, ("t", 1): 7, **(extra or {})}
    assert {tp: o for tp, (o, _md, _e) in offsets.items()} == want
    assert offsets[("t", 1)][1] == "meta"


def test_join_group_errors(broker_factory: Any) -> None:
    b = broker_factory(GROUP_BROKER)
    c = RawClient(b.port)
    m = group_with_commits(b, c)

    # another protocol type than the group's: a Kafka Connect worker joining a consumer group
    assert join(c, "g", protocol_type="connect").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    # no assignor in common with the group's members
    r = join(c, "g", protocols=[("my-own-assignor", b"")])
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    # no protocol at all, no protocol type (a new group too)
    assert join(c, "h", protocols=[]).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert join(c, "h", protocol_type="").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    # the member itself switching protocol type
    r = c.call(join_request("g", m.member_id, protocol_type="connect"))
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL

    # session timeouts outside group.min/max.session.timeout.ms (6000 .. 1800000)
    for timeout in (1, 5999, 1_800_001, -1):
        assert join(c, "g", session_timeout_ms=timeout).error_code == E.INVALID_SESSION_TIMEOUT
        assert join(c, "h", session_timeout_ms=timeout).error_code == E.INVALID_SESSION_TIMEOUT
    r = c.call(join_request("g", m.member_id, session_timeout_ms=10))
    assert r.error_code == E.INVALID_SESSION_TIMEOUT

    # the empty group id
    assert c.call(join_request("")).error_code == E.INVALID_GROUP_ID
    # a member id the group never gave out
    assert c.call(join_request("g", "made-up")).error_code == E.UNKNOWN_MEMBER_ID

    # none of it disturbed the group: same generation, same member, Stable, offsets kept
    d = describe(c, "g")
    assert (d.error_code, d.group_state) == (0, "Stable")
    assert [x.member_id for x in d.members] == [m.member_id]
    assert heartbeat(c, "g", m.generation, m.member_id).error_code == 0
    assert describe(c, "h").group_state == "Dead"  # the refused joins created nothing
    assert_still_committed(c)
    c.close()


def test_sync_heartbeat_and_leave_errors(broker_factory: Any) -> None:
    b = broker_factory(GROUP_BROKER)
    c = RawClient(b.port)
    m = group_with_commits(b, c)

    assert sync(c, "g", m.generation + 1, m.member_id).error_code == E.ILLEGAL_GENERATION
    assert sync(c, "g", m.generation - 1, m.member_id).error_code == E.ILLEGAL_GENERATION
    assert sync(c, "g", m.generation, "made-up").error_code == E.UNKNOWN_MEMBER_ID
    assert sync(c, "nope", 1, m.member_id).error_code == E.UNKNOWN_MEMBER_ID

    assert heartbeat(c, "g", m.generation, "made-up").error_code == E.UNKNOWN_MEMBER_ID
    assert heartbeat(c, "nope", 1, "made-up").error_code == E.UNKNOWN_MEMBER_ID
    assert heartbeat(c, "g", m.generation + 5, m.member_id).error_code == E.ILLEGAL_GENERATION
    assert heartbeat(c, "g", m.generation, m.member_id).error_code == 0

    # the empty group id is no group a member can be in
    assert sync(c, "", 1, m.member_id).error_code == E.INVALID_GROUP_ID
    assert heartbeat(c, "", 1, m.member_id).error_code == E.INVALID_GROUP_ID
    assert leave(c, "", m.member_id).error_code == E.INVALID_GROUP_ID

    r = leave(c, "g", "made-up")
    assert r.error_code == 0
    assert [x.error_code for x in r.members] == [E.UNKNOWN_MEMBER_ID]
    assert describe(c, "g").group_state == "Stable"
    assert_still_committed(c)

    # the real member leaves: the group is Empty and keeps its offsets
    r = leave(c, "g", m.member_id)
    assert [x.error_code for x in r.members] == [0]
    assert describe(c, "g").group_state == "Empty"
    assert heartbeat(c, "g", m.generation, m.member_id).error_code == E.UNKNOWN_MEMBER_ID
    assert_still_committed(c)
    c.close()


def test_offset_commit_errors_are_per_partition(broker_factory: Any) -> None:
    b = broker_factory(GROUP_BROKER)
    c = RawClient(b.port)
    m = group_with_commits(b, c)

    # unknown topic, unknown partition: refused; the good partition in the same request commits
    got = m.commit({("t", 0): 8, ("t", 9): 1, ("no-such-topic", 0): 1})
    assert got == {
        ("t", 0): 0,
        ("t", 9): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
    }
    err, offsets = fetch_offsets(c, "g", [("t", 0), ("t", 9), ("no-such-topic", 0)])
    assert err == 0
    assert {tp: o for tp, (o, _md, _e) in offsets.items()} == {
        ("t", 0): 8,
        ("t", 9): -1,
        ("no-such-topic", 0): -1,
    }

    # metadata over offset.metadata.max.bytes (4096): refused, the other partition commits
    got = m.commit({("t", 1): (9, "x" * 4097), ("t", 0): (9, "y" * 4096)})
    assert got == {("t", 1): E.OFFSET_METADATA_TOO_LARGE, ("t", 0): 0}
    err, offsets = fetch_offsets(c, "g")
    assert offsets[("t", 1)][:2] == (7, "meta")
    assert offsets[("t", 0)][:2] == (9, "y" * 4096)

    # commits that are not the member's: wrong generation, unknown member, and a "simple"
    # (generation -1) commit while the group has a member
    tp0 = {("t", 0): 1}
    assert commit(c, "g", tp0, m.generation + 1, m.member_id) == {("t", 0): E.ILLEGAL_GENERATION}
    assert commit(c, "g", tp0, m.generation, "made-up") == {("t", 0): E.UNKNOWN_MEMBER_ID}
    assert commit(c, "g", tp0) == {("t", 0): E.UNKNOWN_MEMBER_ID}
    # a member's commit to a group that does not exist
    assert commit(c, "nope", tp0, 1, "made-up") == {("t", 0): E.UNKNOWN_MEMBER_ID}
    # the empty group id: Kafka keeps taking offsets for it (old clients committed there)
    assert commit(c, "", tp0) == {("t", 0): 0}
    assert fetch_offsets(c, "")[1] == {("t", 0): (1, "", 0)}

    err, offsets = fetch_offsets(c, "g")
    assert {tp: o for tp, (o, _md, _e) in offsets.items()} == {("t", 0): 9, ("t", 1): 7}
    c.close()


def test_member_metadata_up_to_the_request_limit_works_and_over_it_closes_the_connection(
    broker_factory: Any,
) -> None:
    limit = 300_000
    b = broker_factory({**GROUP_BROKER, "socket.request.max.bytes": str(limit)})
    c = RawClient(b.port)
    m = group_with_commits(b, c)

    # a JoinGroup frame over socket.request.max.bytes: the broker closes the connection
    big = RawClient(b.port)
    assert find_coordinator(big, "g2").error_code == 0
    big.send_frame(big.encode(join_request("g2", protocols=[("range", b"m" * limit)])))
    assert big.is_closed()
    big.close()

    # large but allowed metadata: relayed to the leader as it was sent, kept in the group
    large = b"L" * (limit - 10_000)
    other = RawClient(b.port)
    first = join(other, "g2", protocols=[("range", large)])
    assert first.error_code == 0
    assert [(x.member_id, bytes(x.metadata)) for x in first.members] == [(first.member_id, large)]
    r = sync(other, "g2", first.generation_id, first.member_id, {first.member_id: b"a" * 1000})
    assert (r.error_code, bytes(r.assignment)) == (0, b"a" * 1000)
    d = describe(other, "g2")
    assert d.group_state == "Stable"
    assert bytes(d.members[0].member_metadata) == large
    other.close()

    # the first group never noticed
    assert heartbeat(c, "g", m.generation, m.member_id).error_code == 0
    assert_still_committed(c)
    c.close()


GROUP_APIS = {
    10: ("FindCoordinator", 0, 4),
    11: ("JoinGroup", 0, 9),
    14: ("SyncGroup", 0, 5),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 5),
    8: ("OffsetCommit", 2, 8),
    9: ("OffsetFetch", 1, 8),
    15: ("DescribeGroups", 0, 5),
    16: ("ListGroups", 0, 4),
    42: ("DeleteGroups", 0, 2),
    47: ("OffsetDelete", 0, 0),
}


def test_api_versions_advertises_the_group_apis(broker_factory: Any) -> None:
    b = broker_factory(GROUP_BROKER)
    c = RawClient(b.port)
    resp = c.call(ApiVersionsRequest[3](client_software_name="raw", client_software_version="1"))
    assert resp.error_code == 0
    versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    for key, (name, low, high) in GROUP_APIS.items():
        assert versions.get(key) == (low, high), name
    c.close()


def test_a_member_id_handed_out_stays_valid_while_another_member_completes_a_join(
    broker_factory: Any,
) -> None:
    """KIP-394: JoinGroup v4+ hands out a member id first (MEMBER_ID_REQUIRED). Two members start
    at once; the first completes a generation alone (no initial delay). The second's id is still
    pending, as in Kafka (pending members leave only by joining, LeaveGroup or session expiry):
    its join is accepted and rebalances the group to include it."""
    b = broker_factory(GROUP_BROKER)
    first, second = RawClient(b.port), RawClient(b.port)
    assert find_coordinator(first, "pair").error_code == 0
    r1 = first.call(join_request("pair"))
    r2 = second.call(join_request("pair"))
    assert r1.error_code == r2.error_code == MEMBER_ID_REQUIRED
    a = first.call(join_request("pair", r1.member_id))
    assert (a.error_code, a.generation_id, len(a.members)) == (0, 1, 1)
    assert sync(first, "pair", 1, a.member_id, {a.member_id: b"all"}).error_code == 0

    # the second member joins with the id it was given; its answer waits for the rebalance
    second.send_frame(second.encode(join_request("pair", r2.member_id)))
    deadline = time.monotonic() + 10
    while describe(first, "pair").group_state != "PreparingRebalance":
        readable, _, _ = select.select([second.sock], [], [], 0.05)
        if readable:  # answered at once: refused
            early = JoinGroupResponse[5].decode(second.recv_frame(), header=True)
            raise AssertionError(f"the pending member's join was answered at once: {early}")
        assert time.monotonic() < deadline, "no rebalance"
    assert heartbeat(first, "pair", 1, a.member_id).error_code == E.REBALANCE_IN_PROGRESS
    a = first.call(join_request("pair", a.member_id))
    joined = JoinGroupResponse[5].decode(second.recv_frame(), header=True)
    assert joined.error_code == 0, joined
    assert joined.member_id == r2.member_id
    assert a.error_code == 0 and a.generation_id == joined.generation_id == 2
    assert len(a.members if a.leader == a.member_id else joined.members) == 2
    first.close()
    second.close()


def test_an_assignment_that_cannot_be_stored_fails_the_sync_and_rebalances(
    broker_factory: Any,
) -> None:
    """Three members with 400 KB of metadata each: their group record (1.2 MB) is over
    message.max.bytes of __consumer_offsets. As in Kafka, the SyncGroup answers
    UNKNOWN_SERVER_ERROR to every member waiting, and the group prepares a new rebalance
    (it does not stay in CompletingRebalance with an assignment it could not keep)."""
    b = broker_factory({**GROUP_BROKER, "group.initial.rebalance.delay.ms": "2000"})
    clients = [RawClient(b.port, timeout=20) for _ in range(3)]
    assert find_coordinator(clients[0], "heavy").error_code == 0
    first = [c.call(join_request("heavy")) for c in clients]
    assert {r.error_code for r in first} == {MEMBER_ID_REQUIRED}
    big = b"S" * 400_000
    for c, r in zip(clients, first, strict=True):  # all within the initial delay
        c.send_frame(c.encode(join_request("heavy", r.member_id, protocols=[("range", big)])))
    joined = [JoinGroupResponse[5].decode(c.recv_frame(), header=True) for c in clients]
    assert {(r.error_code, r.generation_id) for r in joined} == {(0, 1)}
    leader = next(i for i, r in enumerate(joined) if r.leader == r.member_id)
    followers = [i for i in range(3) if i != leader]
    for i in followers:  # they wait for the leader's assignment
        clients[i].send_frame(clients[i].encode(sync_request("heavy", 1, joined[i].member_id)))
    assignments = {r.member_id: b"x" for r in joined}
    answer = sync(clients[leader], "heavy", 1, joined[leader].member_id, assignments)
    assert answer.error_code == E.UNKNOWN_SERVER_ERROR
    for i in followers:
        r = SyncGroupResponse[3].decode(clients[i].recv_frame(), header=True)
        assert r.error_code == E.UNKNOWN_SERVER_ERROR
    assert describe(clients[0], "heavy").group_state == "PreparingRebalance"
    # and the broker says why, at ERROR, as Kafka does (the clients see only the unknown error)
    said = b.stderr_path.read_text()
    assert "group coordinator: appending" in said and "__consumer_offsets" in said, said[-2000:]
    assert "larger than the topic's segment.bytes or max.message.bytes" in said
    # the broker is fine: another group works
    assert Member(clients[0], "light").sync().error_code == 0
    for c in clients:
        c.close()


def test_truncated_group_requests_close_the_connection_and_the_broker_serves_on(
    broker_factory: Any,
) -> None:
    """A group request cut short (a client bug, or garbage): the broker cannot parse it, logs
    one line and closes that connection, as Kafka does; no traceback, nothing else disturbed."""
    from kafka.protocol.admin import DeleteGroupsRequest, ListGroupsRequest
    from kafka.protocol.metadata import FindCoordinatorRequest

    b = broker_factory(GROUP_BROKER)
    c = RawClient(b.port)
    m = group_with_commits(b, c)
    requests = [
        join_request("g"),
        sync_request("g", m.generation, m.member_id, {m.member_id: b"x" * 50}),
        commit_request("g", {("t", 0): 99}, m.generation, m.member_id),
        FindCoordinatorRequest[4](key_type=0, coordinator_keys=["g", "other-group"]),
        DeleteGroupsRequest[2](groups_names=["g", "other-group"]),
        ListGroupsRequest[4](states_filter=["Stable", "Empty"]),
    ]
    for req in requests:
        bad = RawClient(b.port)
        frame = bad.encode(req)
        bad.send_frame(frame[: len(frame) - max(2, len(frame) // 3)])
        assert bad.is_closed(), type(req).__name__
        bad.close()
    assert "Traceback" not in b.log_text()
    assert b.log_text().count("malformed") >= len(requests)
    assert heartbeat(c, "g", m.generation, m.member_id).error_code == 0
    assert_still_committed(c)
    c.close()
