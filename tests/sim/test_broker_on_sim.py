"""One real broker (the standalone KafkaServer: its socket server, codec, handlers and logs) on
the VirtualTimeLoop and the simulated network, driven by the broker's own Kafka client
(broker/network/client.py): requests take virtual time only, a partitioned client times out in
virtual time and succeeds after the heal, the socket server's connection limits and timeouts
work through the transport seam, and one seed gives a byte-identical trace."""

from __future__ import annotations

import asyncio
import os
import random
import struct
import subprocess
import sys
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch

from isrlab.broker.config import BrokerConfig
from isrlab.broker.network.client import ConnectionFailed, KafkaConnection
from isrlab.broker.server import KafkaServer
from isrlab.harness.sim import clock
from isrlab.harness.sim.network import SimNetwork
from tests.broker.rawclient import build_batch, fetch_request, produce_req

TOPIC = "t"


def run_with_broker(
    tmp: Path,
    body: Callable[[SimNetwork, KafkaServer], Awaitable[Any]],
    *,
    seed: int = 1,
    overrides: dict[str, str] | None = None,
    on_event: Callable[[str], None] | None = None,
) -> Any:
    """Start broker 0 on host b1:9092 of a fresh network on a fresh virtual-time loop, with
    topic t (one partition), run `body`, stop the broker."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop, seed=seed, on_event=on_event)
        config = BrokerConfig(
            {
                "broker.id": "0",
                "listeners": "PLAINTEXT://b1:9092",
                "log.dirs": str(tmp),
                "zero.copy.threshold.bytes": "1",  # fetches go through loop.sendfile
                **(overrides or {}),
            }
        )
        server = KafkaServer(config, transport=net.host("b1"))
        await server.start()
        try:
            await server.create_topic(TOPIC, 1, 1, None, {})
            return await body(net, server)
        finally:
            await server.stop()

    return clock.run(main())


def values(response: Any) -> list[tuple[int, bytes]]:
    data = bytes(response.responses[0].partitions[0].records or b"")
    out = []
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        for r in DefaultRecordBatch(data[pos : pos + 12 + length]):
            out.append((r.offset, bytes(r.value)))
        pos += 12 + length
    return out


def test_produce_and_fetch_through_the_broker_in_virtual_time(tmp_path: Path) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> Any:
        loop = asyncio.get_running_loop()
        client = KafkaConnection("b1", 9092, "c1", net.host("c1"))
        r = await client.request(produce_req(TOPIC, build_batch([b"a", b"b"]), acks=1), 30)
        p = r.topic_data[0] if hasattr(r, "topic_data") else r.responses[0]
        assert p.partition_responses[0].error_code == 0
        big = [bytes([i]) * 100_000 for i in range(5)]  # 500 kB: many segments, flow control
        await client.request(produce_req(TOPIC, build_batch(big), acks=1), 30)
        f = await client.request(fetch_request(TOPIC, max_bytes=4 << 20), 30)
        took = loop.time()
        client.close()
        return f, took

    f, took = run_with_broker(tmp_path, body)
    assert [v for _, v in values(f)] == [b"a", b"b"] + [bytes([i]) * 100_000 for i in range(5)]
    assert f.responses[0].partitions[0].high_watermark == 7
    assert 0 < took < 0.1  # a few milliseconds of simulated latency


def test_a_partitioned_client_times_out_in_virtual_time_then_succeeds_after_heal(
    tmp_path: Path,
) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> list[str]:
        loop = asyncio.get_running_loop()
        client = KafkaConnection("b1", 9092, "c1", net.host("c1"))
        out = []
        await client.request(produce_req(TOPIC, build_batch([b"before"])), 30)
        net.partition_shape("isolate-one", ["b1", "c1"], leader="c1")
        for what in ("request", "connect"):
            start = loop.time()
            with pytest.raises(ConnectionFailed):
                await client.request(produce_req(TOPIC, build_batch([b"lost"])), 30)
            out.append(f"{what} failed after {loop.time() - start:.3f}")
        net.heal()
        r = await client.request(produce_req(TOPIC, build_batch([b"after"])), 30)
        out.append(f"offset {r.responses[0].partition_responses[0].base_offset}")
        f = await client.request(fetch_request(TOPIC), 30)
        out.append(repr([v for _, v in values(f)]))
        return out

    out = run_with_broker(tmp_path, body)
    # the produce written into the cut is never delivered (the connection is a black hole), the
    # next connect's SYNs are lost until the client gives up; after the heal a new connection
    assert out == [
        "request failed after 30.000",
        "connect failed after 30.000",
        "offset 1",
        "[b'before', b'after']",
    ]


async def _raw(net: SimNetwork, host: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await net.host(host).connect("b1", 9092, limit=1 << 16)


def test_idle_connections_are_closed_after_connections_max_idle_ms(tmp_path: Path) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> float:
        reader, _ = await _raw(net, "c1")
        start = asyncio.get_running_loop().time()
        assert await reader.read(1) == b""  # the broker closed it
        return asyncio.get_running_loop().time() - start

    took = run_with_broker(tmp_path, body, overrides={"connections.max.idle.ms": "60000"})
    assert 60 <= took <= 60 + 16  # checked every idle/4 seconds


def test_a_frame_not_completed_within_request_read_timeout_ms_is_closed(tmp_path: Path) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> float:
        reader, writer = await _raw(net, "c1")
        writer.write(struct.pack(">i", 100) + b"x" * 10)  # 10 bytes of a 100-byte frame
        start = asyncio.get_running_loop().time()
        assert await reader.read(1) == b""
        return asyncio.get_running_loop().time() - start

    took = run_with_broker(tmp_path, body, overrides={"request.read.timeout.ms": "8000"})
    assert 8 <= took <= 8 + 2 + 0.1


def test_max_connections_keeps_a_second_connection_waiting_in_the_backlog(tmp_path: Path) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> list[str]:
        loop = asyncio.get_running_loop()
        first = KafkaConnection("b1", 9092, "c1", net.host("c1"))
        second = KafkaConnection("b1", 9092, "c2", net.host("c2"))
        await first.request(produce_req(TOPIC, build_batch([b"1"])), 30)
        out = []
        with pytest.raises(ConnectionFailed):  # connected (backlog), never accepted, no answer
            await second.request(produce_req(TOPIC, build_batch([b"2"])), 5)
        out.append(f"second timed out at {loop.time():.0f}")
        first.close()
        r = await second.request(produce_req(TOPIC, build_batch([b"2"])), 5)
        out.append(f"second served: offset {r.responses[0].partition_responses[0].base_offset}")
        return out

    out = run_with_broker(tmp_path, body, overrides={"max.connections": "1"})
    # The produce that timed out was already in the queued connection's stream: once accepted,
    # the broker reads and appends it (offset 1) although its client has gone, as on a real
    # network; the retry on a new connection is offset 2.
    assert out == ["second timed out at 5", "second served: offset 2"]


def test_max_connections_per_ip_closes_the_extra_connection_at_once(tmp_path: Path) -> None:
    async def body(net: SimNetwork, server: KafkaServer) -> bytes:
        await _raw(net, "c1")
        reader, _ = await _raw(net, "c1")
        return await reader.read(1)

    assert run_with_broker(tmp_path, body, overrides={"max.connections.per.ip": "1"}) == b""


def _traced_run(tmp: Path, seed: int) -> str:
    """Three clients produce batches of seeded sizes concurrently, one of them is cut off for
    a while, then everything is fetched back: the network's events and the clients' results."""
    trace: list[str] = []

    async def body(net: SimNetwork, server: KafkaServer) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        plans = {
            f"c{i}": [bytes([65 + i]) * rng.randrange(1, 200_000) for _ in range(6)]
            for i in range(3)
        }

        def note(what: str) -> None:
            trace.append(f"{loop.time():.6f} {what}")

        async def producer(name: str, sizes: list[bytes]) -> None:
            conn = KafkaConnection("b1", 9092, name, net.host(name))
            for i, value in enumerate(sizes):
                try:
                    r = await conn.request(produce_req(TOPIC, build_batch([value])), 10)
                except ConnectionFailed as e:
                    note(f"{name} #{i} failed: {e}")
                    continue
                note(f"{name} #{i} offset {r.responses[0].partition_responses[0].base_offset}")
            conn.close()

        async def nemesis() -> None:
            await asyncio.sleep(0.01)
            note(f"partition {net.partition_shape('isolate-one', ['b1', 'c1', 'c2'])}")
            await asyncio.sleep(15)
            net.heal()
            note("heal")

        await asyncio.gather(nemesis(), *(producer(n, s) for n, s in plans.items()))
        reader = KafkaConnection("b1", 9092, "reader", net.host("reader"))
        offset = 0
        while True:
            f = await reader.request(fetch_request(TOPIC, offset=offset, max_bytes=1 << 20), 10)
            got = values(f)
            if not got:
                break
            for o, v in got:
                note(f"read {o} {len(v)} {zlib.crc32(v):08x}")
            offset = got[-1][0] + 1

    run_with_broker(tmp, body, seed=seed, on_event=trace.append)
    return "\n".join(trace) + "\n"


def test_a_seeded_run_gives_a_byte_identical_trace(tmp_path: Path) -> None:
    one = _traced_run(tmp_path / "1", 7)
    two = _traced_run(tmp_path / "2", 7)
    other = _traced_run(tmp_path / "3", 8)
    assert one.encode() == two.encode()
    assert one != other
    assert "failed" in one and " read " in one and "drop" in one


def test_the_trace_is_the_same_in_another_process_with_another_hash_seed(tmp_path: Path) -> None:
    """Nothing depends on object addresses or str hashing: a fresh interpreter with
    PYTHONHASHSEED=1, and one with 2, print the trace this process computes."""
    here = _traced_run(tmp_path / "here", 7)
    code = (
        "import sys, pathlib, logging; logging.disable(logging.CRITICAL); "
        "from tests.sim.test_broker_on_sim import _traced_run; "
        "sys.stdout.write(_traced_run(pathlib.Path(sys.argv[1]), 7))"
    )
    root = Path(__file__).resolve().parents[2]
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / hash_seed)],
            cwd=root,
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
        assert out == here.encode()


def test_pipelined_responses_keep_request_order(tmp_path: Path) -> None:
    """Requests written back to back on one connection are answered in their order: a long
    poll holds back the metadata answers behind it (they wait in the responder's queue); a
    request answered at once with nothing ahead of it goes out straight from the reading task."""
    from kafka.protocol.api_header import ResponseClassRegistry
    from kafka.protocol.metadata import MetadataRequest

    def frame(req: Any, correlation: int) -> bytes:
        req.with_header(correlation_id=correlation, client_id="pipe")
        data: bytes = req.encode(header=True, framed=True)
        return data

    async def body(net: SimNetwork, server: KafkaServer) -> list[tuple[int, float]]:
        loop = asyncio.get_running_loop()
        reader, writer = await net.host("c1").connect("b1", 9092)
        poll = fetch_request(TOPIC)
        poll.max_wait_ms = 300  # the topic is empty: a long poll until the deadline
        reqs = [poll, MetadataRequest[4](topics=None, allow_auto_topic_creation=False)]
        reqs.append(MetadataRequest[4](topics=None, allow_auto_topic_creation=False))
        start = loop.time()
        writer.write(b"".join(frame(r, i + 1) for i, r in enumerate(reqs)))
        got = []
        for _ in reqs:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            data = await reader.readexactly(size)
            got.append((struct.unpack_from(">i", data)[0], round(loop.time() - start, 3)))
        # alone on the connection: answered at once
        last = MetadataRequest[4](topics=None, allow_auto_topic_creation=False)
        writer.write(frame(last, 4))
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        data = await reader.readexactly(size)
        cls = ResponseClassRegistry._response_class_registry[3][4]
        assert cls.decode(data, header=True).header.correlation_id == 4
        got.append((4, round(loop.time() - start, 3)))
        writer.close()
        return got

    got = run_with_broker(tmp_path, body)
    assert [c for c, _ in got] == [1, 2, 3, 4]
    assert got[0][1] >= 0.3 and got[1][1] >= got[0][1] and got[2][1] >= got[0][1]
    assert got[3][1] - got[2][1] < 0.1
