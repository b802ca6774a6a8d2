"""`isrlab sim`: many seeds of the queue test on the simulator, in parallel processes.

The options are `isrlab test`'s, from the same table (`harness.testconfig.cli_parameters`, and
its ``--set`` for workload knobs), with defaults sized for the simulator (`SIM_DEFAULTS`: 3
brokers, 4 clients at 40 ops/s, 30 s of faults; a run is a few CPU seconds), plus:

- ``--seed N`` one run; ``--seeds N`` (seeds 1..N) or ``--seeds A-B`` many; neither: one run
  with a random seed, as `isrlab test`;
- ``--workers K`` processes at a time (default: the CPU count; a forkserver pool with the
  modules loaded, each seed in a fresh process forked from it, so a seed's run is the same
  whatever ran before it, alone or in a sweep, and which worker runs it does not matter);
  ``--switch NAME=VALUE,...`` the matrix's switch grammar
  (`harness.matrix.parse_switches`) on top of the flags;
- ``--stop-at-first``: no new seed once one is invalid (those running finish);
- ``--check-determinism``: each seed run a second time (into a scratch directory, kept next to
  the run as ``<run>-second`` when it differs) and the two histories' sha256 compared; a
  mismatch is a failure of the simulator, not of the broker;
- ``--report``: report.html and the checker's artefacts in each run directory (default:
  results.json only, a second or two less per run); ``--no-invariants``: the cluster's
  invariants are not checked after every event.

Each seed's run directory is ``<store>/<name>/seed-<N>`` (``-2``, ``-3``... when it exists), with
what a real run's holds as far as the simulator has it: test.json (``"mode": "sim"``),
history.jsonl, results.json (with the optional ``mode`` and ``sim`` fields), report.html and the
artefacts with ``--report``, trace.txt (nemesis ops, leaders, high watermarks), sim.log (what the
brokers logged: the simulator's node logs) and error.txt when the run crashed. The name is
``sim_`` + the configuration's name (`harness.testconfig.config_name`) unless ``--name``.

A seed ends valid, invalid (the checker's verdict, or an invariant of the cluster broken: the
run stops there), unknown (the checker's, or a run that acknowledged and read nothing, as
`isrlab test` says) or crashed (the simulator raised). The end prints a summary: counts,
anomalies with the seeds that show them, CPU and simulated seconds, and the first failing
seeds each with the command that replays it (`replay_command`).

Exit code: 0 every seed valid; 1 some seed invalid; 2 bad options, or (none invalid) some seed
unknown, crashed or not deterministic.

Options the simulator cannot honour are refused before anything runs (`refusals`): real hosts
and the embedded cluster's options, and the nemesis kinds `harness.sim.nemesis.SimNemesis`
does not model (transactions and read_committed are simulated: harness/sim/txn.py; consumer
groups too, with the roundrobin, range and cooperative-sticky assignors: harness/sim/group.py;
the eos workload's copiers, transactional or at-least-once: harness/sim/eos.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import multiprocessing
import os
import re
import shlex
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from isrlab.harness.testconfig import (
    OPTIONS,
    ConfigError,
    TestConfig,
    cli_parameters,
    config_name,
    option,
)

__all__ = [
    "SIM_DEFAULTS",
    "SeedJob",
    "SeedResult",
    "SimSummary",
    "parse_seeds",
    "refusals",
    "replay_command",
    "run_seed",
    "sim_command",
]

#: `isrlab test`'s defaults that `isrlab sim` changes: a simulated run costs CPU per op (20
#: clients with no rate limit are minutes of CPU per virtual minute), and 3 brokers are enough
#: for RF 3
SIM_DEFAULTS: dict[str, Any] = {
    "node_count": 3,
    "concurrency": 4,
    "rate": 40.0,
    "time_limit": 30.0,
    "final_time_limit": 30.0,
    "recovery_time": 5.0,
}
#: the name's default: sim_ + the configuration's name
DERIVED_NAME = "sim_<config>"
#: the most seeds the summary lists with their replay commands
FIRST_FAILING = 5

STATUSES = ("valid", "invalid", "unknown", "crashed")


class BadInput(ValueError):
    """An option `isrlab sim` cannot take: exit 2, with the message."""


# ----- options ---------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"N"`` -> seeds 1..N, ``"A-B"`` -> A..B (both included)."""
    text = text.strip()
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if a > b:
            raise BadInput(f"--seeds {text}: the range A-B needs A <= B")
        return list(range(a, b + 1))
    if text.isdigit() and int(text) >= 1:
        return list(range(1, int(text) + 1))
    raise BadInput(
        f"--seeds takes a count N (seeds 1..N) or a range A-B (e.g. 1-100), not {text!r}"
    )


def refusals(values: Mapping[str, Any], config: TestConfig) -> list[str]:
    """Why the simulator cannot run these options (empty: it can), each with what to do.
    ``values`` are the command's raw option values, ``config`` their validated test."""
    from isrlab.harness.sim.nemesis import SUPPORTED

    out = []
    for name in ("nodes", "nodes_file", "node_python"):
        if values.get(name):
            out.append(
                f"{option(name).flag}: the simulator runs its brokers in this process, not on "
                "hosts; leave it out (run `isrlab test` for real hosts)"
            )
    for name in ("cluster_name", "keep_cluster"):
        if values.get(name) not in (None, option(name).default):
            out.append(f"{option(name).flag}: the simulator has no embedded cluster; leave it out")
    if config.clock_mode != "process":
        out.append(
            "--clock-mode date sets the clock of real hosts; the simulator moves each broker's "
            "own clock (process): leave it out"
        )
    if config.workload not in ("queue", "eos"):
        out.append(_workload_refusal(config.workload))
    unsupported = [k for k in config.nemesis if k not in SUPPORTED]
    if unsupported:
        out.append(
            f"--nemesis: {', '.join(unsupported)} not simulated (the simulator models "
            f"{', '.join(SUPPORTED)}); leave {'them' if len(unsupported) > 1 else 'it'} out, "
            "or run `isrlab test` on real brokers"
        )
    return out


def _workload_refusal(workload: str) -> str:
    return (
        f"--workload {workload}: the simulator runs the queue and eos workloads only; run "
        "`isrlab test` for it"
    )


def _flag_text(name: str, value: Any) -> list[str]:
    """The command-line words that give option ``name`` the value ``value``."""
    opt = option(name)
    assert opt.flag
    if isinstance(value, Mapping):  # (broker_config: the flag once per KEY=VALUE item)
        return [word for k, v in value.items() for word in (opt.flag, f"{k}={v}")]
    if isinstance(value, bool):
        return [opt.flag if value else f"--no-{opt.flag[2:]}"]
    if isinstance(value, tuple | list):
        return [opt.flag, ("+" if name == "nemesis" else ",").join(str(v) for v in value)]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return [opt.flag, str(value)]


def replay_command(
    seed: int,
    overrides: Mapping[str, Any],
    knobs: Mapping[str, Any],
    extra: Sequence[str] = (),
) -> str:
    """``isrlab sim --seed N`` with the options of `overrides` that differ from the command's
    defaults (``broker_config``: ``--broker-config KEY=VALUE`` per item), the ``--set`` knobs
    and `extra` flags: the command that replays seed N."""
    words = ["isrlab", "sim", "--seed", str(seed)]
    defaults = _defaults()
    for name, value in overrides.items():
        if name in ("seed", "name") or value is None or value == defaults.get(name):
            continue
        words += _flag_text(name, value)
    if overrides.get("name") not in (None, DERIVED_NAME):
        words += ["--name", str(overrides["name"])]
    for k, v in knobs.items():
        words += ["--set", f"{k}={v}"]
    words += list(extra)
    return shlex.join(words)


def _defaults() -> dict[str, Any]:
    return {p.name: p.default for p in _table_parameters()}


def _table_parameters() -> list[inspect.Parameter]:
    """`isrlab test`'s option parameters with the simulator's defaults."""
    out = []
    for p in cli_parameters():
        if p.name in SIM_DEFAULTS:
            p = p.replace(default=SIM_DEFAULTS[p.name])
        elif p.name == "name":
            p = p.replace(default=DERIVED_NAME)
        out.append(p)
    return out


# ----- one seed (in a worker process) ----------------------------------------------------------


@dataclass(frozen=True)
class SeedJob:
    """One seed to run: the test's overrides (the seed among them) and where its run goes."""

    seed: int
    overrides: dict[str, Any]
    run_dir: str
    report: bool = False
    check_invariants: bool = True
    check_determinism: bool = False


@dataclass
class SeedResult:
    seed: int
    run_dir: str
    status: str  # valid | invalid | unknown | crashed
    anomalies: list[str] = field(default_factory=list)
    detail: str = ""
    history_sha256: str | None = None
    second_sha256: str | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    virtual_s: float = 0.0
    ops: int = 0
    #: the process that ran the seed (each seed its own: `run_seeds`)
    pid: int = 0

    @property
    def nondeterministic(self) -> bool:
        return self.second_sha256 is not None and self.second_sha256 != self.history_sha256


@contextlib.contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """Everything logged during the run (the brokers' logs, asyncio's) into `path`, none of it
    on the terminal, whose lines belong to the progress bar."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = (root.handlers[:], root.level)
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        handler.close()
        root.handlers, root.level = saved[0], saved[1]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _virtual_seconds(run_dir: Path) -> float:
    """The last op's time in the history (virtual ns), when the run did not say."""
    try:
        data = (run_dir / "history.jsonl").read_bytes().rstrip().rsplit(b"\n", 1)[-1]
        import orjson

        return float(orjson.loads(data)["time"]) / 1e9 if data else 0.0
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _simulate(job: SeedJob, run_dir: Path, report: bool) -> dict[str, Any]:
    from isrlab.harness.sim.run import simulate_queue

    with tempfile.TemporaryDirectory(prefix=f"isrlab-sim-{job.seed}-") as work:
        _, results = simulate_queue(
            job.overrides,
            Path(work),
            run_dir=run_dir,
            report=report,
            check_invariants=job.check_invariants,
        )
    return results


def run_seed(job: SeedJob) -> SeedResult:
    """Run, check and classify one seed (see the module doc); never raises for the run's own
    failures (a crash is a result, with error.txt in the run directory)."""
    from isrlab.harness.runner import exit_code
    from isrlab.harness.sim.invariants import InvariantViolation

    cpu0, wall0 = time.process_time(), time.monotonic()
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = SeedResult(job.seed, str(run_dir), "crashed", pid=os.getpid())
    with _logs_to(run_dir / "sim.log"):
        try:
            results = _simulate(job, run_dir, job.report)
        except InvariantViolation as e:
            out.status, out.anomalies, out.detail = "invalid", ["invariant-violation"], str(e)
            (run_dir / "error.txt").write_text(f"invariant violated: {e}\n")
        except Exception as e:
            out.detail = f"{type(e).__name__}: {e}"
            (run_dir / "error.txt").write_text(traceback.format_exc())
        else:
            code = exit_code(results)
            out.status = ("valid", "invalid", "unknown")[code]
            out.anomalies = sorted(results.get("anomaly_types") or [])
            sim = results.get("sim") or {}
            out.virtual_s = float(sim.get("virtual_s") or 0.0)
            out.ops = int(sim.get("invoked") or 0)
        out.history_sha256 = _sha256(run_dir / "history.jsonl")
        if not out.virtual_s:
            out.virtual_s = _virtual_seconds(run_dir)
        if job.check_determinism and out.history_sha256 is not None:
            second = Path(tempfile.mkdtemp(prefix=f"isrlab-sim-{job.seed}-second-"))
            try:
                try:
                    _simulate(job, second / "run", False)
                except Exception:
                    pass  # the first run's outcome decides its status; here only the history
                out.second_sha256 = _sha256(second / "run" / "history.jsonl") or "none"
                if out.nondeterministic:
                    keep = Path(f"{run_dir}-second")
                    shutil.rmtree(keep, ignore_errors=True)
                    shutil.move(str(second / "run"), keep)
            finally:
                shutil.rmtree(second, ignore_errors=True)
    out.cpu_s = time.process_time() - cpu0
    out.wall_s = time.monotonic() - wall0
    return out


# ----- many seeds ------------------------------------------------------------------------------


@dataclass
class SimSummary:
    seeds: list[int]
    results: list[SeedResult] = field(default_factory=list)
    replay: Callable[[int], str] = lambda seed: f"isrlab sim --seed {seed}"
    stopped: str | None = None
    wall_s: float = 0.0
    workers: int = 1

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def nondeterministic(self) -> list[SeedResult]:
        return [r for r in self.results if r.nondeterministic]

    @property
    def failing(self) -> list[SeedResult]:
        """Seeds that are not valid or not deterministic, in seed order."""
        return sorted(
            (r for r in self.results if r.status != "valid" or r.nondeterministic),
            key=lambda r: r.seed,
        )

    def anomalies(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.results:
            for a in r.anomalies:
                out.setdefault(a, []).append(r.seed)
        return {a: sorted(s) for a, s in sorted(out.items())}

    def exit_code(self) -> int:
        if self.count("invalid"):
            return 1
        if self.count("unknown") or self.count("crashed") or self.nondeterministic:
            return 2
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": len(self.seeds),
            "run": len(self.results),
            **{s: self.count(s) for s in STATUSES},
            "nondeterministic": [r.seed for r in self.nondeterministic],
            "anomalies": self.anomalies(),
            "cpu_s": sum(r.cpu_s for r in self.results),
            "virtual_s": sum(r.virtual_s for r in self.results),
            "wall_s": self.wall_s,
            "stopped": self.stopped,
            "runs": [
                {**asdict(r), "replay": self.replay(r.seed)}
                for r in sorted(self.results, key=lambda r: r.seed)
            ],
        }


def _seed_list(seeds: Sequence[int]) -> str:
    items = [str(s) for s in seeds[:12]]
    more = len(seeds) - len(items)
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")


def print_summary(summary: SimSummary, console: Console) -> None:
    n = len(summary.results)
    say = lambda text: console.print(text, highlight=False, soft_wrap=True)  # noqa: E731
    say(
        f"\n[bold]isrlab sim[/]: {n} of {len(summary.seeds)} seeds run "
        f"({summary.workers} worker{'s' if summary.workers != 1 else ''}, "
        f"{summary.wall_s:.1f} s wall)"
    )
    if summary.stopped:
        say(f"[yellow]{escape(summary.stopped)}[/]")
    colours = {"valid": "green", "invalid": "red", "unknown": "yellow", "crashed": "magenta"}
    say("  " + "   ".join(f"[{colours[s]}]{s} {summary.count(s)}[/]" for s in STATUSES))
    if summary.nondeterministic:
        say(
            f"  [magenta]not deterministic (two runs, two histories: a simulator bug) "
            f"{len(summary.nondeterministic)}: seeds "
            f"{_seed_list([r.seed for r in summary.nondeterministic])}[/]"
        )
    anomalies = summary.anomalies()
    if anomalies:
        say("  anomalies:")
        for name, seeds in anomalies.items():
            say(f"    {escape(name)}: {len(seeds)} seed(s): {_seed_list(seeds)}")
    else:
        say("  anomalies: none")
    if n:
        cpu = sum(r.cpu_s for r in summary.results)
        virtual = sum(r.virtual_s for r in summary.results)
        say(
            f"  CPU {cpu:.1f} s ({cpu / n:.2f} s per run), simulated {virtual:.1f} s "
            f"({virtual / n:.1f} s per run)"
            + (f", {virtual / cpu:.0f} simulated s per CPU s" if cpu > 0 else "")
        )
    failing = summary.failing
    if failing:
        say(f"first failing seeds ({min(len(failing), FIRST_FAILING)} of {len(failing)}):")
        for r in failing[:FIRST_FAILING]:
            what = r.status + (" and not deterministic" if r.nondeterministic else "")
            detail = ", ".join(r.anomalies) or r.detail
            say(f"  seed {r.seed}: {what}" + (f" ({escape(detail)})" if detail else ""))
            say(f"    run:    {escape(r.run_dir)}")
            say(f"    replay: {escape(summary.replay(r.seed))}")


def _seed_dir(store: Path, name: str, seed: int, taken: set[Path]) -> Path:
    """``store/name/seed-N``, or ``-2``, ``-3``... when that exists (nothing is overwritten)."""
    base = store / name / f"seed-{seed}"
    run, n = base, 1
    while run.exists() or run in taken:
        n += 1
        run = base.with_name(f"{base.name}-{n}")
    taken.add(run)
    return run


def run_seeds(
    jobs: Sequence[SeedJob],
    workers: int,
    *,
    stop_at_first: bool = False,
    console: Console | None = None,
    replay: Callable[[int], str] | None = None,
) -> SimSummary:
    """Run `jobs` on `workers` processes at a time, each seed in a fresh one (see the module
    doc), with a progress bar."""
    console = console or Console(stderr=True)
    summary = SimSummary([j.seed for j in jobs], workers=workers)
    if replay is not None:
        summary.replay = replay
    t0 = time.monotonic()
    live = console.is_terminal
    progress = Progress(
        TextColumn("[bold]sim[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not live,
    )
    task = progress.add_task("seeds", total=len(jobs), counts="")
    every = max(1, len(jobs) // 20)

    def done(r: SeedResult) -> None:
        summary.results.append(r)
        counts = " ".join(f"{s} {summary.count(s)}" for s in STATUSES if summary.count(s))
        progress.update(task, advance=1, counts=counts)
        if r.status != "valid" or r.nondeterministic:
            what = r.status + (" and not deterministic" if r.nondeterministic else "")
            detail = ", ".join(r.anomalies) or r.detail
            progress.console.print(
                f"seed {r.seed}: [red]{what}[/] {escape(detail)} -> {escape(r.run_dir)}",
                highlight=False,
                soft_wrap=True,
            )
        elif not live and (len(summary.results) % every == 0 or len(summary.results) == len(jobs)):
            console.print(f"[{len(summary.results)}/{len(jobs)}] {counts}", highlight=False)

    with progress:
        # Every seed in a process of its own, forked from the forkserver with the modules
        # loaded: a seed's run never depends on the seeds run before it, so the command a
        # failing seed prints replays it. (Workers that ran seed after seed did not: in
        # one, seed 229 of a 101-400 sweep was invalid and the same seed alone valid.)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["isrlab.harness.sim.run", "isrlab.harness.sim.cli"])
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, max_tasks_per_child=1)
        pending: dict[Future[SeedResult], SeedJob] = {}
        queue = list(jobs)
        try:
            while queue or pending:
                while queue and len(pending) < workers and summary.stopped is None:
                    job = queue.pop(0)
                    pending[pool.submit(run_seed, job)] = job
                if not pending:
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(finished, key=lambda f: pending[f].seed):
                    job = pending.pop(fut)
                    try:
                        r = fut.result()
                    except Exception as e:  # the worker process died (killed, out of memory)
                        r = SeedResult(job.seed, job.run_dir, "crashed", detail=repr(e))
                    done(r)
                    if stop_at_first and r.status == "invalid" and summary.stopped is None:
                        summary.stopped = (
                            f"stopped at the first invalid seed ({r.seed}); "
                            f"{len(queue)} seed(s) not run"
                        )
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    summary.wall_s = time.monotonic() - t0
    return summary


# ----- the command -----------------------------------------------------------------------------


def _sim_command(
    seeds: str | None = None,
    workers: int | None = None,
    stop_at_first: bool = False,
    check_determinism: bool = False,
    report: bool = False,
    invariants: bool = True,
    switch: list[str] | None = None,
    set_: list[str] | None = None,
    **options: Any,
) -> None:
    """Run the queue test on the simulator for many seeds, in parallel processes.

    N real brokers in one process on a virtual clock, with simulated ZooKeeper, network and
    clients; the nemesis is the harness's schedule. Exit 0 when every seed is valid, 1 when
    one is invalid, 2 on bad options or when a seed is unknown, crashed or not deterministic.
    A failing seed is listed with the command that replays it."""
    from isrlab.harness.matrix import parse_switches
    from isrlab.harness.runner import SetupError, check_store, knob_settings

    err = Console(stderr=True)
    try:
        if seeds is not None and options.get("seed") is not None:
            raise BadInput("give --seed N (one run) or --seeds N / A-B (many), not both")
        if workers is not None and workers < 1:
            raise BadInput(f"--workers must be at least 1, not {workers}")
        values = dict(options)
        for text in switch or ():
            try:
                values.update(parse_switches(text))
            except ValueError as e:
                raise BadInput(f"--switch {text!r}: {e}") from None
        knobs = knob_settings(set_, values)
        if seeds is not None:
            seed_list = parse_seeds(seeds)
        elif values.get("seed") is not None:
            seed_list = [int(values["seed"])]
        else:
            seed_list = [TestConfig.from_mapping({}).seed or 0]  # a random one, as isrlab test
        values["seed"] = seed_list[0]
        if values.get("workload") not in (None, "queue", "eos"):  # (before its own checks)
            raise BadInput(
                "the simulator cannot run this:\n  - " + _workload_refusal(values["workload"])
            )
        name_given = values.get("name") not in (None, DERIVED_NAME)
        try:
            config = TestConfig.from_mapping(
                {**values, "name": values["name"] if name_given else "sim", **knobs}
            )
        except ConfigError as e:
            raise BadInput(str(e)) from None
        # the --broker-config items as the checked mapping: the seeds' tests and the replay
        values["broker_config"] = config.broker_config
        refused = refusals(values, config)
        if refused:
            raise BadInput("the simulator cannot run this:\n  - " + "\n  - ".join(refused))
        name = str(values["name"]) if name_given else "sim_" + config_name(config.to_test())
        store = Path(str(values.get("store") or option("store").default))
        check_store(store)
    except (BadInput, SetupError) as e:
        err.print(f"[red]isrlab sim:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    n_workers = min(workers or os.cpu_count() or 1, len(seed_list))
    overrides = {k: v for k, v in values.items() if k in {o.name for o in OPTIONS}}
    extra = [*(["--report"] if report else []), *([] if invariants else ["--no-invariants"])]
    replay_overrides = {k: v for k, v in overrides.items() if k != "seed"}
    if name_given:
        replay_overrides["name"] = name

    def replay(seed: int) -> str:
        return replay_command(seed, replay_overrides, knobs, extra)

    test_overrides = {
        k: v for k, v in overrides.items() if v is not None and k not in ("name", "seed")
    }
    taken: set[Path] = set()
    jobs = [
        SeedJob(
            seed=s,
            overrides={**test_overrides, **knobs, "name": name, "seed": s},
            run_dir=str(_seed_dir(store, name, s, taken)),
            report=report,
            check_invariants=invariants,
            check_determinism=check_determinism,
        )
        for s in seed_list
    ]
    err.print(
        f"[bold]isrlab sim[/] {escape(name)}: {len(jobs)} seed(s) on {n_workers} worker(s) "
        f"-> {escape(str(store / name))}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        summary = run_seeds(
            jobs, n_workers, stop_at_first=stop_at_first, console=err, replay=replay
        )
    except KeyboardInterrupt:
        err.print("[yellow]isrlab sim: interrupted[/]")
        raise typer.Exit(130) from None
    print_summary(summary, Console())
    raise typer.Exit(summary.exit_code())


def _extra_parameters() -> list[inspect.Parameter]:
    from isrlab.harness import runner

    K = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(
            "seeds",
            K,
            default=None,
            annotation=Annotated[
                str | None,
                typer.Option(help="many runs: N (seeds 1..N) or A-B (seeds A..B)"),
            ],
        ),
        inspect.Parameter(
            "workers",
            K,
            default=None,
            annotation=Annotated[
                int | None, typer.Option(help="parallel processes (default: the CPU count)")
            ],
        ),
        inspect.Parameter(
            "stop_at_first",
            K,
            default=False,
            annotation=Annotated[bool, typer.Option(help="start no new seed once one is invalid")],
        ),
        inspect.Parameter(
            "check_determinism",
            K,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(
                    help="run each seed twice and compare the histories' sha256 (a mismatch "
                    "is a simulator bug)"
                ),
            ],
        ),
        inspect.Parameter(
            "report",
            K,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(help="write report.html and the checker's artefacts for each run"),
            ],
        ),
        inspect.Parameter(
            "invariants",
            K,
            default=True,
            annotation=Annotated[
                bool,
                typer.Option(help="check the cluster's invariants after every event"),
            ],
        ),
        inspect.Parameter(
            "switch",
            K,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Option(
                    "--switch",
                    help="switches as `isrlab matrix --switch` takes them, e.g. "
                    "'unclean_leader_election=true,min_insync_replicas=1' (repeatable)",
                ),
            ],
        ),
        # the same --set as `isrlab test` (workload knobs)
        inspect.signature(runner.test_command).parameters["set_"],
    ]


def _build() -> Callable[..., None]:
    def command(**values: Any) -> None:
        _sim_command(**values)

    command.__signature__ = inspect.Signature([*_table_parameters(), *_extra_parameters()])  # type: ignore[attr-defined]
    command.__doc__ = _sim_command.__doc__
    command.__name__ = "sim"
    return command


sim_command = _build()
