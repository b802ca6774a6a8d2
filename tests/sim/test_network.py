"""The simulated network on virtual time: TCP's promises (order within a stream, flow control,
refusal, close and reset) and the faults (partitions in the nemeses' shapes, black holes,
SYN timeouts, delays, resets), and one seed giving one trace."""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from isrlab.harness.sim import clock
from isrlab.harness.sim.network import SYN_TIMEOUT, SimNetwork
from isrlab.nemeses.partition import grudge

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run(body: Callable[[SimNetwork], Awaitable[Any]], seed: int = 1, **kw: Any) -> Any:
    async def main() -> Any:
        return await body(SimNetwork(asyncio.get_running_loop(), seed=seed, **kw))

    return clock.run(main())


async def pair(
    net: SimNetwork, a: str = "a", b: str = "b", port: int = 9092, limit: int = 1 << 16
) -> list[Any]:
    """A connection from host a to a listener on b:port: [client streams, server streams]
    (the server's reader buffering up to `limit` bytes)."""
    listener = await net.host(b).listen("", port)
    client = await net.host(a).connect(b, port)
    accepted = await listener.accept()
    assert accepted.peer[0] == a
    return [client, await accepted.streams(limit)]


def now() -> float:
    return asyncio.get_running_loop().time()


def test_bytes_arrive_in_order_within_a_stream_and_reordered_across_streams() -> None:
    async def body(net: SimNetwork) -> tuple[list[bytes], list[str]]:
        listener = await net.host("b").listen("", 1)
        conns = [await net.host("a").connect("b", 1) for _ in range(2)]
        servers = [await (await listener.accept()).streams(1 << 20) for _ in range(2)]
        arrivals: list[str] = []

        async def drain(i: int) -> bytes:
            got = b""
            while chunk := await servers[i][0].read(1 << 20):
                got += chunk
                arrivals.append(f"{i}:{chunk[:1].decode()}")
            return got

        readers = [asyncio.create_task(drain(i)) for i in range(2)]
        for k in range(200):  # interleaved writes: c0 k, c1 k, c0 k+1, ...
            for _, w in conns:
                w.write(f"{k % 10}".encode() * 10)
            await asyncio.sleep(0.0001)
        for _, w in conns:
            w.close()
        return list(await asyncio.gather(*readers)), arrivals

    streams, arrivals = run(body)
    expected = b"".join(f"{k % 10}".encode() * 10 for k in range(200))
    assert streams == [expected, expected]  # each stream whole and in order
    # the two streams' segments did not arrive in the order they were written
    sent_order = [f"{i}:{k % 10}" for k in range(200) for i in range(2)]
    assert arrivals != sent_order


def test_flow_control_a_writer_waits_for_a_reader_that_does_not_read() -> None:
    async def body(net: SimNetwork) -> tuple[bool, bytes]:
        (_, w), (r, _) = await pair(net)
        w.write(b"x" * (4 << 20))
        drained = asyncio.create_task(w.drain())
        await asyncio.sleep(10)
        blocked = not drained.done()
        data = await r.readexactly(4 << 20)
        await drained
        return blocked, data[-1:]

    blocked, last = run(body)
    assert blocked and last == b"x"


def test_connect_to_a_closed_port_is_refused_and_bind_conflicts_fail() -> None:
    async def body(net: SimNetwork) -> float:
        net.host("b")
        with pytest.raises(ConnectionRefusedError):
            await net.host("a").connect("b", 9)
        took = now()
        await net.host("b").listen("", 9)
        with pytest.raises(OSError) as e:
            await net.host("b").listen("b", 9)
        assert e.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError):
            await net.host("a").connect("nowhere", 9)  # an unknown name does not resolve
        return took

    assert 0 < run(body) < 0.01  # one round trip


def test_a_connect_across_a_partition_times_out_as_a_syn_into_a_black_hole() -> None:
    async def body(net: SimNetwork) -> tuple[float, float]:
        await net.host("b").listen("", 1)
        net.partition({"a": ["b"], "b": ["a"]})
        start = now()
        with pytest.raises(TimeoutError) as e:
            await net.host("a").connect("b", 1)
        assert e.value.errno == errno.ETIMEDOUT
        failed = now() - start
        # healed while the SYNs are retransmitted: the connect gets through at the next one
        start = now()
        task = asyncio.create_task(net.host("a").connect("b", 1))
        await asyncio.sleep(5)
        net.heal()
        await task
        return failed, now() - start

    failed, healed = run(body)
    assert failed == pytest.approx(SYN_TIMEOUT)
    assert 7 < healed < 7.01  # SYNs at 0, 1, 3, 7 s


def test_bytes_sent_into_a_partition_never_arrive_and_the_sender_times_out() -> None:
    async def body(net: SimNetwork) -> list[str]:
        (cr, cw), (sr, sw) = await pair(net)
        (_, iw), (jr, _) = await pair(net, port=2)  # idle during the partition
        out = []
        net.partition_shape("isolate-one", ["a", "b"], leader="a")
        cw.write(b"lost")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sr.read(4), 60)
        net.heal()
        cw.write(b"after the heal")  # a hole in the stream: nothing after it arrives either
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sr.read(4), 60)
        iw.write(b"idle one")  # the connection that sent nothing through the cut works
        out.append((await jr.readexactly(8)).decode())
        start = now()
        with pytest.raises(TimeoutError) as e:
            await cr.read(1)
        out.append(f"sender: errno {e.value.errno} after {now() - start + 120:.0f} s")
        sw.write(b"to a dead peer")  # the receiver learns nothing until it sends: then it too
        with pytest.raises(TimeoutError):
            await sr.read(1)
        return out

    assert run(body, retransmit_timeout=900) == ["idle one", "sender: errno 110 after 900 s"]


def test_reset_close_and_eof() -> None:
    async def body(net: SimNetwork) -> None:
        (cr, cw), (sr, sw) = await pair(net)
        assert net.reset("a", "b") == 1
        for reader in (cr, sr):
            with pytest.raises(ConnectionResetError):
                await reader.read(1)
        # a close after everything was read: a FIN, the peer reads its bytes then EOF
        (cr, cw), (sr, sw) = await pair(net, port=2)
        cw.write(b"bye")
        cw.close()
        assert await sr.read() == b"bye"
        # bytes for a socket that is closed are answered with a reset
        sw.write(b"too late")
        await asyncio.sleep(0.01)
        with pytest.raises(ConnectionResetError):
            sw.write(b"x")
            await sw.drain()
        # a close with unread bytes in the kernel is a reset, not a FIN (asyncio takes what
        # arrives at once, so only bytes held back by a paused reader are unread there)
        (cr, cw), (sr, sw) = await pair(net, port=3)
        cw.write(b"u" * (1 << 20))
        await asyncio.sleep(0.01)
        sw.close()
        with pytest.raises(ConnectionResetError):
            await cr.read(1)

    run(body)


def test_a_full_backlog_leaves_connects_waiting_until_accepted() -> None:
    async def body(net: SimNetwork) -> list[str]:
        listener = await net.host("b").listen("", 1, backlog=2)
        tasks = [asyncio.create_task(net.host("a").connect("b", 1)) for _ in range(3)]
        await asyncio.sleep(0.5)
        out = [f"connected {sum(t.done() for t in tasks)}"]
        await listener.accept()  # room again: the third SYN's retransmission gets in
        await asyncio.gather(*tasks)
        out.append(f"all at {now():.0f}")
        return out

    assert run(body) == ["connected 2", "all at 1"]


def test_delays_add_latency_on_their_links_only() -> None:
    async def body(net: SimNetwork) -> list[float]:
        (_, aw), (br, _) = await pair(net)
        net.delay({"a": ["b"]}, 2.0)
        times = []
        for w, r in ((aw, br),):
            start = now()
            w.write(b"x")
            await r.readexactly(1)
            times.append(now() - start)
        net.clear_delays()
        start = now()
        aw.write(b"y")
        await br.readexactly(1)
        times.append(now() - start)
        return times

    slow, fast = run(body)
    assert 2.0 < slow < 2.01 and fast < 0.01


def test_partition_shapes_are_the_nemeses_grudges() -> None:
    hosts = ["n1", "n2", "n3", "n4", "n5"]

    async def body(net: SimNetwork) -> tuple[Any, list[tuple[str, str, bool]]]:
        for h in hosts:
            await net.host(h).listen("", 1)
        g = net.partition_shape("majorities-ring")
        results = []
        for a in hosts:
            for b in hosts:
                if a != b:
                    try:
                        await asyncio.wait_for(net.host(a).connect(b, 1), 10)
                        results.append((a, b, True))
                    except TimeoutError:
                        results.append((a, b, False))
        return g, results

    g, results = run(body, seed=3)
    # the same function, the same draw: what nemeses.partition imposes on real nodes
    net_rng = random.Random(3)
    assert g == grudge("majorities-ring", hosts, net_rng)
    for a, b, ok in results:
        assert ok == (b not in g[a] and a not in g[b])
    assert not all(ok for *_, ok in results)


def _trace(seed: int) -> str:
    lines: list[str] = []

    async def body(net: SimNetwork) -> None:
        rng = random.Random(seed)
        for h in ("n1", "n2", "n3"):
            await net.host(h).listen("", 1)

        async def echo(listener: Any) -> None:
            while True:
                r, w = await (await listener.accept()).streams(1 << 16)

                async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                    while data := await r.read(1 << 16):
                        w.write(data)
                    w.close()

                tasks.append(asyncio.create_task(serve(r, w)))

        tasks = [asyncio.create_task(echo(net._listeners[(h, 1)])) for h in ("n1", "n2", "n3")]

        async def client(name: str) -> None:
            for _ in range(5):
                target = rng.choice(["n1", "n2", "n3"])
                try:
                    r, w = await asyncio.wait_for(net.host(name).connect(target, 1), 5)
                    for _ in range(4):  # a stream that lasts: a partition may cut it
                        w.write(bytes(rng.randrange(1, 30_000)))
                        await asyncio.sleep(0.002)
                    w.write_eof()
                    got = await asyncio.wait_for(r.read(), 5)
                    lines.append(f"{now():.6f} {name} {target} {len(got)}")
                    w.close()
                except (OSError, TimeoutError) as e:
                    lines.append(f"{now():.6f} {name} {target} {type(e).__name__}")

        async def nemesis() -> None:
            await asyncio.sleep(0.005)
            net.partition_shape("halves", ["n1", "n2", "n3", "c1", "c2"])
            await asyncio.sleep(6)
            net.heal()
            net.reset("n1")

        await asyncio.gather(client("c1"), client("c2"), nemesis())

    run(body, seed=seed, on_event=lines.append)
    return "\n".join(lines) + "\n"


def test_a_seeded_run_gives_a_byte_identical_trace() -> None:
    one, two, other = _trace(5), _trace(5), _trace(6)
    assert one.encode() == two.encode()
    assert one != other
    assert "partition" in one and "drop" in one and "TimeoutError" in one
