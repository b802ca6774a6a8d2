"""Group rebalance: 20 confluent-kafka consumers of one group subscribe at once to a 20-partition
topic on one broker (group.initial.rebalance.delay.ms at its default, 3000). Measured: the time
from the first subscribe() until every member's on_assign callback has fired and DescribeGroups
shows the group Stable with every member holding its assignment; then until every member has
fetched its first record. Baseline in the same run: the same 20 consumers started with plain
assign() of the same partitions (no group membership), time until each has fetched its first
record from each of its partitions. A single member subscribing alone is timed as well: it shows
the bare initial delay.

    python benchmarks/bench_group_rebalance.py [--members 20] [--partitions 20]
        [--initial-delay-ms 3000]

The broker runs as its own process; the consumers run in threads of this process (one thread per
consumer polls it; librdkafka runs each consumer's network I/O in its own threads, and poll()
releases the GIL while it waits). The offsets topic is created before the clock starts (a first
FindCoordinator creates it once per cluster, not once per group).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "bench-rebalance"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the broker exited while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def setup(bootstrap: str, partitions: int) -> None:
    """The topic, one record in each partition, and the offsets topic (created by a first
    FindCoordinator; waited for until a throwaway group can read its committed offsets)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in range(partitions):
        p.produce(TOPIC, value=f"r{part}".encode(), partition=part)
    if p.flush(30):
        raise RuntimeError("could not produce the first records")
    warm = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warmup"})
    deadline = time.monotonic() + 60
    while True:
        try:
            warm.committed([TopicPartition(TOPIC, 0)], timeout=10)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    warm.close()


class Member:
    """One consumer and the moments (seconds after the start) it reached each step."""

    def __init__(self, bootstrap: str, group: str, index: int) -> None:
        self.index = index
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 30000,
            }
        )
        self.assigned_at: float | None = None
        self.assignments: list[list[int]] = []
        self.first_record_at: float | None = None
        self.seen: set[int] = set()
        self.done_at: float | None = None
        self.error: BaseException | None = None


def run_members(
    members: list[Member],
    start: Any,
    done: Any,
    stop: threading.Event,
    t0: list[float],
) -> list[threading.Thread]:
    """Starts one thread per member; each waits at a barrier, then calls start(member) and polls
    until done(member) or stop. t0 receives the moment (perf_counter) the barrier released them;
    returns once it has."""
    barrier = threading.Barrier(len(members), action=lambda: t0.append(time.perf_counter()))

    def loop(m: Member) -> None:
        try:
            barrier.wait()
            start(m)
            while not stop.is_set():
                msg = m.consumer.poll(0.02)
                if msg is not None and msg.error() is None:
                    if m.first_record_at is None:
                        m.first_record_at = time.perf_counter() - t0[0]
                    m.seen.add(msg.partition())
                if done(m):
                    m.done_at = time.perf_counter() - t0[0]
                    # keep serving the group (heartbeats are librdkafka's; rebalance
                    # callbacks need poll) until every member is done
                    while not stop.is_set():
                        m.consumer.poll(0.05)
                    return
        except BaseException as e:  # reported by the caller
            m.error = e

    threads = [threading.Thread(target=loop, args=(m,), daemon=True) for m in members]
    for t in threads:
        t.start()
    while not t0:
        time.sleep(0.001)
    return threads


def join_threads(members: list[Member], threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
    for m in members:
        if m.error is not None:
            raise RuntimeError(f"member {m.index}: {m.error!r}")


def group_run(bootstrap: str, group: str, n: int, timeout: float) -> dict[str, float | int]:
    """n members of `group` subscribe at once. Returns seconds to: every on_assign fired; the
    group seen Stable by DescribeGroups with n members that all hold partitions; every member's
    first record; and how many assignments the members received in all."""
    members = [Member(bootstrap, group, i) for i in range(n)]

    def subscribe(m: Member) -> None:
        def on_assign(c: Consumer, parts: list[TopicPartition]) -> None:
            m.assignments.append([tp.partition for tp in parts])
            if parts and m.assigned_at is None:
                m.assigned_at = time.perf_counter() - t0[0]

        m.consumer.subscribe([TOPIC], on_assign=on_assign)

    def member_done(m: Member) -> bool:
        return m.assigned_at is not None and m.first_record_at is not None

    stop = threading.Event()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    t0: list[float] = []
    threads = run_members(members, subscribe, member_done, stop, t0)
    stable_at: float | None = None
    deadline = time.perf_counter() + timeout
    try:
        while time.perf_counter() < deadline:
            if stable_at is None:
                desc = admin.describe_consumer_groups([group])[group].result(10)
                now = time.perf_counter() - t0[0]
                if (
                    desc.state == ConsumerGroupState.STABLE
                    and len(desc.members) == n
                    and all(
                        mem.assignment and mem.assignment.topic_partitions for mem in desc.members
                    )
                ):
                    stable_at = now
            if stable_at is not None and all(member_done(m) for m in members):
                break
            if any(m.error is not None for m in members):
                break
            time.sleep(0.02)
    finally:
        stop.set()
        join_threads(members, threads)
        for m in members:
            m.consumer.close()
    if stable_at is None or not all(member_done(m) for m in members):
        waiting = [m.index for m in members if not member_done(m)]
        raise RuntimeError(f"group {group} not done after {timeout} s: members {waiting} waiting")
    owned = sorted(p for m in members for p in m.assignments[-1])
    if len(owned) != len(set(owned)):
        raise RuntimeError(f"a partition was assigned twice: {owned}")
    assigned = max(m.assigned_at or 0.0 for m in members)
    return {
        "assigned": assigned,
        "stable": stable_at,
        "ready": max(assigned, stable_at),
        "first_records": max(m.first_record_at or 0.0 for m in members),
        "assignments": sum(len(m.assignments) for m in members),
    }


def assign_run(bootstrap: str, n: int, partitions: int, timeout: float) -> float:
    """The baseline: n consumers assign() the partitions the group spreads over them (i, i+n,
    ...) from the beginning; seconds until every one has a record from each of its partitions."""
    members = [Member(bootstrap, "bench-assign", i) for i in range(n)]
    mine = {m.index: list(range(m.index, partitions, n)) for m in members}

    def assign(m: Member) -> None:
        m.consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in mine[m.index]])

    def member_done(m: Member) -> bool:
        return m.seen >= set(mine[m.index])

    stop = threading.Event()
    t0: list[float] = []
    threads = run_members(members, assign, member_done, stop, t0)
    deadline = time.perf_counter() + timeout
    done_at: float | None = None
    try:
        while time.perf_counter() < deadline:
            if all(member_done(m) for m in members):
                done_at = time.perf_counter() - t0[0]
                break
            if any(m.error is not None for m in members):
                break
            time.sleep(0.002)
    finally:
        stop.set()
        join_threads(members, threads)
        for m in members:
            m.consumer.close()
    if done_at is None:
        raise RuntimeError(f"assign() consumers not done after {timeout} s")
    # the moment the last member had a record from each of its partitions, as its thread saw it
    return max(m.done_at or done_at for m in members)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=20)
    ap.add_argument("--initial-delay-ms", type=int, default=3000)
    ap.add_argument("--no-single", action="store_true", help="skip the one-member reference")
    args = ap.parse_args()
    if args.members < 1 or args.partitions < args.members:
        ap.error(
            "need --members >= 1 and --partitions >= --members (every member gets a partition)"
        )
    n, delay_s = args.members, args.initial_delay_ms / 1000
    timeout = 60 + 4 * delay_s
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as d:
        log = open(Path(d) / "broker.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "isrlab.broker",
                "start",
                "-o",
                f"listeners=PLAINTEXT://127.0.0.1:{port}",
                "-o",
                f"log.dirs={d}/logs",
                "-o",
                "log.level=WARNING",
                "-o",
                f"group.initial.rebalance.delay.ms={args.initial_delay_ms}",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        try:
            wait_port(port, proc)
            bootstrap = f"127.0.0.1:{port}"
            setup(bootstrap, args.partitions)
            base = assign_run(bootstrap, n, args.partitions, timeout)
            grp = group_run(bootstrap, "bench-group", n, timeout)
            single = None if args.no_single else group_run(bootstrap, "bench-single", 1, timeout)
        except BaseException:
            log.flush()
            sys.stderr.write((Path(d) / "broker.log").read_text()[-3000:])
            raise
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()

    load = os.getloadavg()[0]
    print(
        f"\n{n} consumers (threads of one process), a {args.partitions}-partition topic, one "
        f"broker; group.initial.rebalance.delay.ms={args.initial_delay_ms}; "
        f"{os.cpu_count()} cores, load average {load:.1f}\n"
    )
    print("| path | seconds | vs assign() baseline |")
    print("|---|---|---|")
    rows: list[tuple[str, float]] = [
        ("baseline: assign(), every consumer has its first records", base),
        (
            f"group: every on_assign fired ({grp['assignments']} assignments in all)",
            grp["assigned"],
        ),
        ("group: DescribeGroups sees Stable, every member assigned", grp["stable"]),
        ("group: every member has its first record", grp["first_records"]),
    ]
    if single is not None:
        rows.append(("one member alone: on_assign fired and Stable", single["ready"]))
    for name, secs in rows:
        print(f"| {name} | {secs:.3f} | {secs / base:.1f}x |")
    ready = grp["ready"]
    target = delay_s + 1
    print(
        f"\ngroup Stable with every assignment after {ready:.3f} s; target (<= "
        f"group.initial.rebalance.delay.ms + 1 s = {target:.1f} s): "
        f"{'met' if ready <= target else 'NOT met'}"
    )
    if n > 1:
        # The initial delay ends once no member has joined for `delay`: members subscribing at
        # once are all in before the first delay ends, so the floor is one delay. (Kafka's own
        # InitialDelayedJoin would wait 2 x delay here.)
        print(
            f"floor (one initial delay): {delay_s:.1f} s; beyond it: {ready - delay_s:+.3f} s "
            f"(vs the assign() baseline {base:.3f} s)"
        )


if __name__ == "__main__":
    main()
