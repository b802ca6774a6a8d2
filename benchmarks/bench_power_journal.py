"""The cost of the synced-length journal (isrlab.power.journal.enable): produce throughput with
acks=1 and the default flush policy, bookkeeping on vs off, alternating in the same run.

    python benchmarks/bench_power_journal.py [--messages 300000] [--size 100] [--rounds 3]
        [--segment-bytes 8388608] [--paired]

Each round starts a fresh broker process with the journal on, then one with it off (order
alternating by round), and produces the same messages with confluent-kafka (acks=1, as
bench_broker_single.py). Small segments (8 MiB by default) make the rolls, and so the fsyncs the
journal follows, frequent. Prints the median rate of each and on/off (target >= 0.95x).

``--paired`` runs the two brokers at the same time instead, each fed by its own producer
process started together, so whatever else loads the machine loads both alike; it prints each
round's on/off ratio and their median.
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
from bench_broker_single import start_broker as broker_process  # noqa: E402


def start_broker(journal: bool, port: int, d: str, segment_bytes: int) -> subprocess.Popen[bytes]:
    return broker_process(
        port,
        d,
        **{
            "log.segment.bytes": str(segment_bytes),
            "isrlab.power.journal.enable": "true" if journal else "false",
        },
    )


def paired_round(n: int, size: int, segment_bytes: int) -> tuple[float, float]:
    """Both brokers at once, each fed by its own producer process started together: the
    machine's other load falls on both alike. (rate with the journal, rate without)."""
    ports = {True: free_port(), False: free_port()}
    with tempfile.TemporaryDirectory() as d_on, tempfile.TemporaryDirectory() as d_off:
        dirs = {True: d_on, False: d_off}
        brokers = {j: start_broker(j, ports[j], dirs[j], segment_bytes) for j in (True, False)}
        try:
            for port in ports.values():
                wait_port(port)
            producers = {
                j: subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--produce-to",
                        str(ports[j]),
                        "--messages",
                        str(n),
                        "--size",
                        str(size),
                    ],
                    stdout=subprocess.PIPE,
                    cwd=ROOT,
                )
                for j in (True, False)
            }
            secs = {
                j: float(p.communicate(timeout=600)[0].decode().strip())
                for j, p in producers.items()
            }
        finally:
            for b in brokers.values():
                b.terminate()
            for b in brokers.values():
                b.wait(30)
    return n / secs[True], n / secs[False]


def run(journal: bool, n: int, size: int, segment_bytes: int) -> float:
    from confluent_kafka import Producer

    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = start_broker(journal, port, d, segment_bytes)
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
    ap.add_argument(
        "--paired",
        action="store_true",
        help="run the two brokers at the same time, one producer process each, and report "
        "each round's on/off ratio (robust to other load on the machine)",
    )
    ap.add_argument("--produce-to", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.produce_to:  # a paired round's producer process: print the seconds it took
        from confluent_kafka import Producer

        print(_produce(f"127.0.0.1:{a.produce_to}", a.messages, a.size, Producer))
        return
    if a.paired:
        ratios = []
        for r in range(a.rounds):
            on, off = paired_round(a.messages, a.size, a.segment_bytes)
            ratios.append(on / off)
            print(
                f"round {r}: on {on:,.0f} msg/s, off {off:,.0f} msg/s: {on / off:.3f}x", flush=True
            )
        print()
        print(
            f"paired rounds: median on/off {statistics.median(ratios):.3f}x "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}; target >= 0.95x)"
        )
        return
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
