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
from typing import Any

from isrlab.harness.sim.network import RETRANSMIT_TIMEOUT, SimNetwork, retransmissions
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
