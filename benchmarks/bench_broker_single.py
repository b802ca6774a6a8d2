"""Single-broker throughput: confluent-kafka produce (acks=1) and consume of 100-byte messages,
next to a baseline measured in the same run: the same bytes pushed through a plain Python socket
into a file and read back from the file through a socket.

    python benchmarks/bench_broker_single.py [--messages 1000000] [--size 100]

The broker runs as its own process (as users run it); the clients run in this process; the baseline
server runs in its own process too. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.synchronize
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


# ---------------------------------------------------------------- baseline: socket -> file -> socket


def _baseline_server(port: int, path: str, total: int, ready: mp.synchronize.Event) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    ready.set()
    conn, _ = srv.accept()
    with open(path, "wb") as f:
        got = 0
        while got < total:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            f.write(chunk)
            got += len(chunk)
    conn.sendall(b"k")
    conn.close()
    conn, _ = srv.accept()  # read-back phase
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            conn.sendall(chunk)
    conn.close()
    srv.close()


def baseline(n: int, size: int, per_message: bool) -> tuple[float, float]:
    """The same messages through a plain Python socket into a file and back.

    per_message=True: the client hands each message to the socket on its own (a 4-byte length
    prefix and the value: one sendall per message) and splits the bytes it reads back into messages,
    the way an application moves messages one by one without any broker. per_message=False: the
    bytes in 1 MiB chunks, the raw ceiling of socket + file I/O in Python on this machine.
    """
    framed = size + 4 if per_message else size
    total = n * framed
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "baseline.bin")
        ready = mp.Event()
        proc = mp.Process(target=_baseline_server, args=(port, path, total, ready))
        proc.start()
        ready.wait(20)
        s = socket.create_connection(("127.0.0.1", port))
        value = os.urandom(size)
        t0 = time.perf_counter()
        if per_message:
            prefix = struct.pack(">i", size)
            send = s.sendall
            for _ in range(n):
                send(prefix + value)
        else:
            payload = value * ((1 << 20) // size)
            sent = 0
            while sent < total:
                chunk = payload[: min(len(payload), total - sent)]
                s.sendall(chunk)
                sent += len(chunk)
        s.recv(1)
        write_s = time.perf_counter() - t0
        s.close()
        s = socket.create_connection(("127.0.0.1", port))
        t0 = time.perf_counter()
        got = 0
        messages = 0
        pending = b""
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
            if per_message:
                buf = pending + chunk
                pos = 0
                while pos + 4 <= len(buf):
                    (length,) = struct.unpack_from(">i", buf, pos)
                    if pos + 4 + length > len(buf):
                        break
                    _msg = buf[pos + 4 : pos + 4 + length]
                    messages += 1
                    pos += 4 + length
                pending = buf[pos:]
        read_s = time.perf_counter() - t0
        s.close()
        proc.join()
        assert got == total
        assert messages == (n if per_message else 0)
    return write_s, read_s


# ---------------------------------------------------------------- null broker (protocol only)


def _null_broker(port: int, ready: mp.synchronize.Event) -> None:
    """Answers ApiVersions, Metadata, Produce and Fetch (no records: the offsets it counted are
    the high watermark) with the same codec as the broker (its Produce and Fetch encoders
    included) but stores nothing: what the client alone can push through the Kafka protocol on
    this machine."""
    import asyncio

    from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

    from isrlab.broker.network.codec import api_versions_table, decode_request, encode_response
    from isrlab.broker.network.hot_responses import encode_fetch_response, encode_produce_response

    offsets: dict[tuple[str, int], int] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                req = decode_request(await reader.readexactly(size))
                v = req.api_version
                if req.api_key == 18:
                    cls = ApiVersionsResponse[v]
                    resp = cls(
                        error_code=0,
                        api_keys=[
                            cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                            for k, lo, hi in api_versions_table()
                        ],
                        throttle_time_ms=0,
                    )
                elif req.api_key == 3:
                    cls = MetadataResponse[v]
                    T = cls.MetadataResponseTopic
                    P = T.MetadataResponsePartition
                    resp = cls(
                        throttle_time_ms=0,
                        brokers=[
                            cls.MetadataResponseBroker(
                                node_id=0, host="127.0.0.1", port=port, rack=None
                            )
                        ],
                        cluster_id="null",
                        controller_id=0,
                        topics=[
                            T(
                                error_code=0,
                                name=t.name,
                                partitions=[
                                    P(
                                        error_code=0,
                                        partition_index=0,
                                        leader_id=0,
                                        leader_epoch=0,
                                        replica_nodes=[0],
                                        isr_nodes=[0],
                                        offline_replicas=[],
                                    )
                                ],
                            )
                            for t in (req.body.topics or [])
                        ],
                    )
                elif req.api_key == 0:
                    # the broker's own Produce and Fetch encoders (broker/network/hot_responses)
                    produced = []
                    for t in req.body.topic_data:
                        parts = []
                        for pd in t.partition_data:
                            base = offsets.get((t.name, pd.index), 0)
                            count = int.from_bytes(bytes(pd.records[57:61]), "big")
                            offsets[(t.name, pd.index)] = base + count
                            parts.append((pd.index, 0, base, 0, [], None))
                        produced.append((t.name, parts))
                    out = encode_produce_response(v, req.correlation_id, produced)
                elif req.api_key == 1:
                    fetched = []
                    for t in req.body.topics:
                        parts = []
                        for p in t.partitions:
                            hw = offsets.get((t.topic, p.partition), 0)
                            parts.append((p.partition, 0, hw, hw, 0, None, b""))
                        fetched.append((t.topic, parts))
                    out = encode_fetch_response(v, req.correlation_id, fetched)
                else:
                    return
                if req.api_key in (3, 18):
                    out = encode_response(resp, v, req.correlation_id)
                for part in out:
                    writer.write(part)  # type: ignore[arg-type]
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def null_broker_run(n: int, size: int) -> float:
    from confluent_kafka import Producer

    port = free_port()
    ready = mp.Event()
    proc = mp.Process(target=_null_broker, args=(port, ready), daemon=True)
    proc.start()
    ready.wait(20)
    try:
        return _produce(f"127.0.0.1:{port}", n, size, Producer)
    finally:
        proc.terminate()
        proc.join(10)


def _produce(bootstrap: str, n: int, size: int, producer_cls: type) -> float:
    """Seconds to produce n messages with acks=1 (failure reports only; see broker_run)."""
    p = producer_cls(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "delivery.report.only.error": True,
        }
    )
    value = b"v" * size
    failed = 0

    def cb(err, msg):  # type: ignore[no-untyped-def]
        nonlocal failed
        failed += 1

    # produce_batch hands librdkafka 10,000 messages per Python call, so the Python call
    # overhead per message (about 3 us for produce()) does not hide the broker.
    chunk = [{"value": value} for _ in range(10_000)]
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        batch = chunk if n - sent >= len(chunk) else chunk[: n - sent]
        try:
            # returns how many were queued; the rest did not fit into the queue this time
            sent += p.produce_batch("bench", batch, partition=0, on_delivery=cb)
        except BufferError:
            pass
        p.poll(0)
        if sent < n and len(p) > 500_000:
            p.poll(0.002)
    left = p.flush(120)
    secs = time.perf_counter() - t0
    assert left == 0 and failed == 0, f"{left} undelivered, {failed} failed"
    return secs


# ---------------------------------------------------------------- broker


def start_broker(port: int, data_dir: str, **overrides: str) -> subprocess.Popen[bytes]:
    """A broker process on 127.0.0.1:``port`` with its logs under ``data_dir``, quiet, plus
    ``overrides`` (broker keys and values; keys with dots go in as ``**{"key.name": v}``)."""
    args = [
        sys.executable,
        "-m",
        "isrlab.broker",
        "start",
        "-o",
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
        "-o",
        f"log.dirs={data_dir}/logs",
        "-o",
        "log.level=WARNING",
    ]
    for key, value in overrides.items():
        args += ["-o", f"{key}={value}"]
    return subprocess.Popen(args, cwd=ROOT)


def broker_run(n: int, size: int) -> tuple[float, float]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = start_broker(port, d)
        try:
            wait_port(port)
            bootstrap = f"127.0.0.1:{port}"
            # Delivery reports for failures only: a Python callback per message would measure
            # the callback, not the broker. flush() == 0 and no error report = all acked.
            produce_s = _produce(bootstrap, n, size, Producer)
            c = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "bench",
                    "enable.auto.commit": False,
                    "fetch.max.bytes": 50 << 20,
                    "max.partition.fetch.bytes": 8 << 20,
                }
            )
            c.assign([TopicPartition("bench", 0, 0)])
            got = 0
            t0 = time.perf_counter()
            while got < n:
                msgs = c.consume(100000, timeout=5)
                if not msgs:
                    raise RuntimeError(f"consumer stalled at {got}")
                got += len(msgs)
            consume_s = time.perf_counter() - t0
            c.close()
        finally:
            proc.terminate()
            proc.wait(30)
    return produce_s, consume_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    n, size = args.messages, args.size
    mb = n * size / 1e6
    mw, mr = baseline(n, size, per_message=True)
    bw, br = baseline(n, size, per_message=False)
    pw, pr = broker_run(n, size)
    nw = null_broker_run(n, size)
    print(f"\n{n:,} messages of {size} bytes ({mb:.0f} MB of values), {os.cpu_count()} cores\n")
    print("| path | seconds | msgs/s | MB/s (values) | vs per-message baseline |")
    print("|---|---|---|---|---|")
    for name, secs, base in [
        ("broker: confluent-kafka produce, acks=1", pw, mw),
        ("null broker (same codec, stores nothing): produce", nw, mw),
        ("baseline: per-message socket -> file", mw, mw),
        ("ceiling: 1 MiB chunks socket -> file", bw, mw),
        ("broker: confluent-kafka consume", pr, mr),
        ("baseline: file -> socket, split per message", mr, mr),
        ("ceiling: file -> socket, 1 MiB chunks", br, mr),
    ]:
        print(f"| {name} | {secs:.2f} | {n / secs:,.0f} | {mb / secs:.1f} | {base / secs:.2f}x |")
    print(f"\nbroker produce vs the null broker in the same run: {nw / pw:.2f}x")
    target_ok = n / pw >= 100_000 and mw / pw >= 0.5
    print(
        "\ntarget (produce >= 100,000 msgs/s and >= 0.5x the per-message baseline): "
        f"{'met' if target_ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
