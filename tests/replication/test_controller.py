"""Controller core: elections (clean/unclean), ISR cleanup, CAS conflicts, assignment."""

from __future__ import annotations

import orjson
import pytest

from isrlab.broker.controller import (
    Controller,
    NotifyBrokers,
    ReadStateZnode,
    WriteAssignmentZnode,
    assign_replicas_to_brokers,
)
from isrlab.broker.controller.controller import ControllerAction
from isrlab.broker.replication import LeaderAndIsr, TopicPartition, WriteStateZnode

TP = TopicPartition("t", 0)


def writes(actions: list[ControllerAction]) -> list[WriteStateZnode]:
    return [a for a in actions if isinstance(a, WriteStateZnode)]


def running(
    state: LeaderAndIsr,
    live: tuple[int, ...] = (0, 1, 2),
    unclean: bool = False,
    elr: bool = True,
    min_isr: int = 2,
) -> Controller:
    c = Controller(
        controller_epoch=3,
        unclean_leader_election=unclean,
        eligible_leader_replicas=elr,
        min_insync_replicas=min_isr,
    )
    c.load({TP: (0, 1, 2)}, {TP: state}, live)
    return c


def commit(c: Controller, actions: list[ControllerAction], version: int) -> LeaderAndIsr:
    (w,) = writes(actions)
    c.on_write_result(w.tp, True, version)
    return c.states[w.tp]


def test_create_topic_writes_initial_state_and_notifies() -> None:
    c = Controller(controller_epoch=1)
    c.on_broker_change([0, 1, 2])
    actions = c.create_topic("t", 3, 2)
    (assignment,) = [a for a in actions if isinstance(a, WriteAssignmentZnode)]
    assert orjson.loads(assignment.data) == {
        "version": 1,
        "partitions": {"0": [0, 1], "1": [1, 2], "2": [2, 0]},
    }
    ws = writes(actions)
    assert [w.expected_version for w in ws] == [None, None, None]
    assert ws[1].state == LeaderAndIsr(1, 0, (1, 2), 1, zk_version=-1)
    assert ws[1].path == "/brokers/topics/t/partitions/1/state"
    assert orjson.loads(ws[1].data) == {
        "controller_epoch": 1,
        "leader": 1,
        "version": 1,
        "leader_epoch": 0,
        "isr": [1, 2],
    }
    (notify,) = c.on_write_result(TopicPartition("t", 1), True, 0)
    assert isinstance(notify, NotifyBrokers) and notify.brokers == (1, 2)
    with pytest.raises(ValueError, match="already exists"):
        c.create_topic("t", 1, 1)


def test_leader_loss_elects_first_live_isr_member_and_bumps_epoch() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 2, 1), 1, zk_version=7))
    (w,) = writes(c.on_broker_change([1, 2]))
    # assignment order (0, 1, 2) decides among live ISR members, as in Kafka
    assert w.state == LeaderAndIsr(1, 5, (2, 1), 3, zk_version=7)
    assert w.expected_version == 7
    (notify,) = c.on_write_result(TP, True, 8)
    assert isinstance(notify, NotifyBrokers)
    assert notify.brokers == (1, 2) and notify.state.zk_version == 8


def test_follower_loss_shrinks_isr_with_epoch_bump() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 1, 2), 1, zk_version=2))
    (w,) = writes(c.on_broker_change([0, 2]))
    assert (w.state.leader, w.state.leader_epoch, w.state.isr) == (0, 5, (0, 2))


def test_last_isr_member_is_kept_and_partition_goes_offline_without_elr() -> None:
    c = running(LeaderAndIsr(0, 1, (0,), 1, zk_version=1), live=(0, 1, 2), elr=False)
    state = commit(c, c.on_broker_change([1, 2]), 2)
    assert (state.leader, state.isr, state.leader_epoch) == (-1, (0,), 2)
    assert writes(c.on_broker_change([2])) == []  # out-of-sync replicas are not eligible
    state = commit(c, c.on_broker_change([0, 2]), 3)  # the last ISR member returns
    assert (state.leader, state.isr, state.leader_epoch) == (0, (0,), 3)


def test_all_isr_members_dead_keeps_last_leader_without_elr() -> None:
    c = running(LeaderAndIsr(1, 1, (0, 1), 1, zk_version=1), elr=False)
    state = commit(c, c.on_broker_change([2]), 2)
    assert (state.leader, state.isr) == (-1, (1,))


def test_unclean_election_takes_first_live_assigned_replica() -> None:
    c = running(LeaderAndIsr(0, 1, (0,), 1, zk_version=1), unclean=True)
    state = commit(c, c.on_broker_change([1, 2]), 2)
    assert (state.leader, state.isr, state.leader_epoch) == (1, (1,), 2)


def test_no_change_needed_no_write() -> None:
    c = running(LeaderAndIsr(0, 1, (0, 1, 2), 1, zk_version=1))
    assert c.on_broker_change([0, 1, 2]) == []


def test_restarted_broker_is_told_the_current_state() -> None:
    c = running(LeaderAndIsr(0, 1, (0, 1), 1, zk_version=1), live=(0, 1))
    (notify,) = c.on_broker_change([0, 1, 2])
    assert isinstance(notify, NotifyBrokers) and notify.brokers == (2,)


def test_cas_conflict_rereads_and_does_not_clobber_leader_isr_change() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 1, 2), 1, zk_version=0))
    # Meanwhile the leader removed 2 itself (version 1); the controller has not seen it.
    (w,) = writes(c.on_broker_change([0, 2]))
    assert w.state.isr == (0, 2) and w.expected_version == 0
    (read,) = c.on_write_result(TP, False, 1)
    assert isinstance(read, ReadStateZnode) and read.path == w.path
    assert writes(c.on_broker_change([0, 2])) == []  # one write or read at a time
    leader_written = LeaderAndIsr(0, 4, (0, 1), 1, zk_version=1)
    (w2,) = writes(c.on_state_read(TP, leader_written))
    assert w2.state.isr == (0,) and w2.expected_version == 1  # 2 stays out
    assert w2.state.leader_epoch == 5


def test_isr_change_notification_rereads_state() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 1, 2), 1, zk_version=0))
    (read,) = c.on_isr_change_notification([TP])
    assert isinstance(read, ReadStateZnode)
    fresh = LeaderAndIsr(0, 4, (0, 1), 1, zk_version=1)
    (notify,) = c.on_state_read(TP, fresh)  # no decision to make: just (re)announce
    assert isinstance(notify, NotifyBrokers) and notify.state == fresh
    assert c.states[TP].zk_version == 1


def test_broker_starting_during_a_reread_still_learns_the_state() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 1), 1, zk_version=0), live=(0, 1))
    c.on_isr_change_notification([TP])
    (early,) = c.on_broker_change([0, 1, 2])  # told the cached state at once ...
    assert isinstance(early, NotifyBrokers) and early.state.zk_version == 0
    (notify,) = c.on_state_read(TP, LeaderAndIsr(0, 4, (0, 1), 1, zk_version=1))
    assert isinstance(notify, NotifyBrokers) and 2 in notify.brokers  # ... then the fresh one
    assert notify.state.zk_version == 1


def test_newer_controller_fences_this_one() -> None:
    c = running(LeaderAndIsr(0, 4, (0, 1, 2), 1, zk_version=0))
    c.on_write_result(TP, False, 0)
    (w,) = writes(c.on_broker_change([1, 2]))
    c.on_write_result(TP, False, 1)
    assert c.on_state_read(TP, LeaderAndIsr(1, 5, (1, 2), 9, zk_version=1)) == []
    assert c.fenced and w.state.leader == 1


# ---------------------------------------------------------------- assignment
def test_assignment_matches_kafka_round_robin() -> None:
    # Kafka's AdminUtils test: 5 brokers, 10 partitions, RF 3, fixed start index 0.
    expected = {
        0: (0, 1, 2),
        1: (1, 2, 3),
        2: (2, 3, 4),
        3: (3, 4, 0),
        4: (4, 0, 1),
        5: (0, 2, 3),
        6: (1, 3, 4),
        7: (2, 4, 0),
        8: (3, 0, 1),
        9: (4, 1, 2),
    }
    assert assign_replicas_to_brokers([4, 3, 2, 1, 0], 10, 3) == expected


def test_assignment_spreads_leaders_and_uses_broker_ids() -> None:
    result = assign_replicas_to_brokers([10, 20, 30], 6, 2, start_index=1, replica_shift=1)
    leaders = [r[0] for r in result.values()]
    assert sorted(leaders) == [10, 10, 20, 20, 30, 30]
    assert all(len(set(r)) == 2 for r in result.values())


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf", "message"),
    [
        ([0, 1], 1, 3, "larger than available brokers"),
        ([0, 1], 0, 1, "partitions must be larger than 0"),
        ([0, 1], 1, 0, "replication factor must be larger than 0"),
    ],
)
def test_assignment_rejects_bad_requests(
    brokers: list[int], partitions: int, rf: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        assign_replicas_to_brokers(brokers, partitions, rf)


def test_failover_load_elects_where_needed_and_tells_everyone_else() -> None:
    other = TopicPartition("u", 0)
    c = Controller(controller_epoch=4)
    actions = c.load(
        {TP: (0, 1, 2), other: (1, 2, 0)},
        {
            TP: LeaderAndIsr(0, 2, (0, 1), 3, zk_version=5),
            other: LeaderAndIsr(1, 0, (1, 2), 3, zk_version=1),
        },
        live_brokers=[1, 2],
    )
    (w,) = writes(actions)
    assert w.tp == TP and w.state == LeaderAndIsr(1, 3, (1,), 4, zk_version=5)
    (notify,) = [a for a in actions if isinstance(a, NotifyBrokers)]
    assert notify.tp == other and notify.brokers == (1, 2)


@pytest.mark.parametrize("elr", [True, False])
def test_failover_load_moves_leadership_off_a_leader_that_registered_since(elr: bool) -> None:
    """A leader that registered again after its state was written (a bounce no controller
    saw) is a new incarnation: the state must be decided again, as a failure then a start,
    even after a clean shutdown (brokers do not lead from a state older than their
    registration). An in-sync follower takes over."""
    c = Controller(controller_epoch=4, eligible_leader_replicas=elr, min_insync_replicas=1)
    actions = c.load(
        {TP: (0, 1, 2)},
        {TP: LeaderAndIsr(0, 2, (0, 1, 2), 3, zk_version=5)},
        live_brokers=[0, 1, 2],
        registered_since={TP: [0]},
    )
    (w,) = writes(actions)
    assert w.expected_version == 5
    assert w.state.leader == 1 and w.state.leader_epoch > 2, w.state
    assert 0 not in w.state.isr


@pytest.mark.parametrize("elr", [True, False])
def test_failover_load_reelects_a_bounced_sole_replica_with_a_new_epoch(elr: bool) -> None:
    """A single-replica partition whose leader restarted cleanly while no controller ran: the
    same leader, under a new leader epoch its new incarnation may lead from."""
    c = Controller(controller_epoch=2, eligible_leader_replicas=elr, min_insync_replicas=1)
    actions = c.load(
        {TP: (0,)},
        {TP: LeaderAndIsr(0, 7, (0,), 1, zk_version=9)},
        live_brokers=[0],
        registered_since={TP: [0]},
    )
    (w,) = writes(actions)
    assert (w.state.leader, w.state.isr, w.expected_version) == (0, (0,), 9)
    assert w.state.leader_epoch > 7


def test_failover_load_leaves_states_whose_leader_did_not_register_since() -> None:
    """A follower registered since the last write does not change a live leader's state."""
    c = Controller(controller_epoch=4, min_insync_replicas=1)
    actions = c.load(
        {TP: (0, 1, 2)},
        {TP: LeaderAndIsr(0, 2, (0, 1, 2), 3, zk_version=5)},
        live_brokers=[0, 1, 2],
        registered_since={TP: [1]},
    )
    assert writes(actions) == []
