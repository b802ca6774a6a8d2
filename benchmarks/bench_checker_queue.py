"""Queue checker throughput: load-only vs load+check on one synthetic history.

Generates a history of a correct replicated log (checkers.queue.simulate: 20 processes,
10 keys, sends, polls and transactions with some info/fail/crash), writes it as
history.jsonl, then times, in the same run, loading alone (the baseline) and loading
plus `check_queue`. Prints a markdown table row with ops/s (ops = history lines).

    python benchmarks/bench_checker_queue.py [--ops N] [--interleave] [--repeat R] [--header]

Targets: load+check >= 250,000 ops/s on one core, check time <= 2x load time. Wall and
CPU (process) times are both printed: on a shared machine CPU time is the honest one.
"""

from __future__ import annotations

import argparse
import gc
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checkers.history import load_history, write_history
from checkers.queue import check_queue
from checkers.queue.simulate import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=float, default=1e6, help="history lines to generate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="write the history here and keep it")
    ap.add_argument("--header", action="store_true", help="print the table header first")
    ap.add_argument("--repeat", type=int, default=1, help="best of N timings")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="Kafka-like non-isolated transactional writes (many allowed G0/G1c-ww cycles)",
    )
    args = ap.parse_args()
    n = int(args.ops)

    t0 = time.perf_counter()
    ops = simulate(
        n,
        processes=20,
        keys=10,
        seed=args.seed,
        txn_rate=0.25,
        info_rate=0.01,
        fail_rate=0.02,
        crash_rate=0.002,
        assign_rate=0.002,
        interleave=args.interleave,
    )
    gen_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "history.jsonl"
        write_history(ops, path)
        size = path.stat().st_size
        lines = len(ops)
        del ops
        gc.collect()

        # Best of N; CPU time too, since wall time on a shared machine measures neighbours.
        load_s = check_s = load_cpu = check_cpu = float("inf")
        load_sys = check_sys = 0.0
        load_faults = check_faults = 0
        verdict = None
        for _ in range(args.repeat):
            t0, c0, (k0, f0) = time.perf_counter(), time.process_time(), _kernel()
            loaded = load_history(path)
            load_s = min(load_s, time.perf_counter() - t0)
            if time.process_time() - c0 < load_cpu:
                k1, f1 = _kernel()
                load_cpu, load_sys, load_faults = time.process_time() - c0, k1 - k0, f1 - f0
            del loaded
            gc.collect()
            t0, c0, (k0, f0) = time.perf_counter(), time.process_time(), _kernel()
            loaded = load_history(path)
            results = check_queue(loaded)
            check_s = min(check_s, time.perf_counter() - t0)
            if time.process_time() - c0 < check_cpu:
                k1, f1 = _kernel()
                check_cpu, check_sys, check_faults = time.process_time() - c0, k1 - k0, f1 - f0
            verdict = results["valid"]
            del loaded, results
            gc.collect()

    only_check = check_s - load_s
    only_check_cpu = check_cpu - load_cpu
    if args.header:
        print(
            "| ops | MB | load s | load ops/s | load+check s | load+check ops/s | check/load "
            "| cpu: load s | cpu: load+check s | cpu: load+check ops/s | cpu: check/load "
            "| valid | txns | python |"
        )
        print("|" + "---|" * 14)
    print(
        f"| {lines:,} | {size / 1e6:.0f} | {load_s:.2f} | {lines / load_s:,.0f} | "
        f"{check_s:.2f} | {lines / check_s:,.0f} | {only_check / load_s:.2f} | "
        f"{load_cpu:.2f} | {check_cpu:.2f} | {lines / check_cpu:,.0f} | "
        f"{only_check_cpu / load_cpu:.2f} | {verdict} | "
        f"{'interleaved' if args.interleave else 'atomic'} | {platform.python_version()} |"
    )
    print(
        f"(generated in {gen_s:.1f} s; check alone {only_check:.2f} s wall, "
        f"{only_check_cpu:.2f} s cpu; of the cpu time, in the kernel: load {load_sys:.2f} s, "
        f"load+check {check_sys:.2f} s; minor page faults: load {load_faults:,}, "
        f"load+check {check_faults:,})",
        file=sys.stderr,
    )


def _kernel() -> tuple[float, int]:
    """(CPU seconds spent in the kernel, minor page faults) of this process so far.

    Kernel time is part of process_time; building millions of objects touches fresh
    memory, and on some machines its page faults cost as much as the parsing.
    """
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_stime, ru.ru_minflt


if __name__ == "__main__":
    main()
