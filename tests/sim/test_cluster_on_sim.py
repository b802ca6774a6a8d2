"""A whole cluster on the simulator (harness/sim/cluster.py): three real ClusterKafkaServers in
ZooKeeper mode on one virtual-time loop, the simulated ensemble and network, driven by the
broker's own KafkaConnection: a topic with RF 3 created through CreateTopics, acks=all
produces, the leader killed (kill -9), a new leader elected once its ZooKeeper session has
expired in virtual time with every acknowledged record, the old leader restarted and back in
the ISR, invariants checked after every event, one seed giving a byte-identical trace."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest
from kafka.record.default_records import DefaultRecordBatch

from isrlab.broker.network.client import ConnectionFailed, KafkaConnection
from isrlab.harness.sim import clock
from isrlab.harness.sim.cluster import PORT, SimCluster
from isrlab.harness.sim.invariants import Invariants, InvariantViolation
from tests.broker.rawclient import build_batch, fetch_request, produce_req

TOPIC = "t"
TP = (TOPIC, 0)
SESSION_MS = 6000


def run_cluster(
    tmp: Path, body: Callable[[SimCluster], Awaitable[Any]], *, seed: int = 1
) -> tuple[Any, SimCluster]:
    holder: dict[str, SimCluster] = {}

    async def main() -> Any:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(
            loop, tmp, 3, seed=seed, overrides={"zookeeper.session.timeout.ms": str(SESSION_MS)}
        )
        holder["c"] = cluster
        async with cluster:
            return await body(cluster)

    result = clock.run(main())
    return result, holder["c"]


async def create_topic(c: SimCluster, via: int = 1) -> None:
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=TOPIC, num_partitions=1, replication_factor=3, assignments=[], configs=[]
    )
    conn = KafkaConnection(f"n{via}", PORT, "admin", c.net.host("admin"))
    r = await conn.request(C(topics=[topic], timeout_ms=10000, validate_only=False), 30)
    conn.close()
    assert r.topics[0].error_code == 0, r
    await c.wait_for(lambda: c.leader_of(TP) is not None, 30, "a leader for t-0")


def values(response: Any) -> dict[int, bytes]:
    data = bytes(response.responses[0].partitions[0].records or b"")
    out = {}
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        for r in DefaultRecordBatch(data[pos : pos + 12 + length]):
            out[r.offset] = bytes(r.value)
        pos += 12 + length
    return out


async def read_all(c: SimCluster, broker: int) -> dict[int, bytes]:
    conn = KafkaConnection(f"n{broker}", PORT, "reader", c.net.host("reader"))
    got: dict[int, bytes] = {}
    while True:
        f = await conn.request(fetch_request(TOPIC, offset=len(got)), 30)
        assert f.responses[0].partitions[0].error_code == 0, f
        more = values(f)
        if not more:
            break
        got.update(more)
    conn.close()
    return got


async def failover(c: SimCluster, n: int = 20) -> list[str]:
    """Produce n records acks=all, kill the leader, find them all on the new one, restart the
    old leader and wait for it back in the ISR; a log of what happened, in virtual time."""
    loop = asyncio.get_running_loop()
    out: list[str] = []

    def note(what: str) -> None:
        out.append(f"{loop.time():.6f} {what}")
        c.note(f"test: {what}")

    await create_topic(c)
    leader = c.leader_of(TP)
    assert leader is not None
    note(f"leader {leader}")
    producer = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
    acked: dict[int, bytes] = {}
    for i in range(n):
        value = b"v%d" % i
        r = await producer.request(produce_req(TOPIC, build_batch([value]), acks=-1), 30)
        p = r.responses[0].partition_responses[0]
        assert p.error_code == 0, p
        acked[p.base_offset] = value
    note(f"acked {sorted(acked)}")

    c.crash(leader)
    crashed_at = loop.time()
    with pytest.raises(ConnectionFailed):  # the dead leader's connection is gone
        await producer.request(produce_req(TOPIC, build_batch([b"late"]), acks=-1), 5)
    await c.wait_for(lambda: c.leader_of(TP) not in (None, leader), 120, "a new leader", step=0.05)
    new = c.leader_of(TP)
    assert new is not None
    elected_after = loop.time() - crashed_at
    note(f"new leader {new} after {elected_after:.3f}")
    # Every acknowledged record is in the new leader's log at once; consumers see them once
    # its high watermark has moved past them (a new leader's HW lags until its followers'
    # next fetch tells it their log ends, as in Kafka).
    hp = c.server(new).replica_manager.partitions[TP]  # type: ignore[index]
    assert hp.log.log_end_offset >= max(acked) + 1
    await c.wait_for(lambda: hp.high_watermark > max(acked), 30, "the new leader's HW")
    on_new = await read_all(c, new)
    note(f"read {len(on_new)} records from the new leader")
    missing = {o: v for o, v in acked.items() if on_new.get(o) != v}
    assert not missing, f"acknowledged records missing on the new leader: {missing}"

    await c.restart(leader)
    note(f"restarted {leader}")
    took = await c.wait_for(
        lambda: leader in c.server(new).replica_manager.partitions[TP].isr,  # type: ignore[index]
        120,
        "the old leader back in the ISR",
    )
    note(f"{leader} back in the ISR after {took:.3f}")
    await asyncio.sleep(120)  # quiet minutes: fetchers long-polling, invariants checked
    note(f"isr {c.server(new).replica_manager.partitions[TP].isr}")  # type: ignore[index]
    out.append(f"elected_after={elected_after}")
    return out


def test_a_cluster_fails_over_and_the_old_leader_rejoins(tmp_path: Path) -> None:
    out, c = run_cluster(tmp_path, failover)
    elected_after = float(out[-1].split("=")[1])
    # the session expires at the tick boundary after its timeout (6 s, ticks of 500 ms); the
    # controller then elects within a few network round trips
    assert SESSION_MS / 1000 <= elected_after <= SESSION_MS / 1000 + 1.0, out
    assert c.violation is None
    assert c.invariants.checks > 5000  # after every event
    assert any(" leader t-0 epoch 1 " in line for line in c.trace)
    assert any("crash broker" in line for line in c.trace)
    assert c.loop.time() > 120  # minutes of virtual time


def test_the_same_seed_gives_a_byte_identical_trace(tmp_path: Path) -> None:
    one = "\n".join(run_cluster(tmp_path / "1", failover, seed=7)[1].trace)
    two = "\n".join(run_cluster(tmp_path / "2", failover, seed=7)[1].trace)
    other = "\n".join(run_cluster(tmp_path / "3", failover, seed=8)[1].trace)
    assert one.encode() == two.encode()
    assert one != other
    assert " crash broker " in one and " drop " not in one  # nothing was partitioned


def test_a_partitioned_leader_loses_its_session_and_leadership_then_rejoins(
    tmp_path: Path,
) -> None:
    async def body(c: SimCluster) -> list[str]:
        loop = asyncio.get_running_loop()
        await create_topic(c)
        leader = c.leader_of(TP)
        assert leader is not None
        producer = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
        r = await producer.request(produce_req(TOPIC, build_batch([b"before"]), acks=-1), 30)
        assert r.responses[0].partition_responses[0].error_code == 0
        c.partition_shape("isolate-leader", leader=f"n{leader}")
        assert not c.reaches_zookeeper(f"n{leader}")
        start = loop.time()
        await c.wait_for(lambda: c.leader_of(TP) not in (None, leader), 120, "a new leader")
        new = c.leader_of(TP)
        took = loop.time() - start
        c.heal()
        await c.wait_for(
            lambda: (
                leader in c.server(new).replica_manager.partitions[TP].isr  # type: ignore[index]
                and not c.server(leader).replica_manager.partitions[TP].is_leader  # type: ignore[index]
            ),
            120,
            "the old leader following, back in the ISR",
        )
        return [f"{took:.3f}", str(new)]

    (took, _new), c = run_cluster(tmp_path, body, seed=3)
    assert SESSION_MS / 1000 <= float(took) <= SESSION_MS / 1000 + 1.0
    assert c.violation is None
    assert any(" zk cut broker " in line for line in c.trace)


def test_a_killed_process_runs_nothing_more() -> None:
    """kill -9 on the loop: callbacks and timers dropped, tasks frozen (no finally runs),
    nothing it would schedule runs; other processes and the harness carry on."""
    ran: list[str] = []

    async def worker(name: str) -> None:
        try:
            while True:
                await asyncio.sleep(1)
                ran.append(f"{name} {asyncio.get_running_loop().time():.0f}")
        finally:
            ran.append(f"{name} finally")

    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        a, b = clock.Process("a"), clock.Process("b")
        a.run(loop.create_task, worker("a"))
        b.run(loop.create_task, worker("b"))
        a.run(loop.call_later, 2.5, ran.append, "a timer")
        await asyncio.sleep(2.2)
        loop.kill(a)
        await asyncio.sleep(2)
        a.bury()

    clock.run(main())
    # b, alive, is cancelled by clock.run at the end
    assert ran == ["a 1", "b 1", "a 2", "b 2", "b 3", "b 4", "a finally", "b finally"]


def test_the_checker_reports_two_leaders_in_one_epoch_and_a_falling_high_watermark() -> None:
    class HP:
        def __init__(self, epoch: int, hw: int) -> None:
            self.is_leader, self.leader_epoch, self.high_watermark = True, epoch, hw
            self.isr: list[int] = []

    class Broker:
        def __init__(self, bid: int, hps: dict[Any, HP]) -> None:
            self.id, self.incarnation = bid, 1
            self.server = type("S", (), {"replica_manager": type("R", (), {"partitions": hps})})

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    inv = Invariants()
    inv._check_committed = lambda *a: None  # type: ignore[method-assign]
    hp = HP(3, 10)
    b1 = Broker(1, {TP: hp})
    inv.check([b1])
    hp.high_watermark = 9
    with pytest.raises(InvariantViolation, match="went down from 10 to 9"):
        inv.check([b1])
    other = Invariants()
    other._check_committed = lambda *a: None  # type: ignore[method-assign]
    with pytest.raises(InvariantViolation, match="two leaders of t-0 at leader epoch 3"):
        other.check([b1, Broker(2, {TP: HP(3, 0)})])


class _Log:
    def __init__(self, end: int) -> None:
        self.log_start_offset, self.log_end_offset = 0, end

    def read(self, start: int, max_bytes: int, max_offset: int) -> Any:
        return type("Read", (), {"read_bytes": staticmethod(lambda: b"")})()


class _Core:
    def __init__(self, leader: bool, epoch: int, hw: int, isr: list[int]) -> None:
        self.role, self.leader_epoch, self.high_watermark = (
            "leader" if leader else "follower",
            epoch,
            hw,
        )
        self.isr = tuple(isr)


class _HP:
    """A hosted partition stand-in: a core and a log (no batches: the data check reads
    nothing), and the properties the check reads."""

    def __init__(self, leader: bool, epoch: int, hw: int, isr: list[int], end: int) -> None:
        self.core = _Core(leader, epoch, hw, isr)
        self.log = _Log(end)

    is_leader = property(lambda self: self.core.role == "leader")
    leader_epoch = property(lambda self: self.core.leader_epoch)
    high_watermark = property(lambda self: self.core.high_watermark)
    isr = property(lambda self: list(self.core.isr))


class _Broker:
    def __init__(self, bid: int, hps: dict[Any, _HP]) -> None:
        self.id, self.incarnation = bid, 1
        self.server = type("S", (), {"replica_manager": type("R", (), {"partitions": hps})})


def test_after_an_event_only_the_brokers_that_ran_are_looked_at_and_every_change_is_checked() -> (
    None
):
    """The dirty tracking (`check(brokers, ran=...)`): an event that changed nothing checks no
    partition; each field the invariants read, changed by the event's broker, is checked at
    that event: a falling HW, a second leader at an epoch (by becoming leader, or by moving to
    the epoch), a member that joins the ISR with a short log, an ISR member whose log is cut
    below its leader's HW (a follower's change checked at the partition's leader), a leader's
    log cut below its HW, a broker restarted by the harness (a full check; a later incarnation
    behind the HW traced until it has caught up once)."""
    other = ("u", 0)

    def cluster() -> tuple[Invariants, list[_Broker], list[int]]:
        leader = _HP(True, 3, 10, [1, 2], 12)
        follower = _HP(False, 3, 10, [1, 2], 11)
        spare = _HP(True, 2, 0, [3], 0)  # broker 3 leads another partition
        brokers = [
            _Broker(1, {TP: leader}),
            _Broker(2, {TP: follower}),
            _Broker(3, {TP: _HP(False, 3, 0, [1, 2], 4), other: spare}),
        ]
        inv = Invariants()
        led: list[int] = []
        check_leader = inv._check_leader

        def counting(b: Any, *a: Any) -> None:
            led.append(b.id)
            check_leader(b, *a)

        inv._check_leader = counting  # type: ignore[method-assign]
        assert inv.check(brokers)  # a full check first: the leaders' lines
        assert led == [1, 3] and inv.full_checks == 1
        led.clear()
        return inv, brokers, led

    inv, brokers, led = cluster()
    for ran in [(), (1,), (2, 3), None]:
        inv.check(brokers, ran)
    assert led == [1, 3] and inv.full_checks == 2  # only the full check looked at leaders

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[0][TP].core.high_watermark = 9
    inv.check(brokers, (2, 3))  # not broker 1's event: its state cannot have changed
    with pytest.raises(InvariantViolation, match="went down from 10 to 9"):
        inv.check(brokers, (1,))

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[1][TP].core.role = "leader"  # at the epoch broker 1 leads
    with pytest.raises(InvariantViolation, match="two leaders of t-0 at leader epoch 3"):
        inv.check(brokers, (2,))

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[2][other].core.leader_epoch = 3
    inv.check(brokers, (3,))  # another partition at epoch 3: fine
    assert led == [3]
    hps[2][TP].core.role, hps[2][TP].core.leader_epoch = "leader", 2
    inv.check(brokers, (3,))  # leads t-0 at an older epoch: no violation here
    hps[2][TP].core.leader_epoch = 3  # moves to the epoch broker 1 leads
    with pytest.raises(InvariantViolation, match="two leaders of t-0 at leader epoch 3"):
        inv.check(brokers, (3,))

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[0][TP].core.isr = (1, 2, 3)  # broker 3's log ends at 4, below the HW 10
    with pytest.raises(InvariantViolation, match=r"broker 3, in the ISR .* below the high"):
        inv.check(brokers, (1,))

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[1][TP].log.log_end_offset = 7  # the follower truncates below its leader's HW
    with pytest.raises(InvariantViolation, match=r"broker 2, in the ISR .* end at 7, below"):
        inv.check(brokers, (2,))
    assert led == [1]  # checked at broker 1, the leader of the partition that moved

    inv, brokers, led = cluster()
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[0][TP].log.log_end_offset = 9  # the leader's own log cut below its HW
    with pytest.raises(InvariantViolation, match=r"the leader, broker 1, has its log end at 9"):
        inv.check(brokers, (1,))

    inv, brokers, led = cluster()
    # broker 2 restarted by the harness (a new server, its log short): checked at that event,
    # though no code of broker 2 ran yet; the same incarnation is a violation
    brokers[1].server = _Broker(2, {TP: _HP(False, 3, 0, [1, 2], 5)}).server
    with pytest.raises(InvariantViolation, match=r"broker 2, in the ISR .* end at 5, below"):
        inv.check(brokers, ())
    # a later incarnation that has not caught up yet (its disk lost its tail): traced, until
    # it has caught up once
    inv, brokers, led = cluster()
    brokers[1].server = _Broker(2, {TP: _HP(False, 3, 0, [1, 2], 5)}).server
    brokers[1].incarnation = 2
    lines = inv.check(brokers, ())
    assert "isr-member-behind-hw t-0 broker 2 log end 5 hw 10 (leader 1)" in lines
    hps = [b.server.replica_manager.partitions for b in brokers]  # type: ignore[attr-defined]
    hps[1][TP].log.log_end_offset = 10
    inv.check(brokers, (2,))
    hps[1][TP].log.log_end_offset = 8
    with pytest.raises(InvariantViolation, match=r"broker 2, in the ISR .* end at 8, below"):
        inv.check(brokers, (2,))


def test_the_dirty_tracking_misses_no_change_and_traces_as_full_checks_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failover run (kill, election, restart, two quiet minutes) with every check verified
    against a fingerprint of every broker (`VERIFY_TRACKING`: a change the tracking did not
    look at raises); its trace is the trace of the same run with a full check after every
    event, and nearly every check looked at one broker or none."""
    from isrlab.harness.sim import invariants

    monkeypatch.setattr(invariants, "VERIFY_TRACKING", True)
    _, tracked = run_cluster(tmp_path / "tracked", failover, seed=5)
    assert tracked.violation is None and tracked.invariants.verify_tracking
    assert tracked.invariants.full_checks < tracked.invariants.checks / 100

    monkeypatch.setattr(invariants, "VERIFY_TRACKING", False)
    full_check = Invariants.check
    monkeypatch.setattr(
        Invariants, "check", lambda self, brokers, ran=None: full_check(self, brokers)
    )
    # (and the cluster's shortcuts to `check`'s most frequent cases)
    monkeypatch.setattr(Invariants, "quiet", lambda self, brokers: False)
    monkeypatch.setattr(
        Invariants, "check_broker", lambda self, brokers, b: full_check(self, brokers)
    )
    _, full = run_cluster(tmp_path / "full", failover, seed=5)
    assert full.invariants.full_checks == full.invariants.checks
    assert tracked.trace == full.trace
    assert tracked.invariants.checks == full.invariants.checks > 5000


def _open_files_under(directory: Path) -> int:
    n = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if str(Path(os.readlink(fd))).startswith(str(directory)):
                n += 1
        except OSError:
            continue
    for line in Path("/proc/self/maps").read_text().splitlines():  # the index mappings
        if str(directory) in line:
            n += 1
    return n


def test_a_crashed_broker_s_files_are_closed_as_the_kernel_closes_them(tmp_path: Path) -> None:
    """A kill -9 leaves no file of the broker open (its segments, its index mappings): the
    simulator runs every broker in one process, and a crash that kept them open held them for
    the rest of the process (a sweep of seeds in one process once ran out of descriptors)."""

    async def body(c: SimCluster) -> tuple[int, int, int]:
        await create_topic(c)
        victim = c.leader_of(TP)
        assert victim is not None
        data = c.brokers[victim].data_dir
        before = _open_files_under(data)
        marker = sorted(p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file())
        c.crash(victim)
        after = _open_files_under(data)
        unchanged = sorted(p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file())
        return before, after, int(marker == unchanged)

    (before, after, unchanged), _ = run_cluster(tmp_path, body)
    assert before > 0 and after == 0, (before, after)
    assert unchanged  # closed, not flushed or trimmed: a crash writes nothing
