"""The harness's nemesis on the simulator (harness/sim/nemesis.py): every supported kind
performed on a 3-broker SimCluster (invariants checked after every event), each completion
compared with what the real `nemeses.compose.Nemesis` returns for the same op on a fake DB
that answers the cluster questions as the simulation does (`MirrorDB`: the same targets, the
same drawn shapes, the same values), power loss through the brokers' fsync journal, and a
`nemeses.compose.schedule` run twice from one seed giving byte-identical cluster traces."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest

from isrlab.broker import clock as broker_clock
from isrlab.broker.network.client import KafkaConnection
from isrlab.harness.sim import clock
from isrlab.harness.sim.cluster import EPOCH, PORT, SimCluster
from isrlab.harness.sim.nemesis import SimNemesis, SimTargets
from isrlab.nemeses import compose
from isrlab.nemeses.base import NemesisError
from tests.broker.rawclient import build_batch, fetch_request, produce_req
from tests.sim.test_cluster_on_sim import values

SESSION_MS = 6000
KEY = "t/0"
TP = ("t", 0)


# ----- the real nemesis on the simulation's answers --------------------------------------


class _Result:
    def __init__(self, stdout: str = "") -> None:
        self.stdout, self.stderr, self.ok = stdout, "", True

    def check(self) -> _Result:
        return self


class _Shell:
    """A node's shell that runs nothing: clock offset files are kept in memory."""

    def __init__(self, db: MirrorDB, name: str) -> None:
        self.db = db
        self.node = SimpleNamespace(name=name, host=name)

    def exec(self, cmd: str, *, check: bool = True) -> _Result:
        written = re.search(r"printf '%s\\n' (\S+) > (\S+)\.tmp", cmd)
        if written:
            self.db.files[written.group(2)] = written.group(1)
        read = re.match(r"cat (\S+) 2>/dev/null", cmd)
        if read:
            return _Result(self.db.files.get(read.group(1), ""))
        return _Result()


class MirrorDB:
    """The real faults' ClusterDB over a simulated cluster, touching nothing: the cluster
    questions answered by the simulation (`SimTargets`), kill/pause/power answered as the
    simulated brokers' states say they would go."""

    def __init__(self, targets: SimTargets) -> None:
        self.t = targets
        self.test = targets.test
        self.files: dict[str, str] = {}

    @property
    def names(self) -> list[str]:
        return self.t.names

    def _broker(self, node: str) -> Any:
        return self.t.cluster.brokers[self.t.broker_id(node)]

    def remote(self, name: str) -> _Shell:
        return _Shell(self, name)

    def leader_of(self, topic: str, partition: int) -> str | None:
        return self.t.leader_of(topic, partition)

    def controller(self) -> str | None:
        return self.t.controller()

    def coordinator(self, group: str) -> str | None:
        return self.t.coordinator(group)

    def txn_coordinator(self, transactional_id: str) -> str | None:
        return self.t.txn_coordinator(transactional_id)

    def kill(self, node: str) -> bool:
        return bool(self._broker(node).alive)

    def pause(self, node: str) -> bool:
        return bool(self._broker(node).alive)

    def resume(self, node: str) -> bool:
        return True

    def start(self, node: str) -> int:
        return 1

    def broker_state(self, node: str) -> str:
        b = self._broker(node)
        return "down" if b.crashed and not b.alive else "running"

    def power_loss(self, node: str) -> str:
        return "cut"

    def zookeeper_nodes(self) -> list[str]:
        return self.names

    def kill_zookeeper(self, node: str) -> bool:
        raise AssertionError("power-zookeeper is not simulated")

    def start_zookeeper_on(self, node: str) -> int:
        raise AssertionError("power-zookeeper is not simulated")

    def clock_offset_file(self, node: str) -> str:
        return f"/offset/{node}"

    def clock_via_file(self, node: str) -> bool:
        return True


class Both:
    """The real nemesis (on a MirrorDB) and the simulated one, given the same ops."""

    def __init__(self, c: SimCluster, kinds: str, test: dict[str, Any]) -> None:
        self.sim = SimNemesis(c, kinds, test)
        self.real = compose.build(kinds, MirrorDB(self.sim.targets), test)  # type: ignore[arg-type]
        self.pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def invoke(self, op: dict[str, Any]) -> dict[str, Any]:
        real = self.real.invoke(op)  # first: it reads the state the simulated op starts from
        sim = await self.sim.invoke(op)
        self.pairs.append((real, sim))
        return sim

    def close(self) -> None:
        self.real.close()
        self.sim.close()


def assert_alike(real: dict[str, Any], sim: dict[str, Any]) -> None:
    """The simulated completion is the real one (a power loss's summaries aside: the real
    DB's is a stand-in; a clock strobe's phase at the stop aside: the real strobe is a thread
    in real time)."""
    real, sim = dict(real), dict(sim)
    rv, sv = real.pop("value", None), sim.pop("value", None)
    assert real == sim
    if sim["f"] == "start-power" and isinstance(sv, dict):
        assert set(sv["power_loss"]) == set(rv["power_loss"])
        assert all(s.startswith(f"{n}: ") for n, s in sv["power_loss"].items()), sv
        rv, sv = {**rv, "power_loss": None}, {**sv, "power_loss": None}
    if sim["f"] == "stop-clock" and isinstance(sv, dict):
        assert set(sv["nodes"]) <= set(sv["offsets"]) and sv["offsets"] == rv["offsets"]
        rv, sv = rv["offsets"], sv["offsets"]
    assert sv == rv


# ----- driving a simulated cluster -------------------------------------------------------


def run_sim(
    tmp: Path,
    body: Callable[[SimCluster], Awaitable[Any]],
    *,
    seed: int = 1,
    overrides: dict[str, str] | None = None,
) -> tuple[Any, SimCluster]:
    holder: dict[str, SimCluster] = {}

    async def main() -> Any:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(
            loop,
            tmp,
            3,
            seed=seed,
            overrides={"zookeeper.session.timeout.ms": str(SESSION_MS), **(overrides or {})},
        )
        holder["c"] = cluster
        async with cluster:
            return await body(cluster)

    result = clock.run(main())
    assert holder["c"].violation is None
    return result, holder["c"]


async def create_topic(c: SimCluster, rf: int = 3, configs: dict[str, str] | None = None) -> int:
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=TP[0],
        num_partitions=1,
        replication_factor=rf,
        assignments=[],
        configs=[(k, v) for k, v in (configs or {}).items()],
    )
    conn = KafkaConnection("n1", PORT, "admin", c.net.host("admin"))
    r = await conn.request(C(topics=[topic], timeout_ms=10000, validate_only=False), 30)
    conn.close()
    assert r.topics[0].error_code == 0, r
    await c.wait_for(lambda: c.leader_of(TP) is not None, 30, "a leader for t-0")
    if rf > 1:
        await c.wait_for(lambda: len(isr(c)) == rf, 30, "the full ISR")
    leader = c.leader_of(TP)
    assert leader is not None
    return leader


def isr(c: SimCluster, broker: int | None = None) -> list[int]:
    b = broker if broker is not None else c.leader_of(TP)
    if b is None or not c.brokers[b].alive:
        return []
    hp = c.server(b).replica_manager.partitions.get(TP)  # type: ignore[call-overload]
    return list(hp.isr) if hp is not None else []


async def produce(c: SimCluster, leader: int, n: int, tag: str) -> dict[int, bytes]:
    conn = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
    acked: dict[int, bytes] = {}
    for i in range(n):
        value = f"{tag}{i}".encode()
        r = await conn.request(produce_req(TP[0], build_batch([value]), acks=-1), 30)
        p = r.responses[0].partition_responses[0]
        assert p.error_code == 0, p
        acked[p.base_offset] = value
    conn.close()
    return acked


async def read_all(c: SimCluster, broker: int, upto: int = -1) -> dict[int, bytes]:
    """What `broker` serves, once its high watermark is past `upto` (a new leader's lags
    until its followers' next fetches)."""
    await c.wait_for(
        lambda: c.server(broker).replica_manager.partitions[TP].high_watermark > upto,  # type: ignore[index]
        30,
        f"the high watermark of {broker} past {upto}",
    )
    conn = KafkaConnection(f"n{broker}", PORT, "reader", c.net.host("reader"))
    got: dict[int, bytes] = {}
    while True:
        f = await conn.request(fetch_request(TP[0], offset=len(got)), 30)
        assert f.responses[0].partitions[0].error_code == 0, f
        more = values(f)
        if not more:
            break
        got.update(more)
    conn.close()
    return got


async def new_leader(c: SimCluster, old: int) -> int:
    await c.wait_for(lambda: c.leader_of(TP) not in (None, old), 60, "a new leader", step=0.05)
    leader = c.leader_of(TP)
    assert leader is not None
    return leader


def session_of(c: SimCluster, broker: int) -> int | None:
    return c.server(broker).zk.zk._session_id  # type: ignore[no-any-return]


# ----- each kind ---------------------------------------------------------------------------


def test_kill_the_leader_then_restart_it(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        both = Both(c, "kill", {"seed": 5, "keys": [KEY]})
        leader = await create_topic(c)
        acked = await produce(c, leader, 10, "k")
        done = await both.invoke(compose._op("start-kill", {"target": "leader", "key": KEY}))
        assert done["value"] == {"target": "leader", "nodes": [f"n{leader}"]}, done
        assert not c.brokers[leader].alive and c.brokers[leader].crashed
        new = await new_leader(c, leader)
        assert {
            o: v for o, v in (await read_all(c, new, max(acked))).items() if o in acked
        } == acked
        done = await both.invoke(compose._op("stop-kill", None))
        assert done["value"] == {"nodes": [f"n{leader}"]}, done
        assert c.brokers[leader].alive and not c.brokers[leader].crashed
        await c.wait_for(lambda: leader in isr(c, new), 60, "the old leader back in the ISR")
        both.close()
        return both.pairs

    pairs, c = run_sim(tmp_path, body)
    for real, sim in pairs:
        assert_alike(real, sim)
    assert any("crash broker" in line for line in c.trace)


def test_a_broker_whose_restart_failed_is_started_by_heal_all(tmp_path: Path) -> None:
    """A killed broker restarted while it cannot reach ZooKeeper fails to start, as a real
    broker exits at start-up; it is down, not forgotten: `heal_all` starts it again (a
    partition's only eligible replica left down would keep it offline to the end)."""

    async def body(c: SimCluster) -> dict[str, Any]:
        nem = SimNemesis(c, "partition,kill", {"seed": 5, "keys": [KEY]})
        await create_topic(c)
        killed = await nem.invoke(compose._op("start-kill", {"target": "one"}))
        victim = int(killed["value"]["nodes"][0][1:])
        others = [f"n{b}" for b in (1, 2, 3) if b != victim]
        c.partition({f"n{victim}": others, **{o: [f"n{victim}"] for o in others}})
        done = await nem.invoke(compose._op("stop-kill", None))
        assert "restart failed" in str(done.get("error")), done
        assert not c.brokers[victim].alive and c.brokers[victim].crashed
        healed = await nem.heal_all()
        assert c.brokers[victim].alive
        assert healed["kill"] == [f"n{victim}"], healed
        return healed

    run_sim(tmp_path, body)


def test_pause_the_leader_past_its_session_then_resume_it(tmp_path: Path) -> None:
    """SIGSTOP longer than the ZooKeeper session: the session expires, another broker leads;
    after SIGCONT the old leader finds its session gone, registers again and follows. A short
    pause changes nothing: same session, same leader."""

    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        both = Both(c, "pause", {"seed": 5, "keys": [KEY]})
        leader = await create_topic(c)
        acked = await produce(c, leader, 10, "p")
        # short: 2 s, below the session timeout and kazoo's read timeout (2/3 of it)
        sid = session_of(c, leader)
        states: list[str] = []
        c.server(leader).zk.zk.add_listener(states.append)
        done = await both.invoke(compose._op("start-pause", {"target": "leader", "key": KEY}))
        assert done["value"] == {"target": "leader", "nodes": [f"n{leader}"]}, done
        assert c.brokers[leader].paused
        await asyncio.sleep(2)
        done = await both.invoke(compose._op("stop-pause", None))
        assert done["value"] == {"nodes": [f"n{leader}"]}, done
        await asyncio.sleep(10)
        assert session_of(c, leader) == sid and c.leader_of(TP) == leader
        assert states == []  # kazoo never noticed: pings went out again before its timeout
        # long: past the session timeout
        start = loop.time()
        await both.invoke(compose._op("start-pause", {"target": "leader", "key": KEY}))
        held = c.brokers[leader].process.held  # type: ignore[union-attr]
        c.heal()  # the network's heal does not make a stopped process heard again
        new = await new_leader(c, leader)
        took = loop.time() - start
        assert SESSION_MS / 1000 <= took <= SESSION_MS / 1000 + 1.0, took
        assert len(held) > 0  # its fetch responses, timers: held, not run
        # the paused one still thinks it leads, at the old epoch (no two leaders per epoch)
        assert c.server(leader).replica_manager.partitions[TP].is_leader  # type: ignore[index]
        await both.invoke(compose._op("stop-pause", None))
        await c.wait_for(
            lambda: session_of(c, leader) not in (None, sid), 30, "a new session after resume"
        )
        await c.wait_for(
            lambda: (
                leader in isr(c, new)
                and not c.server(leader).replica_manager.partitions[TP].is_leader  # type: ignore[index]
            ),
            60,
            "the paused leader following, back in the ISR",
        )
        got = await read_all(c, new, max(acked))
        assert {o: v for o, v in got.items() if o in acked} == acked
        both.close()
        return both.pairs

    pairs, c = run_sim(tmp_path, body)
    for real, sim in pairs:
        assert_alike(real, sim)
    assert any(" pause broker " in line for line in c.trace)
    assert any(" resume broker " in line for line in c.trace)


def test_every_partition_shape_the_real_nemesis_draws(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        both = Both(c, "partition,partition-iptables", {"seed": 9, "keys": [KEY]})
        leader = await create_topic(c)
        shapes = [*compose.DEFAULT_SHAPES, "isolate-leader"]
        for shape in shapes:
            value = {"shape": shape, "key": KEY} if shape == "isolate-leader" else {"shape": shape}
            done = await both.invoke(compose._op("start-partition", value))
            if shape == "majorities-ring":
                assert "needs at least 4 nodes" in done["error"]
                continue
            g = done["value"]
            assert sorted(g) == ["n1", "n2", "n3"] and any(g.values()), done
            assert c.net.grudge == {a: bs for a, bs in g.items() if bs}
            if shape == "isolate-leader":
                assert g[f"n{leader}"] == sorted({"n1", "n2", "n3"} - {f"n{leader}"})
            await asyncio.sleep(3)
            done = await both.invoke(compose._op("stop-partition", None))
            assert done["value"] == {"n1": [], "n2": [], "n3": []}
            assert c.net.grudge == {}
        grudge = {"n1": ["n2"], "n2": ["n1"], "n3": []}
        done = await both.invoke(compose._op("start-partition-iptables", {"grudge": grudge}))
        assert done["value"] == grudge and c.net.grudge == {"n1": ["n2"], "n2": ["n1"]}
        healed = await both.sim.heal_all()
        assert healed == {"partition": {"n1": ["n2"], "n2": ["n1"]}}
        both.real.invoke(compose._op("stop-partition-iptables", None))
        both.close()
        return both.pairs

    pairs, _ = run_sim(tmp_path, body)
    for real, sim in pairs:
        assert_alike(real, sim)


def test_clock_bump_and_strobe_move_one_brokers_wall_clock_only(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        both = Both(c, "clock", {"seed": 3, "keys": [KEY]})
        await create_topic(c)

        def skew(broker: int) -> tuple[float, float]:
            process = c.brokers[broker].process
            assert process is not None
            wall = process.run(broker_clock.time) - EPOCH - loop.time()
            mono = process.run(broker_clock.monotonic) - loop.time()
            return round(wall, 6), mono

        value = {"mode": "bump", "target": "one", "delta_ms": -1500}
        done = await both.invoke(compose._op("start-clock", value))
        (node,) = done["value"]["offsets"]
        victim = int(node[1:])
        assert done["value"] == {"mode": "bump", "target": "one", "offsets": {node: -1.5}}
        assert skew(victim) == (-1.5, 0.0)
        assert all(skew(b) == (0.0, 0.0) for b in (1, 2, 3) if b != victim)
        await both.invoke(compose._op("start-clock", value))  # bumps add up
        assert skew(victim) == (-3.0, 0.0)
        # the offset outlives a restart (it is the node's, as the offset file is)
        c.crash(victim)
        await c.restart(victim)
        assert skew(victim) == (-3.0, 0.0)
        done = await both.invoke(compose._op("stop-clock", None))
        assert done["value"] == {
            "nodes": [node],
            "offsets": {"n1": 0.0, "n2": 0.0, "n3": 0.0},
        }
        assert skew(victim) == (0.0, 0.0)

        value = {"mode": "strobe", "target": "all", "delta_ms": 2000, "period_ms": 500}
        done = await both.invoke(compose._op("start-clock", value))
        assert done["value"] == {
            "mode": "strobe",
            "target": "all",
            "offsets": {"n1": 2.0, "n2": 2.0, "n3": 2.0},
            "period_ms": 500.0,
        }
        seen = [skew(2)[0]]  # high at once
        await asyncio.sleep(0.25)
        for _ in range(4):  # then sampled between flips
            seen.append(skew(2)[0])
            await asyncio.sleep(0.5)
        assert seen == [2.0, 2.0, 0.0, 2.0, 0.0]
        done = await both.invoke(compose._op("stop-clock", None))
        assert done["value"]["nodes"] == ["n1", "n2", "n3"]
        await asyncio.sleep(2)
        assert skew(2) == (0.0, 0.0)
        both.close()
        return both.pairs

    pairs, _ = run_sim(tmp_path, body)
    for real, sim in pairs:
        assert_alike(real, sim)


def test_power_loss_of_one_replica_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    """acks=all records are on the other replicas' disks (page cache survives there): the
    power-lost leader comes back with a log cut to what it had fsynced, truncates and
    fetches the rest, and nothing acknowledged is lost."""

    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        both = Both(c, "power", {"seed": 5, "keys": [KEY]})
        leader = await create_topic(c)
        acked = await produce(c, leader, 20, "w")
        done = await both.invoke(compose._op("start-power", {"target": "leader", "key": KEY}))
        summary = done["value"]["power_loss"][f"n{leader}"]
        assert done["value"]["nodes"] == [f"n{leader}"], done
        # the page cache of the power-lost machine is gone: its segment was never fsynced
        cut = re.fullmatch(
            rf"n{leader}: (\d+) file\(s\) cut back \((\d+) bytes\), (\d+) emptied, \d+ deleted",
            summary,
        )
        assert cut and (int(cut[2]) > 0 or int(cut[3]) > 0), summary
        new = await new_leader(c, leader)
        done = await both.invoke(compose._op("stop-power", None))
        assert done["value"] == {"nodes": [f"n{leader}"]}
        await c.wait_for(lambda: leader in isr(c, new), 60, "the power-lost broker in the ISR")
        assert {
            o: v for o, v in (await read_all(c, new, max(acked))).items() if o in acked
        } == acked
        # and it holds them all again (fetched back from the leader)
        await c.wait_for(
            lambda: (
                c.server(leader).replica_manager.partitions[TP].log.log_end_offset  # type: ignore[index]
                >= max(acked) + 1
            ),
            30,
            "the power-lost broker caught up",
        )
        both.close()
        return both.pairs

    pairs, c = run_sim(tmp_path, body)
    for real, sim in pairs:
        assert_alike(real, sim)
    assert any(" power loss broker " in line for line in c.trace)


def test_power_loss_of_a_single_replica_loses_what_was_only_in_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One replica, no flush policy (the page cache, as Kafka): the acknowledged records were
    never fsynced, so the journal says the segment has no synced byte and the power loss
    leaves it empty; the restarted broker leads without them (an invariant violation: a leader
    missing committed batches). The fsync system call is skipped
    under simulation but the journal is the same, so the model really applies. With
    flush.messages=1 every append is fsynced (journaled) and the same loss keeps them."""

    async def body(c: SimCluster, flush: dict[str, str]) -> tuple[int, int]:
        nem = SimNemesis(c, "power", {"seed": 1, "keys": [KEY]})
        leader = await create_topic(c, rf=1, configs=flush)
        acked = await produce(c, leader, 10, "u")
        done = await nem.invoke(compose._op("start-power", {"target": "leader", "key": KEY}))
        assert done["value"]["nodes"] == [f"n{leader}"], done
        await nem.invoke(compose._op("stop-power", None))
        await c.wait_for(lambda: c.leader_of(TP) == leader, 60, "the broker leading again")
        got = await read_all(c, leader)
        return len(acked), len(got)

    import os

    fsyncs: list[int] = []
    monkeypatch.setattr(os, "fsync", fsyncs.append)  # none may run: the seam skips them all
    from isrlab.harness.sim.invariants import InvariantViolation

    # the broker leads again without the ten committed records: the invariants say so
    with pytest.raises(
        InvariantViolation,
        match=r"broker \d leads at epoch \d+ with its log end at 0: the batches committed "
        r"before, up to offset 10, are not all on it",
    ):
        run_sim(tmp_path / "cache", lambda c: body(c, {}))
    (acked, got), _ = run_sim(tmp_path / "flushed", lambda c: body(c, {"flush.messages": "1"}))
    assert (acked, got) == (10, 10)
    assert fsyncs == []


def test_a_torn_power_loss_keeps_what_was_synced_and_sometimes_more(tmp_path: Path) -> None:
    """power-torn on one replica: with flush.messages=1 every acknowledged record was synced
    and survives whatever the tear; with the page cache the tear decides, seed by seed, whether
    the unsynced records survived (the broker leads with all ten) or not (the invariants
    report the leader without its committed batches), and a seed decides it the same way
    every time."""
    from isrlab.harness.sim.invariants import InvariantViolation

    async def body(c: SimCluster, flush: dict[str, str], seed: int) -> tuple[int, str]:
        nem = SimNemesis(c, "power-torn", {"seed": 1, "keys": [KEY]})
        leader = await create_topic(c, rf=1, configs=flush)
        acked = await produce(c, leader, 10, "t")
        value = {"target": "leader", "key": KEY, "torn_seed": seed}
        done = await nem.invoke(compose._op("start-power-torn", value))
        assert done["value"]["nodes"] == [f"n{leader}"], done
        assert done["value"]["torn_seed"] == seed
        summary = done["value"]["power_loss"][f"n{leader}"]
        assert "torn (seed " in summary, summary
        await nem.invoke(compose._op("stop-power-torn", None))
        await c.wait_for(lambda: c.leader_of(TP) == leader, 60, "the broker leading again")
        got = await read_all(c, leader)
        assert list(got.items()) == list(acked.items())[: len(got)], "a prefix of the acked"
        return len(got), summary

    def outcome(flush: dict[str, str], seed: int, name: str) -> tuple[int, str]:
        try:
            return run_sim(tmp_path / name, lambda c: body(c, flush, seed))[0]
        except InvariantViolation as e:
            assert "the batches committed before" in str(e), e
            return -1, str(e)

    for seed in range(4):
        assert outcome({"flush.messages": "1"}, seed, f"flushed-{seed}")[0] == 10
    cached = [outcome({}, seed, f"cache-{seed}")[0] for seed in range(8)]
    assert 10 in cached and -1 in cached, cached
    assert outcome({}, 0, "again-0")[0] == cached[0]


def test_a_failed_fsync_halts_the_leader_and_the_simulation_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush.messages=1 and EIO from every fsync of the leader's segments: the next produce's
    flush fails, the leader's log dir goes offline and it halts (`SimCluster._halt`: its
    process ends, the simulator goes on), another replica leads with every acknowledged record,
    and the halted broker, restarted with a working disk, catches up."""
    import errno
    import os

    from isrlab.broker.log import durable
    from tests.sim.test_cluster_on_sim import _open_files_under

    failing: dict[str, str | None] = {"dir": None}
    real = durable._fsync

    def eio(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if failing["dir"] is not None and path.startswith(failing["dir"]):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(durable, "_fsync", eio)

    async def body(c: SimCluster) -> None:
        leader = await create_topic(c, rf=3, configs={"flush.messages": "1"})
        acked = await produce(c, leader, 5, "f")
        failing["dir"] = os.path.realpath(c.brokers[leader].log_dirs[0])
        conn = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
        with pytest.raises(Exception):  # noqa: B017 - the connection ends as the broker halts
            await conn.request(produce_req(TP[0], build_batch([b"lost"]), acks=-1), 30)
        assert c.brokers[leader].crashed and not c.brokers[leader].alive
        assert any(f"broker {leader} halted (exit status 1)" in line for line in c.trace)
        # its process ended: the kernel closed its files (segments, index mappings, journal)
        await asyncio.sleep(0.001)
        assert _open_files_under(c.brokers[leader].data_dir) == 0
        new = await new_leader(c, leader)
        served = await read_all(c, new, max(acked))
        assert {o: v for o, v in served.items() if o in acked} == acked
        failing["dir"] = None
        await c.restart(leader)
        await c.wait_for(lambda: leader in isr(c, new), 60, "the halted broker back in the ISR")

    run_sim(tmp_path, body)


def test_unsupported_kinds_are_refused_by_name(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> None:
        for kinds in ("partition,power-zookeeper",):
            with pytest.raises(NemesisError, match="not supported in the simulator") as e:
                SimNemesis(c, kinds)
            assert kinds.split(",")[-1] in str(e.value)
        nem = SimNemesis(c, "kill")
        done = await nem.invoke(compose._op("start-pause", {"target": "one"}))
        assert done["error"] == "no fault handles 'start-pause' (kinds: kill)"

    run_sim(tmp_path, body)


def test_power_is_refused_without_the_fsync_journal(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> None:
        with pytest.raises(NemesisError, match="fsync journal"):
            SimNemesis(c, "power")

    run_sim(tmp_path, body, overrides={"isrlab.power.journal.enable": "false"})


def test_a_follower_back_from_a_power_loss_within_its_session_is_not_elected(
    tmp_path: Path,
) -> None:
    """A follower loses power and is started again before its ZooKeeper session has expired:
    the controller has not taken it out of the ISR yet (its old session still holds its
    registration), so for a moment the leader's ISR names a live broker whose log lost the
    committed records (the page cache it acknowledged them from is gone), as in ZooKeeper-era
    Kafka. The invariants trace it (isr-member-behind-hw) without calling it a violation; what
    would be one is that broker leading without them. The leader is killed at once: the
    other follower is elected, and every committed record is still on the leader."""

    async def body(c: SimCluster) -> tuple[int, int]:
        leader = await create_topic(c)
        await produce(c, leader, 10, "f")
        follower = min(b for b in (1, 2, 3) if b != leader)
        await c.wait_for(
            lambda: c.server(follower).replica_manager.partitions[TP].log.log_end_offset >= 10,  # type: ignore[index]
            10,
            "the follower caught up",
        )
        c.power_loss(follower)
        await asyncio.sleep(SESSION_MS / 1000 / 2)
        assert follower in isr(c)
        await c.restart(follower)
        await asyncio.sleep(0.01)
        c.crash(leader)
        await c.wait_for(lambda: c.leader_of(TP) not in (None, leader), 30, "a new leader")
        new = c.leader_of(TP)
        assert new is not None
        return new, c.server(new).replica_manager.partitions[TP].log.log_end_offset  # type: ignore[index]

    (_, leo), c = run_sim(tmp_path, body)
    assert any("isr-member-behind-hw" in line for line in c.trace)
    assert leo >= 10
    assert c.violation is None


# ----- a schedule ----------------------------------------------------------------------------

KINDS = "partition,kill,pause,clock,power"


def scheduled(tmp: Path, seed: int) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], str]:
    async def producer(c: SimCluster) -> None:
        """acks=all sends to whoever leads now, one every half second; failures noted."""
        i = 0
        while True:
            await asyncio.sleep(0.5)
            leader = c.leader_of(TP)
            if leader is None:
                continue
            conn = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
            try:
                r = await conn.request(produce_req(TP[0], build_batch([b"s%d" % i]), acks=-1), 5)
                p = r.responses[0].partition_responses[0]
                c.note(f"test: produce s{i} to {leader}: error {p.error_code} at {p.base_offset}")
            except Exception as e:
                c.note(f"test: produce s{i} to {leader}: {type(e).__name__}")
            finally:
                conn.close()
            i += 1

    async def body(c: SimCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        both = Both(c, KINDS, {"seed": seed, "keys": [KEY]})
        await create_topic(c)
        sending = asyncio.get_running_loop().create_task(producer(c))
        ops = compose.schedule(KINDS, 8.0, seed, keys=[KEY])
        for _ in range(40):
            op = next(ops)
            if op["type"] == "sleep":
                await asyncio.sleep(op["value"])
            else:
                await both.invoke(op)
        for op in compose.final_ops(KINDS):
            await both.invoke(op)
        healed = await both.sim.heal_all()
        c.note(f"healed {healed}")
        await c.wait_for(lambda: len(isr(c)) == 3, 60, "the full ISR after the heal")
        await asyncio.sleep(10)
        sending.cancel()
        both.close()
        return both.pairs

    pairs, c = run_sim(tmp, body, seed=seed)
    return pairs, "\n".join(c.trace)


def test_a_schedule_from_one_seed_gives_a_byte_identical_trace(tmp_path: Path) -> None:
    pairs, one = scheduled(tmp_path / "1", 3)
    _, two = scheduled(tmp_path / "2", 3)
    assert one.encode() == two.encode()
    for real, sim in pairs:
        assert_alike(real, sim)
    started = {sim["f"] for _, sim in pairs if sim["f"].startswith("start-")}
    assert len(started) >= 4, started
    errors = [sim for _, sim in pairs if "error" in sim]
    assert all("majorities-ring needs at least 4 nodes" in e["error"] for e in errors), errors
    assert " nemesis " in one
    acked = [line for line in one.splitlines() if ": error 0 at " in line]
    assert len(acked) > 50, len(acked)  # the cluster served writes between the faults


def test_under_simulation_fsync_is_skipped_and_the_journal_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seam (`durable.skip_fsync`): the same file operations journaled with and without
    the fsync system calls give byte-identical journals; with it set, os.fsync is never
    called; unset (the default) it is, as before."""
    import contextvars
    import os

    from isrlab.broker.log import durable

    calls: list[int] = []
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)

    def work(root: Path) -> bytes:
        durable.attach(root)
        try:
            (root / "p-0").mkdir()
            seg = root / "p-0" / "0.log"
            with open(seg, "wb") as f:
                f.write(b"abc")
                f.flush()
                durable.fsync_fd(f.fileno(), seg)
                f.write(b"def")
            durable.fsync_dir(root / "p-0")
            durable.write_atomically(root / "p-0" / "cp", b"checkpoint")
            durable.unlink(root / "p-0" / "cp")
        finally:
            durable.detach(root)
        return (root / durable.JOURNAL_NAME).read_bytes()

    (tmp_path / "real").mkdir()
    (tmp_path / "sim").mkdir()
    real = work(tmp_path / "real")
    assert len(calls) > 5
    calls.clear()
    ctx = contextvars.copy_context()
    ctx.run(durable.skip_fsync.set, True)
    sim = ctx.run(work, tmp_path / "sim")
    assert calls == []
    assert sim == real and b'["S","p-0/0.log",3]' in sim
    assert durable.apply_power_loss(tmp_path / "sim").truncated == [("p-0/0.log", 6, 3)]
