"""Benchmark: `isrlab check` start-up, and many small histories in one process (issue 15).

Two measurements, each next to a baseline taken in the same run:

- start-up: `isrlab check --help` (builds only `check`), next to `isrlab --help` (imports
  every command's module, as every `isrlab` invocation did before commands were registered
  lazily) and `python -c pass` (the interpreter alone). Best and median of ``--repeat`` runs.
- many small histories: one `isrlab check FILE` process per history (the baseline: what a
  shell loop over files costs) against one `isrlab check DIR` process for all of them, wall
  seconds and CPU seconds (user + system of the child processes). Suites: Porcupine's Jepsen
  etcd logs (shared/bench-data/porcupine/jepsen, `--format jepsen-log -w cas-register`) when
  present, and ``--queue-files`` generated queue histories (`pipeline.fixtures.simulate`,
  ``--queue-ops`` ops each, `-w queue`). Both ways must give the same verdicts.

Porcupine itself is not run here (no Go toolchain): no comparison with it is printed.

    .venv/bin/python benchmarks/bench_check_startup.py [--repeat 7] [--queue-files 50]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the console script a user runs (`python -m isrlab.harness.cli` when it is not installed)
_SCRIPT = Path(sys.executable).with_name("isrlab")
ISRLAB = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "isrlab.harness.cli"]
ETCD = ROOT / ".." / "shared" / "bench-data" / "porcupine" / "jepsen"


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit code, stdout) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode, done.stdout


def startup(repeat: int) -> None:
    print(f"start-up, {repeat} runs each: best / median wall s (best CPU s)")
    for label, cmd in (
        ("python -c pass (interpreter)", [sys.executable, "-c", "pass"]),
        ("isrlab check --help", [*ISRLAB, "check", "--help"]),
        ("isrlab --help (every command, baseline)", [*ISRLAB, "--help"]),
    ):
        runs = [timed(cmd) for _ in range(repeat)]
        assert all(r[2] == 0 for r in runs), f"{label} failed"
        walls = [r[0] for r in runs]
        print(
            f"  {label:<42} {min(walls):6.3f} / {statistics.median(walls):6.3f}"
            f"   ({min(r[1] for r in runs):.3f})"
        )


def verdicts_of(lines: str) -> list[str]:
    return [line.split()[0] for line in lines.splitlines() if line.strip()]


def many(label: str, files: list[Path], args: list[str]) -> None:
    folder = files[0].parent
    one_each = [timed([*ISRLAB, "check", str(f), *args]) for f in files]
    wall_each = sum(r[0] for r in one_each)
    cpu_each = sum(r[1] for r in one_each)
    wall_all, cpu_all, code_all, out_all = timed([*ISRLAB, "check", str(folder), *args])
    # the same verdicts both ways (single-file output: first word of the first line)
    single = [r[3].split()[0] if r[3].split() else "error" for r in one_each]
    together = verdicts_of(out_all)
    assert single == together, (single, together)
    worst = max((r[2] for r in one_each), default=0)
    assert code_all == worst, (code_all, worst)
    n = len(files)
    print(f"{label}: {n} histories (exit {code_all}; {', '.join(sorted(set(together)))})")
    print(f"  {'':<36} {'wall s':>8} {'CPU s':>8} {'CPU ms/history':>15}")
    print(
        f"  {'one process per history (baseline)':<36} {wall_each:8.2f} {cpu_each:8.2f}"
        f" {1000 * cpu_each / n:15.1f}"
    )
    print(
        f"  {'one process for all':<36} {wall_all:8.2f} {cpu_all:8.2f} {1000 * cpu_all / n:15.1f}"
    )
    print(f"  CPU ratio {cpu_each / max(cpu_all, 1e-9):.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--queue-files", type=int, default=50)
    ap.add_argument("--queue-ops", type=int, default=200)
    ap.add_argument("--startup-only", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("COLUMNS", "200")
    startup(a.repeat)
    if a.startup_only:
        return
    if ETCD.is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            copies = []
            for f in sorted(ETCD.glob("etcd_*.log")):  # a folder of the logs alone
                target = Path(tmp) / "logs" / f.name
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(f.read_bytes())
                copies.append(target)
            many(
                "Porcupine's Jepsen etcd logs, cas-register",
                copies,
                ["--format", "jepsen-log", "-w", "cas-register"],
            )
    else:
        print(f"(no {ETCD}: the etcd suite is skipped)")
    from isrlab.checkers.history import write_history
    from isrlab.pipeline.fixtures.simulate import simulate

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i in range(a.queue_files):
            files.append(Path(tmp) / f"h{i:04d}.jsonl")
            write_history(simulate(a.queue_ops, seed=i), files[-1])
        many(f"generated queue histories of {a.queue_ops} ops", files, ["-w", "queue"])


if __name__ == "__main__":
    main()
