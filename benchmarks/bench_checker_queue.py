"""Queue checker throughput: `isrlab check FILE --workload queue` next to loading the file.

Generates a history of a correct replicated log (pipeline.fixtures.simulate: 20 processes,
10 keys, sends, polls and transactions with some info/fail/crash), writes it as
history.jsonl, then times, in the same run and each in a fresh Python process (as the
CLI runs):

- `dict load` (the baseline): `checkers.history.load_history`, the file loaded and
  validated as the spec's op dicts (what the library API and the Spark pipeline load);
- `parse`: the file parsed by orjson block by block, the dicts dropped: the least any
  checker that reads JSON pays;
- `check`: what `isrlab check FILE --workload queue` does, from the file to the
  results: the native screen (checkers.queue.screen) and, only if it cannot prove the
  history clean, loading the records and the explaining checker;
- `explain`: that explaining path on its own (`load_queue`, then `check_queue` with the
  screen off, then freeing the records): what a history with anomalies costs.

    python benchmarks/bench_checker_queue.py [--ops N] [--interleave] [--late-acks X]
        [--anomalies acks1] [--repeat R] [--header] [--keep FILE | --history FILE]

`--anomalies acks1` generates the history an acks=1 run under partitions gives: no
transactions (a transactional producer needs acks=all), leaders lost with the last
records they acknowledged alone (lost writes, unseen, inconsistent offsets, committed
truncation, watermarks and send offsets going back) and retries of a producer that is
not idempotent (duplicates, and the G0 cycles they bring): the checker's explaining path.

Targets: `check` >= 250,000 ops/s on one core, and check time <= 2x load time (printed
against both baselines). CPU time (user + system, from getrusage) is the honest figure
on a shared machine; wall time and the load average are printed beside it.
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

STEPS = ("dict-load", "parse", "check", "explain")


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
    from isrlab.checkers.api import load_for_check
    from isrlab.checkers.history import gc_paused, load_history
    from isrlab.checkers.queue import check_queue
    from isrlab.checkers.queue.load import load_queue, parse_blocks

    out: dict[str, Any] = {}
    if step == "dict-load":
        a = _usage()
        ops = load_history(path)
        out = _delta(a, _usage())
        out["lines"] = len(ops)
    elif step == "parse":
        a = _usage()
        n = 0
        with gc_paused():  # as every loader here parses
            for ops, _size in parse_blocks(path):
                n += len(ops)
        out = _delta(a, _usage())
        out["lines"] = n
    elif step == "check":
        a = _usage()
        h = load_for_check(path, "jsonl", "queue")
        results = check_queue(h)
        del h
        out = _delta(a, _usage())
        out["valid"] = results["valid"]
        out["stats"] = results["stats"]
        out["types"] = results["anomaly_types"]
    elif step == "explain":
        a = _usage()
        q = load_queue(path)
        results = check_queue(q, screen=False)
        b = _usage()
        del q  # the CLI frees its history on the way out, too
        out = _delta(a, _usage())
        out["free"] = _delta(b, _usage())["cpu"]
        out["valid"] = results["valid"]
    if step == "check":  # did the screen prove it clean (the file never loaded)?
        from isrlab.checkers.queue.screen import screen_file

        verdict = screen_file(path)
        out["screen"] = "clean" if verdict.stats is not None else verdict.needs_checker
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
    ap.add_argument(
        "--late-acks",
        type=float,
        default=0.0,
        help="fraction of ok sends acknowledged late, as on a real cluster (backward wr "
        "edges: the cycle search's work)",
    )
    ap.add_argument(
        "--anomalies",
        choices=("acks1",),
        help="acks1: the anomalies of an acks=1 run under partitions (see the module doc)",
    )
    ap.add_argument("--measure", nargs=2, metavar=("STEP", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return

    from isrlab.checkers.history import write_history
    from isrlab.pipeline.fixtures.simulate import simulate

    gen_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.history or args.keep or Path(tmp) / "history.jsonl"
        if args.history is None:
            t0 = time.perf_counter()
            acks1 = args.anomalies == "acks1"
            ops = simulate(
                int(args.ops),
                processes=20,
                keys=10,
                seed=args.seed,
                txn_rate=0.0 if acks1 else 0.25,
                truncate_rate=0.003 if acks1 else 0.0,
                retry_dup_rate=0.002 if acks1 else 0.0,
                info_rate=0.01,
                fail_rate=0.02,
                crash_rate=0.002,
                assign_rate=0.002,
                interleave=args.interleave,
                late_acks=args.late_acks,
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
    dl, pa, ck, ex = (best[s] for s in STEPS)
    if args.header:
        print(
            "| ops | MB | history | cpu s: dict load (baseline) | parse | check "
            "| check ops/s (cpu) | check / dict load | check / parse | screen "
            "| explaining path alone | its ops/s "
            "| wall s: dict load | check | check ops/s (wall) | valid | load avg | python |"
        )
        print("|" + "---|" * 18)
    print(
        f"| {lines:,} | {size / 1e6:.0f} | "
        f"{'acks=1 under partitions' if args.anomalies else ''}"
        f"{'interleaved' if args.interleave else 'atomic' if not args.anomalies else ''}"
        f"{f', late acks {args.late_acks:g}' if args.late_acks else ''}"
        f"{' (file)' if args.history else ''} | "
        f"{dl['cpu']:.2f} | {pa['cpu']:.2f} | {ck['cpu']:.2f} | {lines / ck['cpu']:,.0f} | "
        f"{ck['cpu'] / dl['cpu']:.2f} | {ck['cpu'] / pa['cpu']:.2f} | {ck['screen']} | "
        f"{ex['cpu']:.2f} | {lines / ex['cpu']:,.0f} | "
        f"{dl['wall']:.2f} | {ck['wall']:.2f} | {lines / ck['wall']:,.0f} | {ck['valid']} | "
        f"{load_before[0]:.1f}-{load_after[0]:.1f} | {platform.python_version()} |"
    )
    print(
        f"(generated in {gen_s:.1f} s; of the cpu time, in the kernel: dict load "
        f"{dl['sys']:.2f} s, parse {pa['sys']:.2f} s, check {ck['sys']:.2f} s, explain "
        f"{ex['sys']:.2f} s; minor page faults: dict load {dl['faults']:,}, parse "
        f"{pa['faults']:,}, check {ck['faults']:,}, explain {ex['faults']:,}; freeing the "
        f"records in explain {ex['free']:.2f} s cpu; anomaly types {ck['types']}; "
        f"stats {ck['stats']})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
