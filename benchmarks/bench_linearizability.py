"""Benchmark: the linearizability checker against Porcupine on Porcupine's own bench histories.

Suites (Porcupine's ``test_data``, the files its own ``go test`` benchmarks read):

- etcd: the 102 Jepsen etcd logs with a verdict (``etcd_095.log`` is empty), cas-register model;
- kv: the six kv histories (EDN), kv model partitioned by key;
- kv-unpartitioned (``--unpartitioned``): the two 10-client kv histories with one state over
  all keys (slow on both sides).

Both tools are timed in CPU seconds (user + system) from the files to the verdicts, parsing
included, in one process per suite, best of ``--repeat`` rounds:

- isrlab: ``checkers.formats.load_operations`` (file -> the search's operations, no op dicts)
  and ``checkers.linear.check_operations`` for every history of the suite, in this process
  (``time.process_time`` around the round; the interpreter's start and imports are not in it);
- Porcupine: its repository's own benchmarks (``go test -c``; ``-test.benchtime 1x``: each
  benchmark parses its file, then checks it once), the test binary's CPU from getrusage, so
  its process start, parsing and all goroutines are in it.  Its own ns/op figures (check
  only, wall clock) are printed too.

Every verdict is checked against the known one: Porcupine's test file (``checkJepsen(t, N,
verdict)``, ``checkKv(t, name, verdict, ...)``), or ``verdicts.txt`` beside the bench data.

Where the data and Porcupine come from, first found: ``--porcupine DIR`` (a checkout, or a
bare git directory); ``$PORCUPINE_DIR``; the mirror ``../.mirror/anishathalye+porcupine/repo``
beside the repository; a shallow ``git clone`` of https://github.com/anishathalye/porcupine
(``--no-clone`` to skip).  Without the repository the data may come from
``../shared/bench-data/porcupine``; without Go (or the repository) isrlab's figures are
printed alone, saying why.

    .venv/bin/python benchmarks/bench_linearizability.py [--repeat 3] [--no-go] [--unpartitioned]
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from isrlab.checkers.formats import load_operations  # noqa: E402
from isrlab.checkers.linear import (  # noqa: E402
    CAS_REGISTER,
    KV,
    KV_UNPARTITIONED,
    Model,
    check_operations,
)

SHARED_DATA = ROOT / ".." / "shared" / "bench-data" / "porcupine"
MIRROR = ROOT / ".." / ".mirror" / "anishathalye+porcupine" / "repo"
UPSTREAM = "https://github.com/anishathalye/porcupine"

# Which of Porcupine's Go benchmarks make up each suite.
GO_SUITES = {
    "etcd": r"^BenchmarkEtcdJepsen\d+$",
    "kv": r"^BenchmarkKv(1Client|10Clients|50Clients)(Ok|Bad)$",
    "kv-unpartitioned": r"^BenchmarkKvNoPartition10Clients(Ok|Bad)$",
}
KV_NAMES = {"1Client": "c01", "10Clients": "c10", "50Clients": "c50"}


@dataclass
class Suite:
    name: str
    label: str
    model: Model
    fmt: str
    histories: list[tuple[Path, bool]]


@contextmanager
def porcupine_checkout(args: argparse.Namespace) -> Iterator[tuple[Path | None, str]]:
    """(a directory holding Porcupine's source and test_data, or None; where it came from)."""
    given = args.porcupine or os.environ.get("PORCUPINE_DIR")
    candidates = [Path(given)] if given else [MIRROR]
    with tempfile.TemporaryDirectory(prefix="porcupine-") as tmp:
        for candidate in candidates:
            if (candidate / "porcupine_test.go").exists():
                yield candidate, str(candidate)
                return
            if (candidate / "HEAD").exists() and (candidate / "objects").exists():
                archive = subprocess.run(
                    ["git", "--git-dir", str(candidate), "archive", "HEAD"],
                    capture_output=True,
                )
                if archive.returncode == 0:
                    subprocess.run(["tar", "x", "-C", tmp], input=archive.stdout, check=True)
                    yield Path(tmp), f"{candidate.resolve()} (git archive HEAD)"
                    return
        if given:
            yield None, f"--porcupine/PORCUPINE_DIR {given} is not a Porcupine checkout"
            return
        if args.no_clone or shutil.which("git") is None:
            yield None, "no Porcupine checkout found (mirror absent; cloning skipped)"
            return
        target = Path(tmp) / "porcupine"
        try:
            subprocess.run(
                ["git", "clone", "--quiet", "--depth", "1", UPSTREAM, str(target)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            yield None, f"no Porcupine checkout found and cloning {UPSTREAM} failed ({err})"
            return
        yield target, f"{UPSTREAM} (cloned now)"


def go_verdicts(test_file: Path) -> tuple[dict[int, bool], dict[str, bool]]:
    """The verdicts Porcupine's own tests assert, per etcd log number and kv file."""
    text = test_file.read_text()
    etcd = {int(n): v == "true" for n, v in re.findall(r"checkJepsen\(t, (\d+), (\w+)\)", text)}
    kv = {name: v == "true" for name, v in re.findall(r'checkKv\(t, "(\w+-\w+)", (\w+),', text)}
    return etcd, kv


def file_verdicts(folder: Path) -> dict[str, bool]:
    found = {}
    for line in (folder / "verdicts.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, verdict = line.split()
            found[name] = verdict == "true"
    return found


def suites(
    checkout: Path | None, unpartitioned: bool
) -> tuple[list[Suite], str] | tuple[None, str]:
    if checkout is not None and (checkout / "test_data").is_dir():
        data = checkout / "test_data"
        etcd_v, kv_v = go_verdicts(checkout / "porcupine_test.go")
        source = f"{data} (verdicts from porcupine_test.go)"
    elif SHARED_DATA.is_dir():
        data = SHARED_DATA
        etcd_v = {int(n): v for n, v in file_verdicts(data / "jepsen").items()}
        kv_v = file_verdicts(data / "kv")
        source = f"{data.resolve()} (verdicts.txt)"
    else:
        return None, "no bench data: neither Porcupine's test_data nor ../shared/bench-data"
    found = [
        Suite(
            "etcd",
            f"{len(etcd_v)} jepsen etcd logs, cas-register",
            CAS_REGISTER,
            "jepsen-log",
            [(data / "jepsen" / f"etcd_{n:03d}.log", v) for n, v in sorted(etcd_v.items())],
        ),
        Suite(
            "kv",
            f"{len(kv_v)} kv histories, partitioned by key",
            KV,
            "edn",
            [(data / "kv" / f"{name}.txt", v) for name, v in sorted(kv_v.items())],
        ),
    ]
    if unpartitioned:
        found.append(
            Suite(
                "kv-unpartitioned",
                "c10-ok + c10-bad, one state for all keys",
                KV_UNPARTITIONED,
                "edn",
                [(data / "kv" / f"{name}.txt", kv_v[name]) for name in ("c10-ok", "c10-bad")],
            )
        )
    return found, source


def time_isrlab(suite: Suite, repeat: int) -> tuple[float, float, float]:
    """(CPU seconds of the best round, its parsing part, its checking part)."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(repeat):
        parse = check = 0.0
        started = time.process_time()
        for path, expected in suite.histories:
            t0 = time.process_time()
            ops, failed, dropped = load_operations(path, suite.fmt, suite.model)
            t1 = time.process_time()
            result = check_operations(suite.model, ops, failed=failed, dropped_reads=dropped)
            t2 = time.process_time()
            parse += t1 - t0
            check += t2 - t1
            want = "ok" if expected else "illegal"
            if result.verdict != want:
                raise SystemExit(f"isrlab: verdict {result.verdict} on {path}, expected {want}")
        total = time.process_time() - started
        if total < best[0]:
            best = (total, parse, check)
    return best


def build_porcupine(checkout: Path, workdir: Path) -> Path | str:
    """The compiled test binary, or why there is none."""
    go = shutil.which("go")
    if go is None:
        return "Go is not installed (apt-get install golang-go)"
    binary = workdir / "porcupine.test"
    # Porcupine has no dependencies: build offline.
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"}
    built = subprocess.run(
        [go, "test", "-c", "-o", str(binary), "."],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        return f"go test -c failed: {built.stderr.strip()[-500:]}"
    return binary


def time_porcupine(binary: Path, checkout: Path, suite: str, repeat: int) -> tuple[float, float]:
    """(CPU seconds of the best of ``repeat`` runs, sum of its benchmarks' ns/op in seconds)."""
    best_cpu = float("inf")
    best_ns: dict[str, float] = {}
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = subprocess.run(
            [
                str(binary),
                "-test.run",
                "^$",
                "-test.bench",
                GO_SUITES[suite],
                "-test.benchtime",
                "1x",
            ],
            cwd=checkout,
            capture_output=True,
            text=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if run.returncode != 0:  # a wrong verdict fails the benchmark (b.Fatalf)
            raise SystemExit(f"Porcupine's {suite} benchmarks failed:\n{run.stdout[-2000:]}")
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best_cpu = min(best_cpu, used)
        for line in run.stdout.splitlines():
            found = re.match(r"^(Benchmark\S+?)(-\d+)?\s+\d+\s+(\d+) ns/op", line)
            if found:
                name, ns = found[1], int(found[3]) / 1e9
                best_ns[name] = min(best_ns.get(name, float("inf")), ns)
    return best_cpu, sum(best_ns.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds per suite (best counts)")
    parser.add_argument("--no-go", action="store_true", help="do not build/run Porcupine")
    parser.add_argument("--no-clone", action="store_true", help="never git clone Porcupine")
    parser.add_argument("--porcupine", help="Porcupine checkout or bare git directory")
    parser.add_argument(
        "--unpartitioned", action="store_true", help="also the kv-unpartitioned suite (slow)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile isrlab's kv suite once")
    args = parser.parse_args()

    with porcupine_checkout(args) as (checkout, origin):
        print(f"Porcupine: {origin}")
        found, source = suites(checkout, args.unpartitioned)
        if found is None:
            raise SystemExit(source)
        print(f"data: {source}")
        ours = {}
        for suite in found:
            ours[suite.name] = time_isrlab(suite, args.repeat)
            total, parse, check = ours[suite.name]
            print(
                f"  isrlab {suite.label}: {total:.3f} s CPU (parse {parse:.3f}, check {check:.3f})",
                flush=True,
            )
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(time_isrlab, found[1], 1)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)

        theirs: dict[str, tuple[float, float]] = {}
        why = "not run (--no-go)"
        if not args.no_go and checkout is None:
            why = f"not run: {origin}"
        elif not args.no_go and checkout is not None:
            with tempfile.TemporaryDirectory(prefix="porcupine-bin-") as workdir:
                binary = build_porcupine(checkout, Path(workdir))
                if isinstance(binary, str):
                    why = f"not run: {binary}"
                else:
                    for suite in found:
                        theirs[suite.name] = time_porcupine(
                            binary, checkout, suite.name, args.repeat
                        )
                        print(
                            f"  Porcupine {suite.name}: {theirs[suite.name][0]:.3f} s CPU "
                            f"(its ns/op sum {theirs[suite.name][1]:.3f} s)",
                            flush=True,
                        )

    print()
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")
    print(
        f"{'suite':<18}{'histories':<42}{'isrlab CPU s':>13}{'(parse':>8}{'check)':>8}"
        f"{'Porcupine CPU s':>17}{'ratio':>7}"
    )
    for suite in found:
        total, parse, check = ours[suite.name]
        if suite.name in theirs:
            their = f"{theirs[suite.name][0]:>17.3f}{total / theirs[suite.name][0]:>7.2f}"
        else:
            their = f"{'-':>17}{'-':>7}"
        print(f"{suite.name:<18}{suite.label:<42}{total:>13.3f}{parse:>8.3f}{check:>8.3f}{their}")
    if theirs:
        print(
            "(ratio = isrlab CPU / Porcupine CPU, both from the files to the verdicts; below 1 "
            f"is faster.  Best of {args.repeat} rounds each; every verdict agrees.)"
        )
    else:
        print(f"(isrlab's figures alone: Porcupine {why}.  Every verdict agrees.)")


if __name__ == "__main__":
    main()
