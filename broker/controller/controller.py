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

A state znode carrying a newer ``controller_epoch`` than ours means another controller took
over: this one is fenced and stops writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from isrlab.broker.controller.assignment import assign_replicas_to_brokers
from isrlab.broker.replication.state import (
    NO_LEADER,
    LeaderAndIsr,
    TopicPartition,
    WriteStateZnode,
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

    def __init__(self, controller_epoch: int, unclean_leader_election: bool = False) -> None:
        self.controller_epoch = controller_epoch
        self.unclean_leader_election = unclean_leader_election
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
    ) -> list[ControllerAction]:
        """Controller failover: take over what ZooKeeper holds, fix what needs fixing and
        tell every live broker the state of its partitions."""
        self.assignments = {tp: tuple(r) for tp, r in assignments.items()}
        self.states = dict(states)
        self.live_brokers = frozenset(live_brokers)
        actions: list[ControllerAction] = []
        for tp in sorted(self.assignments):
            decided = self._decide_and_write(tp)
            if decided:
                actions += decided
            elif tp in self.states:
                actions += self._notify(tp, self.states[tp])
        return actions

    def on_broker_change(self, live_brokers: Iterable[int]) -> list[ControllerAction]:
        """The set of registered brokers changed (ephemeral /brokers/ids children)."""
        new_live = frozenset(live_brokers)
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
        if written is None:
            return []
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
    def _notify(self, tp: TopicPartition, state: LeaderAndIsr) -> list[ControllerAction]:
        replicas = self.assignments[tp]
        targets = tuple(r for r in replicas if r in self.live_brokers)
        return [NotifyBrokers(targets, tp, state, replicas)] if targets else []

    def _decide_and_write(self, tp: TopicPartition) -> list[ControllerAction]:
        if self.fenced:
            return []
        if tp in self._pending or tp in self._reading:
            self._dirty.add(tp)
            return []
        current = self.states.get(tp)
        target = self.decide(tp)
        if target is None:
            return []
        self._pending[tp] = target
        expected = None if current is None else current.zk_version
        return [WriteStateZnode(tp, target, expected_version=expected)]

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
