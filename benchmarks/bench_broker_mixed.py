"""The brokers' CPU per acknowledged send under a workload like the harness's (issue 16): three
brokers + ZooKeeper on 127.0.0.1-3, one partition with replication factor 3 and
min.insync.replicas=2, one idempotent acks=all producer sending single 100-byte records one at
a time (linger.ms=0, each send waits for its acknowledgement, as a harness op does) and
`--consumers` consumers long-polling the partition from the start (fetch.wait.max.ms=100, the
harness's default), each in its own thread.

    flock /tmp/isrlab-cluster.lock python benchmarks/bench_broker_mixed.py \
        [--seconds 20] [--consumers 4] [--rounds 2] [--baseline-commit C] [--profile-dir DIR]

Per round and broker code (today's, then --baseline-commit's broker/ run in its place through
PYTHONPATH, as bench_broker_requests does): a fresh cluster, a warm-up, then `--seconds` of
sends; the figure is the sum of the three broker processes' CPU time (/proc/<pid>/stat) over
the acknowledged sends in that window, next to the same brokers' CPU per second while the
consumers alone poll (no sends: the cost of idle long polls). With --profile-dir each broker
runs under cProfile (CPU time) through a sitecustomize on PYTHONPATH, for the window of sends
only, and writes broker<id>-<round>.prof; the figures are then the profiler's.

The brokers listen on 127.0.0.1-3 like the cluster tests': hold /tmp/isrlab-cluster.lock.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker_requests import baseline_tree, loadavg  # noqa: E402
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks._cluster import progress, running_cluster  # noqa: E402

TOPIC = "mixed"
# what harness/db.py sets that matters here (10 partitions of each internal topic, not 50)
HARNESS_SETTINGS = {
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
    "replica.lag.time.max.ms": "10000",
    "zookeeper.session.timeout.ms": "6000",
}
VALUE = b"v" * 100
TICKS = os.sysconf("SC_CLK_TCK")

# cProfile (CPU time) in the brokers, started with this directory on PYTHONPATH: SIGUSR2 starts
# the profiler, SIGUSR1 stops it and writes the profile (the measured window only).
SITECUSTOMIZE = """
import cProfile, os, signal, sys, time
if os.environ.get("ISRLAB_PROFILE_DIR"):
    _prof = cProfile.Profile(time.process_time)

    def _dump(signum, frame):
        _prof.disable()
        bid = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("broker.id=")), "x")
        _prof.dump_stats(os.path.join(os.environ["ISRLAB_PROFILE_DIR"],
                         f"broker{bid}-{os.environ['ISRLAB_PROFILE_ROUND']}.prof"))

    signal.signal(signal.SIGUSR1, _dump)
    signal.signal(signal.SIGUSR2, lambda signum, frame: _prof.enable())
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def brokers_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


@contextmanager
def environment(extra: dict[str, str]) -> Iterator[None]:
    """os.environ with ``extra`` while the cluster starts (its processes inherit it)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(
        30
    )


class Consumers:
    """`n` consumers polling partition 0 from its start in their own threads."""

    def __init__(self, bootstrap: str, n: int):
        self.stop = threading.Event()
        self.received = [0] * n
        self.threads = [
            threading.Thread(target=self._run, args=(bootstrap, i), daemon=True) for i in range(n)
        ]
        for t in self.threads:
            t.start()

    def _run(self, bootstrap: str, i: int) -> None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"mixed-{i}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "log_level": 3,
            }
        )
        c.assign([TopicPartition(TOPIC, 0, 0)])
        try:
            while not self.stop.is_set():
                msgs = c.consume(100, timeout=0.1)
                self.received[i] += sum(1 for m in msgs if m.error() is None)
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def send_for(producer: Producer, seconds: float) -> int:
    """Send one record at a time, each waiting for its acknowledgement; returns the acks."""
    acked = 0
    failed = 0

    def cb(err, msg):  # type: ignore[no-untyped-def]
        nonlocal acked, failed
        if err is None:
            acked += 1
        else:
            failed += 1

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        producer.produce(TOPIC, VALUE, partition=0, on_delivery=cb)
        producer.flush(30)
    if failed:
        progress(f"{failed} sends failed")
    return acked


def one_run(
    label: str, consumers: int, seconds: float, env: dict[str, str]
) -> tuple[float, float, int, int]:
    """(broker CPU us per ack, broker CPU ms per second idle, acks, records the consumers got)."""
    with (
        environment(env),
        running_cluster("bench-mixed-", HARNESS_SETTINGS) as cluster,
    ):
        pids = [p.pid for p in cluster.procs]
        create_topic(cluster.bootstrap)
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
                "log_level": 3,
            }
        )
        group = Consumers(cluster.bootstrap, consumers)
        try:
            send_for(producer, 3)  # warm-up: connections, metadata, fetch sessions
            time.sleep(1)
            c0, t0 = brokers_cpu(pids), time.monotonic()
            time.sleep(min(5.0, seconds / 2))
            idle = (brokers_cpu(pids) - c0) / (time.monotonic() - t0) * 1000
            profiling = "ISRLAB_PROFILE_DIR" in env
            if profiling:
                for pid in pids:
                    os.kill(pid, signal.SIGUSR2)
            c0 = brokers_cpu(pids)
            acks = send_for(producer, seconds)
            busy = brokers_cpu(pids) - c0
            if profiling:
                for pid in pids:
                    os.kill(pid, signal.SIGUSR1)
            time.sleep(0.5)
        finally:
            group.close()
            del producer
        received = sum(group.received)
    per_ack = busy / acks * 1e6 if acks else float("nan")
    progress(
        f"{label}: {acks} acks in {seconds:g} s, brokers {busy:.2f} s cpu = {per_ack:.0f} us/ack; "
        f"idle {idle:.1f} ms cpu/s; consumers got {received}"
    )
    return per_ack, idle, acks, received


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline-commit", help="also measure the brokers of this commit")
    ap.add_argument("--profile-dir", type=Path)
    args = ap.parse_args()
    tree = baseline_tree(args.baseline_commit) if args.baseline_commit else None
    profile_env: dict[str, str] = {}
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        site = Path(tempfile.mkdtemp()) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        profile_env = {"ISRLAB_PROFILE_DIR": str(args.profile_dir.resolve())}
    print(
        f"load average at start {loadavg()}, {os.cpu_count()} cores; {args.consumers} consumers, "
        f"{args.seconds:g} s of sends per figure"
    )
    rows = []
    for rnd in range(1, args.rounds + 1):
        runs = [("today", None)] + ([(args.baseline_commit, tree)] if tree is not None else [])
        for label, t in runs:
            paths = [str(p) for p in (t,) if p is not None]
            env = dict(profile_env)
            if args.profile_dir is not None:
                paths.insert(0, str(site))
                env["ISRLAB_PROFILE_ROUND"] = f"{label}-{rnd}"
            if paths:
                env["PYTHONPATH"] = os.pathsep.join(paths)
            per_ack, idle, acks, received = one_run(
                f"round {rnd} {label}", args.consumers, args.seconds, env
            )
            rows.append((rnd, label, per_ack, idle, acks, received))
    print(f"load average at end {loadavg()}\n")
    print(
        "| round, brokers | broker CPU us per acked send (3 brokers) | acks/s | "
        "idle broker CPU ms/s (consumers polling) | records consumed |"
    )
    print("|---|---|---|---|---|")
    for rnd, label, per_ack, idle, acks, received in rows:
        print(
            f"| {rnd} {label} | {per_ack:,.0f} | {acks / args.seconds:,.0f} | {idle:.1f} | "
            f"{received:,} |"
        )


if __name__ == "__main__":
    try:
        main()
    except KafkaException as e:
        sys.exit(f"kafka error: {e}")
