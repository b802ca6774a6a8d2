"""The simulator's speed (issue 18): simulated cluster time per CPU second, next to the same
workload's real run on the embedded cluster.

Issue 18's target: "Simulated cluster time per CPU second with 3 brokers, 10 client processes
and 200 ops/s of simulated workload: >= 20x real time, next to the same workload's real run on
the embedded cluster in the same benchmark."

1. Simulated (`harness.sim.run.simulate_queue`): 3 brokers, concurrency 10, rate 200, acks=all
   (idempotent producers, the test table's default), no faults, `--seconds` of main phase,
   seed 1, the checker on the history (`report=False`: results.json only), invariants checked
   after every event, and again with them off. Each run is a child process; its CPU time
   (`time.process_time`, user+system of the one process that runs brokers, network, ensemble,
   clients, interpreter and checker) against the virtual seconds the loop advanced. Best of
   `--repeat` runs. A third, instrumented, run counts loop iterations and generator asks.
2. Real (`isrlab test` on the embedded cluster: `runner.run_test`, 3 nodes, the same test
   options): the whole run's wall time (cluster up, setup, the run, teardown, the checker) and
   the history's span (first invoke to last completion) with its ops. It needs root and
   network namespaces; when it cannot run, the table says why and the simulated figures
   stand alone (`--no-real` skips it).

`--attribute` (needs py-spy: `pip install py-spy`, and ptrace rights) samples one more
simulated run (invariants on) and splits its CPU by whose code it is in: the innermost frame
of the project's packages on each sampled stack (`broker/`, the simulator `harness/sim/`,
the rest of `harness/`, `checkers/`, ...; stdlib and library frames count for the project
code that called them). The broker's share bounds what any work on the simulator can give:
if the simulator, the clients, the invariants and the checker cost nothing, a run still costs
the broker's share of its CPU, so the ratio can grow at most by 1 / (broker share).

`--tree DIR` runs the simulated part against another checkout (e.g. `git worktree add
/tmp/before <commit>`: its `broker`, `harness`, ... imported as `isrlab.*`), for a before/after
in one session: the counts there come from wrapping its loop's `_run_once` and its
interpreter's generator.

    python benchmarks/bench_sim.py [--seconds 10] [--repeat 2] [--tree /tmp/before] [--no-real]
        [--attribute]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker", "checkers", "harness", "nemeses", "pipeline")


def workload(seconds: float) -> dict[str, Any]:
    """The issue's workload, as test options (the same for the simulated and the real run)."""
    return {
        "name": "bench-sim",
        "node_count": 3,
        "concurrency": 10,
        "rate": 200,
        "time_limit": seconds,
        "nemesis": "none",
        "seed": 1,
        "acks": "all",
    }


# ----- the simulated run (in a child process) ------------------------------------------------


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One simulated run in this process: CPU seconds, virtual seconds, ops, counts."""
    from isrlab.harness.sim import clock, interpreter
    from isrlab.harness.sim.run import simulate_queue

    counts = {"iterations": 0, "queries": 0}
    if spec["count"]:
        run_once = clock.VirtualTimeLoop._run_once

        def counting_run_once(self: Any) -> None:
            counts["iterations"] += 1
            run_once(self)

        clock.VirtualTimeLoop._run_once = counting_run_once  # type: ignore[method-assign]
        init = interpreter.SimInterpreter.__init__

        class Asks:
            def __init__(self, gen: Any) -> None:
                self.gen = gen

            def op(self, ctx: Any) -> Any:
                counts["queries"] += 1
                return self.gen.op(ctx)

            def update(self, ctx: Any, event: Any) -> None:
                self.gen.update(ctx, event)

        def counting_init(self: Any, generator: Any, *a: Any, **k: Any) -> None:
            init(self, Asks(generator), *a, **k)

        interpreter.SimInterpreter.__init__ = counting_init  # type: ignore[method-assign]
    # the CPU time at each op written: the main phase's own rate (the whole run's includes
    # the cluster's start, mostly idle virtual time, and the checker)
    from isrlab.harness.history import HistoryWriter

    marks: list[tuple[int, float]] = []
    write = HistoryWriter.write

    def marking_write(self: Any, op: Any) -> Any:
        stamped = write(self, op)
        marks.append((stamped["time"], time.process_time()))
        return stamped

    HistoryWriter.write = marking_write  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as d:
        t = time.process_time()
        run_dir, res = simulate_queue(
            spec["test"], Path(d), report=False, check_invariants=spec["invariants"]
        )
        cpu = time.process_time() - t
        sim = res["sim"]
        ops = sum(1 for line in (run_dir / "history.jsonl").open() if '"type":"invoke"' not in line)
    main_end = marks[0][0] + spec["test"]["time_limit"] * 1e9
    last = max((m for m in marks if m[0] <= main_end), default=marks[0])
    return {
        "span_s": (marks[-1][0] - marks[0][0]) / 1e9,
        "main_virtual_s": (last[0] - marks[0][0]) / 1e9,
        "main_cpu_s": last[1] - marks[0][1],
        "cpu_s": cpu,
        "virtual_s": sim["virtual_s"],
        "ops": ops,
        "valid": res.get("valid"),
        "invariant_checks": sim.get("invariant_checks"),
        "iterations": counts["iterations"],
        "queries": counts["queries"],
    }


def _shim(tree: Path) -> Path:
    """A directory whose `isrlab/<package>` are `tree`'s packages (a checkout importable as
    `isrlab` ahead of the installed editable one)."""
    shim = Path(tempfile.mkdtemp(prefix="bench-sim-shim-"))
    (shim / "isrlab").mkdir()
    for p in PACKAGES:
        if (tree / p).is_dir():
            (shim / "isrlab" / p).symlink_to(tree / p)
    return shim


def simulate(tree: Path | None, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    shim = None if tree is None else _shim(tree)
    if shim is not None:
        env["PYTHONPATH"] = str(shim)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        if shim is not None:
            shutil.rmtree(shim, ignore_errors=True)  # (the links only, not the tree)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"simulated run failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def simulated(tree: Path | None, seconds: float, repeat: int) -> dict[str, Any]:
    test = workload(seconds)
    best: dict[str, Any] = {}
    for invariants in (True, False):
        runs = [
            simulate(tree, {"test": test, "invariants": invariants, "count": False})
            for _ in range(repeat)
        ]
        best["on" if invariants else "off"] = min(runs, key=lambda r: r["cpu_s"])
    best["counts"] = simulate(tree, {"test": test, "invariants": False, "count": True})
    return best


# ----- whose code the CPU is in ------------------------------------------------------------------

#: the project's packages, as the shares are reported (the simulator apart from the harness)
OWNERS = ("harness/sim", "broker", "harness", "checkers", "nemeses", "pipeline")


def _owner(frame_file: str) -> str | None:
    path = Path(frame_file)
    try:
        rel = path.resolve().relative_to(ROOT)
    except (ValueError, OSError):
        return None
    text = rel.as_posix()
    return next((o for o in OWNERS if text.startswith(o + "/")), None)


def attribute(seconds: float) -> dict[str, Any]:
    """One simulated run (invariants on) under py-spy: CPU shares by package, or why not."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    spec = {"test": workload(seconds), "invariants": True, "count": False}
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "stacks.txt"
        out = subprocess.run(
            [spy, "record", "--rate", "500", "--format", "raw", "--full-filenames", "-o", str(raw),
             "--", sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0 or not raw.exists():
            return {"skipped": f"py-spy failed: {(out.stderr or out.stdout).strip()[-300:]}"}
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        run = json.loads(lines[-1]) if lines else {}
        shares: dict[str, int] = {}
        total = marking = 0
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if "simulate_queue (" not in stack:
                continue  # the interpreter's start and the imports: not the run's CPU time
            if "marking_write (" in stack.rpartition(";")[2]:
                # this benchmark's own time.process_time() per op: cheap (under 1 us), but a
                # system call, where py-spy's samples land far more often (10-15 % of them)
                marking += int(n)
                continue
            total += int(n)
            owner = "other"
            for frame in reversed(stack.split(";")):
                inner = frame.rpartition(" (")[2].rstrip(")")
                found = _owner(inner.rpartition(":")[0])
                if found is not None:
                    owner = found
                    break
            shares[owner] = shares.get(owner, 0) + int(n)
    return {"samples": total, "shares": shares, "run": run, "marking": marking}


def print_attribution(a: dict[str, Any]) -> None:
    if "skipped" in a:
        print(f"\nattribution: not measured: {a['skipped']}")
        return
    total = a["samples"]
    print(
        f"\nwhose code the CPU is in (py-spy, {total:,} samples of one run, invariants on; "
        f"{a.get('marking', 0):,} more in the benchmark's own per-op process_time() left out):\n"
    )
    print("| code | share of the samples |")
    print("|---|---:|")
    for owner, n in sorted(a["shares"].items(), key=lambda kv: -kv[1]):
        print(f"| {owner} | {100 * n / total:.1f} % |")
    broker = a["shares"].get("broker", 0) / max(1, total)
    run = a["run"]
    if broker and run:
        whole = run["virtual_s"] / run["cpu_s"]
        print(
            f"\nthe broker's own code is {100 * broker:.1f} % of the samples: with everything "
            f"else free this run ({whole:.2f}x under the sampler) could reach at most "
            f"{whole / broker:.1f}x; the ceiling for any simulator-side work is "
            f"1 / {broker:.2f} = {1 / broker:.2f} times today's ratio"
        )


# ----- the real run ----------------------------------------------------------------------------


def real(seconds: float) -> dict[str, Any]:
    """`isrlab test` with the same options on a 3-node embedded cluster; or why it cannot."""
    if os.geteuid() != 0:
        return {"skipped": "needs root (network namespaces, iptables): run with sudo"}
    sys.path.insert(0, str(ROOT))
    from isrlab.harness.cluster import embedded
    from isrlab.harness.runner import SetupError, make_test, run_test

    if not embedded.has_admin_privileges():
        return {"skipped": "no CAP_NET_ADMIN/CAP_SYS_ADMIN: network namespaces unavailable"}
    try:
        embedded.preflight()
    except Exception as e:
        return {"skipped": f"the embedded cluster cannot start here: {e}"}
    with tempfile.TemporaryDirectory() as store:
        try:
            config = make_test({**workload(seconds), "store": store, "cluster_name": "bench-sim"})
            t = time.monotonic()
            run_dir, results = run_test(config, progress=False)
            wall = time.monotonic() - t
        except (SetupError, OSError) as e:
            return {"skipped": f"the real run failed to start: {e}"}
        times, ops = [], 0
        for line in (run_dir / "history.jsonl").open():
            op = json.loads(line)
            times.append(op["time"])
            ops += op["type"] != "invoke"
    span = (max(times) - min(times)) / 1e9 if times else 0.0
    return {"wall_s": wall, "span_s": span, "ops": ops, "valid": results.get("valid")}


# ----- the table --------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10, help="main phase (time_limit)")
    ap.add_argument("--repeat", type=int, default=1, help="simulated runs each; the best")
    ap.add_argument("--tree", type=Path, action="append", default=[], help="another checkout")
    ap.add_argument("--no-real", action="store_true", help="skip the embedded cluster's run")
    ap.add_argument("--attribute", action="store_true", help="CPU shares by package (py-spy)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return

    trees: list[tuple[str, Path | None]] = [(str(t), t.resolve()) for t in args.tree]
    trees.append(("this tree", None))
    sims = {name: simulated(tree, args.seconds, args.repeat) for name, tree in trees}
    live = {"skipped": "--no-real"} if args.no_real else real(args.seconds)

    load = os.getloadavg()[0]
    print(
        f"\nqueue workload: 3 brokers, concurrency 10, rate 200, acks=all, no faults, "
        f"{args.seconds:g} s main phase, seed 1; {os.cpu_count()} cores, load average "
        f"{load:.2f}; best of {args.repeat}\n"
    )
    print(
        "| run | invariants | history span, s | whole run, s | CPU s | virtual s per CPU s "
        "| main phase: virtual s per CPU s | ops | ops per CPU s (real: per wall s of the "
        "history) | loop iterations | generator asks per op | valid |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, s in sims.items():
        c = s["counts"]
        for key in ("on", "off"):
            r = s[key]
            checks = f"on ({r['invariant_checks']:,} checks)" if key == "on" else "off"
            # the counting run has invariants off (its counts do not depend on them)
            counts = (
                f"{c['iterations']:,} | {c['queries'] / max(1, c['ops']):.1f}"
                if key == "off"
                else " | "
            )
            print(
                f"| simulated, {name} | {checks} | {r['span_s']:.1f} virtual | "
                f"{r['virtual_s']:.1f} virtual | {r['cpu_s']:.2f} | "
                f"**{r['virtual_s'] / r['cpu_s']:.2f}x** | "
                f"{r['main_virtual_s'] / r['main_cpu_s']:.2f}x | {r['ops']:,} | "
                f"{r['ops'] / r['cpu_s']:,.0f} | {counts} | {r['valid']} |"
            )
    if "skipped" in live:
        print(f"| real, embedded 3 nodes | - | not run: {live['skipped']} |" + " |" * 9)
    else:
        print(
            f"| real, embedded 3 nodes (`isrlab test`) | - | {live['span_s']:.1f} wall | "
            f"{live['wall_s']:.1f} wall (cluster up, run, teardown, checker) | - | 1x | 1x | "
            f"{live['ops']:,} | {live['ops'] / live['span_s']:,.0f} | | | {live['valid']} |"
        )
    if args.attribute:
        print_attribution(attribute(args.seconds))
    here = sims["this tree"]["on"]
    ratio = here["virtual_s"] / here["cpu_s"]
    main_ratio = here["main_virtual_s"] / here["main_cpu_s"]
    print(
        f"\ntarget (issue 18): >= 20x real time with invariants: "
        f"{'met' if min(ratio, main_ratio) >= 20 else 'NOT met'} (whole run {ratio:.2f}x, "
        f"main phase {main_ratio:.2f}x)"
    )


if __name__ == "__main__":
    main()
