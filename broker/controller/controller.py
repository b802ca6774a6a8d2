"""The sans-IO controller core (ZooKeeper-mode Kafka controller decisions).

The shell feeds it ZooKeeper facts (topic assignments, live brokers from /brokers/ids, partition
state znodes with their versions) and carries out the actions it returns:

- :class:`~broker.replication.state.WriteStateZnode`: conditional write of a partition state
  (``expected_version=None``: create). Report with :meth:`Controller.on_write_result`.
- :class:`ReadStateZnode`: re-read a state znode after a version conflict (a leader changed its
  ISR in between). Report with :meth:`Controller.on_state_read`. The controller then decides
  again from the fresh state, so it never clobbers a leader's ISR change.
- :class:`NotifyBrokers`: send a LeaderAndIsr request for one partition to some brokers.
- :class:`WriteAssignmentZnode`: create ``/brokers/topics/<topic>`` for a new topic.

Rules, per partition, whenever membership or state changes:

- leader alive: dead brokers leave the ISR (new state, ``leader_epoch`` bumped);
- leader dead or offline: the first assigned replica that is live and in the ISR leads (clean);
  failing that, with ``unclean_leader_election`` the first live assigned replica leads with an
  ISR of itself; otherwise the partition goes offline (leader -1) and the ISR keeps one member
  (the last leader if it was in the ISR), as Kafka does, so it can lead again when it returns;
- every decision bumps ``leader_epoch``; one write per partition is in flight at a time.

With ``eligible_leader_replicas`` (KIP-966, the broker key ``eligible.leader.replicas.enable``,
default true) the ISR holds live members only and may become empty, and the state znode
carries the eligible leader replicas (``state.next_elr``):

- dead brokers, and brokers that registered after an unclean shutdown (reported by the shell:
  ``unclean_shutdown``), leave the ISR; a broker that shut down uncleanly also leaves the ELR;
- election order: the current leader if still valid; the first assigned replica that is live
  and in the ISR; when the ISR is empty, the first assigned live ELR member (it leads with an
  ISR of itself, the other ELR members stay eligible); when ISR and ELR are both empty, the
  last known leader (``last_known_elr``) if it is live: Kafka 4.x's choice, the behaviour
  before KIP-966 when nobody else is eligible; then unclean election if enabled; otherwise the
  partition stays offline (leader -1) until an eligible replica registers;
- an ELR-only change (an eligible replica's unclean restart) does not bump ``leader_epoch``.

Without it the rules above the paragraph apply unchanged: the last ISR member stays in the ISR
and is elected again whatever it lost (KIP-966's "last replica standing").

A state znode carrying a newer ``controller_epoch`` than ours means another controller took
over: this one is fenced and stops writing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import orjson

from isrlab.broker.controller.assignment import assign_replicas_to_brokers
from isrlab.broker.replication.state import (
    NO_LEADER,
    LeaderAndIsr,
    TopicPartition,
    WriteStateZnode,
    next_elr,
    partition_state_path,
    topic_path,
)


@dataclass(frozen=True)
class NotifyBrokers:
    """Send LeaderAndIsr(``state``, ``replicas``) for ``tp`` to each of ``brokers``."""

    brokers: tuple[int, ...]
    tp: TopicPartition
    state: LeaderAndIsr
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class ReadStateZnode:
    """Read ``tp``'s state znode and its version; answer with ``Controller.on_state_read``."""

    tp: TopicPartition
    path: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", partition_state_path(self.tp))


@dataclass(frozen=True)
class WriteAssignmentZnode:
    """Create the topic znode holding the replica assignment (Kafka's JSON layout)."""

    topic: str
    assignment: tuple[tuple[int, tuple[int, ...]], ...]
    path: str = field(init=False)
    data: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", topic_path(self.topic))
        partitions = {str(p): list(r) for p, r in self.assignment}
        object.__setattr__(self, "data", orjson.dumps({"version": 1, "partitions": partitions}))


ControllerAction = WriteStateZnode | ReadStateZnode | NotifyBrokers | WriteAssignmentZnode


class Controller:
    """Elections and ISR cleanup for every partition, decided from cached ZooKeeper state."""

    def __init__(
        self,
        controller_epoch: int,
        unclean_leader_election: bool = False,
        eligible_leader_replicas: bool = True,
        min_insync_replicas: int | Callable[[str], int] = 1,
    ) -> None:
        """``min_insync_replicas``: a number, or the topic's value by topic name (the ELR
        depends on it)."""
        self.controller_epoch = controller_epoch
        self.unclean_leader_election = unclean_leader_election
        self.eligible_leader_replicas = eligible_leader_replicas
        self._min_isr = (
            min_insync_replicas
            if callable(min_insync_replicas)
            else (lambda _topic, n=min_insync_replicas: n)
        )
        # Brokers that registered after an unclean shutdown, per partition, until a decision
        # taking them into account is written (KIP-966: they leave the ISR and the ELR).
        self._unclean: dict[TopicPartition, frozenset[int]] = {}
        self._pending_unclean: dict[TopicPartition, frozenset[int]] = {}
        self.live_brokers: frozenset[int] = frozenset()
        self.assignments: dict[TopicPartition, tuple[int, ...]] = {}
        self.states: dict[TopicPartition, LeaderAndIsr] = {}
        self.fenced = False
        self._pending: dict[TopicPartition, LeaderAndIsr] = {}
        self._reading: set[TopicPartition] = set()
        self._dirty: set[TopicPartition] = set()

    # ------------------------------------------------------------------ inputs
    def load(
        self,
        assignments: Mapping[TopicPartition, Sequence[int]],
        states: Mapping[TopicPartition, LeaderAndIsr],
        live_brokers: Iterable[int],
        unclean_shutdown: Mapping[TopicPartition, Iterable[int]] | None = None,
        registered_since: Mapping[TopicPartition, Iterable[int]] | None = None,
    ) -> list[ControllerAction]:
        """Controller failover: take over what ZooKeeper holds, fix what needs fixing and
        tell every live broker the state of its partitions. ``unclean_shutdown``: per
        partition, the live brokers that registered after an unclean shutdown since its state
        was last written (the shell compares registration and state znode zxids).
        ``registered_since``: per partition, every live broker that registered since then,
        cleanly or not. A state whose leader is among them names an incarnation that is gone
        (a bounce no controller saw, KIP-380's broker epoch): decided as a failure of that
        leader, then its start, so a new state is written (brokers do not lead from a state
        older than their registration)."""
        self.assignments = {tp: tuple(r) for tp, r in assignments.items()}
        self.states = dict(states)
        self.live_brokers = frozenset(live_brokers)
        for tp, brokers in (unclean_shutdown or {}).items():
            self._mark_unclean(tp, brokers)
        bounced = {
            tp: self.states[tp].leader
            for tp, brokers in (registered_since or {}).items()
            if tp in self.states and self.states[tp].leader in set(brokers)
        }
        actions: list[ControllerAction] = []
        for tp in sorted(self.assignments):
            if tp in bounced:
                actions += self._decide_and_write(tp, bounced=bounced[tp])
                continue
            decided = self._decide_and_write(tp)
            if decided:
                actions += decided
            elif tp in self.states:
                actions += self._notify(tp, self.states[tp])
        return actions

    def on_broker_change(
        self, live_brokers: Iterable[int], unclean_shutdown: Iterable[int] = ()
    ) -> list[ControllerAction]:
        """The set of registered brokers changed (ephemeral /brokers/ids children).
        ``unclean_shutdown``: brokers that (re)registered after an unclean shutdown (their
        registration says so; KIP-966's broker registration with no previous broker epoch)."""
        new_live = frozenset(live_brokers)
        unclean = frozenset(unclean_shutdown)
        if unclean:
            for tp, replicas in self.assignments.items():
                self._mark_unclean(tp, unclean.intersection(replicas))
        started = new_live - self.live_brokers
        self.live_brokers = new_live
        actions: list[ControllerAction] = []
        for tp in sorted(self.assignments):
            decided = self._decide_and_write(tp)
            actions += decided
            state = self.states.get(tp)
            newcomers = tuple(r for r in self.assignments[tp] if r in started)
            if not decided and newcomers and state is not None and tp not in self._pending:
                # A (re)started broker learns the current state so it starts following.
                actions.append(NotifyBrokers(newcomers, tp, state, self.assignments[tp]))
        return actions

    def on_write_result(
        self, tp: TopicPartition, ok: bool, new_version: int
    ) -> list[ControllerAction]:
        """Outcome of a WriteStateZnode this controller emitted."""
        written = self._pending.pop(tp, None)
        used = self._pending_unclean.pop(tp, frozenset())
        if written is None:
            return []
        if ok and used:
            left = self._unclean.get(tp, frozenset()) - used
            if left:
                self._unclean[tp] = left
            else:
                self._unclean.pop(tp, None)
        if not ok:
            # Someone (the leader, changing its ISR) wrote first: re-read, then decide again.
            self._reading.add(tp)
            return [ReadStateZnode(tp)]
        state = LeaderAndIsr(
            leader=written.leader,
            leader_epoch=written.leader_epoch,
            isr=written.isr,
            controller_epoch=written.controller_epoch,
            zk_version=new_version,
            elr=written.elr,
            last_known_elr=written.last_known_elr,
        )
        self.states[tp] = state
        actions = self._notify(tp, state)
        if tp in self._dirty:
            self._dirty.discard(tp)
            actions += self._decide_and_write(tp)
        return actions

    def on_state_read(self, tp: TopicPartition, state: LeaderAndIsr) -> list[ControllerAction]:
        """A state znode's current contents (after a ReadStateZnode or an ISR notification)."""
        self._reading.discard(tp)
        if state.controller_epoch > self.controller_epoch:
            self.fenced = True  # a newer controller exists; it owns the decisions now
        self.states[tp] = state
        self._dirty.discard(tp)
        decided = self._decide_and_write(tp)
        if decided or self.fenced:
            return decided
        # Nothing to change, but brokers that (re)started while we were reading have not
        # been told the state yet; re-sending it to the others is harmless.
        return self._notify(tp, state)

    def on_isr_change_notification(self, tps: Iterable[TopicPartition]) -> list[ControllerAction]:
        """Leaders announced ISR changes (/isr_change_notification): refresh those states."""
        actions: list[ControllerAction] = []
        for tp in tps:
            if tp in self.assignments and tp not in self._reading:
                self._reading.add(tp)
                actions.append(ReadStateZnode(tp))
        return actions

    # ------------------------------------------------------------------ topics
    def create_topic(
        self,
        topic: str,
        n_partitions: int,
        replication_factor: int,
        start_index: int = 0,
        replica_shift: int = 0,
    ) -> list[ControllerAction]:
        """Place a new topic on the live brokers (Kafka's rack-unaware algorithm)."""
        assignment = assign_replicas_to_brokers(
            self.live_brokers, n_partitions, replication_factor, start_index, replica_shift
        )
        return self.add_topic(topic, assignment)

    def add_topic(
        self, topic: str, assignment: Mapping[int, Sequence[int]]
    ) -> list[ControllerAction]:
        """Register a topic with an explicit assignment and bring its partitions online."""
        if any(TopicPartition(topic, p) in self.assignments for p in assignment):
            raise ValueError(f"topic {topic!r} already exists: delete it or pick another name")
        for p, replicas in assignment.items():
            if len(set(replicas)) != len(replicas) or not replicas:
                raise ValueError(
                    f"partition {p} of {topic!r} has assignment {list(replicas)}: "
                    "replicas must be distinct and non-empty"
                )
        ordered = tuple(sorted((p, tuple(r)) for p, r in assignment.items()))
        actions: list[ControllerAction] = [WriteAssignmentZnode(topic, ordered)]
        for p, replicas in ordered:
            tp = TopicPartition(topic, p)
            self.assignments[tp] = replicas
            actions += self._decide_and_write(tp)
        return actions

    # ------------------------------------------------------------------ decisions
    def _mark_unclean(self, tp: TopicPartition, brokers: Iterable[int]) -> None:
        if not self.eligible_leader_replicas:
            return  # before KIP-966 nobody looked at how a broker had stopped
        marked = self._unclean.get(tp, frozenset()).union(brokers)
        if marked:
            self._unclean[tp] = marked

    def _notify(self, tp: TopicPartition, state: LeaderAndIsr) -> list[ControllerAction]:
        replicas = self.assignments[tp]
        targets = tuple(r for r in replicas if r in self.live_brokers)
        return [NotifyBrokers(targets, tp, state, replicas)] if targets else []

    def _decide_and_write(
        self, tp: TopicPartition, bounced: int | None = None
    ) -> list[ControllerAction]:
        if self.fenced:
            return []
        if tp in self._pending or tp in self._reading:
            self._dirty.add(tp)
            return []
        current = self.states.get(tp)
        unclean = self._unclean.get(tp, frozenset())
        target = self.decide(tp) if bounced is None else self._decide_bounce(tp, bounced)
        if target is None:
            self._unclean.pop(tp, None)  # nothing to change for them
            return []
        self._pending[tp] = target
        self._pending_unclean[tp] = unclean
        expected = None if current is None else current.zk_version
        return [WriteStateZnode(tp, target, expected_version=expected)]

    def _decide_bounce(self, tp: TopicPartition, broker: int) -> LeaderAndIsr | None:
        """The state after leader ``broker`` failed and started again, both decisions made
        at once and written as one state."""
        current = self.states[tp]
        live = self.live_brokers
        try:
            self.live_brokers = live - {broker}
            failed = self.decide(tp)  # never None: the state names a dead leader
            if failed is None:
                return None
            self.live_brokers = live
            self.states[tp] = failed
            started = self.decide(tp)
        finally:
            self.live_brokers = live
            self.states[tp] = current
        return started or failed

    def decide(self, tp: TopicPartition) -> LeaderAndIsr | None:
        """The state ``tp`` should move to given live brokers, or None if it is fine."""
        replicas = self.assignments[tp]
        live = self.live_brokers
        current = self.states.get(tp)
        if current is None:
            live_replicas = tuple(r for r in replicas if r in live)
            if not live_replicas:
                return None  # stays new until one of its replicas is up
            return LeaderAndIsr(
                leader=live_replicas[0],
                leader_epoch=0,
                isr=live_replicas,
                controller_epoch=self.controller_epoch,
                zk_version=-1,
            )
        if self.eligible_leader_replicas:
            return self._decide_with_elr(tp, current)
        live_isr = tuple(r for r in current.isr if r in live)
        if current.leader != NO_LEADER and current.leader in live:
            if live_isr == current.isr:
                return None
            return current.new_leader(current.leader, live_isr, self.controller_epoch)
        clean = [r for r in replicas if r in live and r in current.isr]
        if clean:
            return current.new_leader(clean[0], live_isr, self.controller_epoch)
        if self.unclean_leader_election:
            live_assigned = [r for r in replicas if r in live]
            if live_assigned:
                return current.new_leader(
                    live_assigned[0], (live_assigned[0],), self.controller_epoch
                )
        # Offline. The ISR never becomes empty: one member stays so that it (and only it)
        # can lead again without losing what was committed.
        if live_isr:
            kept = live_isr
        elif current.leader in current.isr:
            kept = (current.leader,)
        else:
            kept = current.isr[:1]
        if current.leader == NO_LEADER and kept == current.isr:
            return None
        return current.new_leader(NO_LEADER, kept, self.controller_epoch)

    def _decide_with_elr(self, tp: TopicPartition, current: LeaderAndIsr) -> LeaderAndIsr | None:
        """KIP-966's decision (see the module docstring)."""
        replicas = self.assignments[tp]
        live = self.live_brokers
        unclean = self._unclean.get(tp, frozenset())
        epoch = self.controller_epoch
        isr = tuple(r for r in current.isr if r in live and r not in unclean)
        elr = next_elr(current.isr, current.elr, isr, self._min_isr(tp.topic), unclean)
        if current.leader in isr:
            if isr == current.isr:
                if elr == current.elr and not current.last_known_elr:
                    return None
                # An ELR-only change needs no epoch bump (KIP-966).
                return replace(current, elr=elr, last_known_elr=(), controller_epoch=epoch)
            return current.new_leader(current.leader, isr, epoch, elr=elr)
        for r in replicas:
            if r in isr:
                return current.new_leader(r, isr, epoch, elr=elr)
        if not isr:
            for r in replicas:
                if r in elr and r in live:
                    others = tuple(e for e in elr if e != r)
                    return current.new_leader(r, (r,), epoch, elr=others)
        # The last leader, remembered when the ISR first became empty.
        if current.last_known_elr:
            last_known = current.last_known_elr
        elif current.leader != NO_LEADER:
            last_known = (current.leader,)
        else:
            last_known = current.isr[:1]  # a state written without ELR keeps its last leader
        if not isr and not elr and len(last_known) == 1 and last_known[0] in live:
            # Nobody eligible is left (they all shut down uncleanly): Kafka 4.x elects the last
            # known leader, as Kafka did before KIP-966, rather than stay offline for ever.
            return current.new_leader(last_known[0], last_known, epoch)
        if self.unclean_leader_election:
            live_assigned = [r for r in replicas if r in live]
            if live_assigned:
                return current.new_leader(live_assigned[0], (live_assigned[0],), epoch)
        kept_last = last_known if not isr else ()
        if current.leader == NO_LEADER and (isr, elr, kept_last) == (
            current.isr,
            current.elr,
            current.last_known_elr,
        ):
            return None
        if current.leader == NO_LEADER and isr == current.isr:
            # Still offline, only the ELR changed: no epoch bump.
            return replace(current, elr=elr, last_known_elr=kept_last, controller_epoch=epoch)
        return current.new_leader(NO_LEADER, isr, epoch, elr=elr, last_known_elr=kept_last)
