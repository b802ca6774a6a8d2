"""Port cuts on the simulated network (the shape of the iptables rules of ``late-produce`` and
``lagging-failover --lagging-how cut``) and the two nemesis kinds on the simulator.

The network: a segment a port rule drops is held as the sender's kernel holds an
unacknowledged one and arrives, in order with the rest of its stream, at the first
retransmission (Linux's backoff) after the rule is gone; a cut that outlasts the
retransmissions ends the connection (ETIMEDOUT, then a reset for the peer); other ports and
the other direction of a one-way rule are untouched; a ``--syn`` rule stops new connections
only. The nemesis: ``late-produce`` finds ``transaction.partition.verification.enable=false``
(G1a) on its seed and not with verification on, and one seed gives one history."""

from __future__ import annotations

import asyncio
import errno
import hashlib
from pathlib import Path
from typing import Any

from isrlab.harness.sim import clock
from isrlab.harness.sim.cli import refusals, replay_command
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.nemesis import SimNemesis, _split
from isrlab.harness.sim.network import RETRANSMIT_TIMEOUT, SimNetwork, retransmissions
from isrlab.harness.sim.run import broker_overrides, create_topics, sim_test, simulate_queue
from isrlab.harness.testconfig import TestConfig
from isrlab.nemeses import compose
from tests.sim.test_network import now, pair, run


def test_retransmissions_follow_linux_backoff_and_end_at_the_timeout() -> None:
    at = retransmissions()
    assert at[:7] == (0.2, 0.6, 1.4, 3.0, 6.2, 12.6, 25.4)
    assert len(at) == 15 and at[-1] == 804.6  # tcp_retries2=15, RTO capped at 120 s
    assert at[-1] + 120 == RETRANSMIT_TIMEOUT


def test_held_segments_arrive_late_in_order_after_a_short_cut_other_port_unaffected() -> None:
    """One-way rule a -> b:9092 for 5 s: what a writes meanwhile arrives at b at a's first
    retransmission after the rule went (6.2 s after the first held segment), in order with what
    a wrote after the cut; b's answers reach a during the cut; b:9093 is not cut."""

    async def body(net: SimNetwork) -> dict[str, Any]:
        (cr, cw), (sr, sw) = await pair(net, port=9092)
        (_, ow), (orr, _) = await pair(net, port=9093)
        cut = net.cut_port("b", 9092, {"a"})
        t0 = now()
        for part in (b"1", b"2", b"3"):
            cw.write(part)
            ow.write(part)
            await asyncio.sleep(0.5)
        other = await asyncio.wait_for(orr.readexactly(3), 0.1)  # the other port: at once
        sw.write(b"answer")
        answer = await asyncio.wait_for(cr.readexactly(6), 0.1)  # b -> a is not cut
        early = asyncio.create_task(sr.read(100))
        await asyncio.sleep(5 - (now() - t0))
        assert not early.done()  # nothing of a's got through during the cut
        net.uncut_port(cut)
        cw.write(b"4")  # written after the rule went: still behind the held ones
        got = await early
        arrived = now() - t0
        got += await asyncio.wait_for(sr.readexactly(4 - len(got)), 0.1)
        return {"other": other, "answer": answer, "got": got, "arrived": arrived, "net": net}

    out = run(body)
    assert out["other"] == b"123" and out["answer"] == b"answer"
    assert out["got"] == b"1234"
    assert 6.2 <= out["arrived"] <= 6.2 + 0.01, out["arrived"]
    assert out["net"].stats["held"] >= 3


def test_a_cut_longer_than_the_retransmissions_times_out_and_the_peer_is_reset() -> None:
    """The sender gives up at the retransmission timeout (ETIMEDOUT, held bytes never
    delivered); once the rule is gone, the peer's next segment is answered with a reset."""

    async def body(net: SimNetwork) -> dict[str, Any]:
        (cr, cw), (sr, sw) = await pair(net)
        cut = net.cut_port("b", 9092, {"a"})
        t0 = now()
        cw.write(b"lost")
        try:
            await cr.read(100)
            client_error: BaseException | None = None
        except OSError as e:
            client_error = e
        gave_up = now() - t0
        await asyncio.sleep(100)
        net.uncut_port(cut)
        sw.write(b"hello?")
        try:
            got = await sr.read(100)
            server_error: BaseException | None = None
        except OSError as e:
            got, server_error = b"", e
        return {"client": client_error, "at": gave_up, "server": server_error, "got": got}

    out = run(body)
    assert isinstance(out["client"], TimeoutError) and out["client"].errno == errno.ETIMEDOUT
    assert abs(out["at"] - RETRANSMIT_TIMEOUT) < 0.01, out["at"]
    assert isinstance(out["server"], ConnectionResetError), out
    assert out["got"] == b""


def test_both_ways_drops_the_answers_and_syn_only_stops_new_connections_only() -> None:
    """``both_ways``: b's answers on a's connection are held too (lagging-failover's cut); a
    ``syn_only`` rule lets an open connection carry on while a new connect gets no answer."""

    async def body(net: SimNetwork) -> dict[str, Any]:
        (cr, cw), (sr, sw) = await pair(net)
        cut = net.cut_port("b", 9092, {"a"}, both_ways=True)
        t0 = now()
        sw.write(b"answer")
        reply = asyncio.create_task(cr.readexactly(6))
        await asyncio.sleep(2)
        held = not reply.done()
        net.uncut_port(cut)
        await reply
        answered = now() - t0  # b's retransmission at 3.0 s
        syn = net.cut_port("b", 9092, {"a"}, syn_only=True)
        cw.write(b"still")
        through = await asyncio.wait_for(sr.readexactly(5), 0.1)
        connect = asyncio.create_task(net.host("a").connect("b", 9092))
        await asyncio.sleep(5)
        blocked = not connect.done()
        net.uncut_port(syn)
        await connect  # the SYN sent again at 7 s gets through
        return {"held": held, "answered": answered, "through": through, "blocked": blocked}

    out = run(body)
    assert out["held"] and 3.0 <= out["answered"] <= 3.01, out
    assert out["through"] == b"still" and out["blocked"]


def test_no_port_rule_no_change_a_partition_still_black_holes() -> None:
    """A port rule on another host does not touch a connection; a partition still makes a
    black hole of a connection that sends into it (the old model, kept for partitions)."""

    async def body(net: SimNetwork) -> tuple[bytes, bool]:
        (_, cw), (sr, _) = await pair(net)
        net.cut_port("c", 9092, {"a"})
        cw.write(b"x")
        got = await asyncio.wait_for(sr.readexactly(1), 0.1)
        net.partition({"a": ["b"]})
        cw.write(b"y")
        await asyncio.sleep(1)
        net.heal()
        late = asyncio.create_task(sr.read(1))
        await asyncio.sleep(60)
        return got, late.done()

    got, done = run(body)
    assert got == b"x" and not done


# ----- the nemesis kinds ---------------------------------------------------------------------

KEYS = ["t0/0", "t1/0", "t2/0"]


def _late_produce(tmp: Path, verification: bool) -> dict[str, Any]:
    """A committed transaction, then late-produce on a key whose leader is not the producer's
    transaction coordinator while the producer's next transaction sends to it (op_timeout 3 s:
    it times out and aborts; the hold is 5.5 s, the retransmission of the held Produce 6.2 s
    after it was sent, inside the 3-s SYN-only release), then a third transaction on the key
    once the strike is over, then everything read_committed."""
    rc = sim_test(
        {
            "seed": 1,
            "txn": True,
            "isolation_level": "read_committed",
            "keys": KEYS,
            "op_timeout_ms": 3000,
            "txn_verification": verification,
        }
    )

    async def main() -> dict[str, Any]:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(loop, tmp, 3, seed=1, overrides=broker_overrides(rc))
        async with cluster:
            await create_topics(cluster, KEYS, 3, 2)
            hosts = [b.host for b in cluster.brokers.values()]
            producer = await SimQueueClient.factory(rc, cluster.net, hosts)(0, 0).open()
            nem = SimNemesis(cluster, "late-produce", rc)
            coordinator = nem.targets.txn_coordinator(rc["transactional_ids"][0])
            key = next(k for k in KEYS if nem.targets.leader_of(*_split(k)) != coordinator)
            done = [await producer.invoke({"f": "txn", "value": [["send", key, 1]]})]
            strike = loop.create_task(nem.invoke(compose._op("start-late-produce", {"key": key})))
            await asyncio.sleep(0)
            done.append(await producer.invoke({"f": "txn", "value": [["send", key, 2]]}))
            start = await strike
            done.append(await producer.invoke({"f": "txn", "value": [["send", key, 3]]}))
            reader = await SimQueueClient(rc, cluster.net.host("r1"), hosts, 1).open()
            await reader.invoke({"f": "assign", "value": [key]})
            read: list[int] = []
            for _ in range(20):
                got = await reader.invoke({"f": "poll", "value": [["poll"]], "_poll_ms": 200})
                read += [v for _, v in got["value"][0][1].get(key, [])]
            nem.close()
            return {"done": done, "start": start, "read": read, "trace": cluster.trace}

    return clock.run(main())


def test_late_produce_finds_no_verification_g1a_and_verification_refuses_the_late_batch(
    tmp_path: Path,
) -> None:
    """Without KIP-890 verification the held Produce of the aborted transaction is appended
    after its abort marker and committed by the producer's next transaction: a read_committed
    reader reads the aborted record (G1a). With verification (the default) it is refused."""
    off = _late_produce(tmp_path / "off", verification=False)
    on = _late_produce(tmp_path / "on", verification=True)
    for out in (off, on):
        assert [d["type"] for d in out["done"]] == ["ok", "fail", "ok"], out["done"]
        v = out["start"]["value"]
        assert "error" not in v and v["held_s"] == 5.5 and v["released_s"] == 3.0, v
        late = [ln for ln in out["trace"] if " late " in ln and f"->{v['leader']}:9092" in ln]
        assert late, "no held segment was delivered late"
    assert off["read"] == [1, 2, 3], off["read"]  # 2 was aborted: G1a
    assert on["read"] == [1, 3], on["read"]


def test_lagging_failover_cut_holds_the_followers_fetches_then_kills_the_leader(
    tmp_path: Path,
) -> None:
    """``how: cut``: the in-sync followers' connections to the leader's broker port dropped
    both ways (their fetches held, the followers running), ``lag_ms``, the leader killed,
    the rule removed; a follower leads next; ``stop`` starts the leader again."""
    test = sim_test({"seed": 2, "keys": ["t0/0"]})

    async def main() -> dict[str, Any]:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(loop, tmp_path, 3, seed=2, overrides=broker_overrides(test))
        async with cluster:
            await create_topics(cluster, ["t0/0"], 3, 2)
            nem = SimNemesis(cluster, "lagging-failover", test)
            value = {"key": "t0/0", "lag_ms": 1000, "how": "cut"}
            start = await nem.invoke(compose._op("start-lagging-failover", value))
            rules_after = cluster.net.port_cuts
            paused = [b.host for b in cluster.brokers.values() if b.paused]
            leader = start["value"]["leader"]
            await cluster.wait_for(
                lambda: nem.targets.leader_of("t0", 0) not in (None, leader), 60, "a new leader"
            )
            new_leader = nem.targets.leader_of("t0", 0)
            stop = await nem.invoke(compose._op("stop-lagging-failover", None))
            alive = sorted(b.host for b in cluster.live())
            nem.close()
            return {
                "start": start,
                "rules": rules_after,
                "paused": paused,
                "new": new_leader,
                "stop": stop,
                "alive": alive,
                "trace": cluster.trace,
            }

    out = clock.run(main())
    v = out["start"]["value"]
    assert v["how"] == "cut" and v["lag_ms"] == 1000 and v["leader"], v
    assert sorted(v["followers"]) == sorted(v["cut"]) and len(v["followers"]) == 2
    assert out["rules"] == [] and out["paused"] == []
    assert out["new"] in v["followers"]
    assert out["stop"]["value"] == {"nodes": [v["leader"]]}
    assert out["alive"] == ["n1", "n2", "n3"]
    # the held segments: on the followers' connections to the leader's port, either way
    held = [ln.split()[2] for ln in out["trace"] if " hold " in ln]
    ends = {tuple(sorted(h.split(":")[0] for h in c.split("->"))) for c in held}
    assert held and all(f"{v['leader']}:9092" in c for c in held), held
    assert ends == {tuple(sorted([v["leader"], f])) for f in v["followers"]}, held


def test_one_late_produce_seed_one_history(tmp_path: Path) -> None:
    """A short late-produce run with transactions, twice: the same history, byte for byte,
    with a strike that held segments and delivered them late."""
    over = {
        "seed": 2,
        "txn": True,
        "isolation_level": "read_committed",
        "nemesis": "late-produce",
        "nemesis_interval": 2,
        "op_timeout_ms": 3000,
        "concurrency": 2,
        "rate": 10,
        "key_count": 3,
        "time_limit": 8,
        "recovery_time": 1,
        "final_time_limit": 4,
    }
    shas = []
    for i in range(2):
        run_dir, _ = simulate_queue(over, tmp_path / str(i), check_invariants=False, report=False)
        history = (run_dir / "history.jsonl").read_bytes()
        assert b'"f":"start-late-produce"' in history and b'"held_s":5.5' in history
        assert " late " in (run_dir / "trace.txt").read_text()
        shas.append(hashlib.sha256(history).hexdigest())
    assert shas[0] == shas[1]


def test_isrlab_sim_takes_the_two_kinds_and_lagging_how() -> None:
    """`isrlab sim --nemesis late-produce+lagging-failover --lagging-how cut` is not refused
    (it was: their cuts had no model), and a failing seed's replay keeps ``--lagging-how``."""
    values: dict[str, Any] = {
        "nemesis": ["late-produce", "lagging-failover"],
        "lagging_how": ["cut"],
        "txn": True,
        "isolation_level": "read_committed",
    }
    assert refusals(values, TestConfig.from_mapping(values)) == []
    assert "--lagging-how cut" in replay_command(3, values, {})
    zk_power = {"nemesis": ["power-zookeeper"]}
    assert refusals(zk_power, TestConfig.from_mapping(zk_power))  # still refused: no model
