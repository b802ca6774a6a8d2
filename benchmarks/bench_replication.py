"""Replicated throughput and latency: three brokers + ZooKeeper on this machine (127.0.0.1-3).

For RF=3 with acks=1 and acks=all, and RF=1 (the baseline, same run): throughput of 100-byte
messages from one confluent-kafka producer, and produce latency (send -> delivery report) p50/p99 at
a fixed 5,000 msgs/s.

    python benchmarks/bench_replication.py [--messages 300000] [--latency-seconds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks._cluster import running_cluster  # noqa: E402


def create(bootstrap: str, topic: str, rf: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(topic, 1, rf, config={"min.insync.replicas": "2" if rf == 3 else "1"})]
    )[topic].result(30)


def throughput(bootstrap: str, topic: str, acks: str, n: int) -> float:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "delivery.report.only.error": True,
        }
    )
    failed = 0

    def cb(err, msg):  # type: ignore[no-untyped-def]
        nonlocal failed
        failed += 1

    value = b"v" * 100
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.001)
        if i % 10000 == 0:
            p.poll(0)
    left = p.flush(120)
    secs = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"{left} undelivered, {failed} failed")
    return n / secs


def latency(
    bootstrap: str, topic: str, acks: str, rate: int, seconds: float
) -> tuple[float, float]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 1})
    lat: list[float] = []

    def cb(err, msg, sent):  # type: ignore[no-untyped-def]
        if err is None:
            lat.append(time.perf_counter() - sent)

    n = int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        due = t0 + i / rate
        while (now := time.perf_counter()) < due:
            p.poll(min(due - now, 0.001))
        sent = time.perf_counter()
        p.produce(topic, b"v" * 100, partition=0, on_delivery=lambda e, m, s=sent: cb(e, m, s))
        p.poll(0)
    p.flush(60)
    lat.sort()
    return lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    args = ap.parse_args()
    with running_cluster("bench-replication-") as cluster:
        bootstrap = cluster.bootstrap
        rows = []
        for name, rf, acks in [
            ("RF=1 acks=1 (baseline)", 1, "1"),
            ("RF=3 acks=1", 3, "1"),
            ("RF=3 acks=all, min.insync=2", 3, "all"),
        ]:
            topic = f"bench-rf{rf}-acks{acks}"
            create(bootstrap, topic, rf)
            tput = throughput(bootstrap, topic, acks, args.messages)
            p50, p99 = latency(bootstrap, topic, acks, 5000, args.latency_seconds)
            rows.append((name, tput, p50, p99))
    base_tput = rows[0][1]
    print(
        f"\n{args.messages:,} messages of 100 bytes per throughput run; latency at 5,000 msgs/s; "
        f"{os.cpu_count()} cores\n"
    )
    print("| configuration | msgs/s | vs RF=1 | p50 latency ms | p99 latency ms |")
    print("|---|---|---|---|---|")
    for name, tput, p50, p99 in rows:
        print(f"| {name} | {tput:,.0f} | {tput / base_tput:.2f}x | {p50:.1f} | {p99:.1f} |")
    all_row = rows[2]
    ok = all_row[1] >= 50_000 and all_row[1] >= 0.4 * base_tput and all_row[3] < 50
    print(
        "\ntarget (acks=all RF=3 >= 50,000 msgs/s, >= 0.4x RF=1, p99 < 50 ms at 5,000 msgs/s): "
        f"{'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
