"""Spark pipeline throughput: `isrlab analyze` on local[1] and local[2] vs the in-process loop.

Builds (or reuses) a synthetic store of RUNS runs x OPS history lines each
(pipeline.fixtures.synthetic: the default grid's configurations, cycled), then times in the same
run:

- baseline: one Python process looping `pipeline.check.check_run` (load_history +
  checkers.api.check, exactly what `isrlab check` does) over every run;
- `pipeline.analyze.analyze` on each master (default local[1] and local[2]), each in a
  fresh SparkSession: ingest to Parquet + checks inside Spark + aggregation + report.

Prints a markdown table: wall seconds with and without Spark start-up, ops/s, CPU
seconds (this process and its children: the JVM and Python workers) and the load
average while it ran (other work on a shared machine skews wall times), and the
local[1] / local[2] scaling ratio. Targets (issue 6): 200 x 50,000 ops under 5 minutes
on this 2-core machine; local[2] at least 1.7x faster than local[1].

    python benchmarks/bench_pipeline.py [--runs 200] [--ops 50000] [--store DIR]
        [--masters local[1],local[2]] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from isrlab.pipeline.check import check_run
from isrlab.pipeline.fixtures.synthetic import default_grid, write_run
from isrlab.pipeline.store import discover_runs


def _write(args: tuple[Path, dict[str, Any], int]) -> Path:
    store, test, n_ops = args
    return write_run(store, test, n_ops)


def build_store(store: Path, runs: int, n_ops: int, jobs: int) -> float:
    """Write `runs` run directories unless the store already holds them; returns seconds."""
    marker = store / ".bench.json"
    want = {"runs": runs, "ops": n_ops, "version": 1}
    if marker.is_file() and orjson.loads(marker.read_bytes()) == want:
        return 0.0
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)
    grid = list(default_grid(1))
    tests = []
    for i in range(runs):
        t = dict(grid[i % len(grid)])
        t["repeat"] = i // len(grid)
        t["seed"] = i
        t["name"] = f"{t['name'].rsplit('_r', 1)[0]}_r{t['repeat']}"
        tests.append(t)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(_write, [(store, t, n_ops) for t in tests], chunksize=4))
    marker.write_bytes(orjson.dumps(want))
    return time.perf_counter() - t0


def _proc_times(pid: int) -> tuple[int, list[int]] | None:
    """(parent pid, [utime, stime, cutime, cstime] in ticks) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), [int(x) for x in fields[11:15]]


def _jvm_cpu() -> float:
    """CPU seconds of Spark's JVM plus every live descendant (the Python workers).

    Sampled while the session is still up: the workers' time is only ever reaped into
    the JVM's counters in part, so each worker is read directly from /proc.
    """
    from pyspark import SparkContext

    gateway = getattr(SparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return 0.0
    jvm = _proc_times(proc.pid)
    if jvm is None:
        return 0.0
    total = jvm[1][0] + jvm[1][1]
    parents: dict[int, int] = {}
    times: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            got = _proc_times(int(entry.name))
            if got is not None:
                parents[int(entry.name)], times[int(entry.name)] = got
    for pid, t in times.items():
        p = parents.get(pid, 0)
        while p and p != proc.pid:
            p = parents.get(p, 0)
        if p == proc.pid:
            total += sum(t)
    return total / os.sysconf("SC_CLK_TCK")


def baseline(store: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, ops) of one process checking every run in turn."""
    runs, _ = discover_runs(store)
    t0 = time.perf_counter()
    c0 = time.process_time()
    ops = 0
    for r in runs:
        row = check_run(r.run_id, r.path, r.test)
        ops += row["ops"] or 0
    return time.perf_counter() - t0, time.process_time() - c0, ops


def spark_run(store: Path, out: Path, master: str) -> dict[str, float]:
    from pyspark.sql import SparkSession

    from isrlab.pipeline.analyze import analyze
    from isrlab.pipeline.spark import spark_session

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    c0 = _jvm_cpu() + time.process_time()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    spark = spark_session(master, app_name=f"bench-{master}")
    start = time.perf_counter() - t0
    analysis = analyze(store, out, spark=spark)
    seconds = dict(analysis.seconds)
    seconds["spark_start"] = start
    seconds["analysis"] = seconds["total"] - seconds.get("start", 0.0)
    # The first session's JVM starts inside this call: its CPU is all new.
    seconds["cpu"] = _jvm_cpu() + time.process_time() - c0
    spark.stop()
    seconds["load"] = (load0 + os.getloadavg()[0]) / 2
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--ops", type=int, default=50_000, help="history lines per run")
    ap.add_argument("--store", type=Path, help="keep / reuse the synthetic store here")
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="generator processes")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()

    tmp = None
    if args.store is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-pipeline-")
        store = Path(tmp.name) / "store"
    else:
        store = args.store
    gen = build_store(store, args.runs, args.ops, args.jobs)
    total_ops = args.runs * args.ops
    print(f"# store {store}: {args.runs} runs x {args.ops} ops (generated in {gen:.0f} s)")
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    rows: list[tuple[str, float, float | None, float, float]] = []
    if not args.skip_baseline:
        load0 = os.getloadavg()[0]
        secs, cpu, ops = baseline(store)
        load = (load0 + os.getloadavg()[0]) / 2
        rows.append(("in-process loop (1 core)", secs, None, cpu, load))
        print(f"# baseline: {secs:.1f} s ({cpu:.1f} CPU s) for {ops} ops", flush=True)
    timings: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-out-") as out:
        for master in [m.strip() for m in args.masters.split(",") if m.strip()]:
            s = spark_run(store, Path(out) / master.replace("[", "").replace("]", ""), master)
            timings[master] = s
            rows.append((f"analyze {master}", s["analysis"], s["spark_start"], s["cpu"], s["load"]))
            print(f"# {master}: " + ", ".join(f"{k} {v:.1f}" for k, v in s.items()), flush=True)
    print()
    print("| what | wall s | + Spark start | ops/s | CPU s | load avg |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, secs, start, cpu, load in rows:
        start_txt = f"{secs + start:.1f}" if start is not None else "-"
        print(
            f"| {name} | {secs:.1f} | {start_txt} | {total_ops / secs:,.0f} "
            f"| {cpu:.0f} | {load:.1f} |"
        )
    if "local[1]" in timings and "local[2]" in timings:
        ratio = timings["local[1]"]["analysis"] / timings["local[2]"]["analysis"]
        print(f"\nscaling local[1] / local[2]: {ratio:.2f}x (target >= 1.7x)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
