"""Broker memory held by partial request frames, bounded and unbounded, in one run.

N connections each declare a frame of `--declare` MiB and send `--send` MiB of it, never the
rest (a slow or hostile client). The broker's resident memory growth is printed for
`queued.max.request.bytes=-1` (no bound, Kafka's own default: the baseline) and for the
broker's default bound (`socket.request.max.bytes`), each on a fresh broker process.

    python benchmarks/bench_broker_memory.py [--connections 20] [--declare 100] [--send 60]
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on {port}")


def suppress_os_error(fn: Callable[[bytes], None], data: bytes) -> None:
    try:
        fn(data)
    except OSError:
        pass


def grow(queued_max: str | None, connections: int, declare: int, send: int) -> float:
    """RSS growth (MiB) of a fresh broker while `connections` clients hold partial frames."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, "-m", "isrlab.broker", "start"]
        args += ["-o", f"listeners=PLAINTEXT://127.0.0.1:{port}", "-o", f"log.dirs={d}/logs"]
        args += ["-o", f"socket.request.max.bytes={declare}", "-o", "log.level=WARNING"]
        if queued_max is not None:
            args += ["-o", f"queued.max.request.bytes={queued_max}"]
        proc = subprocess.Popen(args, cwd=ROOT)
        socks: list[socket.socket] = []
        try:
            wait_port(port)
            time.sleep(0.3)
            before = rss_mib(proc.pid)
            payload = struct.pack(">i", declare) + b"\1" * send
            for _ in range(connections):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            # a bounded broker stops reading: those sends end in a timeout, which is the point
            with ThreadPoolExecutor(max_workers=connections) as pool:
                list(pool.map(lambda s: suppress_os_error(s.sendall, payload), socks))
            time.sleep(0.5)
            return rss_mib(proc.pid) - before
        finally:
            for s in socks:
                s.close()
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=20)
    ap.add_argument("--declare", type=int, default=100, help="MiB each frame declares")
    ap.add_argument("--send", type=int, default=60, help="MiB each client sends of it")
    a = ap.parse_args()
    declare, send = a.declare << 20, a.send << 20
    print(
        f"{a.connections} connections, each declaring {a.declare} MiB and sending {a.send} MiB "
        "(RSS growth of the broker process)"
    )
    baseline = grow("-1", a.connections, declare, send)
    print(f"  queued.max.request.bytes=-1 (unbounded, baseline): +{baseline:8.1f} MiB")
    bounded = grow(None, a.connections, declare, send)
    print(f"  default bound (= socket.request.max.bytes):        +{bounded:8.1f} MiB")
    print(f"  bounded / unbounded: {bounded / max(baseline, 1e-9):.3f}")


if __name__ == "__main__":
    main()
