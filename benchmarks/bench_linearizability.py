"""Benchmark: the linearizability checker against Porcupine on Porcupine's own bench histories.

Suites (shared/bench-data/porcupine beside the repository):

- etcd: the 102 Jepsen etcd logs with a verdict, cas-register model;
- kv: the six kv histories, kv model partitioned by key;
- kv-unpartitioned: the two 10-client kv histories with one state over all keys.

Every verdict is checked against verdicts.txt while timing.  Times are for checking only
(parsing is reported apart), each history's best of ``--repeat`` runs, summed per suite; next to
wall-clock seconds the CPU seconds, which a machine shared with other work distorts less.
Porcupine is measured in the same run when Go and a copy of its repository are available
(``go test -c`` of the repository's own benchmarks, ``-test.benchtime 1x``, best of
``--repeat``); otherwise the figures from the bench data's README are printed, labelled so.

    .venv/bin/python benchmarks/bench_linearizability.py [--repeat 3] [--no-go]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from isrlab.checkers.formats import load_edn, load_jepsen_log  # noqa: E402
from isrlab.checkers.linear import CAS_REGISTER, KV, KV_UNPARTITIONED, Model, check  # noqa: E402

BENCH = ROOT / ".." / "shared" / "bench-data" / "porcupine"
PORCUPINE_MIRROR = ROOT / ".." / ".mirror" / "anishathalye+porcupine" / "repo"
README_FIGURES = {"etcd": 0.65, "kv": 0.4, "kv-unpartitioned": 6.0}

# Which of Porcupine's Go benchmarks make up each suite.
GO_SUITES = {
    "etcd": re.compile(r"^BenchmarkEtcdJepsen\d+$"),
    "kv": re.compile(r"^BenchmarkKv(1Client|10Clients|50Clients)(Ok|Bad)$"),
    "kv-unpartitioned": re.compile(r"^BenchmarkKvNoPartition10Clients(Ok|Bad)$"),
}


def verdicts(folder: str) -> dict[str, bool]:
    found = {}
    for line in (BENCH / folder / "verdicts.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, verdict = line.split()
            found[name] = verdict == "true"
    return found


def time_suite(
    model: Model,
    histories: dict[str, tuple[list[dict[str, Any]], bool]],
    repeat: int,
    workers: int = 1,
) -> tuple[float, float]:
    """(wall, cpu) seconds: each history's best of ``repeat`` checks, summed."""
    wall_total = cpu_total = 0.0
    for name, (ops, expected) in histories.items():
        wall = cpu = float("inf")
        for _ in range(repeat):
            started, started_cpu = time.perf_counter(), time.process_time()
            result = check(model, ops, workers=workers)
            wall = min(wall, time.perf_counter() - started)
            cpu = min(cpu, time.process_time() - started_cpu)
            want = "ok" if expected else "illegal"
            if result.verdict != want:
                raise SystemExit(f"verdict mismatch on {name}: {result.verdict}, expected {want}")
        wall_total += wall
        cpu_total += cpu
    return wall_total, cpu_total


def porcupine_times(repeat: int) -> tuple[dict[str, float], dict[str, float]] | None:
    """Porcupine's own Go benchmarks per suite: (wall, CPU) seconds, or None without Go.

    Wall: each benchmark's best ns/op of ``repeat`` runs, summed.  CPU: the benchmark
    process's user+system time per run of the suite (all goroutines and the Go runtime,
    including its parsing of the test files, so a slight overestimate).
    """
    go = shutil.which("go")
    if go is None or not PORCUPINE_MIRROR.exists():
        return None
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="porcupine-") as tmp:
        archive = subprocess.run(
            ["git", "--git-dir", str(PORCUPINE_MIRROR), "archive", "HEAD"],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "x", "-C", tmp], input=archive.stdout, check=True)
        # Porcupine has no dependencies: build offline.
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"}
        subprocess.run([go, "test", "-c", "-o", "porc.test", "."], cwd=tmp, env=env, check=True)
        for suite, pattern in GO_SUITES.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            output = subprocess.run(
                [
                    "./porc.test",
                    "-test.run",
                    "^$",
                    "-test.bench",
                    pattern.pattern,
                    "-test.benchtime",
                    "1x",
                    "-test.count",
                    str(repeat),
                ],
                cwd=tmp,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            cpu[suite] = used / repeat
            best: dict[str, float] = {}
            for line in output.splitlines():
                found = re.match(r"^(Benchmark\S+?)(-\d+)?\s+\d+\s+(\d+) ns/op", line)
                if found:
                    name, ns = found[1], int(found[3])
                    best[name] = min(best.get(name, float("inf")), ns / 1e9)
            wall[suite] = sum(best.values())
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per history (best counts)")
    parser.add_argument("--no-go", action="store_true", help="do not build/run Porcupine")
    parser.add_argument("--profile", action="store_true", help="cProfile the kv suite once")
    args = parser.parse_args()
    if not BENCH.exists():
        raise SystemExit(f"bench data not found at {BENCH.resolve()}")

    started = time.perf_counter()
    etcd_verdicts = verdicts("jepsen")
    etcd = {
        n: (load_jepsen_log(BENCH / "jepsen" / f"etcd_{int(n):03d}.log"), v)
        for n, v in etcd_verdicts.items()
    }
    kv_verdicts = verdicts("kv")
    kv = {name: (load_edn(BENCH / "kv" / f"{name}.txt"), v) for name, v in kv_verdicts.items()}
    parse_s = time.perf_counter() - started
    print(f"parsed {len(etcd)} etcd logs and {len(kv)} kv histories in {parse_s:.2f} s")

    suites: list[tuple[str, str, Callable[[], tuple[float, float]]]] = [
        (
            "etcd",
            "102 jepsen etcd logs, cas-register",
            lambda: time_suite(CAS_REGISTER, etcd, args.repeat),
        ),
        ("kv", "6 kv histories, partitioned by key", lambda: time_suite(KV, kv, args.repeat)),
        (
            "kv",
            "the same, partitions in 2 processes",
            lambda: time_suite(KV, kv, args.repeat, workers=2),
        ),
        (
            "kv-unpartitioned",
            "c10-ok + c10-bad, one state for all keys",
            lambda: time_suite(
                KV_UNPARTITIONED, {n: kv[n] for n in ("c10-ok", "c10-bad")}, args.repeat
            ),
        ),
    ]
    ours: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for _suite, label, run in suites:
        ours[label], cpu[label] = run()
        print(f"  isrlab {label}: {ours[label]:.3f} s ({cpu[label]:.3f} s CPU)", flush=True)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(time_suite, KV, kv, 1)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)

    go = None if args.no_go else porcupine_times(args.repeat)
    source = "Porcupine (Go), measured now" if go else "Porcupine (Go), README figures"
    theirs, their_cpu = go if go else (README_FIGURES, {})
    print()
    print(
        f"{'suite':<18}{'histories':<42}{'isrlab s':>10}{'CPU s':>8}"
        f"{'Porcupine s':>13}{'CPU s':>8}{'ratio':>7}{'CPU ratio':>10}"
    )
    for suite, label, _run in suites:
        ratio = ours[label] / theirs[suite]
        their = their_cpu.get(suite)
        cpu_ratio = f"{cpu[label] / their:>10.2f}" if their and "2 processes" not in label else ""
        # The parent's CPU says nothing about forked workers: left blank.
        our_cpu = f"{'-':>8}" if "2 processes" in label else f"{cpu[label]:>8.3f}"
        print(
            f"{suite:<18}{label:<42}{ours[label]:>10.3f}{our_cpu}"
            f"{theirs[suite]:>13.3f}{their if their else float('nan'):>8.3f}{ratio:>7.2f}"
            f"{cpu_ratio}"
        )
    print(
        f"(ratio = isrlab / Porcupine; below 1 is faster.  Porcupine column: {source}; "
        f"best of {args.repeat} per history; all verdicts agree with verdicts.txt)"
    )


if __name__ == "__main__":
    main()
