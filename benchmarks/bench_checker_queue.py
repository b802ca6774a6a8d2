"""Queue checker throughput: loading, checking, and both as `isrlab check` does them.

Generates a history of a correct replicated log (checkers.queue.simulate: 20 processes,
10 keys, sends, polls and transactions with some info/fail/crash), writes it as
history.jsonl, then times, in the same run and each in a fresh Python process (as the
CLI runs; a process that already freed a big load would reuse that memory and fault
fewer pages):

- `dict load`: `checkers.history.load_history`, the spec's op dicts (the baseline: what
  the library API and the Spark pipeline load);
- `fast load`: `checkers.queue.load.load_queue`, the records `isrlab check` loads;
- `check`: `check_queue` of those records alone;
- `load+check`: `load_queue`, `check_queue` and freeing the records, timed together
  (what `isrlab check FILE --workload queue` does; freeing half a million records and
  their reads is about a second of it, printed apart).

    python benchmarks/bench_checker_queue.py [--ops N] [--interleave] [--repeat R] [--header]

Targets: load+check >= 250,000 ops/s on one core, check time <= 2x load time. CPU time
(user + system, from getrusage) is the honest figure on a shared machine; wall time and
the load average are printed beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = ("dict-load", "fast-load", "check", "load+check")


def _usage() -> tuple[float, float, float, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), ru.ru_utime, ru.ru_stime, ru.ru_minflt


def _delta(a: tuple[float, float, float, int], b: tuple[float, float, float, int]) -> dict:
    return {
        "wall": b[0] - a[0],
        "cpu": (b[1] - a[1]) + (b[2] - a[2]),
        "sys": b[2] - a[2],
        "faults": b[3] - a[3],
    }


def measure(step: str, path: Path) -> dict[str, Any]:
    """Run one step in this (fresh) process; its figures, and the verdict if it checked."""
    from checkers.history import load_history
    from checkers.queue import check_queue
    from checkers.queue.load import QueueHistory, load_queue

    out: dict[str, Any] = {}
    if step == "dict-load":
        a = _usage()
        ops = load_history(path)
        out = _delta(a, _usage())
        out["lines"] = len(ops)
    elif step == "fast-load":
        a = _usage()
        h = load_queue(path)
        out = _delta(a, _usage())
        out["fast"] = isinstance(h, QueueHistory)
    elif step == "check":
        h = load_queue(path)
        a = _usage()
        results = check_queue(h)
        out = _delta(a, _usage())
        out["valid"] = results["valid"]
        out["stats"] = results["stats"]
    elif step == "load+check":
        a = _usage()
        h = load_queue(path)
        results = check_queue(h)
        b = _usage()
        del h  # the CLI frees its history on the way out, too
        out = _delta(a, _usage())
        out["free"] = _delta(b, _usage())["cpu"]
        out["valid"] = results["valid"]
    return out


def _run_step(step: str, path: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, __file__, "--measure", step, str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=float, default=1e6, help="history lines to generate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="write the history here and keep it")
    ap.add_argument(
        "--history",
        type=Path,
        help="time this history file instead (with --interleave only to label its row)",
    )
    ap.add_argument("--header", action="store_true", help="print the table header first")
    ap.add_argument("--repeat", type=int, default=1, help="best of N timings (by CPU time)")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="Kafka-like non-isolated transactional writes (many allowed G0/G1c-ww cycles)",
    )
    ap.add_argument("--measure", nargs=2, metavar=("STEP", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return

    from checkers.history import write_history
    from checkers.queue.simulate import simulate

    gen_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.history or args.keep or Path(tmp) / "history.jsonl"
        if args.history is None:
            t0 = time.perf_counter()
            ops = simulate(
                int(args.ops),
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
            write_history(ops, path)
            del ops
            gc.collect()
        size = path.stat().st_size
        load_before = os.getloadavg()
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeat):
            for step in STEPS:
                r = _run_step(step, path)
                if step not in best or r["cpu"] < best[step]["cpu"]:
                    best[step] = r
        load_after = os.getloadavg()

    lines = best["dict-load"]["lines"]
    dl, fl, ck, lc = (best[s] for s in STEPS)
    if args.header:
        print(
            "| ops | MB | txns | cpu s: dict load | fast load | check | load+check "
            "| load+check ops/s (cpu) | check / fast load (cpu) "
            "| wall s: dict load | fast load | check | load+check | load+check ops/s (wall) "
            "| valid | load avg | python |"
        )
        print("|" + "---|" * 17)
    print(
        f"| {lines:,} | {size / 1e6:.0f} | "
        f"{'interleaved' if args.interleave else 'atomic'}"
        f"{' (file)' if args.history else ''} | "
        f"{dl['cpu']:.2f} | {fl['cpu']:.2f} | {ck['cpu']:.2f} | {lc['cpu']:.2f} | "
        f"{lines / lc['cpu']:,.0f} | {ck['cpu'] / fl['cpu']:.2f} | "
        f"{dl['wall']:.2f} | {fl['wall']:.2f} | {ck['wall']:.2f} | {lc['wall']:.2f} | "
        f"{lines / lc['wall']:,.0f} | {lc['valid']} | "
        f"{load_before[0]:.1f}-{load_after[0]:.1f} | {platform.python_version()} |"
    )
    print(
        f"(generated in {gen_s:.1f} s; fast path taken: {fl['fast']}; of the cpu time, in "
        f"the kernel: dict load {dl['sys']:.2f} s, fast load {fl['sys']:.2f} s, check "
        f"{ck['sys']:.2f} s, load+check {lc['sys']:.2f} s; minor page faults: dict load "
        f"{dl['faults']:,}, fast load {fl['faults']:,}, check {ck['faults']:,}, load+check "
        f"{lc['faults']:,}; freeing the records in load+check {lc['free']:.2f} s cpu; check/dict load {ck['cpu'] / dl['cpu']:.2f}; "
        f"stats {ck['stats']})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
