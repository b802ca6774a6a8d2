"""ZooKeeper calls that meet a dropped connection (broker/zk_retry.py) on the simulated
ensemble: made again once reconnected, a write whose reply was lost counted as written, and a
changed session ending the call. Each rule here was found missing by `isrlab sim` (a
controller that dropped a broker-membership event, a leader whose ISR write was never
retried: partitions left without a usable leader, acknowledged records never readable)."""

from __future__ import annotations

import asyncio
import functools

import pytest
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from isrlab.broker import zk_retry
from isrlab.broker.replication import LeaderAndIsr, TopicPartition, WriteStateZnode
from isrlab.broker.zk_client import KafkaZkClient
from isrlab.harness.sim.clock import VirtualTimeLoop
from isrlab.harness.sim.kazoo_client import SimEnsemble, SimKazooClient


@pytest.fixture
def loop() -> VirtualTimeLoop:
    lp = VirtualTimeLoop()
    yield lp
    lp.close()


def zk_client(loop: VirtualTimeLoop) -> KafkaZkClient:
    k = KafkaZkClient(
        "sim/kafka", 6000, kazoo=functools.partial(SimKazooClient, SimEnsemble(loop, seed=5))
    )
    k.start()
    return k


TP = TopicPartition("t", 0)
STATE = LeaderAndIsr(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1)


def test_a_read_whose_connection_dropped_is_made_again_once_reconnected(loop) -> None:
    zk = zk_client(loop)
    zk.zk.create("/x", b"value")
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0])
    with pytest.raises(ConnectionLoss):  # without the retry
        zk.zk.get("/x")
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0])
    data, _ = loop.run_until_complete(zk_retry.call(zk.zk, zk.zk.get, "/x"))
    assert data == b"value" and zk.zk.connected


def test_a_state_write_whose_reply_was_lost_counts_as_written(loop) -> None:
    zk = zk_client(loop)
    assert zk.write_state(WriteStateZnode(TP, STATE, None)) == (True, 0)
    shrunk = WriteStateZnode(TP, STATE.with_isr((1,)), 0)
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0], applied=True)
    assert loop.run_until_complete(zk_retry.call(zk.zk, zk.write_state, shrunk)) == (True, 1)
    # a write that really conflicts still fails, with the znode's version
    assert zk.write_state(WriteStateZnode(TP, STATE.with_isr((2,)), 0)) == (False, 1)
    assert zk.write_state(WriteStateZnode(TP, STATE.with_isr((1, 2)), 1)) == (True, 2)
    assert zk.write_state(WriteStateZnode(TP, STATE.with_isr((1,)), 1)) == (False, 2)


def test_a_controller_whose_create_reply_was_lost_is_the_controller(loop) -> None:
    zk = zk_client(loop)
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0], applied=True)
    epoch = loop.run_until_complete(zk_retry.call(zk.zk, zk.try_become_controller, 1))
    assert epoch == 1 and zk.controller_id() == 1
    other = KafkaZkClient(
        "sim/kafka", 6000, kazoo=functools.partial(SimKazooClient, zk.zk.ensemble)
    )
    other.start()
    assert other.try_become_controller(2) is None  # held by another session


def test_a_session_that_changed_while_waiting_ends_the_call(loop) -> None:
    zk = zk_client(loop)
    zk.zk.create("/x", b"value")
    sid = zk.zk.client_id[0]
    zk.zk.partition()  # cut: requests fail at once, the session expires after 6 s

    async def expire_later() -> None:
        await asyncio.sleep(7)
        zk.zk.heal()

    async def main() -> None:
        healer = asyncio.ensure_future(expire_later())
        with pytest.raises(SessionExpiredError):
            await zk_retry.call(zk.zk, zk.zk.get, "/x")
        await healer

    loop.run_until_complete(main())
    assert zk.zk.client_id[0] != sid


def test_the_leaders_isr_write_and_the_controllers_calls_go_through_the_retry(loop) -> None:
    """The shells use it: ZkStateStore (a leader's ISR change) and ControllerService."""
    from isrlab.broker.cluster import ZkStateStore
    from isrlab.broker.controller_service import ControllerService

    zk = zk_client(loop)
    assert zk.write_state(WriteStateZnode(TP, STATE, None)) == (True, 0)
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0], applied=True)
    write = ZkStateStore(zk).write_state(WriteStateZnode(TP, STATE.with_isr((1,)), 0))
    assert loop.run_until_complete(write) == (True, 1)

    zk = zk_client(loop)  # a fresh ensemble: no half-made topic
    controller = ControllerService(zk, broker_id=1, unclean_leader_election=False)
    zk.zk.core.lose_connection_on_next(zk.zk.client_id[0], applied=False)
    loop.run_until_complete(controller._elect())
    assert controller.is_active and zk.controller_id() == 1


def test_the_controller_looks_at_the_registrations_again_after_a_reconnection(loop) -> None:
    """A broker that bounced while the controller's connection was down leaves /brokers/ids
    with the same children, which kazoo's ChildrenWatch does not report after reconnecting:
    the controller reads the registrations again on every reconnection, so it still sees the
    new broker epoch (and handles the bounce as a failure and a start)."""
    from isrlab.broker.controller_service import ControllerService

    ens = SimEnsemble(loop, seed=7)

    def client() -> KafkaZkClient:
        k = KafkaZkClient("sim/kafka", 6000, kazoo=functools.partial(SimKazooClient, ens))
        k.start()
        return k

    zk1, zk2 = client(), client()
    assert zk1.register_broker(1, "h1", 9092) and zk2.register_broker(2, "h2", 9092)
    controller = ControllerService(zk1, broker_id=1, unclean_leader_election=False)

    async def main() -> tuple[int, int, int]:
        controller.start()
        await asyncio.sleep(1)
        assert controller.is_active
        before = controller._epochs[2]
        zk1.zk.partition()  # past the read timeout (4 s), within the session (6 s)
        await asyncio.sleep(1)
        zk2.zk.stop()  # broker 2 bounces: its registration goes, a new one comes
        bounced = client()
        assert bounced.register_broker(2, "h2", 9092)
        await asyncio.sleep(4)
        zk1.zk.heal()
        await asyncio.sleep(2)
        after = controller._epochs[2]
        await controller.stop()
        return before, after, bounced.broker_registration(2)[0]

    before, after, registered = loop.run_until_complete(main())
    assert before != registered and after == registered
