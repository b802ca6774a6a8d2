"""The socket server's per-request cost before and after the connection limits of issue 15
(the accept loop, the idle and read-timeout bookkeeping), measured in the same run: the server
of an older commit (loaded from git) and today's, each in its own process, each answering
ApiVersions v0 (the handler is the broker's own encoder, no log work). The client sends
`--requests` requests one at a time (round trips) and then `--requests` pipelined, 64 in flight.

    python benchmarks/bench_socket_server.py [--requests 20000] [--baseline-commit cedb6ef]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load_server_module(source: str, name: str) -> Any:
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def serve(source: str, port_out: Any, variant: str) -> None:
    from isrlab.broker.apis.metadata import handle_api_versions

    module = load_server_module(source, f"server_{variant}")

    async def handler(request: Any, conn: Any) -> Any:
        return await handle_api_versions(None, request)  # type: ignore[arg-type]

    async def main() -> None:
        if hasattr(module, "Listener"):
            server = module.SocketServer(
                [module.Listener("PLAINTEXT", "127.0.0.1", 0)], handler, 1 << 20
            )
        else:
            server = module.SocketServer("127.0.0.1", 0, handler, 1 << 20)
        await server.start()
        port_out.put(server.bound_port)
        await asyncio.Event().wait()

    asyncio.run(main())


def request_frame(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, 5) + b"bench"
    return struct.pack(">i", len(body)) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def recv_response(sock: socket.socket) -> None:
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    recv_exactly(sock, size)


def measure(port: int, n: int) -> tuple[float, float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = request_frame(1)
    t0 = time.perf_counter()
    for _ in range(n):
        sock.sendall(frame)
        recv_response(sock)
    round_trips = n / (time.perf_counter() - t0)
    window = 64
    t0 = time.perf_counter()
    sent = done = 0
    while done < n:
        while sent < n and sent - done < window:
            sock.sendall(frame)
            sent += 1
        recv_response(sock)
        done += 1
    pipelined = n / (time.perf_counter() - t0)
    sock.close()
    return round_trips, pipelined


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--baseline-commit", default="cedb6ef")
    args = ap.parse_args()
    old = subprocess.run(
        ["git", "show", f"{args.baseline_commit}:broker/network/server.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    new = (ROOT / "broker/network/server.py").read_text()
    ctx = mp.get_context("spawn")
    rows = []
    for variant, source in [(f"baseline {args.baseline_commit}", old), ("today", new)] * 2:
        q = ctx.Queue()
        proc = ctx.Process(target=serve, args=(source, q, variant.split()[0]), daemon=True)
        proc.start()
        port = q.get(timeout=30)
        try:
            measure(port, 1000)  # warm-up
            rows.append((variant, *measure(port, args.requests)))
        finally:
            proc.terminate()
            proc.join()
    print("| server | round trips/s | pipelined requests/s |")
    print("|---|---|---|")
    for variant, rt, pl in rows:
        print(f"| {variant} | {rt:,.0f} | {pl:,.0f} |")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
