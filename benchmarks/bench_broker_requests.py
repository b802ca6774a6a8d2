"""The broker's cost per request (issue 16): small requests on one connection, next to the
protocol-only null server of bench_broker_single.py (the same codec, stores nothing) in the
same run.

    python benchmarks/bench_broker_requests.py [--requests 20000] [--rounds 2]
        [--fetch-version 12] [--produce-version 9] [--profile-dir DIR] [--baseline-commit C]

Requests, each sent `--requests` times one at a time (round trips) and then pipelined (64 in
flight), every one the same prebuilt frame:
- fetch: Fetch of an empty, caught-up partition, max_wait_ms=0 (a consumer's poll that finds
  nothing: the broker's most frequent request under the harness workload);
- produce acks=1, produce acks=all: Produce of one record batch holding one 100-byte record
  (acks=all on a single broker: the ISR is the leader alone).
The broker runs as users run it (`python -m isrlab.broker start`, its own process); the null
server runs in its own process too. Each round runs the null server, then the broker, then
with --baseline-commit the broker of that commit (its broker/ from git, run in place of
today's through PYTHONPATH; the null server stays today's). With
--profile-dir the broker runs under cProfile (CPU time, one .prof file per round): the figures are
then the profiler's, not the broker's.

Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker_single import _null_broker, free_port, wait_port  # noqa: E402

WINDOW = 64
VALUE_SIZE = 100


def _frame(request: Any) -> bytes:
    request.with_header(correlation_id=1, client_id="bench")
    return bytes(request.encode(header=True, framed=True))


def record_batch(size: int) -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=int(time.time() * 1000), key=None, value=b"v" * size, headers=[])
    builder.close()
    return bytes(builder.buffer())


def fetch_frame(version: int, topic: str) -> bytes:
    from kafka.protocol.consumer import FetchRequest

    F = FetchRequest[version]
    return _frame(
        F(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=52428800,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                F.FetchTopic(
                    topic=topic,
                    partitions=[
                        F.FetchTopic.FetchPartition(
                            partition=0,
                            current_leader_epoch=-1,
                            fetch_offset=0,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1048576,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
    )


def produce_frame(version: int, topic: str, acks: int, batch: bytes) -> bytes:
    from kafka.protocol.producer import ProduceRequest

    P = ProduceRequest[version]
    return _frame(
        P(
            transactional_id=None,
            acks=acks,
            timeout_ms=30000,
            topic_data=[
                P.TopicProduceData(
                    name=topic, partition_data=[P.TopicProduceData.PartitionProduceData(0, batch)]
                )
            ],
        )
    )


def decode_response(request_frame: bytes, response: bytes) -> Any:
    from kafka.protocol.api_header import ResponseClassRegistry

    api_key, version = struct.unpack_from(">hh", request_frame, 4)
    cls = ResponseClassRegistry._response_class_registry[api_key]
    return cls[version].decode(response, header=True)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def call(sock: socket.socket, frame: bytes) -> Any:
    sock.sendall(frame)
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return decode_response(frame, recv_exactly(sock, size))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Figure = tuple[float, float]  # requests/s, server CPU microseconds per request


def drive(sock: socket.socket, frame: bytes, n: int, window: int, pid: int) -> Figure:
    """`n` copies of `frame`, at most `window` unanswered: requests per second and the
    server's CPU time per request (less disturbed than wall time by a loaded machine)."""
    sent = done = 0
    buf = b""
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    while done < n:
        k = min(window - (sent - done), n - sent)
        if k > 0:
            sock.sendall(frame * k)
            sent += k
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = struct.unpack_from(">i", buf, pos)
            if len(buf) - pos - 4 < size:
                break
            pos += 4 + size
            done += 1
        buf = buf[pos:]
    secs = time.perf_counter() - t0
    return n / secs, (cpu_seconds(pid) - cpu0) / n * 1e6


def check(resp: Any, what: str) -> None:
    """Every partition of the response answered without error (the benchmark measures the
    path that works, not an error path)."""
    for t in resp.responses:
        for p in getattr(t, "partitions", None) or getattr(t, "partition_responses", []):
            if p.error_code != 0:
                raise RuntimeError(f"{what}: error {p.error_code} in {resp}")


def measure(port: int, pid: int, frames: dict[str, bytes], n: int) -> dict[str, list[Figure]]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = {}
    try:
        for name, frame in frames.items():
            check(call(sock, frame), name)
            drive(sock, frame, min(n, 2000), WINDOW, pid)  # warm-up
            out[name] = [drive(sock, frame, n, 1, pid), drive(sock, frame, n, WINDOW, pid)]
            check(call(sock, frame), name)
    finally:
        sock.close()
    return out


def create_topics(port: int, names: list[str]) -> None:
    """Metadata with auto-creation, until every partition has a leader."""
    from kafka.protocol.metadata import MetadataRequest

    M = MetadataRequest[12]
    sock = socket.create_connection(("127.0.0.1", port))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            req = M(
                topics=[M.MetadataRequestTopic(topic_id=None, name=n) for n in names],
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            )
            resp = call(sock, _frame(req))
            if all(
                t.error_code == 0 and t.partitions and t.partitions[0].leader_id >= 0
                for t in resp.topics
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"topics {names} not created: {resp}")
    finally:
        sock.close()


def frames(fetch_version: int, produce_version: int) -> dict[str, bytes]:
    batch = record_batch(VALUE_SIZE)
    return {
        "fetch (empty, max_wait_ms=0)": fetch_frame(fetch_version, "empty"),
        "produce acks=1": produce_frame(produce_version, "bench", 1, batch),
        "produce acks=all": produce_frame(produce_version, "bench", -1, batch),
    }


def null_server_run(fr: dict[str, bytes], n: int) -> dict[str, list[Figure]]:
    port = free_port()
    ready = mp.Event()
    proc = mp.Process(target=_null_broker, args=(port, ready), daemon=True)
    proc.start()
    ready.wait(20)
    try:
        assert proc.pid is not None
        return measure(port, proc.pid, fr, n)
    finally:
        proc.terminate()
        proc.join(10)


def broker_run(
    fr: dict[str, bytes], n: int, profile: Path | None, tree: Path | None = None
) -> dict[str, list[Figure]]:
    """The broker of this tree, or the isrlab package under ``tree`` (see `baseline_tree`)."""
    port = free_port()
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryDirectory() as d:
        run = ["-m", "isrlab.broker"] if profile is None else ["-c", PROFILED, str(profile)]
        proc = subprocess.Popen(
            [
                sys.executable,
                *run,
                "start",
                "-o",
                f"listeners=PLAINTEXT://127.0.0.1:{port}",
                "-o",
                f"log.dirs={d}/logs",
                "-o",
                "log.level=WARNING",
            ],
            cwd=ROOT if tree is None else tree,
            env=env,
        )
        try:
            wait_port(port)
            create_topics(port, ["empty", "bench"])
            return measure(port, proc.pid, fr, n)
        finally:
            proc.terminate()
            proc.wait(60)


# The broker under cProfile counting CPU time (wall time would count the time the broker waits
# for a core on a loaded machine to whichever call it was in).
PROFILED = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    runpy.run_module("isrlab.broker", run_name="__main__", alter_sys=True)
finally:
    prof.disable()
    prof.dump_stats(out)
"""


def baseline_tree(commit: str) -> Path:
    """broker/ of ``commit`` as the package isrlab.broker in a temporary directory (a regular
    package, found before the editable install's finder)."""
    tree = Path(tempfile.mkdtemp()) / "tree"
    (tree / "isrlab").mkdir(parents=True)
    (tree / "isrlab" / "__init__.py").write_text("")
    archive = subprocess.run(
        ["git", "archive", commit, "broker"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree / "isrlab")], input=archive, check=True)
    for so in (ROOT / "broker").rglob("*.so"):  # compiled helpers are not in git
        dest = tree / "isrlab" / so.relative_to(ROOT)
        if dest.parent.is_dir() and not dest.exists():
            dest.write_bytes(so.read_bytes())
    return tree


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fetch-version", type=int, default=12)
    ap.add_argument("--produce-version", type=int, default=9)
    ap.add_argument("--profile-dir", type=Path)
    ap.add_argument("--baseline-commit", help="also measure the broker of this commit")
    args = ap.parse_args()
    fr = frames(args.fetch_version, args.produce_version)
    print(
        f"load average at start {loadavg()}, {os.cpu_count()} cores; "
        f"Fetch v{args.fetch_version}, Produce v{args.produce_version}, "
        f"{args.requests:,} requests per figure, {WINDOW} in flight when pipelined"
    )
    tree = baseline_tree(args.baseline_commit) if args.baseline_commit else None
    rows = []
    for r in range(args.rounds):
        null = null_server_run(fr, args.requests)
        profile = None
        if args.profile_dir is not None:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            profile = args.profile_dir / f"broker-{r}.prof"
        broker = broker_run(fr, args.requests, profile)
        runs = [("today", broker)]
        if tree is not None:
            runs.append((args.baseline_commit, broker_run(fr, args.requests, None, tree)))
        for which, figures in runs:
            for name in fr:
                rows.append((f"{r + 1} {which}", name, figures[name], null[name]))
    print(f"load average at end {loadavg()}\n")
    print(
        "| round, broker | request | one at a time: broker req/s | null req/s | ratio "
        "| broker CPU us/req | null CPU us/req "
        "| pipelined: broker req/s | null req/s | ratio | broker CPU us/req | null CPU us/req |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r, name, broker, null in rows:
        cells = []
        for (b_rate, b_cpu), (n_rate, n_cpu) in zip(broker, null, strict=True):
            cells += [
                f"{b_rate:,.0f}",
                f"{n_rate:,.0f}",
                f"{b_rate / n_rate:.2f}x",
                f"{b_cpu:,.0f}",
                f"{n_cpu:,.0f}",
            ]
        print(f"| {r} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
