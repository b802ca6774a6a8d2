"""The simulated ZooKeeper's sessions and faults on virtual time, and the broker's
KafkaZkClient on it. These have no differential twin (a real ensemble cannot be partitioned
or made to lose a reply on cue from a test); they check the behaviour docs/simulation.md states."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.protocol.states import EventType, KazooState

from isrlab.broker.replication import LeaderAndIsr, TopicPartition, WriteStateZnode
from isrlab.broker.topics import TopicInfo
from isrlab.broker.zk_client import KafkaZkClient
from isrlab.harness.sim.clock import VirtualTimeLoop
from isrlab.harness.sim.kazoo_client import SimEnsemble, SimKazooClient
from isrlab.harness.sim.zookeeper import Notice, SimZooKeeper, WatchEvent


@pytest.fixture
def loop() -> VirtualTimeLoop:
    lp = VirtualTimeLoop()
    yield lp
    lp.close()


def until(loop: VirtualTimeLoop, t: float) -> None:
    loop.run_until_complete(asyncio.sleep(max(0.0, t - loop.time())))


def clients(loop: VirtualTimeLoop, n: int = 2, timeout: float = 4.0) -> list[SimKazooClient]:
    ens = SimEnsemble(loop, seed=1)
    out = [SimKazooClient(ens, timeout=timeout) for _ in range(n)]
    for c in out:
        c.start()
    return out


def test_a_cut_client_is_suspended_then_expires_and_its_ephemerals_go(loop) -> None:
    a, b = clients(loop)
    states: list[str] = []
    a.add_listener(states.append)
    a.create("/e", b"", ephemeral=True)
    seen: list[tuple[str, str]] = []
    b.exists("/e", watch=lambda ev: seen.append((ev.type, ev.path)))
    sid = a.client_id[0]
    a.partition()
    with pytest.raises(ConnectionLoss):
        a.get("/e")
    until(loop, 4 * 2 / 3 + 0.01)  # kazoo's read timeout: 2/3 of the session timeout
    assert states == [KazooState.SUSPENDED]
    assert b.exists("/e") is not None and seen == []
    until(loop, 4.49)  # timeout 4 s, expiry at the tick boundary after it: 4.5 s
    assert b.exists("/e") is not None
    until(loop, 4.51)
    assert b.exists("/e") is None and seen == [("DELETED", "/e")]
    a.heal()
    until(loop, 5.0)
    assert states == [KazooState.SUSPENDED, KazooState.LOST, KazooState.CONNECTED]
    assert a.client_id[0] != sid


def test_a_cut_healed_within_the_timeout_keeps_the_session(loop) -> None:
    a, b = clients(loop)
    a.create("/e", b"", ephemeral=True)
    sid = a.client_id[0]
    states: list[str] = []
    a.add_listener(states.append)
    a.partition()
    until(loop, 3.0)
    a.heal()
    until(loop, 20.0)
    assert states == [KazooState.SUSPENDED, KazooState.CONNECTED]
    assert a.client_id[0] == sid and b.exists("/e").ephemeralOwner == sid


def test_a_cut_shorter_than_the_read_timeout_goes_unnoticed(loop) -> None:
    """The TCP connection outlives a cut shorter than kazoo's read timeout (2/3 of the
    session timeout): no SUSPENDED, the watches stay, the session too."""
    a, b = clients(loop)
    sid = a.client_id[0]
    states: list[str] = []
    a.add_listener(states.append)
    seen: list[str] = []
    a.exists("/w", watch=lambda ev: seen.append(ev.type))
    a.partition()
    until(loop, 1.0)
    a.heal()
    until(loop, 10.0)
    assert states == [] and a.connected and a.client_id[0] == sid
    b.create("/w", b"")
    until(loop, 10.5)
    assert seen == ["CREATED"]


@pytest.mark.parametrize("applied", [True, False])
def test_connection_loss_with_the_write_applied_or_not(loop, applied: bool) -> None:
    (a,) = clients(loop, 1)
    states: list[str] = []
    a.add_listener(states.append)
    a.core.lose_connection_on_next(a.client_id[0], applied=applied)
    with pytest.raises(ConnectionLoss):
        a.create("/x", b"v")
    assert states == [KazooState.SUSPENDED]
    until(loop, 1.0)
    assert states == [KazooState.SUSPENDED, KazooState.CONNECTED]
    assert (a.exists("/x") is not None) == applied


def test_a_lost_connection_clears_watches_with_a_none_event(loop) -> None:
    a, b = clients(loop)
    a.create("/w", b"")
    seen: list[str] = []
    a.get("/w", watch=lambda ev: seen.append(ev.type))
    a.core.lose_connection_on_next(a.client_id[0], applied=False)
    with pytest.raises(ConnectionLoss):
        a.exists("/w")
    until(loop, 1.0)
    b.set("/w", b"changed")
    until(loop, 2.0)
    assert seen == ["NONE"]


def test_a_watch_event_fired_while_the_client_is_unreachable_arrives_when_it_is_again(
    loop,
) -> None:
    """A client cut (or a process paused, SimCluster.pause) for less than kazoo's read timeout
    keeps its TCP connection: an event the ensemble fires meanwhile is delivered after the heal,
    not lost (a lost one left a broker's DataWatch on a state znode silent for good: isrlab sim
    --seed 44 --nemesis kill+pause+partition --nemesis-interval 4 lost acknowledged records)."""
    a, b = clients(loop)
    b.create("/state", b"epoch 1")
    calls: list[bytes | None] = []
    a.DataWatch("/state", lambda data, stat: calls.append(data))
    a.partition()
    b.set("/state", b"epoch 2")
    until(loop, 1.0)
    assert calls == [b"epoch 1"]
    a.heal()  # within the read timeout: the connection lived on
    until(loop, 2.0)
    assert calls == [b"epoch 1", b"epoch 2"]
    b.set("/state", b"epoch 3")  # and the watch is set again
    until(loop, 3.0)
    assert calls == [b"epoch 1", b"epoch 2", b"epoch 3"]


def test_events_held_for_an_unreachable_client_go_with_its_connection(loop) -> None:
    """Once the client has dropped the connection (its read timeout), the events held for it
    are gone with the connection: the watches are cleared with a NONE event and DataWatch
    reads again on reconnection, so it sees the change once."""
    a, b = clients(loop)
    b.create("/state", b"epoch 1")
    calls: list[bytes | None] = []
    a.DataWatch("/state", lambda data, stat: calls.append(data))
    a.partition()
    b.set("/state", b"epoch 2")
    until(loop, 3.0)  # SUSPENDED after 2/3 of the 4 s session timeout
    assert not a.connected
    a.heal()
    until(loop, 4.0)
    assert a.connected and calls == [b"epoch 1", b"epoch 2"]


class _Still:
    def time(self) -> float:
        return 0.0


def test_the_ensemble_holds_events_for_an_unreachable_session_until_its_connection_drops() -> None:
    """The core: events for a cut session are held and sent on the heal, in order; a dropped
    connection discards them (its watches are gone with it)."""
    core = SimZooKeeper(clock=_Still(), rng=random.Random(1))
    notices: list[object] = []
    sid, _ = core.open_session(4000, notices.append)
    core.request(sid, "create", "/a", b"", False, False)
    core.request(sid, "create", "/b", b"", False, False)
    for path in ("/a", "/b"):
        core.request(sid, "get", path, True)
    core.partition(sid)
    core.request(core.open_session(4000, lambda n: None)[0], "set", "/b", b"1", -1)
    core.request(core.open_session(4000, lambda n: None)[0], "set", "/a", b"1", -1)
    assert notices == [Notice.CUT]
    core.heal(sid)
    assert notices == [
        Notice.CUT,
        Notice.REACHABLE,
        WatchEvent(EventType.CHANGED, "/b"),
        WatchEvent(EventType.CHANGED, "/a"),
    ]
    notices.clear()
    core.request(sid, "get", "/a", True)
    core.partition(sid)
    core.request(core.open_session(4000, lambda n: None)[0], "set", "/a", b"2", -1)
    core.drop_connection(sid)
    core.heal(sid)
    assert notices == [Notice.CUT, Notice.REACHABLE]


def test_an_expired_session_is_replaced_and_datawatch_reads_again(loop) -> None:
    a, b = clients(loop)
    calls: list[bytes | None] = []
    b.create("/reg", b"1", ephemeral=True)
    a.DataWatch("/reg", lambda data, stat: calls.append(data))
    old = b.client_id[0]
    b.core.expire(old)
    with pytest.raises(SessionExpiredError):
        b.get("/reg")  # told before the new session is opened on the loop
    until(loop, 0.5)
    assert b.connected and b.client_id[0] != old
    b.create("/reg", b"2", ephemeral=True)
    until(loop, 1.0)
    assert calls == [b"1", None, b"2"]


def test_children_watch_follows_registrations(loop) -> None:
    a, b = clients(loop)
    a.ensure_path("/brokers/ids")
    seen: list[list[str]] = []
    a.ChildrenWatch("/brokers/ids", seen.append)
    b.create("/brokers/ids/1", b"", ephemeral=True)
    until(loop, 0.1)
    b.stop()
    until(loop, 0.2)
    assert seen == [[], ["1"], []]


def test_kafka_zk_client_runs_on_the_simulated_ensemble(loop) -> None:
    ens = SimEnsemble(loop, seed=3)
    zks = []
    for _ in range(2):  # the first one creates the chroot through a root client, as with kazoo
        k = KafkaZkClient("sim/kafka", 18000, kazoo=functools.partial(SimKazooClient, ens))
        k.start()
        zks.append(k)
    one, two = zks
    assert one.zk._session_timeout == 10_000  # negotiated down to 20 ticks
    assert one.cluster_id() == two.cluster_id()
    assert one.register_broker(1, "h1", 9092) is True
    assert one.register_broker(1, "h1", 9092) is False  # this session holds it
    assert two.register_broker(2, "h2", 9092) is True
    assert one.broker_ids() == [1, 2]
    epoch1, clean = one.broker_registration(1)
    assert clean and epoch1 < two.broker_registration(2)[0]
    assert one.try_become_controller(1) == 1 and two.try_become_controller(2) is None
    info = TopicInfo(name="t", topic_id=None, assignment={0: [1, 2]}, config={})  # type: ignore[arg-type]
    assert one.create_topic(info) and not one.create_topic(info)
    tp = TopicPartition("t", 0)
    state = LeaderAndIsr(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1)
    assert one.write_state(WriteStateZnode(tp, state, None)) == (True, 0)
    # exists: with other data a conflict; with the same data this write's own (a retry)
    assert one.write_state(WriteStateZnode(tp, state.with_isr((2,)), None)) == (False, 0)
    assert one.write_state(WriteStateZnode(tp, state, None)) == (True, 0)
    assert one.write_state(WriteStateZnode(tp, state, 5)) == (False, 0)  # stale version
    assert two.write_state(WriteStateZnode(tp, state.with_isr((1,)), 0)) == (True, 1)
    read = two.partition_state(tp)
    assert read is not None and read.isr == (1,) and read.zk_version == 1
    # the controller's session expires: /controller goes, the other broker takes over
    one.zk.core.expire(one.zk.client_id[0])
    until(loop, 1.0)
    assert two.try_become_controller(2) == 2
    assert one.allocate_producer_id_block(1) == (0, 999)
    assert two.allocate_producer_id_block(2) == (1000, 1999)
    with pytest.raises(NoNodeError):
        one.zk.get("/brokers/ids/1")  # the expired session's registration went with it
    with pytest.raises(NodeExistsError):
        two.zk.create("/controller", b"")


def _trace(seed: int) -> bytes:
    """Random requests and faults from a few clients over virtual time: every result, state
    change and watch event with its virtual time."""
    rng = random.Random(seed)
    loop = VirtualTimeLoop()
    lines: list[str] = []
    try:
        ens = SimEnsemble(loop, seed=seed)
        cs = [SimKazooClient(ens, timeout=3) for _ in range(3)]
        for i, c in enumerate(cs):
            c.add_listener(lambda s, i=i: lines.append(f"{loop.time():.3f} c{i} {s}"))
            c.start()
        paths = ["/a", "/b", "/a/x"]
        for _ in range(300):
            i = rng.randrange(3)
            c = cs[i]
            p = rng.choice(paths)
            op = rng.choice(["create", "eph", "set", "delete", "get", "cut", "heal", "lose"])
            try:
                if op == "create":
                    r: object = c.create(p, b"d", sequence=rng.random() < 0.3)
                elif op == "eph":
                    r = c.create(p, b"e", ephemeral=True)
                elif op == "set":
                    r = c.set(p, str(rng.random()).encode(), version=rng.choice([-1, 0, 1]))
                elif op == "delete":
                    r = c.delete(p)
                elif op == "get":
                    r = c.get(p, watch=lambda ev, i=i: lines.append(f"{loop.time():.3f} c{i} {ev}"))
                elif op == "cut":
                    r = c.partition()
                elif op == "heal":
                    r = c.heal()
                else:
                    if c.client_id is not None and c.client_id[0] in ens.core.sessions:
                        ens.core.lose_connection_on_next(c.client_id[0])
                    r = None
            except Exception as e:
                r = type(e).__name__
            lines.append(f"{loop.time():.3f} c{i} {op} {p} -> {r!r}")
            until(loop, loop.time() + rng.choice([0.0, 0.1, 1.0, 2.5]))
        lines.append(f"zxid {ens.core.zxid}")
    finally:
        loop.close()
    return "\n".join(lines).encode()


def test_the_same_seed_gives_a_byte_identical_trace() -> None:
    first = _trace(11)
    assert b"LOST" in first and b"SUSPENDED" in first and b"ConnectionLoss" in first
    assert _trace(11) == first
    assert _trace(12) != first


def test_a_recipe_read_cut_off_before_kazoo_notices_is_answered_at_the_heal(loop) -> None:
    """An event reaches the client, and the cut comes before its DataWatch reads the node
    again (one instant): kazoo's recipes retry their reads until answered, and the request,
    on a TCP connection that outlives the cut, is answered at the heal. Dropped, the
    DataWatch never read again nor set its watch: a broker paused past an election, resumed
    and cut from ZooKeeper at once never learnt it led (`isrlab sim --seed 190 --nemesis
    partition+kill+pause --nemesis-interval 4 --subscribe --commit-p 0.5`: a cluster stuck
    until the end, 30 acknowledged values unread)."""
    a, b = clients(loop)
    b.create("/state", b"epoch 1")
    b.create("/ids")
    calls: list[bytes | None] = []
    children: list[list[str]] = []
    a.DataWatch("/state", lambda data, stat: calls.append(data))
    a.ChildrenWatch("/ids", children.append)
    b.set("/state", b"epoch 2")  # delivered: the watchers read on the loop, after ...
    b.create("/ids/1", b"")
    a.partition()  # ... the cut, in the same instant
    until(loop, 1.0)
    assert calls == [b"epoch 1"] and children == [[]]
    a.heal()  # within the read timeout: nothing noticed, the reads answered now
    until(loop, 1.5)
    assert a.connected
    assert calls == [b"epoch 1", b"epoch 2"] and children == [[], ["1"]]
    b.set("/state", b"epoch 3")  # and the watches are set again
    b.create("/ids/2", b"")
    until(loop, 2.0)
    assert calls == [b"epoch 1", b"epoch 2", b"epoch 3"] and children[-1] == ["1", "2"]
