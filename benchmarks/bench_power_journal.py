"""The cost of the synced-length journal (isrlab.power.journal.enable): produce throughput with
acks=1 and the default flush policy, bookkeeping on vs off, alternating in the same run.

    python benchmarks/bench_power_journal.py [--messages 300000] [--size 100] [--rounds 3]
        [--segment-bytes 8388608]

Each round starts a fresh broker process with the journal on, then one with it off (order
alternating by round), and produces the same messages with confluent-kafka (acks=1, as
bench_broker_single.py). Small segments (8 MiB by default) make the rolls, and so the fsyncs the
journal follows, frequent. Prints the median rate of each and on/off (target >= 0.95x).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_broker_single import ROOT, _produce, free_port, wait_port  # noqa: E402


def run(journal: bool, n: int, size: int, segment_bytes: int) -> float:
    from confluent_kafka import Producer

    port = free_port()
    with tempfile.TemporaryDirectory() as d:
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
                f"log.segment.bytes={segment_bytes}",
                "-o",
                f"isrlab.power.journal.enable={'true' if journal else 'false'}",
            ],
            cwd=ROOT,
        )
        try:
            wait_port(port)
            secs = _produce(f"127.0.0.1:{port}", n, size, Producer)
        finally:
            proc.terminate()
            proc.wait(30)
    return n / secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--segment-bytes", type=int, default=8 << 20)
    a = ap.parse_args()
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds):
        for journal in (True, False) if r % 2 == 0 else (False, True):
            rate = run(journal, a.messages, a.size, a.segment_bytes)
            rates[journal].append(rate)
            print(f"round {r}: journal {'on ' if journal else 'off'} {rate:,.0f} msg/s", flush=True)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print()
    print("| bookkeeping | median produce rate (acks=1, msg/s) |")
    print("|---|---|")
    print(f"| off (baseline) | {off:,.0f} |")
    print(f"| on | {on:,.0f} ({on / off:.2f}x; target >= 0.95x) |")


if __name__ == "__main__":
    main()
