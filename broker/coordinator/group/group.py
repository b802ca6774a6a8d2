"""One consumer group's membership, as Kafka's GroupMetadata keeps it (the classic protocol).

A group moves between five states:

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup written--> Stable
    Stable / CompletingRebalance --join with new metadata, leave, session expiry--> PreparingRebalance
    PreparingRebalance --everyone gone--> Empty;  any --deleted / partition unloaded--> Dead

This module holds the data and the rules that need no clock and no I/O: which transitions are
legal, which protocol the members agree on, who has rejoined. The decisions that answer requests
and write records are in `coordinator.py`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


#: Legal previous states of each state (Kafka's GroupState.validPreviousStates).
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(
        {
            GroupState.STABLE,
            GroupState.PREPARING_REBALANCE,
            GroupState.COMPLETING_REBALANCE,
            GroupState.EMPTY,
            GroupState.DEAD,
        }
    ),
}


class IllegalStateTransition(AssertionError):
    """A bug: the coordinator asked for a transition Kafka's state machine does not have."""


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata) in the member's order of preference
    assignment: bytes = b""
    #: the request ref of a JoinGroup waiting for the rebalance to complete
    awaiting_join: Any = None
    #: the request ref of a SyncGroup waiting for the leader's assignment to be written
    awaiting_sync: Any = None
    #: when the member is considered dead without a heartbeat (ms)
    heartbeat_deadline: int = 0
    #: joined in the rebalance now in progress (new members get a longer grace: Kafka's
    #: new.member.join.timeout)
    is_new: bool = False

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(protocol)

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int | None = None
    #: where the commit's batch starts in __consumer_offsets (Kafka's appendedBatchOffset);
    #: -1 while its append is in flight, or when unknown
    append_offset: int = -1

    def older_than(self, other: CommittedOffset) -> bool:
        """Kafka's CommitRecordMetadataAndOffset.olderThan: a commit replaces another only if
        its record comes later in the log. A transactional commit is made visible by its marker,
        possibly after a later plain commit, which must keep winning. Without both offsets
        (a caller that does not report them) the commit applied last wins."""
        if self.append_offset < 0 or other.append_offset < 0:
            return True
        return self.append_offset < other.append_offset


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp: int = 0
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: group.instance.id -> member id (static membership, KIP-345)
    static_members: dict[str, str] = field(default_factory=dict)
    #: member ids handed out by MEMBER_ID_REQUIRED, not yet joined -> their deadline (ms)
    pending_members: dict[str, int] = field(default_factory=dict)
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    #: commits written but not yet acknowledged: (topic, partition) -> how many in flight
    pending_commits: Counter[tuple[str, int]] = field(default_factory=Counter)
    #: transactional offset commits (TxnOffsetCommit) waiting for their transaction's marker:
    #: producer id -> (topic, partition) -> offset (Kafka's pendingTransactionalOffsetCommits)
    pending_txn_offsets: dict[int, dict[tuple[str, int], CommittedOffset]] = field(
        default_factory=dict
    )
    #: when the rebalance in progress ends anyway (ms); None outside PreparingRebalance
    rebalance_deadline: int | None = None
    #: group.initial.rebalance.delay.ms: an empty group's first rebalance waits until no new
    #: member has joined for this long, and never past the rebalance timeout after the first
    #: join (`initial_delay_cap`). Kafka's InitialDelayedJoin re-arms a whole delay whenever a
    #: member joined during the last one, so 20 members joining at once wait two delays there.
    initial_delay_ms: int = 0
    initial_delay_cap: int = 0

    # ----- state ---------------------------------------------------------------------------

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def transition(self, to: GroupState, now: int) -> None:
        if self.state not in VALID_PREVIOUS[to]:
            raise IllegalStateTransition(
                f"group {self.group_id}: {self.state.value} -> {to.value} is not a legal transition"
            )
        self.state = to
        self.state_timestamp = now

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # ----- offsets -------------------------------------------------------------------------

    def has_pending_commit(self, tp: tuple[str, int]) -> bool:
        """A commit of `tp` not yet acknowledged, or a transactional one whose transaction
        has not ended (Kafka's hasPendingOffsetCommitsForTopicPartition)."""
        return tp in self.pending_commits or any(
            tp in offsets for offsets in self.pending_txn_offsets.values()
        )

    def has_offsets(self) -> bool:
        """Kafka's hasOffsets: an Empty group without any is removed."""
        return bool(self.offsets or self.pending_commits or self.pending_txn_offsets)

    def commit_offset(self, tp: tuple[str, int], c: CommittedOffset) -> bool:
        """Make `c` the committed offset of `tp` unless the current one's record is newer
        in the log. True if it was applied."""
        current = self.offsets.get(tp)
        if current is None or current.older_than(c):
            self.offsets[tp] = c
            return True
        return False

    def remove_pending_txn_offset(self, producer_id: int, tp: tuple[str, int]) -> None:
        offsets = self.pending_txn_offsets.get(producer_id)
        if offsets is not None:
            offsets.pop(tp, None)
            if not offsets:
                del self.pending_txn_offsets[producer_id]

    # ----- members -------------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            # Kafka prefers a member that has already rejoined as the next leader.
            rejoined = [m for m in self.members.values() if m.awaiting_join is not None]
            nxt = rejoined[0] if rejoined else next(iter(self.members.values()), None)
            self.leader_id = nxt.member_id if nxt else None
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """A static member restarted: the same instance takes a new member id (KIP-345). The old
        id is fenced; its waiting requests are the caller's to answer."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        return member

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def all_rejoined(self) -> bool:
        return all(m.awaiting_join is not None for m in self.members.values()) and not (
            self.pending_members
        )

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if m.awaiting_join is None]

    def max_rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # ----- protocols -----------------------------------------------------------------------

    def supports(self, protocol_type: str, protocols: list[str]) -> bool:
        """A new member fits if its protocol type is the group's and it shares a protocol with
        every member (Kafka's supportsProtocols)."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        return bool(self.candidate_protocols() & set(protocols))

    def candidate_protocols(self) -> set[str]:
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those all members support;
        the most votes win (ties by the first candidate a member listed)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise IllegalStateTransition(f"group {self.group_id}: no protocol all members support")
        votes: Counter[str] = Counter()
        order: list[str] = []
        for m in self.members.values():
            vote = next(p for p in m.protocol_names() if p in candidates)
            votes[vote] += 1
            if vote not in order:
                order.append(vote)
        return max(order, key=lambda p: (votes[p], -order.index(p)))

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members' consumer subscriptions name, or None if not known (another
        protocol type, or metadata that does not parse)."""
        if self.protocol_type != "consumer" or self.protocol is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                topics |= set(consumer_subscription_topics(m.metadata(self.protocol)))
            except (KeyError, ValueError):
                return None
        return topics


def consumer_subscription_topics(metadata: bytes) -> list[str]:
    """Topics of a ConsumerProtocolSubscription (version int16, then an array of strings)."""
    import struct

    if len(metadata) < 6:
        raise ValueError("subscription too short")
    pos = 2
    (n,) = struct.unpack_from(">i", metadata, pos)
    pos += 4
    if n < 0 or n > len(metadata):
        raise ValueError("bad topic count")
    topics = []
    for _ in range(n):
        if pos + 2 > len(metadata):
            raise ValueError("subscription truncated")
        (ln,) = struct.unpack_from(">h", metadata, pos)
        pos += 2
        if ln < 0 or pos + ln > len(metadata):
            raise ValueError("bad topic name")
        topics.append(metadata[pos : pos + ln].decode("utf-8"))
        pos += ln
    return topics
