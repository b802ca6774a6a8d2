"""Harness throughput on the 5-node embedded cluster, next to the broker's own throughput.

1. Cluster up: time from "nodes have their venvs" to "ZooKeeper x3 + 5 brokers ready" (the
   install, cached after the first run, is timed separately).
2. Recorded ops/s: `isrlab test` machinery (generator, interpreter, 20 processes of
   confluent-kafka clients, history writer) with no faults, acks=all, idempotent producers.
3. Null-client harness rate, before the cluster is up: the same generator, interpreter,
   processes and history writer with `NullClient` (harness/workloads/queue/nullclient.py), a
   client that completes every op at once without any network: what the harness alone
   records on this machine.
4. CPU during the main phase of the real run (utime+stime from /proc/<pid>/stat, summed over
   each daemon's process group, found through the harness's pid files): the 5 brokers',
   ZooKeeper's and this process's (the clients: librdkafka threads and the interpreter),
   each also divided by the number of acknowledged sends in the main phase.
5. Baseline, same cluster, same run: one confluent-kafka producer writing 100-byte messages as
   fast as it can with acks=all (what the brokers themselves sustain).

    sudo python benchmarks/bench_harness.py [--seconds 30] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--cluster-name", default="bench", help="the embedded cluster's name")
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

    from isrlab.checkers.history import load_history
    from isrlab.harness.cluster import embedded
    from isrlab.harness.db import KafkaDB
    from isrlab.harness.history import HistoryWriter
    from isrlab.harness.interpreter import Interpreter
    from isrlab.harness.runner import SetupError, make_test
    from isrlab.harness.workloads.queue.client import QueueClient
    from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test
    from isrlab.harness.workloads.queue.nullclient import NullClient

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

        # The null-client harness rate: same generator, interpreter and history writer.
        null_history = HistoryWriter(run_dir / "null-history.jsonl")
        Interpreter(
            queue_test(QueueWorkload(test), test),
            null_history,
            NullClient.factory(),
            args.concurrency,
            seed=1,
        ).run()
        null_history.close()
        null_ops = load_history(run_dir / "null-history.jsonl")
        null_rate = len(_main_phase(null_ops, args.seconds)) / args.seconds
        del null_ops

        with embedded.embedded_cluster(5, name=args.cluster_name) as cluster:
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
            del p  # its librdkafka threads would count as the clients' CPU

            nodes = {n: db.bootstrap_servers([n]) for n in db.names}
            history = HistoryWriter(run_dir / "history.jsonl")
            interp = Interpreter(
                queue_test(QueueWorkload(test), test),
                history,
                QueueClient.factory(test, nodes),
                args.concurrency,
                seed=1,
            )
            groups = {
                "brokers": [db.broker_pid(n) for n in db.names],
                "zookeeper": [db.remote(n).daemon_pid(db.zk_pidfile(n)) for n in db.names],
            }
            cpu: dict[str, float] = {}
            meter = threading.Thread(
                target=_meter_cpu, args=(groups, args.seconds, cpu), daemon=True
            )
            meter.start()
            stats = interp.run()
            meter.join()
            history.close()
            db.teardown()
            db.close()
        ops = load_history(run_dir / "history.jsonl")
        main_ops = _main_phase(ops, args.seconds)
        rate = len(main_ops) / args.seconds
        acked = sum(_acked_sends(o) for o in main_ops)
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
    print(f"| null-client harness rate, ops/s (no network) | {null_rate:,.0f} |")
    print(f"| acknowledged sends in main phase | {acked:,} |")
    for who in ("brokers", "zookeeper", "clients"):
        sec = cpu.get(who, float("nan"))
        label = {
            "brokers": "broker CPU (5 brokers, user+sys)",
            "zookeeper": "ZooKeeper CPU (x3)",
            "clients": "client + harness CPU (this process)",
        }[who]
        per = sec / acked * 1000 if acked else float("nan")
        print(
            f"| {label}, main phase | {sec:.1f} s ({sec / args.seconds:.2f} cores); "
            f"{per:.3f} ms per acked send |"
        )
    print(f"| baseline: one producer, acks=all, 100 B msgs/s | {base_rate:,.0f} |")
    print("\n| op | count | p50 ms | p99 ms |\n|---|---|---|---|")
    for f, (n, p50, p99) in sorted(latency.items()):
        print(f"| {f} | {n:,} | {p50:.1f} | {p99:.1f} |")
    broker_ms = cpu.get("brokers", float("nan")) / acked * 1000 if acked else float("nan")
    print(
        f"\ntargets: >= 5,000 recorded ops/s (issue 5): {'met' if rate >= 5000 else 'NOT met'}; "
        f">= 3,000 (issue 16): {'met' if rate >= 3000 else 'NOT met'}; "
        f"broker CPU per acked send <= 0.4 ms: {'met' if broker_ms <= 0.4 else 'NOT met'} "
        f"({broker_ms:.3f} ms); cluster up < 20 s: {'met' if up_s < 20 else 'NOT met'}"
    )


def _main_phase(ops: list[dict], seconds: float) -> list[dict]:
    """The client completions of the main phase (the first `seconds` of the history)."""
    return [
        o
        for o in ops
        if o["type"] != "invoke" and o["time"] <= seconds * 1e9 and o["process"] != "nemesis"
    ]


def _acked_sends(op: dict) -> int:
    """How many of `op`'s send micro-ops the broker acknowledged (``["send", k, [off, v]]``)."""
    if op["type"] == "invoke" or not isinstance(op.get("value"), list):
        return 0
    return sum(
        1
        for m in op["value"]
        if isinstance(m, list) and len(m) == 3 and m[0] == "send" and isinstance(m[2], list)
    )


def _group_cpu(leaders: list[int | None]) -> float:
    """utime+stime seconds of every live process in the process groups led by `leaders`
    (the harness starts each daemon with setsid, so its pid file names its group)."""
    pgids = {p for p in leaders if p}
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15
        if int(fields[2]) in pgids:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _meter_cpu(groups: dict[str, list[int | None]], seconds: float, out: dict[str, float]) -> None:
    """CPU seconds of each group of daemons, and of this process, over the next `seconds`."""
    before = {k: _group_cpu(v) for k, v in groups.items()}
    before["clients"] = _self_cpu()
    time.sleep(seconds)
    for k, v in groups.items():
        out[k] = _group_cpu(v) - before[k]
    out["clients"] = _self_cpu() - before["clients"]


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
