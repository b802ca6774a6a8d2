"""KIP-966 on the sans-IO cores: strict min ISR, eligible leader replicas (ELR), election
order, the clean-shutdown rule and the ``eligible.leader.replicas.enable`` switch."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from isrlab.broker.controller import Controller
from isrlab.broker.controller.controller import ControllerAction
from isrlab.broker.replication import (
    ACKS_ALL,
    LeaderAndIsr,
    MemoryLog,
    Partition,
    ReplicationConfig,
    TopicPartition,
    WriteStateZnode,
)
from isrlab.broker.replication.state import next_elr
from tests.replication.cluster_sim import SimCluster

TP = TopicPartition("t", 0)
A, B, C = 0, 1, 2


# ---------------------------------------------------------------- the ELR rule
replica_sets = st.lists(st.integers(0, 5), unique=True, max_size=6).map(tuple)


@given(replica_sets, replica_sets, replica_sets, st.integers(1, 4), replica_sets)
def test_next_elr_keeps_exactly_the_isr_leavers_while_below_min_isr(
    old_isr: tuple[int, ...],
    old_elr: tuple[int, ...],
    new_isr: tuple[int, ...],
    min_isr: int,
    unclean: tuple[int, ...],
) -> None:
    elr = next_elr(old_isr, old_elr, new_isr, min_isr, unclean)
    assert len(set(elr)) == len(elr)
    if len(new_isr) >= min_isr:
        assert elr == ()  # the HW may advance again: nobody outside the ISR is safe
        return
    expected = (set(old_isr) | set(old_elr)) - set(new_isr) - set(unclean)
    assert set(elr) == expected


def test_state_znode_carries_elr_only_when_there_is_one() -> None:
    plain = LeaderAndIsr(1, 4, (1,), 2, zk_version=3)
    assert "eligible_leader_replicas" not in orjson.loads(plain.to_json())
    with_elr = LeaderAndIsr(-1, 5, (), 2, zk_version=3, elr=(2, 3), last_known_elr=(1,))
    obj = orjson.loads(with_elr.to_json())
    assert obj["eligible_leader_replicas"] == [2, 3] and obj["last_known_elr"] == [1]
    assert LeaderAndIsr.from_json(with_elr.to_json(), 3) == with_elr
    assert LeaderAndIsr.from_json(plain.to_json(), 3) == plain


# ---------------------------------------------------------------- leader: ISR changes
def leader(
    isr: tuple[int, ...] = (A, B, C), min_isr: int = 2, elr: bool = True, state_elr=()
) -> Partition:
    p = Partition(
        TP,
        A,
        MemoryLog(),
        ReplicationConfig(
            min_insync_replicas=min_isr,
            replica_lag_time_max_ms=1_000,
            eligible_leader_replicas_enable=elr,
        ),
    )
    p.become_leader(LeaderAndIsr(A, 0, isr, 1, zk_version=0, elr=state_elr), (A, B, C), now=0)
    return p


def shrink(p: Partition, now: int, keep_fetching: tuple[int, ...] = ()) -> WriteStateZnode:
    p.on_produce(900 + now, ["x"], 1, 30_000, now)
    for r in keep_fetching:
        p.on_follower_fetch(r, p.log_end_offset, 0, now=now)
    (write,) = [a for a in p.tick(now + 1_001) if isinstance(a, WriteStateZnode)]
    p.on_isr_update_result(True, write.state.zk_version + 1, now + 1_001)
    return write


def test_leader_records_replicas_dropped_below_min_isr_as_eligible() -> None:
    p = leader()
    first = shrink(p, 10, keep_fetching=(B,))  # C lags: ISR (A, B) is still min ISR
    assert first.state.isr == (A, B) and first.state.elr == ()
    second = shrink(p, 5_000)  # B lags too: below min ISR, B keeps everything below the HW
    assert second.state.isr == (A,) and second.state.elr == (B,)
    assert p.elr == (B,)


def test_leader_drops_both_followers_at_once_into_the_elr() -> None:
    p = leader()
    write = shrink(p, 10)
    assert write.state.isr == (A,) and set(write.state.elr) == {B, C}


def test_leader_expansion_back_to_min_isr_clears_the_elr() -> None:
    p = leader(isr=(A,), state_elr=(B, C))
    p.on_produce(1, ["x"], 1, 30_000, 0)
    (write,) = [a for a in p.on_follower_fetch(C, 1, 0, now=5) if isinstance(a, WriteStateZnode)]
    assert write.state.isr == (A, C) and write.state.elr == ()


def test_leader_expansion_below_min_isr_takes_the_member_out_of_the_elr() -> None:
    p = leader(isr=(A,), min_isr=3, state_elr=(B, C))
    p.on_produce(1, ["x"], 1, 30_000, 0)
    (write,) = [a for a in p.on_follower_fetch(C, 1, 0, now=5) if isinstance(a, WriteStateZnode)]
    assert write.state.isr == (A, C) and write.state.elr == (B,)


def test_switch_off_leader_writes_no_elr() -> None:
    p = leader(elr=False)
    write = shrink(p, 10)
    assert write.state.isr == (A,) and write.state.elr == ()


# ---------------------------------------------------------------- strict min ISR
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["produce1", "produceall", "fetch", "tick"]), st.integers(0, 3)),
        max_size=40,
    )
)
def test_hw_never_advances_while_the_isr_is_below_min_isr(ops: list[tuple[str, int]]) -> None:
    """Whatever the leader is asked (acks=1 and acks=all produces, follower fetches from any
    offset, ISR shrinks and expansions as time passes), while |ISR| < min.insync.replicas its
    HW stays where it was when the ISR fell below it."""
    p = leader(isr=(A, B), min_isr=2)
    now = 0
    frozen_at: int | None = None
    for kind, n in ops:
        now += 300
        if kind == "produce1":
            p.on_produce(now, [f"v{i}" for i in range(n + 1)], 1, 30_000, now)
        elif kind == "produceall":
            p.on_produce(now, ["w"], ACKS_ALL, 30_000, now)
        elif kind == "fetch":
            follower = B if n % 2 else C
            actions = p.on_follower_fetch(follower, max(0, p.log_end_offset - n), 0, now=now)
            for a in actions:
                if isinstance(a, WriteStateZnode):  # an expansion
                    p.on_isr_update_result(True, a.state.zk_version + 1, now)
        else:
            now += 1_000 * n
            for a in p.tick(now):
                if isinstance(a, WriteStateZnode):  # a shrink
                    p.on_isr_update_result(True, a.state.zk_version + 1, now)
        if len(p.isr) >= 2:
            frozen_at = None
            continue
        if frozen_at is None:
            frozen_at = p.high_watermark
        assert p.high_watermark == frozen_at, (p.isr, p.log_end_offset)


def test_acks_1_writes_stay_invisible_while_the_isr_is_below_min_isr() -> None:
    p = leader(isr=(A,), min_isr=2)
    p.on_produce(1, ["a", "b"], 1, 30_000, 0)
    p.on_follower_fetch(B, 2, 0, now=1)  # a follower has them, but is not in the ISR yet
    assert p.log_end_offset == 2 and p.high_watermark == 0
    assert p.on_consumer_fetch(0).records_end == 0


# ---------------------------------------------------------------- controller: elections
def controller(state: LeaderAndIsr, live: tuple[int, ...], elr: bool = True) -> Controller:
    c = Controller(3, eligible_leader_replicas=elr, min_insync_replicas=2)
    c.load({TP: (A, B, C)}, {TP: state}, live)
    return c


def commit(c: Controller, actions: list[ControllerAction]) -> LeaderAndIsr:
    (write,) = [a for a in actions if isinstance(a, WriteStateZnode)]
    c.on_write_result(TP, True, write.state.zk_version + 1)
    return c.states[TP]


def test_dead_last_isr_member_moves_to_the_elr_and_the_partition_waits() -> None:
    c = controller(LeaderAndIsr(A, 3, (A,), 1, zk_version=4, elr=(B,)), live=(A,))
    state = commit(c, c.on_broker_change([]))
    assert (state.leader, state.isr, state.elr, state.last_known_elr) == (-1, (), (B, A), (A,))
    assert state.leader_epoch == 4


def test_election_prefers_the_isr_then_the_elr_in_assignment_order() -> None:
    c = controller(LeaderAndIsr(A, 3, (A, C), 1, zk_version=4), live=(A, B, C))
    state = commit(c, c.on_broker_change([B, C]))
    assert (state.leader, state.isr) == (C, (C,))  # the live ISR member, not B
    assert state.elr == (A,)  # A left an ISR that fell below min ISR
    c = controller(LeaderAndIsr(-1, 3, (), 1, zk_version=4, elr=(C, B)), live=())
    state = commit(c, c.on_broker_change([B, C]))
    assert (state.leader, state.isr, state.elr) == (B, (B,), (C,))  # assignment order


def test_clean_restart_keeps_eligibility_unclean_restart_loses_it() -> None:
    offline = LeaderAndIsr(-1, 4, (), 1, zk_version=5, elr=(B, A), last_known_elr=(A,))
    c = controller(offline, live=())
    state = commit(c, c.on_broker_change([A]))  # A restarted cleanly: eligible
    assert (state.leader, state.isr, state.elr) == (A, (A,), (B,))
    assert state.last_known_elr == ()
    c = controller(offline, live=())
    state = commit(c, c.on_broker_change([A], unclean_shutdown=[A]))
    # A may have lost its tail and B, eligible, may come back: stay offline, no epoch bump
    assert (state.leader, state.isr, state.elr, state.leader_epoch) == (-1, (), (B,), 4)
    assert state.last_known_elr == (A,)
    state = commit(c, c.on_broker_change([A, B]))
    assert (state.leader, state.isr, state.elr) == (B, (B,), ())


def test_last_known_leader_is_elected_only_when_nobody_eligible_is_left() -> None:
    c = controller(LeaderAndIsr(-1, 4, (), 1, zk_version=5, elr=(A,), last_known_elr=(A,)), ())
    # B is not eligible: it is only told the (offline) state
    assert [a for a in c.on_broker_change([B]) if isinstance(a, WriteStateZnode)] == []
    state = commit(c, c.on_broker_change([A, B], unclean_shutdown=[A]))
    assert (state.leader, state.isr, state.elr) == (A, (A,), ())


def test_unclean_restart_of_an_isr_member_nobody_saw_die_removes_it() -> None:
    # A restarted inside its ZooKeeper session: the shell sees a new registration.
    c = controller(LeaderAndIsr(A, 3, (A, B), 1, zk_version=4), live=(A, B, C))
    state = commit(c, c.on_broker_change([A, B, C], unclean_shutdown=[A]))
    assert (state.leader, state.isr, state.elr) == (B, (B,), ())


def test_unclean_restart_of_an_elr_member_under_a_live_leader_needs_no_epoch_bump() -> None:
    c = controller(LeaderAndIsr(A, 3, (A,), 1, zk_version=4, elr=(B, C)), live=(A, C))
    state = commit(c, c.on_broker_change([A, B, C], unclean_shutdown=[B]))
    assert (state.leader, state.isr, state.elr, state.leader_epoch) == (A, (A,), (C,), 3)


def test_failover_applies_unclean_registrations_newer_than_the_state() -> None:
    c = Controller(3, eligible_leader_replicas=True, min_insync_replicas=2)
    offline = LeaderAndIsr(-1, 4, (), 1, zk_version=5, elr=(A, B), last_known_elr=(A,))
    (write,) = [a for a in c.load({TP: (A, B, C)}, {TP: offline}, [A], {TP: [A]})]
    assert isinstance(write, WriteStateZnode)
    assert (write.state.leader, write.state.elr) == (-1, (B,))


def test_switch_off_reelects_the_last_isr_member_whatever_it_lost() -> None:
    c = controller(LeaderAndIsr(A, 3, (A,), 1, zk_version=4), live=(A,), elr=False)
    state = commit(c, c.on_broker_change([]))
    assert (state.leader, state.isr, state.elr) == (-1, (A,), ())
    state = commit(c, c.on_broker_change([A], unclean_shutdown=[A]))
    assert (state.leader, state.isr) == (A, (A,))


# ---------------------------------------------------------------- the whole scenario
def last_replica_standing(elr: bool) -> tuple[SimCluster, int]:
    """KIP-966's scenario: RF 3, min ISR 2, acks=all. The followers stop cleanly, so the ISR
    is the leader alone; the leader loses its unflushed tail (power loss) and comes back
    first; then the followers come back."""
    c = SimCluster(3, ReplicationConfig(min_insync_replicas=2, eligible_leader_replicas_enable=elr))
    c.settle()
    value = c.produce(acks=ACKS_ALL)
    c.settle()
    assert value in c.acked
    c.shutdown(B)
    c.shutdown(C)
    assert c.zk_state is not None and c.zk_state.isr == (A,)
    c.crash(A, lose_unflushed=True)
    c.expire(A)
    c.restart(A)
    c.settle()
    return c, value


def test_last_replica_standing_without_elr_loses_acked_records() -> None:
    c, value = last_replica_standing(elr=False)
    assert c.leader() == A and value not in c.values(A)  # A leads with what it kept
    c.restart(B)
    c.restart(C)
    c.advance(30_000)
    c.settle()
    assert all(value not in c.values(b) for b in (A, B, C))  # the followers truncated to A


def test_last_replica_standing_with_elr_waits_for_an_eligible_replica() -> None:
    c, value = last_replica_standing(elr=True)
    assert c.leader() is None and c.zk_state is not None
    assert (c.zk_state.isr, c.zk_state.elr) == ((), (C,))  # A lost eligibility; B never had it
    c.restart(B)
    c.settle()
    assert c.leader() is None  # B left while the ISR was still at min ISR
    c.restart(C)
    c.settle()
    assert c.leader() == C
    c.advance(30_000)
    c.settle()
    assert all(value in c.values(b) for b in (A, B, C))
