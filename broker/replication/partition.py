"""The sans-IO replication core of one partition replica (Kafka's ``Partition``).

A :class:`Partition` is fed events and returns actions (see ``broker.replication.actions``);
it never touches a socket, ZooKeeper or the clock. Time is the ``now`` argument, in ms. The
only side effects are on the :class:`~broker.replication.replica_log.ReplicaLog` it was given.

Leader (``become_leader``):
- Followers pull: ``on_follower_fetch`` takes the fetch offset as the follower's LEO, updates
  its last-caught-up time, may expand the ISR (follower LEO >= max(HW, start offset of the
  current leader epoch)) and may advance the HW. A fetch finding no new data is parked up to
  its ``max_wait_ms`` and answered when data arrives or on ``tick``.
- HW = min LEO over the ISR (pending expansions included), advanced only while
  |ISR| >= min.insync.replicas; it never decreases while leading.
- ``tick`` shrinks the ISR of followers not caught up within ``replica.lag.time.max.ms`` (a
  follower at the leader's LEO is caught up). ISR changes are proposed as compare-and-set
  writes of the state znode (:class:`WriteStateZnode`); one at a time; the shell answers with
  ``on_isr_update_result``. A failed write means someone else (the controller) changed the
  state: the leader stops proposing until it is told the new state. With
  ``eligible.leader.replicas.enable`` each proposal carries KIP-966's ELR
  (``state.next_elr``): the replicas it drops while the ISR is below min.insync.replicas.
- Produce: NOT_LEADER_OR_FOLLOWER on non-leaders, NOT_ENOUGH_REPLICAS before appending when
  acks=all and |ISR| < min.insync.replicas; acks=0 never answers, acks=1 answers after the
  append, acks=all waits in the delayed-produce purgatory until HW > last offset (success),
  the ISR shrinks below min.insync.replicas (NOT_ENOUGH_REPLICAS_AFTER_APPEND), leadership is
  lost (NOT_LEADER_OR_FOLLOWER) or the request timeout passes (REQUEST_TIMED_OUT).
- Fetch, ListOffsets and OffsetsForLeaderEpoch carry the sender's current leader epoch: older
  -> FENCED_LEADER_EPOCH, newer -> UNKNOWN_LEADER_EPOCH (-1 skips the check), checked before
  leadership (NOT_LEADER_OR_FOLLOWER), as Kafka does. ``on_fetch`` and ``on_list_offsets`` also
  decide how far the requester may read: a follower to the LEO, a consumer below the HW (the LSO
  under read_committed).

The broker's shell (``broker/partition.py``, ``broker/apis/``) calls these very entry points
(``become_leader_or_follower``, ``on_produce``, ``on_fetch``, ``on_list_offsets``,
``on_offsets_for_leader_epoch``, ``tick`` and the follower's response handlers) and decides
nothing itself, so the hypothesis state machines that drive them test the production path.

Follower (``become_follower``): first truncates, then fetches one request at a time,
appending what it gets and taking HW = min(leader HW, own LEO). Truncation follows
``replica.truncation.mode`` (see ``broker.replication.config``): with leader epochs it asks
OffsetsForLeaderEpoch(latest local epoch); if the answer's epoch is unknown locally it
truncates to the end of the largest smaller local epoch and asks again, otherwise it truncates
to min(leader end offset, local end offset of that epoch) (KIP-101 + KIP-279). Lost requests
are re-sent after ``replica.socket.timeout.ms``; errors are retried after
``replica.fetch.backoff.ms``; FENCED_LEADER_EPOCH waits for the controller's next state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from isrlab.broker.replication.actions import (
    CONSUMER_REPLICA_ID,
    Action,
    FetchResponse,
    ListOffsetsResponse,
    OffsetsForLeaderEpochResponse,
    ProduceResponse,
    SendFetch,
    SendOffsetsForLeaderEpoch,
)
from isrlab.broker.replication.config import ReplicationConfig, TruncationMode
from isrlab.broker.replication.errors import ErrorCode
from isrlab.broker.replication.replica import UNKNOWN_OFFSET, Replica
from isrlab.broker.replication.replica_log import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    ReplicaLog,
)
from isrlab.broker.replication.state import (
    NO_LEADER,
    LeaderAndIsr,
    TopicPartition,
    WriteStateZnode,
    next_elr,
)

ACKS_ALL = -1
NO_EPOCH_CHECK = -1


def valid_acks(acks: int) -> bool:
    """Kafka takes acks 0, 1 and -1 (all); any other value is INVALID_REQUIRED_ACKS (for the
    whole Produce request, before any partition is looked at)."""
    return acks in (ACKS_ALL, 0, 1)


class Role(StrEnum):
    """What this replica currently is for its partition."""

    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class FollowerPhase(StrEnum):
    """Where a follower is in its truncate-then-fetch cycle."""

    IDLE = "idle"  # no leader to follow, or fenced: waiting for the controller
    TRUNCATING = "truncating"  # OffsetsForLeaderEpoch exchange in progress
    FETCHING = "fetching"


@dataclass
class _DelayedProduce:
    request_id: int
    base_offset: int
    last_offset: int
    deadline_ms: int


@dataclass
class _ParkedFetch:
    request_id: int
    replica_id: int
    fetch_offset: int
    deadline_ms: int


@dataclass
class _Inflight:
    kind: str  # "fetch" or "epoch"
    request_id: int
    sent_ms: int
    fetch_offset: int


class Partition:
    """One replica of one partition: leader or follower logic over a ReplicaLog."""

    def __init__(
        self,
        tp: TopicPartition,
        broker_id: int,
        log: ReplicaLog,
        config: ReplicationConfig | None = None,
    ) -> None:
        self.tp = tp
        self.broker_id = broker_id
        self.log = log
        self.config = config or ReplicationConfig()
        # A restarted replica starts from its checkpointed HW, clamped to what survived.
        self._hw = max(log.log_start_offset, min(log.hw_checkpoint, log.log_end_offset))
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.leader_epoch = UNDEFINED_EPOCH
        self.controller_epoch = -1
        self.zk_version = -1
        self.isr: tuple[int, ...] = ()
        self.elr: tuple[int, ...] = ()
        self.last_known_elr: tuple[int, ...] = ()
        self.assigned_replicas: tuple[int, ...] = ()
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        self._remote: dict[int, Replica] = {}
        self._pending_isr: LeaderAndIsr | None = None
        self._isr_update_blocked = False
        self._delayed_produces: dict[int, _DelayedProduce] = {}
        self._parked_fetches: list[_ParkedFetch] = []
        self.phase = FollowerPhase.IDLE
        self._inflight: _Inflight | None = None
        self._retry_at: int | None = None
        self._next_request_id = 0

    # ------------------------------------------------------------------ introspection
    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def last_stable_offset(self) -> int:
        """LSO = min(the log's first unstable offset, HW), the first unstable offset raised
        to the log start (Kafka's UnifiedLog.lastStableOffset): the oldest transaction that
        is open, or whose marker is not yet below the HW. Without one it is the HW. So
        log start <= LSO <= HW whenever log start <= HW."""
        first_unstable = self.log.first_unstable_offset()
        if first_unstable is None:
            return self._hw
        return min(max(first_unstable, self.log.log_start_offset), self._hw)

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def pending_isr(self) -> tuple[int, ...] | None:
        """The ISR of the in-flight state write, if any."""
        return self._pending_isr.isr if self._pending_isr else None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus members of a pending expansion: what the HW must wait for."""
        if self._pending_isr is None:
            return self.isr
        extra = tuple(r for r in self._pending_isr.isr if r not in self.isr)
        return self.isr + extra

    def replica(self, broker_id: int) -> Replica | None:
        """Leader-side state of a follower (None when not leading or not assigned)."""
        return self._remote.get(broker_id)

    @property
    def delayed_produce_ids(self) -> list[int]:
        return sorted(self._delayed_produces)

    # ------------------------------------------------------------------ state changes
    def become_leader_or_follower(
        self, state: LeaderAndIsr, assigned_replicas: Sequence[int], now: int
    ) -> list[Action]:
        """A partition state from the controller (LeaderAndIsr, or the state znode a broker
        watches): lead when it names this broker, follow otherwise. Stale states are ignored."""
        if state.leader == self.broker_id:
            return self.become_leader(state, assigned_replicas, now)
        return self.become_follower(state, assigned_replicas, now)

    def become_leader(
        self, state: LeaderAndIsr, assigned_replicas: Sequence[int], now: int
    ) -> list[Action]:
        """Take leadership as described by the controller (a LeaderAndIsr request)."""
        if state.leader != self.broker_id:
            raise ValueError(
                f"become_leader on broker {self.broker_id} with a state naming leader "
                f"{state.leader}: call become_follower instead"
            )
        if state.leader_epoch < self.leader_epoch:
            return []  # a stale controller decision
        if self.role is Role.LEADER and state.leader_epoch == self.leader_epoch:
            return self._adopt_same_epoch_state(state, now)
        actions: list[Action] = self._answer_parked_fetches(ErrorCode.FENCED_LEADER_EPOCH)
        self._set_state(Role.LEADER, state, assigned_replicas)
        self._cancel_follower_requests()
        self.phase = FollowerPhase.IDLE
        leo = self.log.log_end_offset
        self.log.assign_epoch_start_offset(state.leader_epoch, leo)
        self.leader_epoch_start_offset = leo
        self._remote = {}
        for r in self.assigned_replicas:
            if r != self.broker_id:
                replica = Replica(r)
                replica.reset(in_isr=r in self.isr, now=now)
                self._remote[r] = replica
        actions += self._maybe_increment_hw()
        return actions

    def become_follower(
        self, state: LeaderAndIsr, assigned_replicas: Sequence[int], now: int
    ) -> list[Action]:
        """Follow ``state.leader`` (or wait, when it is NO_LEADER); starts truncation."""
        if state.leader == self.broker_id:
            raise ValueError(
                f"become_follower on broker {self.broker_id} with a state naming it leader: "
                "call become_leader instead"
            )
        if state.leader_epoch < self.leader_epoch:
            return []
        if (
            self.role is Role.FOLLOWER
            and state.leader_epoch == self.leader_epoch
            and state.leader == self.leader_id
        ):
            if state.zk_version > self.zk_version:
                self.isr, self.zk_version = state.isr, state.zk_version
                self.elr, self.last_known_elr = state.elr, state.last_known_elr
            return []
        actions: list[Action] = []
        if self.role is Role.LEADER:
            actions += self._fail_delayed_produces(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            actions += self._answer_parked_fetches(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        leader_changed = self.role is not Role.FOLLOWER or self.leader_id != state.leader
        self._set_state(Role.FOLLOWER, state, assigned_replicas)
        self._remote = {}
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        self._cancel_follower_requests()
        if state.leader == NO_LEADER:
            self.phase = FollowerPhase.IDLE
            return actions
        actions += self._start_truncation(leader_changed, now)
        return actions

    def _set_state(self, role: Role, state: LeaderAndIsr, assigned: Sequence[int]) -> None:
        self.role = role
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.controller_epoch = state.controller_epoch
        self.zk_version = state.zk_version
        self.isr = tuple(state.isr)
        self.elr, self.last_known_elr = tuple(state.elr), tuple(state.last_known_elr)
        self.assigned_replicas = tuple(assigned)
        self._pending_isr = None
        self._isr_update_blocked = False

    def _adopt_same_epoch_state(self, state: LeaderAndIsr, now: int) -> list[Action]:
        # The same leadership re-announced (e.g. after the controller re-read the znode): a
        # newer znode version carries an ISR someone wrote; take it and resume ISR updates.
        if state.zk_version <= self.zk_version:
            return []
        self.isr, self.zk_version = tuple(state.isr), state.zk_version
        self.elr, self.last_known_elr = tuple(state.elr), tuple(state.last_known_elr)
        self.controller_epoch = state.controller_epoch
        self._pending_isr = None
        self._isr_update_blocked = False
        actions: list[Action] = []
        if len(self.isr) < self.config.min_insync_replicas:
            actions += self._fail_delayed_produces(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        actions += self._maybe_increment_hw()
        return actions

    # ------------------------------------------------------------------ leader: requests
    def _epoch_error(self, current_leader_epoch: int) -> ErrorCode | None:
        if current_leader_epoch != NO_EPOCH_CHECK and self.role is not Role.NONE:
            if current_leader_epoch < self.leader_epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            if current_leader_epoch > self.leader_epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None

    def _fetch_response(
        self, request_id: int, replica_id: int, error: ErrorCode, fetch_offset: int, end: int
    ) -> FetchResponse:
        return FetchResponse(
            tp=self.tp,
            request_id=request_id,
            replica_id=replica_id,
            error=error,
            fetch_offset=fetch_offset,
            records_end=end if error is ErrorCode.NONE else fetch_offset,
            high_watermark=self._hw,
            log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset,
            leader_epoch=self.leader_epoch,
            last_stable_offset=self.last_stable_offset,
        )

    def _readable_end(self, replica_id: int, read_committed: bool) -> int:
        """Where what ``replica_id`` may read ends (exclusive): followers read up to the LEO,
        consumers below the HW (read_uncommitted) or the LSO (read_committed)."""
        if replica_id >= 0:
            return self.log.log_end_offset
        return self.last_stable_offset if read_committed else self._hw

    def on_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        current_leader_epoch: int,
        now: int,
        request_id: int = 0,
        max_wait_ms: int = 0,
        read_committed: bool = False,
    ) -> list[Action]:
        """A Fetch, from a follower (``replica_id`` >= 0) or a consumer (``replica_id`` < 0,
        which ``read_committed`` bounds by the LSO); the answer is a FetchResponse naming the
        range to serve (a follower's may be parked, see ``on_follower_fetch``)."""
        if replica_id >= 0:
            return self.on_follower_fetch(
                replica_id, fetch_offset, current_leader_epoch, now, request_id, max_wait_ms
            )
        return [
            self.on_consumer_fetch(fetch_offset, current_leader_epoch, request_id, read_committed)
        ]

    def fetch_has_answer(
        self,
        replica_id: int,
        fetch_offset: int,
        current_leader_epoch: int,
        read_committed: bool = False,
    ) -> bool:
        """Whether ``on_fetch`` with these arguments would now answer with an error or with
        records (``records_end > fetch_offset``), without its side effects: what a fetch
        waiting for data waits for (Kafka's DelayedFetch.tryComplete). The shell wakes a
        waiting fetch only when this holds for one of its partitions."""
        if self._epoch_error(current_leader_epoch) is not None:
            return True
        if replica_id >= 0 and replica_id not in self._remote:
            return True  # REPLICA_NOT_AVAILABLE
        if not self.log.log_start_offset <= fetch_offset <= self.log.log_end_offset:
            return True  # OFFSET_OUT_OF_RANGE
        return self._readable_end(replica_id, read_committed) > fetch_offset

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        current_leader_epoch: int,
        now: int,
        request_id: int = 0,
        max_wait_ms: int = 0,
    ) -> list[Action]:
        """A Fetch from follower ``replica_id``: acknowledges ``fetch_offset`` as its LEO."""
        error = self._epoch_error(current_leader_epoch)
        if error is None and replica_id not in self._remote:
            error = ErrorCode.REPLICA_NOT_AVAILABLE
        leo = self.log.log_end_offset
        if error is None and not self.log.log_start_offset <= fetch_offset <= leo:
            error = ErrorCode.OFFSET_OUT_OF_RANGE
        if error is not None:
            return [self._fetch_response(request_id, replica_id, error, fetch_offset, leo)]
        replica = self._remote[replica_id]
        replica.update_fetch_state(fetch_offset, leo, now)
        actions: list[Action] = []
        actions += self._maybe_expand_isr(replica)
        actions += self._maybe_increment_hw()
        if fetch_offset == leo and max_wait_ms > 0:
            self._parked_fetches.append(
                _ParkedFetch(request_id, replica_id, fetch_offset, now + max_wait_ms)
            )
        else:
            actions.append(
                self._fetch_response(request_id, replica_id, ErrorCode.NONE, fetch_offset, leo)
            )
        return actions

    def on_consumer_fetch(
        self,
        fetch_offset: int,
        current_leader_epoch: int = NO_EPOCH_CHECK,
        request_id: int = 0,
        read_committed: bool = False,
    ) -> FetchResponse:
        """A consumer Fetch: it may read only below the HW (the LSO when ``read_committed``)."""
        error, end = self.consumer_fetch(fetch_offset, current_leader_epoch, read_committed)
        return self._fetch_response(request_id, CONSUMER_REPLICA_ID, error, fetch_offset, end)

    def consumer_fetch(
        self,
        fetch_offset: int,
        current_leader_epoch: int = NO_EPOCH_CHECK,
        read_committed: bool = False,
    ) -> tuple[ErrorCode, int]:
        """`on_consumer_fetch`'s answer without building it: (error, where the records to
        serve end). The rest of its FetchResponse is the core's state as it stands
        (``high_watermark``, ``last_stable_offset``, the log start; records end at
        ``fetch_offset`` on an error); a consumer fetch changes nothing here."""
        error = self._epoch_error(current_leader_epoch)
        if error is None and not (
            self.log.log_start_offset <= fetch_offset <= self.log.log_end_offset
        ):
            error = ErrorCode.OFFSET_OUT_OF_RANGE
        end = max(fetch_offset, self._readable_end(CONSUMER_REPLICA_ID, read_committed))
        return error or ErrorCode.NONE, end

    def on_list_offsets(
        self,
        current_leader_epoch: int = NO_EPOCH_CHECK,
        replica_id: int = CONSUMER_REPLICA_ID,
        read_committed: bool = False,
    ) -> ListOffsetsResponse:
        """ListOffsets: the earliest offset (log start) and the latest one ``replica_id`` may
        see (LEO for a follower, else HW or, ``read_committed``, LSO); leader only, with the
        same leader epoch check as Fetch, and for clients OFFSET_NOT_AVAILABLE while the HW
        is below the leader epoch's start offset (KIP-207). A timestamp lookup must find an
        offset below ``latest`` to count."""
        error = self._epoch_error(current_leader_epoch)
        if error is not None:
            return ListOffsetsResponse(self.tp, error, -1, -1, self.leader_epoch)
        if replica_id < 0 and self.leader_epoch_start_offset > self._hw:
            # KIP-207: a new leader's HW may lag the old leader's until its followers catch
            # up; answering with it would move a client's "latest" backwards. Kafka answers
            # OFFSET_NOT_AVAILABLE (retriable) until the HW reaches the epoch's start offset.
            return ListOffsetsResponse(
                self.tp, ErrorCode.OFFSET_NOT_AVAILABLE, -1, -1, self.leader_epoch
            )
        return ListOffsetsResponse(
            self.tp,
            ErrorCode.NONE,
            self.log.log_start_offset,
            self._readable_end(replica_id, read_committed),
            self.leader_epoch,
        )

    def on_offsets_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> OffsetsForLeaderEpochResponse:
        """Where ``leader_epoch`` ends in the leader's log (with the KIP-279 epoch)."""
        error = self._epoch_error(current_leader_epoch)
        if error is not None:
            return OffsetsForLeaderEpochResponse(
                self.tp, error, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            )
        epoch, end_offset = self.log.end_offset_for_epoch(leader_epoch)
        return OffsetsForLeaderEpochResponse(self.tp, ErrorCode.NONE, epoch, end_offset)

    def on_produce(
        self,
        request_id: int,
        records: Sequence[Any],
        acks: int,
        timeout_ms: int,
        now: int,
    ) -> list[Action]:
        """A Produce of ``records``: admission (leader, acks=all against min.insync.replicas),
        the append with the leader epoch, then ``acks``: a ProduceResponse now (acks=1), none
        (acks=0), or once HW > the last offset (acks=all, see ``_produce_appended``).

        The broker's shell calls exactly this. Its log validates the records (and the
        idempotent producer's sequence) inside ``append_as_leader``: a refusal is raised out of
        this method with nothing changed here, and a duplicate batch returns its original
        offsets, which then wait for the HW like a fresh append."""
        if not valid_acks(acks):
            return [ProduceResponse(self.tp, request_id, ErrorCode.INVALID_REQUIRED_ACKS)]
        if self.role is not Role.LEADER:
            return [ProduceResponse(self.tp, request_id, ErrorCode.NOT_LEADER_OR_FOLLOWER)]
        if acks == ACKS_ALL and len(self.isr) < self.config.min_insync_replicas:
            return [
                ProduceResponse(
                    self.tp,
                    request_id,
                    ErrorCode.NOT_ENOUGH_REPLICAS,
                    message=f"ISR {list(self.isr)} is smaller than min.insync.replicas="
                    f"{self.config.min_insync_replicas}",
                )
            ]
        base_offset, last_offset = self.log.append_as_leader(records, self.leader_epoch)
        actions = self._answer_parked_fetches(ErrorCode.NONE, only_with_data=True)
        actions += self._produce_appended(
            request_id, base_offset, last_offset, acks, timeout_ms, now
        )
        return actions

    def _produce_appended(
        self, request_id: int, base: int, last_offset: int, acks: int, timeout_ms: int, now: int
    ) -> list[Action]:
        actions: list[Action] = []
        if acks == 1:
            actions.append(ProduceResponse(self.tp, request_id, ErrorCode.NONE, base, last_offset))
        elif acks == ACKS_ALL:
            self._delayed_produces[request_id] = _DelayedProduce(
                request_id, base, last_offset, now + timeout_ms
            )
        actions += self._maybe_increment_hw()
        return actions

    # ------------------------------------------------------------------ leader: ISR and HW
    def _propose_isr(self, isr: tuple[int, ...]) -> WriteStateZnode:
        elr: tuple[int, ...] = ()
        if self.config.eligible_leader_replicas_enable:
            elr = next_elr(self.isr, self.elr, isr, self.config.min_insync_replicas)
        proposal = LeaderAndIsr(
            leader=self.broker_id,
            leader_epoch=self.leader_epoch,
            isr=isr,
            controller_epoch=self.controller_epoch,
            zk_version=self.zk_version,
            elr=elr,
        )
        self._pending_isr = proposal
        return WriteStateZnode(self.tp, proposal, expected_version=self.zk_version)

    def _can_propose(self) -> bool:
        return (
            self.role is Role.LEADER and self._pending_isr is None and not self._isr_update_blocked
        )

    def _maybe_expand_isr(self, replica: Replica) -> list[Action]:
        if not self._can_propose() or replica.broker_id in self.isr:
            return []
        # Also at least the current epoch's start: the follower has finished truncating
        # against this leader, so everything committed by earlier leaders is in its log.
        if replica.log_end_offset >= max(self._hw, self.leader_epoch_start_offset):
            return [self._propose_isr((*self.isr, replica.broker_id))]
        return []

    def _maybe_shrink_isr(self, now: int) -> list[Action]:
        if not self._can_propose():
            return []
        leo = self.log.log_end_offset
        lag = self.config.replica_lag_time_max_ms
        out_of_sync = {
            r
            for r in self.isr
            if r != self.broker_id
            and (r not in self._remote or not self._remote[r].is_caught_up(leo, now, lag))
        }
        if not out_of_sync:
            return []
        return [self._propose_isr(tuple(r for r in self.isr if r not in out_of_sync))]

    def on_isr_update_result(
        self, ok: bool, new_version: int, now: int, proposal: LeaderAndIsr | None = None
    ) -> list[Action]:
        """Outcome of a WriteStateZnode this leader emitted: ``proposal`` is its state (None:
        the last one emitted). The result of a proposal no longer pending is ignored: a newer
        state was adopted since (the watch can deliver a write's own znode before its
        result), and the next proposal may already be in flight; crediting it with this result
        would make its ISR count before it is in ZooKeeper."""
        if proposal is not None and proposal is not self._pending_isr:
            return []
        pending, self._pending_isr = self._pending_isr, None
        if pending is None or self.role is not Role.LEADER:
            return []
        if pending.leader_epoch != self.leader_epoch:
            return []
        if not ok:
            # Kafka: "Cached zkVersion not equal to that in zookeeper, skip updating ISR". The
            # controller changed the state and will tell us.
            self._isr_update_blocked = True
            return []
        self.isr, self.zk_version = pending.isr, new_version
        self.elr, self.last_known_elr = pending.elr, pending.last_known_elr
        actions: list[Action] = []
        if len(self.isr) < self.config.min_insync_replicas:
            actions += self._fail_delayed_produces(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        actions += self._maybe_increment_hw()
        return actions

    def _maybe_increment_hw(self) -> list[Action]:
        """Advance the HW as far as the ISR allows, then answer the delayed produces it
        satisfies (the HW is frozen while |ISR| < min.insync.replicas)."""
        if self.role is Role.LEADER and len(self.isr) >= self.config.min_insync_replicas:
            new_hw = self.log.log_end_offset
            for r in self.maximal_isr:
                if r != self.broker_id:
                    replica = self._remote.get(r)
                    new_hw = min(new_hw, replica.log_end_offset if replica else UNKNOWN_OFFSET)
            if new_hw > self._hw:
                self._set_hw(new_hw)
        return self._try_complete_delayed_produces()

    def _set_hw(self, hw: int) -> None:
        self._hw = hw
        self.log.hw_checkpoint = hw

    def _try_complete_delayed_produces(self) -> list[Action]:
        if not self._delayed_produces:
            return []
        done = [d for d in self._delayed_produces.values() if self._hw > d.last_offset]
        actions: list[Action] = []
        for d in done:
            del self._delayed_produces[d.request_id]
            error = (
                ErrorCode.NONE
                if len(self.isr) >= self.config.min_insync_replicas
                else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            )
            actions.append(
                ProduceResponse(self.tp, d.request_id, error, d.base_offset, d.last_offset)
            )
        return actions

    def _fail_delayed_produces(self, error: ErrorCode) -> list[Action]:
        actions: list[Action] = [
            ProduceResponse(self.tp, d.request_id, error, d.base_offset, d.last_offset)
            for d in self._delayed_produces.values()
        ]
        self._delayed_produces.clear()
        return actions

    def _answer_parked_fetches(
        self, error: ErrorCode, only_with_data: bool = False, now: int | None = None
    ) -> list[Action]:
        if not self._parked_fetches:
            return []
        leo = self.log.log_end_offset
        keep: list[_ParkedFetch] = []
        actions: list[Action] = []
        for p in self._parked_fetches:
            due = (only_with_data and p.fetch_offset < leo) or (
                now is not None and now >= p.deadline_ms
            )
            if (only_with_data or now is not None) and not due:
                keep.append(p)
                continue
            actions.append(
                self._fetch_response(p.request_id, p.replica_id, error, p.fetch_offset, leo)
            )
        self._parked_fetches = keep
        return actions

    # ------------------------------------------------------------------ time
    def tick(self, now: int) -> list[Action]:
        """Time passed: ISR shrink, produce timeouts, long-poll expiry, follower re-sends."""
        actions: list[Action] = []
        if self.role is Role.LEADER:
            actions += self._answer_parked_fetches(ErrorCode.NONE, now=now)
            actions += self._maybe_shrink_isr(now)
            expired = [d for d in self._delayed_produces.values() if now >= d.deadline_ms]
            for d in expired:
                del self._delayed_produces[d.request_id]
                actions.append(
                    ProduceResponse(
                        self.tp,
                        d.request_id,
                        ErrorCode.REQUEST_TIMED_OUT,
                        d.base_offset,
                        d.last_offset,
                    )
                )
        elif self.role is Role.FOLLOWER and self.phase is not FollowerPhase.IDLE:
            inflight = self._inflight
            if inflight is not None:
                if now - inflight.sent_ms >= self.config.replica_socket_timeout_ms:
                    self._inflight = None
                    actions += self._resume(now)
            elif self._retry_at is not None and now >= self._retry_at:
                actions += self._resume(now)
        return actions

    def next_tick_ms(self, now: int) -> int | None:
        """The earliest time at which ``tick`` may act if nothing else reaches this partition
        first (no request, response, state or result): ``tick(t)`` returns no actions for any
        ``t`` below it. None: not until something else happens. A shell may skip the ticks
        before it, as long as any other input makes it ask again."""
        at: list[int] = []
        if self.role is Role.LEADER:
            at += [p.deadline_ms for p in self._parked_fetches]
            at += [d.deadline_ms for d in self._delayed_produces.values()]
            if self._can_propose():
                leo = self.log.log_end_offset
                lag = self.config.replica_lag_time_max_ms
                for r in self.isr:
                    if r == self.broker_id:
                        continue
                    replica = self._remote.get(r)
                    if replica is None:
                        return now  # an ISR member this leader does not know: shrinks now
                    if replica.log_end_offset != leo:
                        # out of sync once now - last caught up exceeds the lag
                        at.append(replica.last_caught_up_time_ms + lag + 1)
        elif self.role is Role.FOLLOWER and self.phase is not FollowerPhase.IDLE:
            if self._inflight is not None:
                at.append(self._inflight.sent_ms + self.config.replica_socket_timeout_ms)
            elif self._retry_at is not None:
                at.append(self._retry_at)
        return min(at) if at else None

    # ------------------------------------------------------------------ follower
    def _cancel_follower_requests(self) -> None:
        self._inflight = None
        self._retry_at = None

    def _new_request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send_fetch(self, now: int) -> SendFetch:
        request_id = self._new_request_id()
        fetch_offset = self.log.log_end_offset
        self.phase = FollowerPhase.FETCHING
        self._inflight = _Inflight("fetch", request_id, now, fetch_offset)
        self._retry_at = None
        return SendFetch(
            tp=self.tp,
            request_id=request_id,
            leader_id=self.leader_id,
            replica_id=self.broker_id,
            fetch_offset=fetch_offset,
            current_leader_epoch=self.leader_epoch,
            max_wait_ms=self.config.replica_fetch_wait_max_ms,
        )

    def _ask_epoch_or_fetch(self, now: int) -> list[Action]:
        epoch = self.log.latest_epoch()
        if epoch == UNDEFINED_EPOCH:
            # Nothing to compare with: fall back to the high watermark, as Kafka does.
            self._truncate(self._hw)
            return [self._send_fetch(now)]
        request_id = self._new_request_id()
        self.phase = FollowerPhase.TRUNCATING
        self._inflight = _Inflight("epoch", request_id, now, self.log.log_end_offset)
        self._retry_at = None
        return [
            SendOffsetsForLeaderEpoch(
                tp=self.tp,
                request_id=request_id,
                leader_id=self.leader_id,
                replica_id=self.broker_id,
                current_leader_epoch=self.leader_epoch,
                leader_epoch=epoch,
            )
        ]

    def _start_truncation(self, leader_changed: bool, now: int) -> list[Action]:
        if self.config.truncation_mode is TruncationMode.HIGH_WATERMARK:
            # Pre-KIP-101: trust our own HW, which may lag the leader's by a fetch round trip.
            if leader_changed:
                self._truncate(self._hw)
            return [self._send_fetch(now)]
        return self._ask_epoch_or_fetch(now)

    def _resume(self, now: int) -> list[Action]:
        if self.phase is FollowerPhase.TRUNCATING:
            return self._ask_epoch_or_fetch(now)
        return [self._send_fetch(now)]

    def _truncate(self, offset: int) -> None:
        if offset < self.log.log_end_offset:
            self.log.truncate_to(offset)
        if self._hw > self.log.log_end_offset:
            self._set_hw(self.log.log_end_offset)

    def _take_inflight(self, kind: str, request_id: int) -> _Inflight | None:
        inflight = self._inflight
        if (
            self.role is not Role.FOLLOWER
            or inflight is None
            or inflight.kind != kind
            or inflight.request_id != request_id
        ):
            return None  # late, duplicated or superseded response
        self._inflight = None
        return inflight

    def _on_follower_error(self, error: ErrorCode, now: int) -> list[Action]:
        if error is ErrorCode.FENCED_LEADER_EPOCH:
            # The leader is ahead of us: the controller's next state will reach us.
            self.phase = FollowerPhase.IDLE
            return []
        self._retry_at = now + self.config.replica_fetch_backoff_ms
        return []

    def on_offsets_for_leader_epoch_response(
        self, request_id: int, error: ErrorCode, leader_epoch: int, end_offset: int, now: int
    ) -> list[Action]:
        """The leader's answer to our SendOffsetsForLeaderEpoch: truncate, then ask or fetch."""
        if self._take_inflight("epoch", request_id) is None:
            return []
        if error is not ErrorCode.NONE:
            return self._on_follower_error(error, now)
        leo = self.log.log_end_offset
        if end_offset == UNDEFINED_EPOCH_OFFSET:
            self._truncate(self._hw)
            return [self._send_fetch(now)]
        if (
            self.config.truncation_mode is TruncationMode.LEADER_EPOCH_V0
            or leader_epoch == UNDEFINED_EPOCH
        ):
            # KIP-101 as first shipped: the end offset alone, whatever epoch it belongs to.
            self._truncate(min(end_offset, leo))
            return [self._send_fetch(now)]
        local_epoch, local_end = self.log.end_offset_for_epoch(leader_epoch)
        if local_epoch == UNDEFINED_EPOCH:
            self._truncate(min(end_offset, leo))
            return [self._send_fetch(now)]
        if local_epoch != leader_epoch:
            # KIP-279: we never saw the leader's epoch; cut back to the end of our largest
            # smaller epoch and ask again about that one.
            self._truncate(local_end)
            return self._ask_epoch_or_fetch(now)
        self._truncate(min(end_offset, local_end))
        return [self._send_fetch(now)]

    def on_fetch_response(
        self,
        request_id: int,
        error: ErrorCode,
        records: Sequence[Any],
        high_watermark: int,
        log_start_offset: int,
        log_end_offset: int,
        now: int,
    ) -> list[Action]:
        """The leader's answer to our SendFetch (records are what it served)."""
        inflight = self._take_inflight("fetch", request_id)
        if inflight is None:
            return []
        if inflight.fetch_offset != self.log.log_end_offset:
            return [self._send_fetch(now)]
        if error is ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.log.log_end_offset > log_end_offset:
                self._truncate(log_end_offset)
            elif self.log.log_end_offset < log_start_offset:
                self.log.truncate_fully_and_start_at(log_start_offset)
                self._set_hw(log_start_offset)
            return [self._send_fetch(now)]
        if error is not ErrorCode.NONE:
            return self._on_follower_error(error, now)
        if records:
            # Should the log refuse the records (the exception goes to the shell), fetch again
            # after the back-off instead of waiting for an answer that will never come.
            self._retry_at = now + self.config.replica_fetch_backoff_ms
            self.log.append_as_follower(records)
        leo = self.log.log_end_offset
        self._set_hw(max(self.log.log_start_offset, min(high_watermark, leo)))
        return [self._send_fetch(now)]
