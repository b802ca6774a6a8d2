"""Scripted replays of the published replication failures, on the real cores.

Each scenario runs twice: with the historic setting it must lose or diverge data exactly as
published; with Kafka's current behaviour the same steps must keep everything.
"""

from __future__ import annotations

from isrlab.broker.replication import ACKS_ALL, ErrorCode, ReplicationConfig, TruncationMode
from tests.replication.cluster_sim import SimCluster

A, B, C = 0, 1, 2


def cfg(
    mode: TruncationMode = TruncationMode.LEADER_EPOCH, min_isr: int = 1, elr: bool = True
) -> ReplicationConfig:
    return ReplicationConfig(
        min_insync_replicas=min_isr, truncation_mode=mode, eligible_leader_replicas_enable=elr
    )


def committed_value(c: SimCluster, acks: int = ACKS_ALL) -> int:
    value = c.produce(acks=acks)
    assert value is not None
    c.settle()
    return value


# ---------------------------------------------------------------- KIP-101 scenario 1
def kip101_scenario_1(mode: TruncationMode) -> SimCluster:
    """The follower restarts, truncates to its stale HW, then becomes leader."""
    c = SimCluster(2, cfg(mode))
    c.settle()
    committed_value(c)  # m1 everywhere, HWs 1
    m2 = c.produce(acks=ACKS_ALL)
    c.deliver_where("fetch_response", A, B)  # B appends m2; its HW is still 1
    c.deliver_where("fetch", B, A)  # fetching offset 2 acknowledges m2: leader HW 2
    assert m2 in c.acked and c.partitions[B].high_watermark == 1
    c.crash(B)
    c.restart(B, noticed=False)  # B restarts inside its ZooKeeper session, still in the ISR
    c.deliver_where("leader_and_isr", dst=B)
    c.crash(A)  # before B fetches again
    c.expire(A)
    c.settle()
    assert c.leader() == B
    return c


def test_kip101_scenario_1_high_watermark_truncation_loses_acked_record() -> None:
    c = kip101_scenario_1(TruncationMode.HIGH_WATERMARK)
    assert c.values(B) == [0]  # m2 (value 1) was acked and is gone
    assert 1 in c.acked


def test_kip101_scenario_1_leader_epoch_truncation_keeps_it() -> None:
    c = kip101_scenario_1(TruncationMode.LEADER_EPOCH)
    assert c.values(B) == [0, 1]


# ---------------------------------------------------------------- KIP-101 scenario 2
def kip101_scenario_2(mode: TruncationMode) -> SimCluster:
    """Both replicas crash; the one that lost unflushed data leads and overwrites."""
    c = SimCluster(2, cfg(mode))
    c.settle()
    committed_value(c)  # m1
    c.flush(A)
    c.flush(B)
    committed_value(c, acks=1)  # m2 at offset 1, replicated, HW 2 on both
    assert c.partitions[B].high_watermark == 2
    c.crash(A)
    c.crash(B, lose_unflushed=True)  # B loses m2
    c.expire(A)  # the controller still thinks B is up and elects it
    c.expire(B)  # then B is gone too: offline; B is the last leader (KIP-966: ISR empty)
    st = c.zk_state
    assert st is not None and st.leader == -1 and st.isr == () and st.last_known_elr == (B,)
    c.restart(B)  # after an unclean shutdown, but nobody else is eligible: B leads again
    c.settle()
    assert c.leader() == B
    c.produce(acks=1)  # m3 lands at offset 1
    c.restart(A)
    c.settle()
    committed_value(c)  # m4 moves the HW past offset 1 on both
    return c


def test_kip101_scenario_2_high_watermark_truncation_diverges() -> None:
    c = kip101_scenario_2(TruncationMode.HIGH_WATERMARK)
    hw = min(c.partitions[A].high_watermark, c.partitions[B].high_watermark)
    assert hw >= 2
    assert c.values(A)[:2] == [0, 1] and c.values(B)[:2] == [0, 2]  # silent divergence


def test_kip101_scenario_2_leader_epoch_truncation_converges() -> None:
    c = kip101_scenario_2(TruncationMode.LEADER_EPOCH)
    assert c.values(A) == c.values(B) == [0, 2, 3]


# ---------------------------------------------------------------- KIP-279
def kip279_scenario(mode: TruncationMode) -> SimCluster:
    """Two fast leader changes leave a follower with an epoch the new leader never saw."""
    c = SimCluster(3, cfg(mode))
    c.settle()
    committed_value(c)  # m1 (value 0) everywhere
    c.produce(broker=A, acks=1)  # m2 (value 1) at offset 1, epoch 0
    c.deliver_where("fetch_response", A, C)  # C gets m2, B does not
    c.crash(A)
    c.expire(A)  # B (first live ISR member) leads epoch 1
    c.deliver_where("leader_and_isr", dst=B)
    c.produce(broker=B, acks=1)  # m3 (value 2) at offset 1, epoch 1
    c.deliver_where("leader_and_isr", dst=C)  # C starts truncating against B ...
    c.crash(B)  # ... but B dies before answering
    c.expire(B)  # C leads epoch 2 with [m1, m2]
    c.deliver_where("leader_and_isr", dst=C)
    assert c.leader() == C
    c.produce(broker=C, acks=1)  # m4 (value 3) at offset 2, epoch 2
    c.restart(B)  # B holds [m1, m3(epoch 1)] and follows C
    c.settle()
    committed_value(c)  # m5 moves the HW on both
    return c


def test_kip279_leader_epoch_v0_diverges_after_fast_leader_changes() -> None:
    c = kip279_scenario(TruncationMode.LEADER_EPOCH_V0)
    hw = min(c.partitions[B].high_watermark, c.partitions[C].high_watermark)
    assert hw >= 3
    assert c.values(C)[:3] == [0, 1, 3]
    assert c.values(B)[:3] == [0, 2, 3]  # offset 1 differs below the HW


def test_kip279_truncation_asks_again_and_converges() -> None:
    c = kip279_scenario(TruncationMode.LEADER_EPOCH)
    assert c.values(B) == c.values(C) == [0, 1, 3, 4]
    assert c.logs[B].epoch_entries == c.logs[C].epoch_entries


# ---------------------------------------------------------------- ISR of one
def isr_of_one_scenario(min_isr: int) -> tuple[SimCluster, int]:
    c = SimCluster(3, cfg(min_isr=min_isr))
    c.settle()
    c.crash(B)
    c.crash(C)
    c.expire(B)
    c.expire(C)
    assert c.zk_state is not None and c.zk_state.isr == (A,)
    c.settle()
    value = c.produce(acks=ACKS_ALL)
    assert value is not None
    c.restart(B)
    c.restart(C)
    c.crash(A, lose_unflushed=True)  # before anyone fetched the record
    c.restart(A)
    c.settle()
    return c, value


def test_isr_of_one_with_min_insync_1_acks_then_loses_the_record() -> None:
    c, value = isr_of_one_scenario(min_isr=1)
    assert value in c.acked
    assert c.leader() == A and value not in c.values(A)


def test_isr_of_one_with_min_insync_2_refuses_the_write() -> None:
    c, value = isr_of_one_scenario(min_isr=2)
    assert value not in c.acked
    assert c.produce_errors[value] is ErrorCode.NOT_ENOUGH_REPLICAS


# ---------------------------------------------------------------- unclean election
def unclean_scenario(unclean: bool, elr: bool = True) -> tuple[SimCluster, int]:
    c = SimCluster(3, cfg(min_isr=2, elr=elr), unclean_leader_election=unclean)
    c.settle()
    c.crash(C)
    c.expire(C)
    value = committed_value(c)  # on A and B
    assert value in c.acked
    c.crash(A)
    c.crash(B)
    c.expire(A)
    c.expire(B)
    c.restart(C)  # out of sync, and the only broker up
    c.settle()
    return c, value


def test_unclean_election_elects_out_of_sync_replica_and_loses_acked_record() -> None:
    c, value = unclean_scenario(unclean=True)
    assert c.leader() == C and value not in c.values(C)


def test_clean_election_waits_for_an_isr_member_without_elr() -> None:
    c, value = unclean_scenario(unclean=False, elr=False)
    assert c.leader() is None and c.zk_state is not None and c.zk_state.leader == -1
    c.restart(B)
    c.settle()
    assert c.leader() == B and value in c.values(B)
    c.settle()
    assert c.values(C) == c.values(B)  # C truncated nothing committed and caught up


def test_clean_election_waits_for_an_eligible_replica() -> None:
    c, value = unclean_scenario(unclean=False)
    st = c.zk_state
    assert c.leader() is None and st is not None and st.leader == -1
    assert (st.isr, st.elr, st.last_known_elr) == ((), (A, B), (B,))
    c.restart(B)  # crashed: an unclean shutdown, so not eligible while A may return
    c.settle()
    assert c.leader() is None and c.zk_state is not None and c.zk_state.elr == (A,)
    c.restart(A)  # crashed too: nobody eligible is left, the last leader (B) is elected
    c.settle()
    assert c.leader() == B and value in c.values(B)
    c.settle()
    assert c.values(C) == c.values(B) == c.values(A)


# ---------------------------------------------------------------- acks=1 failover
def test_acks_1_record_not_yet_replicated_is_truncated_after_failover() -> None:
    c = SimCluster(3, cfg())
    c.settle()
    committed_value(c)
    value = c.produce(acks=1)
    assert value in c.acked_acks1
    c.crash(A)  # before any follower fetched it
    c.expire(A)
    c.settle()
    c.produce(acks=ACKS_ALL)
    c.restart(A)
    c.settle()
    assert all(value not in c.values(b) for b in (A, B, C))


# ---------------------------------------------------------------- zombie leader
def test_zombie_leader_cannot_shrink_isr_or_ack_after_losing_its_session() -> None:
    c = SimCluster(3, ReplicationConfig(min_insync_replicas=2, replica_lag_time_max_ms=1_000))
    c.settle()
    c.isolate(A)  # A can no longer talk to B and C ...
    c.session_expiry(A)  # ... and the controller moves leadership away
    assert c.zk_state is not None and c.zk_state.leader == B
    zombie_write = c.produce(broker=A, acks=ACKS_ALL)  # A still believes it leads
    assert zombie_write is not None
    c.advance(2_000)  # A's followers look lagging: A tries to shrink the ISR to itself
    assert any("leader 0 isr write (0,) ok=False" in line for line in c.trace)
    assert c.partitions[A].isr == (0, 1, 2)  # the failed CAS changed nothing
    c.advance(30_000)
    assert c.produce_errors[zombie_write] is ErrorCode.REQUEST_TIMED_OUT
    c.heal()
    c.settle()
    assert c.leader() == B and zombie_write not in c.values(B)
    assert c.values(A) == c.values(B)  # A truncated its unacknowledged write away
