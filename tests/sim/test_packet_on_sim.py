"""The ``packet`` nemesis on the simulator: netem qdiscs on the simulated network
(`SimNetwork.netem`, harness/sim/netem.py) and the ``start-packet`` / ``stop-packet`` ops.

The model's promises: a delay shows as one-way latency on the qdisc's host's egress only; a
lost, corrupted, duplicated or reordered packet never shows as a gap, a duplicate or a
reordering in the bytes (TCP's retransmissions and reassembly), only as time (fast retransmit
or the RTO, doubling); a packet lost at every retransmission ends its connection with
ETIMEDOUT as a black hole does; a lost SYN is retried on Linux's SYN schedule; no qdisc, no
draw from the seed; one seed, one trace."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from isrlab.harness.sim.cli import SIM_DEFAULTS, refusals
from isrlab.harness.sim.netem import PACKET, Netem, parse_percent, parse_time
from isrlab.harness.sim.network import RETRANSMIT_TIMEOUT, RTO_MIN, SYN_TIMEOUT, SimNetwork
from isrlab.harness.sim.run import simulate_queue
from isrlab.harness.testconfig import TestConfig
from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.packet import DEFAULT_BEHAVIOUR
from tests.sim.test_network import pair as _pair
from tests.sim.test_network import run


async def pair(net: SimNetwork, a: str = "a", b: str = "b", port: int = 9092) -> list[Any]:
    """test_network's connection, its server side buffering up to 4 MiB (these tests write
    more than a reader would buffer by default before reading)."""
    return await _pair(net, a, b, port, limit=1 << 22)


def now() -> float:
    return asyncio.get_running_loop().time()


async def stream(
    net: SimNetwork, writes: int, size: int, gap: float, port: int = 9092
) -> tuple[bytes, bytes, list[float]]:
    """`writes` writes of `size` bytes from a to b, `gap` s apart (each write its own
    bytes): what was sent, what b read, and each write's latency (sent to fully read)."""
    (_, w), (r, _) = await pair(net, port=port)
    sent_at: list[float] = []
    chunks = [bytes([k % 251]) * size for k in range(writes)]

    async def writer() -> None:
        for chunk in chunks:
            sent_at.append(now())
            w.write(chunk)
            await asyncio.sleep(gap)

    task = asyncio.create_task(writer())
    got, latencies = b"", []
    for k in range(writes):
        got += await r.readexactly(size)
        latencies.append(now() - sent_at[k])
    await task
    return b"".join(chunks), got, latencies


# ----- parsing: the real nemesis's rules ---------------------------------------------------


def test_behaviours_parse_as_tc_reads_them_and_the_real_nemesis_refuses_the_same() -> None:
    q = Netem.parse({"delay": "50ms", "jitter": "10ms", "loss": "20%", "corrupt": "1"})
    assert (q.delay, q.jitter, q.loss, q.corrupt) == pytest.approx((0.05, 0.01, 0.2, 0.01))
    assert Netem.parse({"reorder": "25%"}).delay == pytest.approx(0.01)  # netem_args' 10 ms
    assert Netem.parse(DEFAULT_BEHAVIOUR).jitter == pytest.approx(0.01)
    assert parse_time("300") == pytest.approx(300e-6)  # tc: a bare number is microseconds
    assert parse_time("1.5s") == 1.5 and parse_percent("7") == pytest.approx(0.07)
    for bad, said in (
        ({"bogus": "1"}, "unknown netem behaviour"),
        ({}, "empty netem behaviour"),
        ({"rate": "1mbit"}, "rate is not modelled"),
        ({"loss": "20% 25%"}, "correlations are not modelled"),
        ({"loss": "120%"}, "not a percentage"),
        ({"delay": "fast"}, "not a time"),
    ):
        with pytest.raises(NemesisError, match=said):
            Netem.parse(bad)


# ----- the model on SimNetwork ---------------------------------------------------------------


def test_a_delay_adds_its_latency_on_the_hosts_egress_only_and_clearing_restores_it() -> None:
    async def body(net: SimNetwork) -> dict[str, list[float]]:
        (ar, aw), (br, bw) = await pair(net)
        out: dict[str, list[float]] = {"a->b": [], "b->a": [], "cleared": []}
        net.netem("a", {"delay": "50ms"})
        for _ in range(20):
            for way, w, r in (("a->b", aw, br), ("b->a", bw, ar)):
                start = now()
                w.write(b"x")
                await r.readexactly(1)
                out[way].append(now() - start)
        assert net.clear_netem() == ["a"] and net.clear_netem() == []
        for _ in range(20):
            start = now()
            aw.write(b"z")
            await br.readexactly(1)
            out["cleared"].append(now() - start)
        return out

    out = run(body)
    lo, hi = 0.0002, 0.002  # SimNetwork's base latency
    assert all(0.05 + lo <= t <= 0.05 + hi + 1e-9 for t in out["a->b"]), out["a->b"]
    assert all(lo <= t <= hi + 1e-9 for t in out["b->a"]), out["b->a"]  # b has no qdisc
    assert all(lo <= t <= hi + 1e-9 for t in out["cleared"]), out["cleared"]


def test_a_delay_with_jitter_spreads_the_latency_around_the_delay() -> None:
    async def body(net: SimNetwork) -> list[float]:
        net.netem("a", {"delay": "50ms", "jitter": "10ms"})
        _, _, latencies = await stream(net, 200, 100, 0.2)
        return latencies

    latencies = run(body)
    mean = sum(latencies) / len(latencies)
    assert 0.045 < mean < 0.056, mean
    assert min(latencies) < 0.04 and max(latencies) > 0.062  # a spread, not a constant


def test_loss_loses_no_byte_keeps_order_and_costs_retransmission_time() -> None:
    """20% loss per packet: every byte arrives once and in order, but some writes wait for a
    retransmission: the RTO (>= 200 ms) or, in a segment with three packets after the lost
    one through, a fast retransmit one round trip later."""

    async def body(net: SimNetwork) -> tuple[bytes, bytes, list[float], dict[str, int]]:
        net.netem("a", {"loss": "20%"})
        small = await stream(net, 150, 100, 0.5)  # one packet a write
        big = await stream(net, 40, 20 * PACKET, 1.0, port=2)  # 20 packets a write
        return small[0] + big[0], small[1] + big[1], small[2] + big[2], dict(net.stats)

    sent, got, latencies, stats = run(body)
    assert got == sent  # no byte lost, duplicated or out of order
    slow = [t for t in latencies if t >= RTO_MIN]
    assert 15 <= len(slow) <= 60, sorted(latencies)[-70:]  # ~20% of the small writes, +
    assert max(latencies) >= 3 * RTO_MIN  # a packet lost twice: the RTO doubled
    assert stats["netem_retransmit"] > 0 and stats["netem_fast_retransmit"] > 0, stats
    # a fast retransmit is quicker than an RTO: big writes lost only once mostly cost < 200 ms
    assert min(latencies[150:]) < RTO_MIN


def test_total_loss_ends_the_connection_with_etimedout_as_a_black_hole() -> None:
    async def body(net: SimNetwork) -> tuple[float, int | None, float, int | None]:
        (cr, cw), _ = await pair(net)
        net.netem("a", {"loss": "100%"})
        start = now()
        cw.write(b"never")
        with pytest.raises(TimeoutError) as e:
            await cr.read(1)  # the sender gives up after its retransmissions
        took = now() - start
        # and a connect through the qdisc: every SYN lost, ETIMEDOUT at the SYN timeout
        await net.host("b").listen("", 2)
        start = now()
        with pytest.raises(TimeoutError) as e2:
            await net.host("a").connect("b", 2)
        return took, e.value.errno, now() - start, e2.value.errno

    took, err, syn_took, syn_err = run(body)
    assert err == errno.ETIMEDOUT and took == pytest.approx(RETRANSMIT_TIMEOUT, abs=1e-6)
    assert syn_err == errno.ETIMEDOUT and syn_took == pytest.approx(SYN_TIMEOUT, abs=0.01)


def test_a_give_up_loses_what_waited_behind_and_the_peer_is_reset_when_it_sends() -> None:
    """The sender gives up with segments queued behind the lost one: none of them arrives
    (no gap is ever delivered), and the peer, which heard nothing, gets a reset when it
    sends to the forgotten socket (as after a port cut's give-up)."""

    async def body(net: SimNetwork) -> tuple[bytes, str, int]:
        (cr, cw), (sr, sw) = await pair(net)
        cw.write(b"first ")
        got = await sr.readexactly(6)
        net.netem("a", {"loss": "100%"})
        for k in range(5):
            cw.write(b"queued %d " % k)
        await asyncio.sleep(60)
        net.clear_netem()  # the qdisc gone: the next retransmission would get through ...
        net.netem("a", {"loss": "100%"})  # ... but it is back before it
        with pytest.raises(TimeoutError):
            await cr.read(1)
        net.clear_netem()
        sw.write(b"answer")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(sr.read(100), 5)
        return got, "closed" if cw.is_closing() else "open", len(net._connections)

    got, state, left = run(body)
    assert got == b"first " and state == "closed" and left == 0


def test_total_loss_for_a_while_delays_the_bytes_to_the_next_retransmission() -> None:
    """A qdisc cleared while a packet waits for its retransmission: the retransmission after
    the clear gets through (Linux's backoff from the first send: 0.2, 0.6, 1.4, 3.0, 6.2,
    12.6 s ...), the connection lives on."""

    async def body(net: SimNetwork) -> tuple[float, bytes]:
        (_, cw), (sr, _) = await pair(net)
        net.netem("a", {"loss": "100%"})
        start = now()
        cw.write(b"late")
        cw.write(b" but whole")
        await asyncio.sleep(10)
        net.clear_netem("a")
        got = await sr.readexactly(14)
        return now() - start, got

    took, got = run(body)
    assert got == b"late but whole"
    assert 12.6 < took < 12.8, took  # the retransmission at 12.6 s (RTO = 0.2 s + round trip)


def test_a_lost_syn_is_retried_on_the_syn_schedule() -> None:
    async def body(net: SimNetwork) -> list[float]:
        await net.host("b").listen("", 1, backlog=100)
        net.netem("a", {"loss": "50%"})
        took = []
        for _ in range(30):
            start = now()
            await net.host("a").connect("b", 1)
            took.append(now() - start)
        return took

    took = run(body)
    assert any(t < 0.01 for t in took) and any(1 <= t < 1.01 for t in took), took
    assert all(t < 0.01 or 1 <= t < 1.01 or 3 <= t < 3.01 or t >= 7 for t in took), took


def test_duplicates_change_nothing_in_the_bytes_or_their_timing() -> None:
    async def body(net: SimNetwork) -> tuple[bytes, bytes, list[float], int]:
        net.netem("a", {"duplicate": "50%"})
        sent, got, latencies = await stream(net, 100, 3 * PACKET, 0.05)
        return sent, got, latencies, net.stats["netem_duplicate"]

    sent, got, latencies, dups = run(body)
    assert got == sent and dups > 50
    assert max(latencies) < 0.01


def test_reordered_packets_skip_the_delay_and_tcp_keeps_the_order() -> None:
    async def body(net: SimNetwork) -> tuple[bytes, bytes, list[float], int]:
        net.netem("a", {"delay": "20ms", "reorder": "25%"})
        sent, got, latencies = await stream(net, 200, 100, 0.03)
        return sent, got, latencies, net.stats["netem_reorder"]

    sent, got, latencies, reordered = run(body)
    assert got == sent and 25 < reordered < 80
    assert min(latencies) < 0.005 and max(latencies) > 0.02  # some went at once, in order


def test_a_corrupted_packet_is_a_lost_one_retransmitted() -> None:
    async def body(net: SimNetwork) -> tuple[bytes, bytes, list[float], dict[str, int]]:
        net.netem("a", {"corrupt": "30%"})
        sent, got, latencies = await stream(net, 50, 100, 0.5)
        return sent, got, latencies, dict(net.stats)

    sent, got, latencies, stats = run(body)
    assert got == sent and stats["netem_corrupt"] > 5 and stats["netem_retransmit"] > 5
    assert max(latencies) >= RTO_MIN


def _trace(seed: int, setup: Callable[[SimNetwork], None] | None = None) -> tuple[str, Any]:
    lines: list[str] = []

    async def body(net: SimNetwork) -> Any:
        if setup is not None:
            setup(net)
        await stream(net, 30, 5000, 0.1)
        await stream(net, 30, 100, 0.1, port=2)
        return net.rng.getstate()

    state = run(body, seed=seed, on_event=lines.append)
    return "\n".join(ln for ln in lines if "netem" not in ln) + "\n", state


def test_no_qdisc_no_draw_and_one_seed_one_trace() -> None:
    """A qdisc on a host that sends nothing, or one set and cleared before the traffic,
    leaves the seed's draws and the trace as they are without one; with a qdisc on the
    sender, one seed gives one trace, another seed another."""
    plain, state = _trace(5)
    for setup in (
        lambda net: net.netem("c", {"loss": "50%", "delay": "5ms"}),
        lambda net: (net.netem("a", {"loss": "50%"}), net.clear_netem()),
    ):
        assert _trace(5, setup) == (plain, state)
    lossy = _trace(5, lambda net: net.netem("a", {"loss": "20%", "delay": "5ms", "jitter": "2ms"}))
    assert lossy == _trace(
        5, lambda net: net.netem("a", Netem.parse({"loss": "20%", "delay": "5ms", "jitter": "2ms"}))
    )
    assert lossy[0] != plain and lossy[1] != state
    other = _trace(6, lambda net: net.netem("a", {"loss": "20%", "delay": "5ms", "jitter": "2ms"}))
    assert other[0] != lossy[0]


# ----- the nemesis ----------------------------------------------------------------------------


SHORT = {
    "nemesis": "packet",
    "nemesis_interval": 3,
    "concurrency": 3,
    "rate": 20,
    "key_count": 3,
    "time_limit": 12,
    "recovery_time": 2,
    "final_time_limit": 10,
}


def _run(tmp: Path, over: dict[str, Any], schedule: Any = None) -> tuple[Path, dict[str, Any]]:
    return simulate_queue(over, tmp, report=False, nemesis_schedule=schedule)


def test_packet_nemesis_start_and_stop_have_the_real_faults_shape(tmp_path: Path) -> None:
    schedule = [
        (1_000_000_000, {"f": "start-packet", "value": None}),
        (3_000_000_000, {"f": "stop-packet"}),
        (
            4_000_000_000,
            {"f": "start-packet", "value": {"target": "one", "behaviour": {"loss": "20%"}}},
        ),
        (6_000_000_000, {"f": "stop-packet"}),
        (7_000_000_000, {"f": "start-packet", "value": {"behaviour": {"rate": "1mbit"}}}),
    ]
    run_dir, results = _run(tmp_path, {**SHORT, "seed": 1}, schedule)
    assert results["valid"] is True, results

    nemesis = [
        json.loads(ln)
        for ln in (run_dir / "history.jsonl").read_text().splitlines()
        if '"process":"nemesis"' in ln
    ]
    done = nemesis[1::2]  # each op's invocation, then its completion
    by_f = [(d["f"], d.get("value"), d.get("error")) for d in done]
    assert by_f[0] == (
        "start-packet",
        {"target": "all", "nodes": ["n1", "n2", "n3"], "behaviour": DEFAULT_BEHAVIOUR},
        None,
    ), by_f
    assert by_f[1] == ("stop-packet", {"nodes": ["n1", "n2", "n3"]}, None)
    f, v, _ = by_f[2]
    assert f == "start-packet" and v["target"] == "one" and len(v["nodes"]) == 1, by_f
    assert by_f[3] == ("stop-packet", {"nodes": v["nodes"]}, None)
    assert by_f[4][0] == "start-packet" and "rate is not modelled" in by_f[4][2], by_f
    trace = (run_dir / "trace.txt").read_text()
    assert "net netem n1 {'delay': '50ms', 'jitter': '10ms'}" in trace


def test_heal_all_clears_every_qdisc_and_names_the_nodes(tmp_path: Path) -> None:
    from isrlab.harness.sim.nemesis import SimNemesis
    from isrlab.nemeses import compose
    from tests.sim.test_nemesis_on_sim import run_sim

    async def body(c: Any) -> list[Any]:
        nem = SimNemesis(c, "packet", {"seed": 3})
        one = await nem.invoke(compose._op("start-packet", {"target": "minority"}))
        qdiscs = sorted(c.net.qdiscs)
        healed = await nem.heal_all()
        again = await nem.heal_all()
        nem.close()
        return [one["value"], qdiscs, healed, again, c.net.qdiscs]

    (one, qdiscs, healed, again, left), _ = run_sim(tmp_path, body)
    assert one["target"] == "minority" and len(one["nodes"]) == 1 and qdiscs == one["nodes"]
    assert one["behaviour"] == DEFAULT_BEHAVIOUR
    assert healed == {"packet": one["nodes"]} and again == {} and left == {}


def test_isrlab_sim_packet_is_valid_and_deterministic_on_its_own_schedule(
    tmp_path: Path,
) -> None:
    """`isrlab sim --nemesis packet` is not refused any more; short runs of seeds 1 and 2
    with the schedule's own behaviours are valid, and seed 1 twice is one history."""
    packet = {"nemesis": ["packet"]}
    assert refusals(packet, TestConfig.from_mapping(packet)) == []
    shas = {}
    for seed in (1, 2):
        for i in range(1 if seed == 2 else 2):
            run_dir, results = _run(tmp_path / f"{seed}-{i}", {**SHORT, "seed": seed})
            assert results["valid"] is True, (seed, results)
            history = (run_dir / "history.jsonl").read_bytes()
            assert b'"f":"start-packet"' in history
            shas.setdefault(seed, set()).add(hashlib.sha256(history).hexdigest())
    assert len(shas[1]) == 1


def test_packet_loss_finds_duplicates_without_idempotence_and_not_with_it(
    tmp_path: Path,
) -> None:
    """Jepsen's use of packet faults: `isrlab sim --seed 1 --nemesis packet --no-idempotence
    --set request_timeout_ms=500` draws a 20% loss on the leader of a key; produce requests
    wait for retransmissions past the request timeout, are sent again, and both appends
    stay: duplicate (and the G0 cycles it makes). Idempotent producers, same seed: valid."""
    base = {**SIM_DEFAULTS, "seed": 1, "nemesis": "packet", "request_timeout_ms": 500}
    _, off = simulate_queue({**base, "idempotence": False}, tmp_path / "off", report=False)
    assert off["valid"] is False and "duplicate" in off["anomaly_types"], off["anomaly_types"]
    _, on = simulate_queue({**base, "idempotence": True}, tmp_path / "on", report=False)
    assert on["valid"] is True, on["anomaly_types"]
