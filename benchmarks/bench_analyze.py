"""`isrlab analyze` wall time on small and large stores: sized to the store vs the previous
settings, in the same run.

Issue 15: on a one-run store `isrlab analyze` took ~73 s (Spark's start, then a job shaped
for thousands of runs). `pipeline.analyze.analyze` now sizes Spark to the store (`tuned`):
`spark.sql.shuffle.partitions` scaled to the runs (`shuffle_partitions_for`), and a store of at
most `SMALL_STORE_RUNS` runs starts its JVM for a short job (C1 only, serial GC, no whole-stage
code generation). `tuned=False` is what every store got before (8 shuffle partitions, JVM
defaults): the baseline.

Each measurement is a fresh Python process doing what `isrlab analyze STORE` does (interpreter,
imports, Spark start on local[*], the analysis, the report, the JVM's exit), timed from outside;
the two settings alternate per store so that other work on the machine hits both alike. Also
printed: whether pyspark's "does not yet fully support pandas" warning appeared (its cause,
pandas >= 3 with pyspark 4, is fixed by the `spark` extra's `pandas<3` pin).

    python benchmarks/bench_analyze.py [--small 1,20] [--large 100] [--ops 5000] [--repeats 1]

Target (issue 15): stores of <= 20 runs in <= 20 s; large stores no slower than before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from isrlab.pipeline.fixtures.synthetic import default_grid, write_run

CHILD = """
import json, sys, time
from pathlib import Path
from isrlab.pipeline.analyze import analyze
from rich.console import Console
a = analyze(Path(sys.argv[1]), Path(sys.argv[2]), "local[*]", tuned=sys.argv[3] == "1",
            console=Console(stderr=True, quiet=True))
print(json.dumps({"runs": a.runs, "checked": a.checked, "seconds": a.seconds}))
"""


def build_store(store: Path, runs: int, n_ops: int) -> None:
    grid = list(default_grid(1))
    for i in range(runs):
        t = dict(grid[i % len(grid)])
        t["repeat"] = i // len(grid)
        t["seed"] = i
        t["name"] = f"{t['name'].rsplit('_r', 1)[0]}_r{t['repeat']}"
        write_run(store, t, n_ops)


def measure(store: Path, out: Path, tuned: bool) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(store), str(out), "1" if tuned else "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"analyze failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    got["wall"] = wall
    got["pandas_warning"] = "support pandas" in proc.stderr
    got["load"] = (load0 + os.getloadavg()[0]) / 2
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", default="1,20", help="run counts of the small stores")
    ap.add_argument("--large", default="100", help="run counts of the large stores (0: none)")
    ap.add_argument("--ops", type=int, default=5000, help="history lines per run")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    sizes = [int(x) for x in f"{args.small},{args.large}".split(",") if x.strip() and int(x) > 0]
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.ops} ops per run")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as tmp:
        for runs in sizes:
            store = Path(tmp) / f"store-{runs}"
            build_store(store, runs, args.ops)
            for rep in range(args.repeats):
                for tuned in (False, True) if rep % 2 == 0 else (True, False):
                    got = measure(store, Path(tmp) / f"out-{runs}-{int(tuned)}", tuned)
                    rows.append((runs, tuned, got))
                    print(
                        f"# {runs} runs, {'sized to the store' if tuned else 'previous'}: "
                        f"{got['wall']:.1f} s, "
                        + ", ".join(f"{k} {v:.1f}" for k, v in got["seconds"].items())
                        + f", load {got['load']:.1f}",
                        flush=True,
                    )
    print()
    print(
        "| runs | previous settings (s) | sized to the store (s) | ratio | pandas warning | load |"
    )
    print("|---:|---:|---:|---:|---|---:|")
    for runs in sizes:
        prev = [g for r, t, g in rows if r == runs and not t]
        new = [g for r, t, g in rows if r == runs and t]
        p = min(g["wall"] for g in prev)
        n = min(g["wall"] for g in new)
        warn = f"{any(g['pandas_warning'] for g in prev)} / {any(g['pandas_warning'] for g in new)}"
        load = sum(g["load"] for g in prev + new) / len(prev + new)
        print(f"| {runs} | {p:.1f} | {n:.1f} | {n / p:.2f}x | {warn} | {load:.1f} |")


if __name__ == "__main__":
    main()
