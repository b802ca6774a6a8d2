"""The group coordinator's decisions, sans-IO (Kafka's GroupCoordinator + GroupMetadataManager).

Every request is a method call `(now, ref, request) -> [Effect]`. `ref` is the caller's handle on
the waiting request; the coordinator answers it with a `Reply(ref, result)` effect, at once or
later (a JoinGroup waits for the rebalance, a SyncGroup for the leader's assignment to be
written, an OffsetCommit for its record to be acknowledged). Writing to `__consumer_offsets` is an
`Append` effect; the shell appends the records and reports back with `on_append_done(token, ...)`.
Time only moves through `tick(now)`, so hypothesis can drive the coordinator through any
interleaving without a clock or a socket (tests/coordinator/).

Which groups this broker coordinates: the groups whose `partition_for(group)` partition of
`__consumer_offsets` it leads. `begin_load` marks such a partition as loading (requests get
COORDINATOR_LOAD_IN_PROGRESS), `complete_load` replays its records (latest value per key wins, a
null value deletes) into groups and offsets, `unload` drops them again when leadership moves.

Transactional offset commits (TxnOffsetCommit, KIP-98/KIP-447) are written as a transactional
batch (`Append.producer`) and stay pending per (group, producer id) until the transaction's
marker is written to the group's partition: the shell then calls `complete_txn`, which makes them
the committed offsets (commit; unless a plain commit whose record is later in the log already
replaced them) or drops them (abort). OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for a partition with a commit pending. A load holds the records of
transactional batches per producer until that producer's marker (`TxnMarker`) in the log.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from isrlab.broker import clock
from isrlab.broker.coordinator.effects import Reply
from isrlab.broker.coordinator.group.group import (
    CommittedOffset,
    Group,
    GroupState,
    Member,
)
from isrlab.broker.coordinator.group.records import (
    GroupMetadataKey,
    GroupValue,
    MemberRecord,
    OffsetKey,
    OffsetValue,
)
from isrlab.broker.coordinator.ownership import PartitionOwnership
from isrlab.broker.errors import ErrorCode

TopicPartition = tuple[str, int]
Key = OffsetKey | GroupMetadataKey
Value = OffsetValue | GroupValue

log = logging.getLogger(__name__)
#: (group, topic, partition): an offset while loading
_OffsetId = tuple[str, str, int]


# ----- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupConfig:
    num_partitions: int = 50  # offsets.topic.num.partitions
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    new_member_join_timeout_ms: int = 300_000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs


# ----- requests and results ------------------------------------------------------------------


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool = True  # JoinGroup v4+ (KIP-394)
    supports_skip_assignment: bool = False  # JoinGroup v9+ (KIP-814)


@dataclass
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    #: the leader's view: (member id, group instance id, metadata for the chosen protocol)
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncRequest:
    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol: str | None
    assignments: dict[str, bytes]


@dataclass
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class HeartbeatRequest:
    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None


@dataclass(frozen=True)
class LeaveRequest:
    group_id: str
    members: list[tuple[str, str | None]]  # (member id, group instance id)


@dataclass
class LeaveResult:
    error: ErrorCode
    members: list[tuple[str, str | None, ErrorCode]] = field(default_factory=list)


@dataclass(frozen=True)
class CommitRequest:
    group_id: str
    generation: int  # -1: a "simple" commit by a client that is not a group member
    member_id: str
    group_instance_id: str | None
    offsets: dict[TopicPartition, tuple[int, int, str | None]]  # offset, leader epoch, metadata
    #: OffsetCommit v2-v4 `retention_time_ms`: -1 for the broker's retention, else the offsets
    #: expire this long after the commit (Kafka's expire timestamp, OffsetCommitValue v1)
    retention_ms: int = -1


@dataclass(frozen=True)
class TxnCommitRequest:
    """TxnOffsetCommit: offsets sent to a transaction (Kafka's handleTxnCommitOffsets).
    `generation`, `member_id` and `group_instance_id` come with v3+ (KIP-447); older versions
    send -1, "" and None, and the group membership is not checked."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None
    offsets: dict[TopicPartition, tuple[int, int, str | None]]  # offset, leader epoch, metadata


@dataclass
class CommitResult:
    errors: dict[TopicPartition, ErrorCode]


@dataclass
class OffsetFetchResult:
    error: ErrorCode
    offsets: dict[TopicPartition, CommittedOffset | None]
    #: partitions answered with an error instead of an offset (UNSTABLE_OFFSET_COMMIT under
    #: require_stable); their entry in `offsets` is None
    errors: dict[TopicPartition, ErrorCode] = field(default_factory=dict)


# ----- loading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedRecord:
    """One record of `__consumer_offsets` read while loading. `offset` is the first offset of
    its batch (Kafka's appendedBatchOffset: which of two commits is newer); `producer_id` >= 0
    when the batch is transactional (the record is pending until that producer's marker)."""

    key: Key
    value: Value | None
    offset: int = -1
    producer_id: int = -1


@dataclass(frozen=True)
class TxnMarker:
    """A transaction marker (control batch) read while loading: the producer's pending records
    in this partition are committed or dropped."""

    producer_id: int
    commit: bool


#: What `complete_load` replays, in log order. A bare (key, value) is a plain record of unknown
#: offset.
LoadItem = LoadedRecord | TxnMarker | tuple[Key, Value | None]


@dataclass
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol: str
    #: (member id, instance id, client id, client host, metadata, assignment)
    members: list[tuple[str, str | None, str, str, bytes, bytes]]


@dataclass
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


# ----- effects -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """Write these records to partition `partition` of __consumer_offsets (acks=all), then call
    `on_append_done(token, error, offset)` with the offset of the batch's first record.
    `producer` (producer id, epoch): a transactional batch of that producer (TxnOffsetCommit),
    appended with the coordinator's origin so the partition checks the producer's epoch and
    that its transaction includes the partition."""

    partition: int
    entries: list[tuple[Key, Value | None]]
    token: int
    producer: tuple[int, int] | None = None


Effect = Reply | Append


@dataclass
class _PendingAppend:
    kind: str  # "sync", "commit", "offset-delete", "group-delete", "store"
    group_id: str
    partition: int
    ref: Any = None
    generation: int = -1
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    #: a transactional commit's producer id (-1: a plain commit)
    producer_id: int = -1
    #: the pending offsets of the same transaction this commit replaced, restored if its
    #: write fails (their records are in the log, pending on the same marker)
    replaced: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)


class GroupCoordinator(PartitionOwnership):
    def __init__(
        self,
        config: GroupConfig,
        new_member_id: Callable[[str], str] | None = None,
    ):
        self.config = config
        self.num_partitions = config.num_partitions
        self.groups: dict[str, Group] = {}
        #: offsets partitions this broker leads and has loaded, with the leader epoch
        self.owned: dict[int, int] = {}
        #: offsets partitions being loaded (requests wait with COORDINATOR_LOAD_IN_PROGRESS)
        self.loading: dict[int, int] = {}
        self._new_member_id = new_member_id or (lambda client_id: f"{client_id}-{clock.uuid4()}")
        self._tokens = itertools.count(1)
        self._appends: dict[int, _PendingAppend] = {}
        #: the first offsets-retention check runs one interval after the first tick, as Kafka
        #: schedules it (not at start-up, where it raced clients creating their first group)
        self._next_retention_check: int | None = None
        #: per-partition errors of a commit decided before its append (metadata too large)
        self._commit_errors: dict[int, dict[TopicPartition, ErrorCode]] = {}
        #: OffsetDelete answers waiting for their tombstones
        self._offset_deletes: dict[int, tuple[ErrorCode, dict[TopicPartition, ErrorCode]]] = {}
        #: DeleteGroups: request ref -> (answer so far, tokens of tombstone appends not yet done)
        self._group_deletes: dict[Any, tuple[dict[str, ErrorCode], set[int]]] = {}
        #: transactions completed (`complete_txn`) while a partition was loading, applied once
        #: its load is done: (producer id, commit)
        self._completed_while_loading: dict[int, list[tuple[int, bool]]] = {}
        #: producer id -> groups that may hold its pending offsets (Kafka's
        #: openGroupsForProducer): a marker looks only at these, not at every group
        self._txn_groups: dict[int, set[str]] = {}

    # ----- ownership -----------------------------------------------------------------------

    def begin_load(self, partition: int, epoch: int) -> list[Effect]:
        effects = self._drop_partition(partition) if partition in self.owned else []
        self.owned.pop(partition, None)
        self.loading[partition] = epoch
        self._completed_while_loading[partition] = []
        return effects

    def complete_load(
        self, partition: int, epoch: int, items: Iterable[LoadItem], now: int
    ) -> None:
        """Replay the partition's records (oldest first), as Kafka's doLoadGroupsAndOffsets:
        latest value per key wins; the offsets of a transactional batch are held per producer
        until that producer's marker (commit: they replace the loaded offset unless its record
        is newer; abort: dropped); those without a marker at the log end stay pending (a later
        `complete_txn` resolves them). Ignored if the load was overtaken by a newer leadership
        change."""
        if self.loading.get(partition) != epoch:
            return
        offsets: dict[_OffsetId, CommittedOffset] = {}
        pending: dict[int, dict[_OffsetId, CommittedOffset]] = {}
        groups: dict[str, GroupValue] = {}
        for item in items:
            if isinstance(item, TxnMarker):
                txn = pending.pop(item.producer_id, {})
                if item.commit:
                    for k, c in txn.items():
                        current = offsets.get(k)
                        if current is None or current.older_than(c):
                            offsets[k] = c
                continue
            if isinstance(item, LoadedRecord):
                key, value, at, producer_id = item.key, item.value, item.offset, item.producer_id
            else:
                (key, value), at, producer_id = item, -1, -1
            if isinstance(key, OffsetKey):
                k = (key.group, key.topic, key.partition)
                target = offsets if producer_id < 0 else pending.setdefault(producer_id, {})
                if value is None:
                    target.pop(k, None)
                elif isinstance(value, OffsetValue):
                    target[k] = CommittedOffset(
                        value.offset,
                        value.leader_epoch,
                        value.metadata,
                        value.commit_timestamp,
                        value.expire_timestamp,
                        append_offset=at,
                    )
            else:
                if value is None:
                    groups.pop(key.group, None)
                elif isinstance(value, GroupValue):
                    groups[key.group] = value
        for group_id, gv in groups.items():
            self.groups[group_id] = self._group_from_record(group_id, gv, now)

        def group_of(group_id: str) -> Group:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = Group(group_id, state_timestamp=now)
            return group

        for (group_id, topic, p), c in offsets.items():
            group_of(group_id).offsets[(topic, p)] = c
        for producer_id, txn in pending.items():
            for (group_id, topic, p), c in txn.items():
                group_of(group_id).pending_txn_offsets.setdefault(producer_id, {})[(topic, p)] = c
                self._txn_groups.setdefault(producer_id, set()).add(group_id)
        del self.loading[partition]
        self.owned[partition] = epoch
        for producer_id, commit in self._completed_while_loading.pop(partition, []):
            self._complete_txn_in(partition, producer_id, commit)

    def unload(self, partition: int) -> list[Effect]:
        """Leadership of the partition moved away: forget its groups, answer their waiting
        requests with NOT_COORDINATOR (the clients find the new coordinator)."""
        self.loading.pop(partition, None)
        self._completed_while_loading.pop(partition, None)
        effects = self._drop_partition(partition)
        self.owned.pop(partition, None)
        return effects

    def _drop_partition(self, partition: int) -> list[Effect]:
        effects: list[Effect] = []
        for group_id in [g for g in self.groups if self.partition_for(g) == partition]:
            group = self.groups.pop(group_id)
            for producer_id in group.pending_txn_offsets:
                ids = self._txn_groups.get(producer_id)
                if ids is not None:
                    ids.discard(group_id)
                    if not ids:
                        del self._txn_groups[producer_id]
            for m in group.members.values():
                if m.awaiting_join is not None:
                    effects.append(Reply(m.awaiting_join, JoinResult(ErrorCode.NOT_COORDINATOR)))
                    m.awaiting_join = None
                if m.awaiting_sync is not None:
                    effects.append(Reply(m.awaiting_sync, SyncResult(ErrorCode.NOT_COORDINATOR)))
                    m.awaiting_sync = None
            group.state = GroupState.DEAD
        for token, pa in list(self._appends.items()):
            if pa.partition == partition:
                # the append itself will fail or be truncated; its requester must not wait
                del self._appends[token]
                effects.extend(self._fail_append(pa, ErrorCode.NOT_COORDINATOR, token))
        return effects

    def _group_from_record(self, group_id: str, gv: GroupValue, now: int) -> Group:
        group = Group(group_id, state_timestamp=gv.current_state_timestamp or now)
        group.generation = gv.generation
        group.protocol_type = gv.protocol_type or None
        group.protocol = gv.protocol
        group.leader_id = gv.leader
        for mr in gv.members:
            member = Member(
                member_id=mr.member_id,
                group_instance_id=mr.group_instance_id,
                client_id=mr.client_id,
                client_host=mr.client_host,
                rebalance_timeout_ms=mr.rebalance_timeout,
                session_timeout_ms=mr.session_timeout,
                protocol_type=gv.protocol_type,
                protocols=[(gv.protocol or "", mr.subscription)],
                assignment=mr.assignment,
                heartbeat_deadline=now + mr.session_timeout,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        return group

    # ----- JoinGroup -----------------------------------------------------------------------

    def join_group(self, now: int, ref: Any, req: JoinRequest) -> list[Effect]:
        def fail(code: ErrorCode, member_id: str = "") -> list[Effect]:
            return [Reply(ref, JoinResult(code, member_id=member_id))]

        if not req.group_id:
            return fail(ErrorCode.INVALID_GROUP_ID, req.member_id)
        err = self.coordinator_error(req.group_id)
        if err:
            return fail(err, req.member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return fail(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id)
        if not req.protocol_type or not req.protocols:
            return fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return fail(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id)
            group = self.groups[req.group_id] = Group(req.group_id, state_timestamp=now)
        if group.is_(GroupState.DEAD):
            # being deleted or unloaded: the client looks the coordinator up again
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not req.member_id:
            return self._join_unknown_member(now, ref, group, req)
        return self._join_known_member(now, ref, group, req)

    def _join_unknown_member(
        self, now: int, ref: Any, group: Group, req: JoinRequest
    ) -> list[Effect]:
        names = [p for p, _ in req.protocols]
        if not group.supports(req.protocol_type, names):
            return [Reply(ref, JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))]
        new_id = self._new_member_id(req.client_id or "member")
        old_id = group.static_member_id(req.group_instance_id)
        if req.group_instance_id is not None and old_id is not None:
            return self._replace_static_member(now, ref, group, req, old_id, new_id)
        if len(group.members) + len(group.pending_members) >= self.config.max_size:
            return [Reply(ref, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED))]
        if req.group_instance_id is None and req.require_known_member_id:
            # KIP-394: hand out the id first; the member joins with it
            group.pending_members[new_id] = now + req.session_timeout_ms
            return [Reply(ref, JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_id))]
        return self._add_member_and_rebalance(now, ref, group, req, new_id)

    def _join_known_member(
        self, now: int, ref: Any, group: Group, req: JoinRequest
    ) -> list[Effect]:
        mid = req.member_id
        if mid in group.pending_members:
            if not group.supports(req.protocol_type, [p for p, _ in req.protocols]):
                return [
                    Reply(ref, JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=mid))
                ]
            return self._add_member_and_rebalance(now, ref, group, req, mid)
        err = self._member_error(group, mid, req.group_instance_id)
        if err:
            return [Reply(ref, JoinResult(err, member_id=mid))]
        member = group.members[mid]
        if req.protocol_type != group.protocol_type or not self._supported_by_others(
            group, mid, [p for p, _ in req.protocols]
        ):
            return [Reply(ref, JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=mid))]
        effects: list[Effect] = []
        if group.is_(GroupState.PREPARING_REBALANCE):
            effects += self._update_member(member, req, ref)
            effects += self._maybe_complete_join(now, group)
        elif group.is_(GroupState.COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                effects.append(Reply(ref, self._join_result(group, member)))
            else:
                effects += self._update_member(member, req, ref)
                effects += self._prepare_rebalance(now, group)
        elif group.is_(GroupState.STABLE):
            if mid == group.leader_id or not member.matches(req.protocols):
                effects += self._update_member(member, req, ref)
                effects += self._prepare_rebalance(now, group)
            else:
                effects.append(Reply(ref, self._join_result(group, member)))
        else:  # Empty: it has no members
            effects.append(Reply(ref, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=mid)))
        return effects

    def _supported_by_others(self, group: Group, member_id: str, names: list[str]) -> bool:
        others = [set(m.protocol_names()) for k, m in group.members.items() if k != member_id]
        common = set(names).intersection(*others) if others else set(names)
        return bool(common)

    def _member_error(self, group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
        """UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID as Kafka's validateCurrentMember decides."""
        if instance_id is not None:
            known = group.static_member_id(instance_id)
            if known is not None and known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def _update_member(self, member: Member, req: JoinRequest, ref: Any) -> list[Effect]:
        effects: list[Effect] = []
        if member.awaiting_join is not None and member.awaiting_join is not ref:
            # the client gave up on its earlier JoinGroup and sent another
            effects.append(Reply(member.awaiting_join, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS)))
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.awaiting_join = ref
        return effects

    def _add_member_and_rebalance(
        self, now: int, ref: Any, group: Group, req: JoinRequest, member_id: str
    ) -> list[Effect]:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
            awaiting_join=ref,
            is_new=True,
            heartbeat_deadline=now + self.config.new_member_join_timeout_ms,
        )
        group.add(member)
        if group.initial_delay_ms and group.rebalance_deadline is not None:
            # a newcomer during the initial delay: wait `delay` from its arrival, never past the
            # rebalance timeout counted from the first join
            group.rebalance_deadline = min(now + group.initial_delay_ms, group.initial_delay_cap)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return self._maybe_complete_join(now, group)
        return self._prepare_rebalance(now, group)

    def _replace_static_member(
        self, now: int, ref: Any, group: Group, req: JoinRequest, old_id: str, new_id: str
    ) -> list[Effect]:
        """A known group.instance.id joins without a member id: the instance restarted. The old
        member id is fenced; the group rebalances only if it has to (KIP-345)."""
        old = group.members[old_id]
        effects: list[Effect] = []
        if old.awaiting_join is not None:
            effects.append(
                Reply(old.awaiting_join, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old_id))
            )
            old.awaiting_join = None
        if old.awaiting_sync is not None:
            effects.append(Reply(old.awaiting_sync, SyncResult(ErrorCode.FENCED_INSTANCE_ID)))
            old.awaiting_sync = None
        same_metadata = old.matches(req.protocols)
        was_leader = group.leader_id == old_id
        member = group.replace_static_member(req.group_instance_id or "", old_id, new_id)
        member.client_id, member.client_host = req.client_id, req.client_host
        member.heartbeat_deadline = now + req.session_timeout_ms
        if group.is_(GroupState.STABLE) and same_metadata:
            # no rebalance, the leader's restart included (Kafka's updateStaticMemberAndRebalance)
            result = self._join_result(group, member)
            if was_leader and not req.supports_skip_assignment:
                # before JoinGroup v9: name the old leader id, so the restarted leader does not
                # compute an assignment the Stable group would ignore
                result.leader, result.members = old_id, []
            elif was_leader:
                result.skip_assignment = True  # KIP-814: it is the leader, with nothing to do
            effects.append(Reply(ref, result))
            # the new member id must survive a coordinator failover
            effects += self._store_group(group)
            return effects
        effects += self._update_member(member, req, ref)
        if group.is_(GroupState.PREPARING_REBALANCE):
            effects += self._maybe_complete_join(now, group)
        else:
            effects += self._prepare_rebalance(now, group)
        return effects

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members: list[tuple[str, str | None, bytes]] = []
        if member.member_id == group.leader_id and group.protocol is not None:
            members = [
                (m.member_id, m.group_instance_id, m.metadata(group.protocol))
                for m in group.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol=group.protocol,
            leader=group.leader_id or "",
            member_id=member.member_id,
            members=members,
        )

    # ----- rebalance -----------------------------------------------------------------------

    def _prepare_rebalance(self, now: int, group: Group) -> list[Effect]:
        effects: list[Effect] = []
        if group.is_(GroupState.COMPLETING_REBALANCE):
            effects += self._reset_and_propagate_sync_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        if group.is_(GroupState.EMPTY):
            # InitialDelayedJoin: wait for more members before the first generation
            delay = min(self.config.initial_rebalance_delay_ms, group.max_rebalance_timeout())
            group.initial_delay_ms = delay
            group.rebalance_deadline = now + delay
            group.initial_delay_cap = now + group.max_rebalance_timeout()
            group.transition(GroupState.PREPARING_REBALANCE, now)
            if delay <= 0:
                group.initial_delay_ms = 0
                effects += self._maybe_complete_join(now, group)
            return effects
        group.initial_delay_ms = 0
        group.rebalance_deadline = now + group.max_rebalance_timeout()
        group.transition(GroupState.PREPARING_REBALANCE, now)
        effects += self._maybe_complete_join(now, group)
        return effects

    def _maybe_complete_join(self, now: int, group: Group) -> list[Effect]:
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return []
        if group.initial_delay_ms:
            return []  # the initial delay ends by time only
        if group.all_rejoined():
            return self._complete_join(now, group)
        return []

    def _complete_join(self, now: int, group: Group) -> list[Effect]:
        effects: list[Effect] = []
        for m in group.not_yet_rejoined():
            if m.group_instance_id is None:
                group.remove(m.member_id)
        # pending members (KIP-394 ids handed out, not joined yet) stay, as in Kafka: they leave
        # by joining (a new rebalance), by LeaveGroup or when their session expires
        group.rebalance_deadline = None
        group.initial_delay_ms = 0
        if group.is_(GroupState.DEAD):
            return effects
        group.generation += 1
        if group.members:
            group.protocol = group.select_protocol()
            group.transition(GroupState.COMPLETING_REBALANCE, now)
        else:
            group.protocol = None
            group.transition(GroupState.EMPTY, now)
            effects += self._store_group(group)
        for m in group.members.values():
            if m.awaiting_join is not None:
                effects.append(Reply(m.awaiting_join, self._join_result(group, m)))
                m.awaiting_join = None
            m.is_new = False
            m.heartbeat_deadline = now + m.session_timeout_ms
        return effects

    def _reset_and_propagate_sync_error(self, group: Group, error: ErrorCode) -> list[Effect]:
        effects: list[Effect] = []
        for m in group.members.values():
            m.assignment = b""
            if m.awaiting_sync is not None:
                effects.append(Reply(m.awaiting_sync, SyncResult(error)))
                m.awaiting_sync = None
        return effects

    def _remove_member_and_update(self, now: int, group: Group, member_id: str) -> list[Effect]:
        effects: list[Effect] = []
        member = group.remove(member_id)
        if member is not None and member.awaiting_sync is not None:
            effects.append(Reply(member.awaiting_sync, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)))
        if group.is_(GroupState.PREPARING_REBALANCE):
            effects += self._maybe_complete_join(now, group)
        elif group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            effects += self._prepare_rebalance(now, group)
        return effects

    # ----- SyncGroup -----------------------------------------------------------------------

    def sync_group(self, now: int, ref: Any, req: SyncRequest) -> list[Effect]:
        def fail(code: ErrorCode) -> list[Effect]:
            return [Reply(ref, SyncResult(code))]

        err = self.coordinator_error(req.group_id)
        if err:
            return fail(err)
        group = self.groups.get(req.group_id)
        if group is None or group.is_(GroupState.DEAD):
            return fail(ErrorCode.UNKNOWN_MEMBER_ID)
        err = self._member_error(group, req.member_id, req.group_instance_id)
        if err:
            return fail(err)
        if req.generation != group.generation:
            return fail(ErrorCode.ILLEGAL_GENERATION)
        if (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
            req.protocol is not None and req.protocol != group.protocol
        ):
            return fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[req.member_id]
        if group.is_(GroupState.EMPTY):
            return fail(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return fail(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.is_(GroupState.STABLE):
            member.heartbeat_deadline = now + member.session_timeout_ms
            return [
                Reply(ref, SyncResult(ErrorCode.NONE, group.protocol_type, group.protocol,
                                      member.assignment))
            ]  # fmt: skip
        # CompletingRebalance
        if member.awaiting_sync is not None and member.awaiting_sync is not ref:
            prior = member.awaiting_sync
            member.awaiting_sync = ref
            effects: list[Effect] = [Reply(prior, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))]
        else:
            member.awaiting_sync = ref
            effects = []
        member.heartbeat_deadline = now + member.session_timeout_ms
        if req.member_id == group.leader_id:
            assignments = {
                mid: req.assignments.get(mid, b"") for mid in group.members
            }  # members the leader left out get an empty assignment
            token = next(self._tokens)
            self._appends[token] = _PendingAppend(
                "sync", group.group_id, self.partition_for(group.group_id),
                generation=group.generation,
            )  # fmt: skip
            for mid, a in assignments.items():
                group.members[mid].assignment = a
            effects.append(
                Append(
                    self.partition_for(group.group_id),
                    [(GroupMetadataKey(group.group_id), self._group_record(group))],
                    token,
                )
            )
        return effects

    def _group_record(self, group: Group) -> GroupValue:
        proto = group.protocol
        return GroupValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation,
            protocol=proto,
            leader=group.leader_id if group.members else None,
            current_state_timestamp=group.state_timestamp,
            members=[
                MemberRecord(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms,
                    subscription=m.metadata(proto) if proto is not None else b"",
                    assignment=m.assignment,
                )
                for m in group.members.values()
            ],
        )

    def _store_group(self, group: Group) -> list[Effect]:
        token = next(self._tokens)
        p = self.partition_for(group.group_id)
        self._appends[token] = _PendingAppend("store", group.group_id, p)
        return [Append(p, [(GroupMetadataKey(group.group_id), self._group_record(group))], token)]

    # ----- Heartbeat / LeaveGroup ----------------------------------------------------------

    def heartbeat(self, now: int, ref: Any, req: HeartbeatRequest) -> list[Effect]:
        err = self.coordinator_error(req.group_id)
        if err:
            return [Reply(ref, err)]
        group = self.groups.get(req.group_id)
        if group is None or group.state in (GroupState.DEAD, GroupState.EMPTY):
            return [Reply(ref, ErrorCode.UNKNOWN_MEMBER_ID)]
        err = self._member_error(group, req.member_id, req.group_instance_id)
        if err:
            return [Reply(ref, err)]
        if req.generation != group.generation:
            return [Reply(ref, ErrorCode.ILLEGAL_GENERATION)]
        member = group.members[req.member_id]
        member.heartbeat_deadline = now + member.session_timeout_ms
        if group.is_(GroupState.PREPARING_REBALANCE):
            return [Reply(ref, ErrorCode.REBALANCE_IN_PROGRESS)]
        return [Reply(ref, ErrorCode.NONE)]

    def leave_group(self, now: int, ref: Any, req: LeaveRequest) -> list[Effect]:
        err = self.coordinator_error(req.group_id)
        if err:
            return [Reply(ref, LeaveResult(err))]
        group = self.groups.get(req.group_id)
        results: list[tuple[str, str | None, ErrorCode]] = []
        effects: list[Effect] = []
        for member_id, instance_id in req.members:
            if group is None or group.is_(GroupState.DEAD):
                results.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            if instance_id is not None:
                known = group.static_member_id(instance_id)
                if known is None:
                    results.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                    continue
                if member_id and member_id != known:
                    results.append((member_id, instance_id, ErrorCode.FENCED_INSTANCE_ID))
                    continue
                member_id = known
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                results.append((member_id, instance_id, ErrorCode.NONE))
                effects += self._maybe_complete_join(now, group)
                continue
            elif not group.has(member_id):
                results.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            results.append((member_id, instance_id, ErrorCode.NONE))
            effects += self._remove_member_and_update(now, group, member_id)
        return [*effects, Reply(ref, LeaveResult(ErrorCode.NONE, results))]

    # ----- offsets -------------------------------------------------------------------------

    def commit_offsets(self, now: int, ref: Any, req: CommitRequest) -> list[Effect]:
        def fail(code: ErrorCode) -> list[Effect]:
            return [Reply(ref, CommitResult({tp: code for tp in req.offsets}))]

        err = self.coordinator_error(req.group_id)
        if err:
            return fail(err)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.generation >= 0 or req.member_id:
                # a member of a group that does not exist (it expired, or the client is
                # confused): Kafka answers as for an unknown member
                return fail(ErrorCode.UNKNOWN_MEMBER_ID)
            group = self.groups[req.group_id] = Group(req.group_id, state_timestamp=now)
        if group.is_(GroupState.DEAD):
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if req.generation < 0 and group.is_(GroupState.EMPTY):
            pass  # the group only uses Kafka to store offsets
        elif req.generation < 0 and not req.member_id and not group.members:
            pass
        else:
            if group.is_(GroupState.COMPLETING_REBALANCE):
                return fail(ErrorCode.REBALANCE_IN_PROGRESS)
            err = self._member_error(group, req.member_id, req.group_instance_id)
            if err:
                return fail(err)
            if req.generation != group.generation:
                return fail(ErrorCode.ILLEGAL_GENERATION)
            member = group.members[req.member_id]
            member.heartbeat_deadline = now + member.session_timeout_ms
        expire = now + req.retention_ms if req.retention_ms >= 0 else None
        errors, accepted = self._accept_offsets(now, req.offsets, expire)
        if not accepted:
            return [Reply(ref, CommitResult(errors))]
        token = next(self._tokens)
        p = self.partition_for(group.group_id)
        self._appends[token] = _PendingAppend(
            "commit", group.group_id, p, ref=ref, offsets=accepted
        )
        self._commit_errors[token] = errors
        for tp in accepted:
            group.pending_commits[tp] += 1
        return [Append(p, _offset_records(group.group_id, accepted), token)]

    def _accept_offsets(
        self,
        now: int,
        offsets: dict[TopicPartition, tuple[int, int, str | None]],
        expire: int | None,
    ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, CommittedOffset]]:
        """The offsets of an (Txn)OffsetCommit whose metadata fits offset.metadata.max.bytes,
        committed at `now` and expiring at `expire`; OFFSET_METADATA_TOO_LARGE for the rest."""
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for tp, (offset, epoch, metadata) in offsets.items():
            md = metadata or ""
            if len(md.encode("utf-8")) > self.config.offset_metadata_max_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = CommittedOffset(offset, epoch, md, now, expire)
        return errors, accepted

    def txn_offset_commit(self, now: int, ref: Any, req: TxnCommitRequest) -> list[Effect]:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): the offsets are written as a
        transactional batch of the producer and stay pending until `complete_txn`. A member
        (v3+: a generation >= 0, a member id or an instance id) must be the group's current
        one, in its generation; without them any producer may commit (older clients send
        none). Answers `ref` with a CommitResult once the batch is acknowledged."""

        def fail(code: ErrorCode) -> list[Effect]:
            return [Reply(ref, CommitResult({tp: code for tp in req.offsets}))]

        if not req.group_id:
            return fail(ErrorCode.INVALID_GROUP_ID)
        err = self.coordinator_error(req.group_id)
        if err:
            return fail(err)
        # a group Kafka would create Empty; kept only once a commit is accepted
        group = self.groups.get(req.group_id) or Group(req.group_id, state_timestamp=now)
        if group.is_(GroupState.DEAD):
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if req.generation < 0 and group.is_(GroupState.EMPTY):
            pass  # an admin client, or a producer without group management
        elif req.generation >= 0 or req.member_id or req.group_instance_id is not None:
            err = self._member_error(group, req.member_id, req.group_instance_id)
            if err:
                return fail(err)
            if req.generation != group.generation:
                return fail(ErrorCode.ILLEGAL_GENERATION)
        errors, accepted = self._accept_offsets(now, req.offsets, None)
        if not accepted:
            return [Reply(ref, CommitResult(errors))]
        self.groups.setdefault(group.group_id, group)
        token = next(self._tokens)
        p = self.partition_for(group.group_id)
        # prepareTxnOffsetCommit: pending before the write, so a fetch requiring stable offsets
        # waits for it, and a commit that replaces one of this transaction's replaces it here
        txn = group.pending_txn_offsets.setdefault(req.producer_id, {})
        self._txn_groups.setdefault(req.producer_id, set()).add(group.group_id)
        replaced = {tp: txn[tp] for tp in accepted if tp in txn}
        txn.update(accepted)
        self._appends[token] = _PendingAppend(
            "commit", group.group_id, p, ref=ref, offsets=accepted, producer_id=req.producer_id,
            replaced=replaced,
        )  # fmt: skip
        self._commit_errors[token] = errors
        entries = _offset_records(group.group_id, accepted)
        return [Append(p, entries, token, producer=(req.producer_id, req.producer_epoch))]

    def complete_txn(
        self, now: int, producer_id: int, partitions: list[int], commit: bool
    ) -> list[Effect]:
        """A transaction marker of `producer_id` was written to these partitions of
        __consumer_offsets (Kafka's scheduleHandleTxnCompletion): the producer's pending
        offsets in the groups of those partitions become committed (unless a plain commit
        whose record is later in the log replaced them) or are dropped. Call it before
        answering the WriteTxnMarkers request: a partition still loading applies it once
        loaded, in case its load read the log before the marker."""
        for p in set(partitions):
            if p in self.loading:
                self._completed_while_loading.setdefault(p, []).append((producer_id, commit))
            elif p in self.owned:
                self._complete_txn_in(p, producer_id, commit)
        return []

    def _complete_txn_in(self, partition: int, producer_id: int, commit: bool) -> None:
        group_ids = self._txn_groups.get(producer_id, set())
        for group_id in sorted(group_ids):
            group = self.groups.get(group_id)
            if group is None or producer_id not in group.pending_txn_offsets:
                group_ids.discard(group_id)  # gone (deleted, unloaded, failed writes)
                continue
            if group.is_(GroupState.DEAD) or self.partition_for(group_id) != partition:
                continue
            group_ids.discard(group_id)
            txn = group.pending_txn_offsets.pop(producer_id, None)
            if not txn or not commit:
                continue
            for tp, c in txn.items():
                if c.append_offset < 0:
                    # its write is not acknowledged yet: a client that ended its transaction
                    # before its TxnOffsetCommit was answered. Kafka refuses to complete it
                    # (IllegalStateException) and the offset is dropped; so here.
                    log.warning(
                        "group %s: transactional commit of %s-%d by producer %d ended before "
                        "its write was acknowledged; dropped",
                        group.group_id,
                        tp[0],
                        tp[1],
                        producer_id,
                    )
                    continue
                group.commit_offset(tp, c)
        if not group_ids:
            self._txn_groups.pop(producer_id, None)

    def fetch_offsets(
        self,
        now: int,
        ref: Any,
        group_id: str,
        partitions: list[TopicPartition] | None,
        require_stable: bool = False,
    ) -> list[Effect]:
        """OffsetFetch. `require_stable` (v7+, KIP-447): a partition with a commit not yet
        acknowledged or a transactional commit not yet ended answers UNSTABLE_OFFSET_COMMIT
        (the client retries) instead of an offset that may be about to change."""
        err = self.coordinator_error(group_id)
        if err:
            return [Reply(ref, OffsetFetchResult(err, {}))]
        group = self.groups.get(group_id)
        known = group.offsets if group is not None else {}
        if partitions is None:
            result: dict[TopicPartition, CommittedOffset | None] = dict(known)
        else:
            result = {tp: known.get(tp) for tp in partitions}
        errors: dict[TopicPartition, ErrorCode] = {}
        if require_stable and group is not None and not group.is_(GroupState.DEAD):
            for tp in result:
                if group.has_pending_commit(tp):
                    result[tp] = None
                    errors[tp] = ErrorCode.UNSTABLE_OFFSET_COMMIT
        return [Reply(ref, OffsetFetchResult(ErrorCode.NONE, result, errors))]

    def delete_offsets(
        self, now: int, ref: Any, group_id: str, partitions: list[TopicPartition]
    ) -> list[Effect]:
        """OffsetDelete: a group's committed offsets for topics it no longer consumes."""
        err = self.coordinator_error(group_id)
        if err:
            return [Reply(ref, (err, {}))]
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return [Reply(ref, (ErrorCode.GROUP_ID_NOT_FOUND, {}))]
        subscribed: set[str] = set()
        if not group.is_(GroupState.EMPTY):
            topics = group.subscribed_topics()
            if topics is None:
                return [Reply(ref, (ErrorCode.NON_EMPTY_GROUP, {}))]
            subscribed = topics
        errors: dict[TopicPartition, ErrorCode] = {}
        deleted: list[TopicPartition] = []
        for tp in partitions:
            if tp[0] in subscribed:
                errors[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                errors[tp] = ErrorCode.NONE
                if tp in group.offsets:
                    deleted.append(tp)
        for tp in deleted:
            del group.offsets[tp]
        for tp, e in errors.items():
            if e == ErrorCode.NONE:  # Kafka's removeOffsets drops a pending commit too
                for producer_id in list(group.pending_txn_offsets):
                    group.remove_pending_txn_offset(producer_id, tp)
        if not deleted:
            return [Reply(ref, (ErrorCode.NONE, errors))]
        token = next(self._tokens)
        p = self.partition_for(group_id)
        self._appends[token] = _PendingAppend("offset-delete", group_id, p, ref=ref)
        self._offset_deletes[token] = (ErrorCode.NONE, errors)
        entries: list[tuple[Key, Value | None]] = [
            (OffsetKey(group_id, tp[0], tp[1]), None) for tp in deleted
        ]
        return [Append(p, entries, token)]

    def delete_groups(self, now: int, ref: Any, group_ids: list[str]) -> list[Effect]:
        """Answers `ref` with {group: error} once the tombstones are acknowledged."""
        results: dict[str, ErrorCode] = {}
        effects: list[Effect] = []
        tokens: list[int] = []
        for group_id in group_ids:
            err = self.coordinator_error(group_id)
            group = self.groups.get(group_id)
            if err:
                results[group_id] = err
            elif group is None or group.is_(GroupState.DEAD):
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif not group.is_(GroupState.EMPTY):
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            else:
                results[group_id] = ErrorCode.NONE
                group.transition(GroupState.DEAD, now)
                del self.groups[group_id]
                entries: list[tuple[Key, Value | None]] = [
                    (OffsetKey(group_id, tp[0], tp[1]), None) for tp in group.offsets
                ]
                entries.append((GroupMetadataKey(group_id), None))
                token = next(self._tokens)
                p = self.partition_for(group_id)
                self._appends[token] = _PendingAppend("group-delete", group_id, p, ref=ref)
                tokens.append(token)
                effects.append(Append(p, entries, token))
        if not tokens:
            return [Reply(ref, results)]
        self._group_deletes[ref] = (results, set(tokens))
        return effects

    # ----- appends done --------------------------------------------------------------------

    def on_append_done(
        self, now: int, token: int, error: ErrorCode, offset: int = -1
    ) -> list[Effect]:
        """The append `token` is acknowledged (or failed with `error`); `offset` is where its
        first record is in the log (-1: unknown; then the commit acknowledged last wins)."""
        pa = self._appends.pop(token, None)
        if pa is None:
            return []  # the partition was unloaded meanwhile; already answered
        if error:
            if pa.kind == "sync":
                return self._fail_sync(now, pa, error)
            return self._fail_append(pa, _commit_error(error), token)
        group = self.groups.get(pa.group_id)
        if pa.kind == "sync":
            if (
                group is None
                or group.generation != pa.generation
                or not group.is_(GroupState.COMPLETING_REBALANCE)
            ):
                return []
            group.transition(GroupState.STABLE, now)
            effects: list[Effect] = []
            for m in group.members.values():
                if m.awaiting_sync is not None:
                    effects.append(
                        Reply(m.awaiting_sync, SyncResult(ErrorCode.NONE, group.protocol_type,
                                                          group.protocol, m.assignment))
                    )  # fmt: skip
                    m.awaiting_sync = None
            return effects
        if pa.kind == "commit":
            errors = self._commit_errors.pop(token, {})
            if group is not None and not group.is_(GroupState.DEAD):
                for tp, c in pa.offsets.items():
                    c.append_offset = offset
                    if pa.producer_id >= 0:
                        # onTxnOffsetCommitAppend: it stays pending; its place in the log is
                        # known now (if the transaction has not already dropped it)
                        continue
                    group.commit_offset(tp, c)
                    group.pending_commits[tp] -= 1
                    if group.pending_commits[tp] <= 0:
                        del group.pending_commits[tp]
            errors.update({tp: ErrorCode.NONE for tp in pa.offsets})
            return [Reply(pa.ref, CommitResult(errors))]
        if pa.kind in ("offset-delete", "group-delete"):
            return self._finish_delete(token, pa, ErrorCode.NONE)
        return []  # "store": nobody waits

    def _fail_sync(self, now: int, pa: _PendingAppend, error: ErrorCode) -> list[Effect]:
        """The leader's assignment could not be stored: as Kafka's doSyncGroup, every member
        waiting in SyncGroup gets the error and the group rebalances again (if it is still in
        that generation's CompletingRebalance)."""
        group = self.groups.get(pa.group_id)
        if (
            group is None
            or group.generation != pa.generation
            or not group.is_(GroupState.COMPLETING_REBALANCE)
        ):
            return []
        effects = self._reset_and_propagate_sync_error(group, _store_group_error(error))
        effects += self._prepare_rebalance(now, group)
        return effects

    def _fail_append(self, pa: _PendingAppend, error: ErrorCode, token: int) -> list[Effect]:
        group = self.groups.get(pa.group_id)
        if pa.kind == "sync":
            if (
                group is not None
                and group.generation == pa.generation
                and group.is_(GroupState.COMPLETING_REBALANCE)
            ):
                effects = self._reset_and_propagate_sync_error(group, error)
                return effects
            return []
        if pa.kind == "commit":
            if group is not None and pa.producer_id >= 0:
                # failPendingTxnOffsetCommit, unless a later commit of the same transaction
                # replaced it meanwhile. Unlike Kafka, the commit it replaced is pending again:
                # that record is in the log and its marker will commit or abort it.
                txn = group.pending_txn_offsets.get(pa.producer_id, {})
                for tp, c in pa.offsets.items():
                    prev = pa.replaced.get(tp)
                    if txn.get(tp) is c:
                        if prev is not None:
                            txn[tp] = prev
                        else:
                            group.remove_pending_txn_offset(pa.producer_id, tp)
                        continue
                    # a later commit replaced it: that one falls back to what this one replaced
                    for other in self._appends.values():
                        if other.group_id == pa.group_id and other.replaced.get(tp) is c:
                            if prev is None:
                                del other.replaced[tp]
                            else:
                                other.replaced[tp] = prev
            elif group is not None:
                for tp in pa.offsets:
                    group.pending_commits[tp] -= 1
                    if group.pending_commits[tp] <= 0:
                        del group.pending_commits[tp]
            errors = self._commit_errors.pop(token, {})
            errors.update({tp: error for tp in pa.offsets})
            return [Reply(pa.ref, CommitResult(errors))]
        if pa.kind in ("offset-delete", "group-delete"):
            return self._finish_delete(token, pa, error)
        return []

    def _finish_delete(self, token: int, pa: _PendingAppend, error: ErrorCode) -> list[Effect]:
        if pa.kind == "offset-delete":
            top, errors = self._offset_deletes.pop(token)
            return [Reply(pa.ref, (error, {}) if error else (top, errors))]
        ref = pa.ref
        if ref not in self._group_deletes:
            return []
        results, tokens = self._group_deletes[ref]
        if error:
            results[pa.group_id] = error
        tokens.discard(token)
        if tokens:
            return []
        self._group_deletes.pop(ref, None)
        return [Reply(ref, results)]

    # ----- describe / list -----------------------------------------------------------------

    def describe_group(self, group_id: str) -> GroupDescription:
        err = self.coordinator_error(group_id)
        if err:
            return GroupDescription(group_id, err, "", "", "", [])
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, ErrorCode.NONE, GroupState.DEAD.value, "", "", [])
        stable = group.is_(GroupState.STABLE)
        members = [
            (
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol) if stable and group.protocol else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        return GroupDescription(
            group_id,
            ErrorCode.NONE,
            group.state.value,
            group.protocol_type or "",
            (group.protocol or "") if stable else "",
            members,
        )

    def list_groups(self, states: set[str] | None = None) -> tuple[ErrorCode, list[GroupListing]]:
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.loading else ErrorCode.NONE
        listings = [
            GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if not g.is_(GroupState.DEAD) and (not states or g.state.value in states)
        ]
        return error, listings

    # ----- time ----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for g in self.groups.values():
            if g.rebalance_deadline is not None:
                deadlines.append(g.rebalance_deadline)
            for m in g.members.values():
                if m.awaiting_join is None:
                    deadlines.append(m.heartbeat_deadline)
            deadlines.extend(g.pending_members.values())
        if self.groups and self._next_retention_check is not None:
            deadlines.append(self._next_retention_check)
        return min(deadlines) if deadlines else None

    def tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            effects += self._tick_group(now, group)
        if self._next_retention_check is None:
            self._next_retention_check = now + self.config.offsets_retention_check_interval_ms
        elif now >= self._next_retention_check:
            self._next_retention_check = now + self.config.offsets_retention_check_interval_ms
            effects += self._expire_offsets(now)
        return effects

    def _tick_group(self, now: int, group: Group) -> list[Effect]:
        effects: list[Effect] = []
        for mid, deadline in list(group.pending_members.items()):
            if now >= deadline:
                del group.pending_members[mid]
                effects += self._maybe_complete_join(now, group)
        for m in list(group.members.values()):
            if m.awaiting_join is None and now >= m.heartbeat_deadline and group.has(m.member_id):
                effects += self._remove_member_and_update(now, group, m.member_id)
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and group.rebalance_deadline is not None
            and now >= group.rebalance_deadline
        ):
            effects += self._complete_join(now, group)
        return effects

    def _expire_offsets(self, now: int) -> list[Effect]:
        """offsets.retention.minutes as in Kafka 2.1+ (KIP-211): a consumer group's offsets
        expire once it has been Empty that long; a group's offsets for topics it no longer
        subscribes to expire by their commit time; a group without a protocol (offsets only)
        expires by commit time too."""
        retention = self.config.offsets_retention_ms
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            if group.is_(GroupState.DEAD):
                continue
            expired: list[TopicPartition] = []
            subscribed = group.subscribed_topics() if group.is_(GroupState.STABLE) else None
            for tp, c in group.offsets.items():
                if tp in group.pending_commits:
                    continue
                if c.expire_timestamp is not None:
                    due = now >= c.expire_timestamp
                elif group.protocol_type is None:
                    due = now >= c.commit_timestamp + retention
                elif group.is_(GroupState.EMPTY):
                    base = max(group.state_timestamp, c.commit_timestamp)
                    due = now >= base + retention
                elif subscribed is not None and tp[0] not in subscribed:
                    due = now >= c.commit_timestamp + retention
                else:
                    due = False
                if due:
                    expired.append(tp)
            entries: list[tuple[Key, Value | None]] = []
            for tp in expired:
                del group.offsets[tp]
                entries.append((OffsetKey(group.group_id, tp[0], tp[1]), None))
            # a member between KIP-394's two joins (pending) keeps its group
            if (
                group.is_(GroupState.EMPTY)
                and not group.has_offsets()
                and not group.pending_members
            ):
                group.transition(GroupState.DEAD, now)
                del self.groups[group.group_id]
                entries.append((GroupMetadataKey(group.group_id), None))
            if entries:
                token = next(self._tokens)
                p = self.partition_for(group.group_id)
                self._appends[token] = _PendingAppend("store", group.group_id, p)
                effects.append(Append(p, entries, token))
        return effects


_UNAVAILABLE = (
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
)
_MOVED = (
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.KAFKA_STORAGE_ERROR,
)
_TOO_LARGE = (
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.RECORD_LIST_TOO_LARGE,
    ErrorCode.INVALID_FETCH_SIZE,
)


def _append_error(error: ErrorCode, *, timed_out: ErrorCode, too_large: ErrorCode) -> ErrorCode:
    """How Kafka maps an append error to __consumer_offsets for a group client: the same for
    a group record and an offset commit except for a timeout and a record too large."""
    if error in _UNAVAILABLE:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in _MOVED:
        return ErrorCode.NOT_COORDINATOR
    if error == ErrorCode.REQUEST_TIMED_OUT:
        return timed_out
    if error in _TOO_LARGE:
        return too_large
    return error


def _store_group_error(error: ErrorCode) -> ErrorCode:
    """Kafka's storeGroup mapping, for the members waiting in SyncGroup."""
    return _append_error(
        error,
        timed_out=ErrorCode.REBALANCE_IN_PROGRESS,
        too_large=ErrorCode.UNKNOWN_SERVER_ERROR,
    )


def _commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka's storeOffsets mapping (a timeout passes through: the commit may still be
    written)."""
    return _append_error(
        error,
        timed_out=ErrorCode.REQUEST_TIMED_OUT,
        too_large=ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    )


def _offset_records(
    group_id: str, accepted: dict[TopicPartition, CommittedOffset]
) -> list[tuple[Key, Value | None]]:
    """The __consumer_offsets records of a group's accepted commits."""
    return [
        (
            OffsetKey(group_id, tp[0], tp[1]),
            OffsetValue(
                c.offset, c.leader_epoch, c.metadata, c.commit_timestamp, c.expire_timestamp
            ),
        )
        for tp, c in accepted.items()
    ]
