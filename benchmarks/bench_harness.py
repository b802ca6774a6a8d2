"""Harness throughput on the 5-node embedded cluster, next to the broker's own throughput.

1. Cluster up: time from "nodes have their venvs" to "ZooKeeper x3 + 5 brokers ready" (the
   install, cached after the first run, is timed separately).
2. Recorded ops/s: `isrlab test` machinery (generator, interpreter, 20 processes of
   confluent-kafka clients, history writer) with no faults, acks=all, idempotent producers.
3. Baseline, same cluster, same run: one confluent-kafka producer writing 100-byte messages as
   fast as it can with acks=all (what the brokers themselves sustain).

    sudo python benchmarks/bench_harness.py [--seconds 30] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a test option for the harness run, e.g. poll_ms=5 or "
        "consumer_config='{\"fetch.min.bytes\": 4096}' (repeatable)",
    )
    args = ap.parse_args()
    overrides = {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            sys.exit(f"bench_harness: --set wants KEY=JSON, not {item!r}")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    if os.geteuid() != 0:
        sys.exit("bench_harness: the embedded cluster needs root")

    from confluent_kafka import Producer

    from isrlab.harness.cluster import embedded
    from isrlab.harness.db import KafkaDB
    from isrlab.harness.history import HistoryWriter
    from isrlab.harness.interpreter import Interpreter
    from isrlab.harness.runner import SetupError, make_test
    from isrlab.harness.workloads.queue.client import QueueClient
    from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test

    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        try:
            config = make_test(
                {
                    "name": "bench",
                    "nemesis": "none",
                    "concurrency": args.concurrency,
                    "time_limit": args.seconds,
                    "final_time_limit": 30,
                    "recovery_time": 0,
                    "acks": "all",
                    "idempotence": True,
                    "store": d,
                    "seed": 1,
                    **overrides,
                }
            )
        except SetupError as e:
            sys.exit(f"bench_harness: {e}")
        test = config.to_test()
        with embedded.embedded_cluster(5, name="bench") as cluster:
            db = KafkaDB(
                test, cluster.inventory, run_dir, workdirs=cluster.workdirs, progress=lambda m: None
            )
            t0 = time.monotonic()
            db.install()
            install_s = time.monotonic() - t0
            t0 = time.monotonic()
            db.setup()
            up_s = time.monotonic() - t0
            db.create_topics(test["keys"], 3, 2)
            db.create_topics(["baseline/0"], 3, 2)
            bootstrap = db.bootstrap_servers()

            p = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "delivery.report.only.error": True,
                }
            )
            t0 = time.perf_counter()
            for i in range(args.messages):
                while True:
                    try:
                        p.produce("baseline", b"v" * 100, partition=0)
                        break
                    except BufferError:
                        p.poll(0.001)
                if i % 10000 == 0:
                    p.poll(0)
            left = p.flush(120)
            base_rate = (args.messages - left) / (time.perf_counter() - t0)

            nodes = {n: db.bootstrap_servers([n]) for n in db.names}
            history = HistoryWriter(run_dir / "history.jsonl")
            interp = Interpreter(
                queue_test(QueueWorkload(test), test),
                history,
                QueueClient.factory(test, nodes),
                args.concurrency,
                seed=1,
            )
            stats = interp.run()
            history.close()
            db.teardown()
            db.close()
        from isrlab.checkers.history import load_history

        ops = load_history(run_dir / "history.jsonl")
        main_ops = [
            o
            for o in ops
            if o["type"] != "invoke"
            and o["time"] <= args.seconds * 1e9
            and o["process"] != "nemesis"
        ]
        rate = len(main_ops) / args.seconds
        latency = _latencies(ops, args.seconds)
    print(f"\n5-node embedded cluster, {os.cpu_count()} cores, {args.concurrency} processes")
    print(f"options: {overrides or 'the harness defaults'}\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| install (wheelhouse + venvs; cached afterwards) | {install_s:.1f} s |")
    print(f"| cluster up (ZooKeeper x3 + 5 brokers ready) | {up_s:.1f} s |")
    print(f"| recorded ops/s, main phase (harness, acks=all) | {rate:,.0f} |")
    print(
        f"| completed ops in main phase | {len(main_ops):,} (ok {stats.get('ok')}, info {stats.get('info')}) |"
    )
    print(f"| baseline: one producer, acks=all, 100 B msgs/s | {base_rate:,.0f} |")
    print("\n| op | count | p50 ms | p99 ms |\n|---|---|---|---|")
    for f, (n, p50, p99) in sorted(latency.items()):
        print(f"| {f} | {n:,} | {p50:.1f} | {p99:.1f} |")
    print(
        f"\ntargets: >= 5,000 recorded ops/s: {'met' if rate >= 5000 else 'NOT met'}; "
        f"cluster up < 20 s: {'met' if up_s < 20 else 'NOT met'}"
    )


def _latencies(ops: list[dict], seconds: float) -> dict[str, tuple[int, float, float]]:
    """Invoke -> completion latency per f (main phase), as (count, p50 ms, p99 ms)."""
    started: dict[object, dict] = {}
    per_f: dict[str, list[float]] = {}
    for o in ops:
        if o["process"] == "nemesis":
            continue
        if o["type"] == "invoke":
            started[o["process"]] = o
        elif o["process"] in started and o["time"] <= seconds * 1e9:
            inv = started.pop(o["process"])
            per_f.setdefault(o["f"], []).append((o["time"] - inv["time"]) / 1e6)
    out = {}
    for f, xs in per_f.items():
        xs.sort()
        out[f] = (len(xs), xs[len(xs) // 2], xs[min(len(xs) - 1, int(len(xs) * 0.99))])
    return out


if __name__ == "__main__":
    main()
