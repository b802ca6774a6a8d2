"""Hypothesis state machines over :class:`SimCluster`: random faults, checked invariants.

:class:`ClusterMachine` drives a 3-broker cluster (acks=all and acks=1 produces, message
delivery in any order, message loss, time passing, crashes with or without losing unflushed
data, ZooKeeper session expiry, restarts, flushes) and after every step checks:

1. log start <= HW <= LEO on every live replica;
2. a leader's HW never decreases while it leads in one epoch;
3. every acks=all record is, at its acked offset, in the log of the current leader and of every
   live replica whose HW has passed it;
4. the committed prefixes of any two live replicas (below the smaller HW) are identical;
5. log start <= LSO <= HW on every live replica (where log start <= HW), and the LSO is at or
   below the first offset of every transaction its log holds without a marker (what a
   read_committed consumer reads is never part of an open transaction).
   :class:`TransactionalClusterMachine` also produces transactional data and markers of two
   producers (``TxnValue`` records).

Fault budget (Kafka's own durability assumptions, since it does not fsync per write): a crash
that loses unflushed data may only hit a broker while every other broker is up and, if the
broker is in the ISR, while the ISR still has at least ``min.insync.replicas`` members; after
such a crash no other broker may crash until the damaged one is back in the ISR. Clean crashes
are otherwise unrestricted.

Subclasses flip one historic switch each; with it the same checks must fail.
:class:`LastReplicaStandingMachine` widens the budget the way KIP-966 allows (the last ISR
member may lose its tail while another eligible replica is up); without eligible leader
replicas (:class:`NoEligibleLeaderReplicasMachine`) the same budget loses acked records.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from isrlab.broker.replication import ACKS_ALL, Partition, ReplicationConfig, TruncationMode
from tests.replication.cluster_sim import SimCluster

BROKERS = (0, 1, 2)
# Fault kinds that a run may switch off as a whole ("swarm testing", Groce et al. 2012):
# histories without, say, message loss reach deep failover sequences far more often.
FEATURES = ("drop", "reorder", "flush", "lossy", "acks1", "pause", "expire", "isolate", "zk")


def config(**overrides: object) -> ReplicationConfig:
    """Short timeouts so that interesting things happen within a few dozen steps."""
    base: dict[str, object] = {
        "min_insync_replicas": 2,
        "replica_lag_time_max_ms": 10_000,
        "replica_fetch_wait_max_ms": 500,
        "replica_fetch_backoff_ms": 1_000,
        "replica_socket_timeout_ms": 3_000,
    }
    base.update(overrides)
    return ReplicationConfig(**base)  # type: ignore[arg-type]


class ClusterMachine(RuleBasedStateMachine):
    """Safe settings: leader-epoch truncation, clean elections, min.insync.replicas=2."""

    CONFIG = config()
    UNCLEAN = False
    PARTITION: type[Partition] = Partition

    runs = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.c = SimCluster(
            3, self.CONFIG, self.UNCLEAN, produce_timeout_ms=20_000, partition_class=self.PARTITION
        )
        self.c.settle()
        self.tainted: set[int] = set()
        self.leader_hw: dict[tuple[int, int, int], int] = {}
        self.disabled: frozenset[str] = frozenset()

    @initialize(disabled=st.frozensets(st.sampled_from(FEATURES)))
    def choose_faults(self, disabled: frozenset[str]) -> None:
        self.disabled = disabled

    def _on(self, feature: str) -> bool:
        return feature not in self.disabled

    # ------------------------------------------------------------------ budget
    def _may_crash(self, b: int, lossy: bool) -> bool:
        if not self.c.alive[b] or self.tainted - {b}:
            return False
        if not lossy:
            return True
        if not all(self.c.alive[o] for o in BROKERS if o != b):
            return False
        isr = self.c.zk_state.isr if self.c.zk_state else ()
        return b not in isr or len(isr) >= self.CONFIG.min_insync_replicas

    # ------------------------------------------------------------------ rules
    @rule(acks=st.sampled_from([ACKS_ALL, ACKS_ALL, 1]))
    def produce(self, acks: int) -> None:
        self.c.produce(acks=acks if self._on("acks1") else ACKS_ALL)

    @precondition(lambda self: bool(self.c.network))
    @rule(i=st.integers(0, 31), n=st.sampled_from([1, 1, 2, 4, 8, 20]))
    def deliver(self, i: int, n: int) -> None:
        """Deliver one message picked anywhere (reordering), then the n-1 oldest."""
        self.c.deliver(i % len(self.c.network) if self._on("reorder") else 0)
        self.c.deliver_all(max_messages=n - 1)

    @precondition(lambda self: self._on("drop") and any(m.droppable for m in self.c.network))
    @rule(i=st.integers(0, 31))
    def drop(self, i: int) -> None:
        droppable = [k for k, m in enumerate(self.c.network) if m.droppable]
        self.c.drop(droppable[i % len(droppable)])

    @precondition(lambda self: self._on("isolate"))
    @rule(victim=st.sampled_from(["leader", "follower", *BROKERS]))
    def isolate(self, victim: int | str) -> None:
        b = self._target(victim)
        if b is not None:
            self.c.isolate(b)

    @precondition(lambda self: bool(self.c.isolated))
    @rule()
    def heal(self) -> None:
        self.c.heal()

    @precondition(lambda self: self._on("zk"))
    @rule(victim=st.sampled_from(["leader", *BROKERS]))
    def session_expiry(self, victim: int | str) -> None:
        b = self._target(victim)
        if b is not None and self.c.alive[b] and b in self.c.registered:
            self.c.session_expiry(b)

    @rule(ms=st.sampled_from([100, 600, 3_000, 11_000]))
    def advance(self, ms: int) -> None:
        self.c.advance(ms if self._on("pause") else min(ms, 3_000))

    def _target(self, target: int | str) -> int | None:
        # Nemeses like Jepsen's aim at roles as well as at fixed nodes.
        if isinstance(target, int):
            return target
        leader = self.c.zk_state.leader if self.c.zk_state else -1
        if target == "leader":
            return leader if leader >= 0 else None
        followers = [b for b in BROKERS if b != leader and self.c.alive[b]]
        return followers[0] if followers else None

    @rule(
        victim=st.sampled_from(["leader", "leader", "follower", *BROKERS]),
        lossy=st.booleans(),
        detected=st.booleans(),
    )
    def crash(self, victim: int | str, lossy: bool, detected: bool) -> None:
        """Kill a broker; ``detected``: its ZooKeeper session expires right away."""
        b = self._target(victim)
        lossy = lossy and self._on("lossy")
        detected = detected or not self._on("expire")
        if b is None or not self._may_crash(b, lossy):
            return
        self.c.crash(b, lose_unflushed=lossy)
        if lossy:
            self.tainted.add(b)
        if detected:
            self.c.expire(b)

    @precondition(lambda self: self._on("expire"))
    @rule(i=st.integers(0, 2))
    def expire(self, i: int) -> None:
        pending = [b for b in BROKERS if not self.c.alive[b] and b in self.c.registered]
        if pending:
            self.c.expire(pending[i % len(pending)])

    @rule(i=st.integers(0, 2))
    def restart(self, i: int) -> None:
        dead = [b for b in BROKERS if not self.c.alive[b]]
        if dead:
            self.c.restart(dead[i % len(dead)])

    @precondition(lambda self: self._on("flush"))
    @rule(b=st.sampled_from(BROKERS))
    def flush(self, b: int) -> None:
        self.c.flush(b)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def check(self) -> None:
        try:
            self._check()
        except AssertionError as exc:
            # The cluster's own event trace explains a counterexample far better than the
            # rule list alone.
            trace = "\n  ".join(self.c.trace[-80:])
            raise AssertionError(f"{exc}\nlast events:\n  {trace}") from None

    @invariant()
    def a_waiting_fetch_wakes_exactly_when_it_has_an_answer(self) -> None:
        """``fetch_has_answer`` (what wakes a fetch waiting for data in the broker's shell)
        holds exactly when a consumer's ``on_fetch`` would answer with an error or records,
        at offsets around the log's bounds and epochs around the current one (followers:
        tests/replication/test_partition.py)."""
        for b in BROKERS:
            if not self.c.alive[b]:
                continue
            p, log = self.c.partitions[b], self.c.logs[b]
            offsets = {log.log_start_offset - 1, log.log_start_offset, p.high_watermark}
            offsets |= {p.last_stable_offset, log.log_end_offset - 1, log.log_end_offset}
            offsets.add(log.log_end_offset + 1)
            epochs = (-1, p.leader_epoch - 1, p.leader_epoch, p.leader_epoch + 1)
            for offset in sorted(offsets):
                for epoch in epochs:
                    for committed in (False, True):
                        answer = p.on_consumer_fetch(offset, epoch, read_committed=committed)
                        expected = answer.error != 0 or answer.records_end > offset
                        got = p.fetch_has_answer(-1, offset, epoch, committed)
                        assert got == expected, (
                            f"broker {b}: consumer fetch at {offset} epoch {epoch} "
                            f"committed={committed}: fetch_has_answer {got}, on_fetch {answer}"
                        )

    def _check(self) -> None:
        c = self.c
        isr = c.zk_state.isr if c.zk_state else ()
        self.tainted = {t for t in self.tainted if not (c.alive[t] and t in isr)}
        live = [b for b in BROKERS if c.alive[b]]
        for b in live:
            p, log = c.partitions[b], c.logs[b]
            assert log.log_start_offset <= p.high_watermark <= log.log_end_offset, (
                f"broker {b}: log start {log.log_start_offset}, HW {p.high_watermark}, "
                f"LEO {log.log_end_offset}"
            )
            if p.is_leader:
                key = (b, p.leader_epoch, id(p))
                previous = self.leader_hw.get(key, p.high_watermark)
                assert p.high_watermark >= previous, (
                    f"leader {b} epoch {p.leader_epoch}: HW went from {previous} to "
                    f"{p.high_watermark}"
                )
                self.leader_hw[key] = p.high_watermark
        leader = c.leader()
        for value, offset in c.acked.items():
            if leader is not None:
                record = c.logs[leader].record_at(offset)
                assert record is not None and record[0] == value, (
                    f"acked value {value} at offset {offset} is missing on leader {leader} "
                    f"(has {record}); log {c.values(leader)}"
                )
            for b in live:
                if c.partitions[b].high_watermark > offset:
                    record = c.logs[b].record_at(offset)
                    assert record is not None and record[0] == value, (
                        f"acked value {value} at offset {offset}: broker {b} has {record} "
                        f"below its HW {c.partitions[b].high_watermark}"
                    )
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                hw = min(c.partitions[a].high_watermark, c.partitions[b].high_watermark)
                assert c.logs[a].read(0, hw) == c.logs[b].read(0, hw), (
                    f"brokers {a} and {b} diverge below HW {hw}: "
                    f"{c.logs[a].read(0, hw)} vs {c.logs[b].read(0, hw)}"
                )
        for b in live:
            p, log = c.partitions[b], c.logs[b]
            lso, hw, start = p.last_stable_offset, p.high_watermark, log.log_start_offset
            assert lso <= hw and (hw < start or start <= lso), (
                f"broker {b}: LSO {lso} outside [log start {start}, HW {hw}]"
            )
            for pid, first in log.open_transactions().items():
                assert lso <= first, (
                    f"broker {b}: LSO {lso} is past offset {first}, where producer {pid}'s "
                    f"open transaction starts (HW {hw}); log {c.values(b)}"
                )


def squeeze_isr_to_the_leader(c: SimCluster) -> None:
    """Cut the leader off from its followers until it shrinks the ISR to itself."""
    leader = c.leader()
    if leader is None:
        return
    for b in BROKERS:
        if b != leader:
            c.isolate(b)
    c.produce(acks=1)  # followers at the leader's end would count as caught up
    c.advance(11_000)
    c.deliver_all()


class HighWatermarkTruncationMachine(ClusterMachine):
    """Pre-KIP-101: followers truncate to their own, possibly stale, high watermark."""

    CONFIG = config(truncation_mode=TruncationMode.HIGH_WATERMARK)


class UncleanElectionMachine(ClusterMachine):
    """unclean.leader.election.enable=true: out-of-sync replicas may be elected. Without eligible
    leader replicas, as Kafka had it before KIP-966: with them an unclean election happens
    only once no eligible replica is alive either, and a counterexample takes minutes to find
    (test_scenarios.py::test_unclean_election_* runs with them)."""

    CONFIG = config(eligible_leader_replicas_enable=False)
    UNCLEAN = True


class IsrOfOneMachine(ClusterMachine):
    """min.insync.replicas=1 with acks=all: the ISR may shrink to the leader alone."""

    CONFIG = config(min_insync_replicas=1)

    @rule()
    def squeeze_isr_to_the_leader(self) -> None:
        """Steering: the leader alone in the ISR then acknowledges acks=all produces by
        itself. Without it the derandomized run needed anything from 20 to over 1,500
        histories depending on the draws (Hypothesis version, other rules' literals)."""
        squeeze_isr_to_the_leader(self.c)


class TransactionalClusterMachine(ClusterMachine):
    """The safe settings with transactions: data and markers of producers 1 and 2 too."""

    @rule(
        pid=st.sampled_from([1, 2]),
        kind=st.sampled_from([None, None, "commit", "abort"]),
        acks=st.sampled_from([ACKS_ALL, 1]),
    )
    def produce_txn(self, pid: int, kind: str | None, acks: int) -> None:
        self.c.produce(acks=acks if self._on("acks1") else ACKS_ALL, txn=(pid, kind))


class _LsoIsHighWatermark(Partition):
    """A core that forgets the transaction bound of the LSO (read_committed = read_uncommitted)."""

    @property
    def last_stable_offset(self) -> int:
        return self.high_watermark


class LsoIgnoresTransactionsMachine(TransactionalClusterMachine):
    """The LSO rule removed: the invariant must catch an open transaction below it."""

    PARTITION = _LsoIsHighWatermark


class LastReplicaStandingMachine(ClusterMachine):
    """KIP-966's budget: brokers may also stop cleanly (flushed, registering next time after a
    clean shutdown), and a lossy crash may also hit the leader of an ISR below
    min.insync.replicas (the "last replica standing") while another eligible leader replica
    is intact: alive, or stopped cleanly. Eligible leader replicas must then keep every
    acked record, whether the damaged replica comes back before the intact one or after."""

    def _may_crash(self, b: int, lossy: bool) -> bool:
        if super()._may_crash(b, lossy):
            return True
        if not lossy or not self.c.alive[b] or self.tainted - {b}:
            return False
        return self._another_eligible_replica_is_intact(b)

    def _another_eligible_replica_is_intact(self, b: int) -> bool:
        st = self.c.zk_state
        return st is not None and any(e != b and e not in self.c.crashed for e in st.elr)

    @rule(victim=st.sampled_from(["follower", *BROKERS]))
    def shutdown(self, victim: int | str) -> None:
        """A clean stop (no data lost; the controller hears of it at once)."""
        b = self._target(victim)
        if b is not None and self.c.alive[b] and not self.tainted - {b}:
            self.c.shutdown(b)

    @rule()
    def produce_while_in_sync(self) -> None:
        """An acks=all produce while the network delivers in order until quiet: acked
        whenever the ISR can take it. KIP-966's scenario starts from acknowledged records
        that the squeezed leader then holds alone; random produces and deliveries rarely
        get one acknowledged before the next squeeze (a few dozen histories in a thousand
        did), which left the ELR-less twin's loss to luck."""
        self.c.produce(acks=ACKS_ALL)
        self.c.deliver_all()

    @rule()
    def squeeze_isr_to_the_leader(self) -> None:
        """Cut the leader off from its followers until it shrinks the ISR to itself."""
        squeeze_isr_to_the_leader(self.c)

    @precondition(lambda self: self._on("lossy"))
    @rule(detected=st.booleans())
    def lose_the_last_replica_standing(self, detected: bool) -> None:
        """The sole ISR member loses its unflushed tail (KIP-966's scenario)."""
        state = self.c.zk_state
        if state is None or state.isr != (state.leader,) or not self._may_crash(state.leader, True):
            return
        self.c.crash(state.leader, lose_unflushed=True)
        self.tainted.add(state.leader)
        if detected or not self._on("expire"):
            self.c.expire(state.leader)


class NoEligibleLeaderReplicasMachine(LastReplicaStandingMachine):
    """eligible.leader.replicas.enable=false under the same budget (no ELR is recorded, so
    any lossy crash of the last ISR member is allowed): the last replica standing is elected
    again whatever it lost."""

    CONFIG = config(eligible_leader_replicas_enable=False)

    def _another_eligible_replica_is_intact(self, b: int) -> bool:
        return True
