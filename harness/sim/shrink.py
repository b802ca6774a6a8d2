"""Shrinking a failing simulated run to a small reproduction (issue 18), hypothesis-style.

A simulated run (`harness/sim/run.py`'s `simulate_queue`) is a pure function of its test
overrides (the seed among them) and, when its nemesis is the test's own, of the nemesis
schedule `runner.ScheduleGenerator` draws from the seed. This module makes that schedule
explicit and shrinks the whole input:

- `schedule_of(history)`: the nemesis ops a run performed, as ``(at, op)`` pairs: ``at`` the
  virtual time (ns, the history's clock) the generator gave the op, ``op`` its ``f`` and
  ``value`` (the final ``heal-all`` of the heal phase is not part of it). Read from the
  history's nemesis invocations, so any simulated run directory has one;
- `FixedSchedule(ops)`: a generator (harness/generator.py's protocol) that gives those ops at
  those times and nothing after; `simulate_queue(..., nemesis_schedule=ops)` runs the test's
  nemesis (`SimNemesis`) from it instead of the generated schedule. The generator answers
  every question the generated one answered the same way (an op at the time it was given,
  ``Pending`` before), so replaying a run's own schedule gives its history byte for byte;
- `shrink(overrides, out_dir)`: from a failing run (INVALID, or an invariant violation),
  search for a smaller failing input with the same seed: drop fault start/stop pairs (delta
  debugging, Zeller's ddmin over the pairs), shorten the time limit (the schedule cut to it),
  lower the concurrency, the rate and the key count. Every candidate is one full
  deterministic simulated run; one is accepted when it still fails with at least one of the
  original anomaly names (or, for a run stopped by the invariants checker, a violation of the
  same kind). The search is bounded by a number of runs and CPU seconds. The result:
  `out_dir/run` (the minimal run through the normal checker path, with report.html),
  `out_dir/shrink.json` (overrides and schedule before and after, the reduction, every
  candidate tried, the replay call) and `out_dir/shrink.md`;
- `replay(summary, base_dir)`: the minimal run again from shrink.json.

From the command line: ``python -m isrlab.harness.sim.shrink shrink overrides.json OUT``
(overrides as a JSON object, or a run directory's test.json) and ``python -m
isrlab.harness.sim.shrink replay OUT/shrink.json DIR``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from isrlab.harness.generator import Context, Pending, Result

__all__ = [
    "FixedSchedule",
    "Outcome",
    "ShrinkResult",
    "fault_units",
    "replay",
    "run_once",
    "schedule_of",
    "shrink",
    "violation_kind",
]

Op = dict[str, Any]
Schedule = list[tuple[int, Op]]
NS = 1_000_000_000

#: later than any run: what the fixed schedule answers once its ops are given
_NEVER = 1 << 62

#: the keys of a test map that are not overrides (sim_test adds them)
_DERIVED = ("simulated", "mode")


class FixedSchedule:
    """The nemesis generator of a fixed list of ``(at, op)`` (at: ns on the history's clock,
    ascending): `op` once ``ctx.time >= at``, ``Pending(at)`` before, ``Pending`` far in the
    future after the last one (the time limit ends the phase, as it ends the endless
    generated schedule)."""

    def __init__(self, ops: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        self.ops: Schedule = sorted(((int(at), dict(op)) for at, op in ops), key=lambda p: p[0])
        self._i = 0

    def op(self, ctx: Context) -> Result:
        if self._i >= len(self.ops):
            return Pending(_NEVER)
        at, op = self.ops[self._i]
        if ctx.time < at:
            return Pending(at)
        self._i += 1
        return {"f": op["f"], "value": op.get("value")}

    def update(self, ctx: Context, event: Op) -> None:
        return None


def _history(run_dir_or_history: Path) -> list[Op]:
    p = Path(run_dir_or_history)
    if p.is_dir():
        p = p / "history.jsonl"
    return [orjson.loads(line) for line in p.read_bytes().splitlines() if line.strip()]


def schedule_of(run_dir_or_history: Path | Sequence[Op]) -> Schedule:
    """The nemesis ops of a run (a run directory, its history.jsonl, or the ops) as ``(at,
    {"f", "value"})``: every nemesis invocation but the heal phase's ``heal-all``. The
    nemesis is one thread: its records alternate invocation, completion."""
    ops = (
        list(run_dir_or_history)
        if not isinstance(run_dir_or_history, str | Path)
        else _history(Path(run_dir_or_history))
    )
    nem = [o for o in ops if o.get("process") == "nemesis"]
    out: Schedule = []
    for o in nem[0::2]:
        if o.get("f") == "heal-all":
            continue
        out.append((int(o["time"]), {"f": o["f"], "value": o.get("value")}))
    return out


def fault_units(schedule: Sequence[tuple[int, Op]]) -> list[list[int]]:
    """The schedule's ops (indices) grouped into faults: each ``start-X`` with the next
    ``stop-X`` after it; any other op alone."""
    units: list[list[int]] = []
    open_: dict[str, list[int]] = {}  # kind -> its started units not stopped yet
    for i, (_at, op) in enumerate(schedule):
        f = str(op["f"])
        kind = f.split("-", 1)[1] if "-" in f else f
        if f.startswith("start-"):
            units.append([i])
            open_.setdefault(kind, []).append(len(units) - 1)
        elif f.startswith("stop-") and open_.get(kind):
            units[open_[kind].pop(0)].append(i)
        else:
            units.append([i])
    return units


_VIOLATIONS = [
    ("two-leaders", re.compile(r"two leaders of")),
    ("hw-went-down", re.compile(r"high watermark .* went down")),
    ("epoch-went-down", re.compile(r"leader epoch went down")),
    ("isr-member-below-hw", re.compile(r"in the ISR .* below the high watermark")),
    ("committed-beyond-end", re.compile(r"holds a committed batch")),
    ("committed-batch-differs", re.compile(r"committed batch at offset .* differs")),
]


def violation_kind(message: str | None) -> str | None:
    """The invariant a violation message of harness/sim/invariants.py names, as a short name."""
    if not message:
        return None
    for name, pattern in _VIOLATIONS:
        if pattern.search(message):
            return name
    return "violation"


@dataclass
class Outcome:
    """One simulated run, as the shrinker sees it."""

    valid: Any  # True, False, or "unknown"/None (a run stopped by a violation has no check)
    anomalies: list[str]
    violation: str | None
    ops: int  # client operations invoked
    faults: int  # start ops of the nemesis performed
    history_sha256: str | None
    cpu_s: float
    run_dir: str
    error: str | None = None  # the run raised (not a violation) or did not end

    @property
    def failed(self) -> bool:
        return self.valid is False or self.violation is not None

    def kinds(self) -> set[str]:
        """The anomaly names, and the violation's kind."""
        k = set(self.anomalies)
        v = violation_kind(self.violation)
        if v:
            k.add(f"invariant:{v}")
        return k


def overrides_of(test: Mapping[str, Any]) -> dict[str, Any]:
    """A run's test.json (or overrides) as overrides for `simulate_queue`."""
    return {k: v for k, v in test.items() if k not in _DERIVED}


def run_once(
    overrides: Mapping[str, Any],
    base_dir: Path,
    schedule: Sequence[tuple[int, Op]] | None = None,
    *,
    report: bool = False,
    check_invariants: bool = True,
) -> Outcome:
    """One full simulated run (`simulate_queue`) into `base_dir`/run, with `schedule` as the
    nemesis's (None: the test's generated one); an invariant violation is an outcome."""
    from isrlab.harness.sim.invariants import InvariantViolation
    from isrlab.harness.sim.run import simulate_queue

    base_dir = Path(base_dir)
    run_dir = base_dir / "run"
    cpu = time.process_time()
    violation: str | None = None
    results: dict[str, Any] = {}
    try:
        _, results = simulate_queue(
            overrides,
            base_dir,
            report=report,
            check_invariants=check_invariants,
            nemesis_schedule=None if schedule is None else list(schedule),
        )
    except InvariantViolation as e:
        violation = str(e)
    cpu = time.process_time() - cpu
    history = _history(run_dir) if (run_dir / "history.jsonl").is_file() else []
    ops = sum(1 for o in history if o.get("type") == "invoke" and o.get("process") != "nemesis")
    faults = sum(1 for _at, op in schedule_of(history) if str(op["f"]).startswith("start-"))
    sha = (results.get("sim") or {}).get("history_sha256")
    if violation is None:
        violation = (results.get("sim") or {}).get("violation")
    return Outcome(
        valid=results.get("valid") if results else None,
        anomalies=sorted(results.get("anomaly_types") or []),
        violation=violation,
        ops=ops,
        faults=faults,
        history_sha256=sha,
        cpu_s=round(cpu, 3),
        run_dir=str(run_dir),
    )


def run_isolated(
    overrides: Mapping[str, Any],
    base_dir: Path,
    schedule: Sequence[tuple[int, Op]] | None = None,
    *,
    timeout_s: float = 300.0,
    report: bool = False,
    check_invariants: bool = True,
) -> Outcome:
    """`run_once` in a forked child (the parent's modules, and any monkeypatch, inherited),
    killed after `timeout_s` wall seconds: a run that does not end (a livelock in virtual
    time) is an outcome (``hung``) instead of the end of the search."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            out = run_once(
                overrides, base_dir, schedule, report=report, check_invariants=check_invariants
            )
            send.send(asdict(out))
        except BaseException as e:  # the parent reads it as an error outcome
            send.send({"crash": f"{type(e).__name__}: {e}"})
        finally:
            send.close()

    started = time.monotonic()
    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    data: dict[str, Any] | None = None
    if recv.poll(timeout_s):
        try:
            data = recv.recv()
        except EOFError:
            data = None
    proc.join(1.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    recv.close()
    if data is None or "crash" in data:
        return Outcome(
            valid=None,
            anomalies=[],
            violation=None,
            ops=0,
            faults=0,
            history_sha256=None,
            cpu_s=round(time.monotonic() - started, 3),
            run_dir=str(Path(base_dir) / "run"),
            error=(data or {}).get("crash") or f"no end within {timeout_s:.0f} s (hung)",
        )
    return Outcome(**data)


@dataclass
class Candidate:
    """One input of the search: the overrides the shrinker varies and the schedule."""

    time_limit: float
    concurrency: int
    rate: float
    key_count: int
    schedule: Schedule

    def key(self) -> str:
        return json.dumps(
            [self.time_limit, self.concurrency, self.rate, self.key_count, self.schedule],
            sort_keys=True,
            default=str,
        )

    def overrides(self, base: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(base)
        out.update(
            time_limit=self.time_limit,
            concurrency=self.concurrency,
            rate=self.rate,
            key_count=self.key_count,
        )
        if self.key_count != int(base.get("key_count") or 0) or "keys" in out:
            out.pop("keys", None)  # the key list follows key_count
        return out


@dataclass
class ShrinkResult:
    before: dict[str, Any]
    after: dict[str, Any]
    overrides: dict[str, Any]
    schedule: Schedule
    target: list[str]
    runs: int
    cpu_s: float
    out_dir: str
    run_dir: str
    outcome: dict[str, Any]
    tried: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str | None = None


class _Budget(Exception):
    pass


class _Search:
    def __init__(
        self,
        base: Mapping[str, Any],
        target: set[str],
        work: Path,
        max_runs: int,
        max_cpu_s: float,
        check_invariants: bool,
        log: Callable[[str], None],
        run_timeout_s: float = 300.0,
    ) -> None:
        self.base = dict(base)
        self.target = target
        self.work = work
        self.max_runs = max_runs
        self.max_cpu_s = max_cpu_s
        self.check_invariants = check_invariants
        self.log = log
        self.run_timeout_s = run_timeout_s
        self.runs = 0
        self.cpu = 0.0
        self.cache: dict[str, Outcome] = {}
        self.tried: list[dict[str, Any]] = []

    def fails(self, c: Candidate, what: str) -> bool:
        k = c.key()
        if k in self.cache:
            return self.accept(self.cache[k])
        if self.runs >= self.max_runs:
            raise _Budget(f"{self.max_runs} runs")
        if self.cpu >= self.max_cpu_s:
            raise _Budget(f"{self.max_cpu_s:.0f} CPU s")
        self.runs += 1
        d = self.work / f"c{self.runs}"
        out = run_isolated(
            c.overrides(self.base),
            d,
            c.schedule,
            timeout_s=self.run_timeout_s,
            check_invariants=self.check_invariants,
        )
        shutil.rmtree(d, ignore_errors=True)
        self.cpu += out.cpu_s
        self.cache[k] = out
        ok = self.accept(out)
        self.tried.append(
            {
                "run": self.runs,
                "step": what,
                "time_limit": c.time_limit,
                "concurrency": c.concurrency,
                "rate": c.rate,
                "key_count": c.key_count,
                "faults": sum(1 for _, op in c.schedule if str(op["f"]).startswith("start-")),
                "ops": out.ops,
                "failed": out.failed,
                "kinds": sorted(out.kinds()),
                "accepted": ok,
                "cpu_s": out.cpu_s,
                "error": out.error,
            }
        )
        self.log(
            f"run {self.runs} [{what}]: faults {self.tried[-1]['faults']}, ops {out.ops}, "
            f"time limit {c.time_limit}, concurrency {c.concurrency}, rate {c.rate}: "
            + (f"FAILS {','.join(sorted(out.kinds()))}" if ok else out.error or "passes")
        )
        return ok

    def accept(self, out: Outcome) -> bool:
        return out.failed and bool(out.kinds() & self.target)


def _cut(schedule: Schedule, start_ns: int, time_limit: float) -> Schedule:
    """The ops the run can perform within `time_limit` seconds from `start_ns`."""
    end = start_ns + int(time_limit * NS)
    return [(at, op) for at, op in schedule if at < end]


def _ddmin(units: list[list[int]], fails: Callable[[list[list[int]]], bool]) -> list[list[int]]:
    """Zeller's ddmin: a 1-minimal sublist of `units` for which `fails` holds (it holds for
    all of them): none at all first, then chunks alone, then their complements, the chunks
    made finer until single units."""
    if units and fails([]):
        return []
    n = 2
    while len(units) >= 2:
        size = len(units) / n
        chunks = [units[int(i * size) : int((i + 1) * size)] for i in range(n)]
        chunks = [c for c in chunks if c]
        for c in chunks:
            if fails(c):
                units, n = c, 2
                break
        else:
            for c in chunks if len(chunks) > 2 else []:
                rest = [u for u in units if u not in c]
                if fails(rest):
                    units, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(units):
                    break
                n = min(len(units), 2 * n)
    return units


def shrink(
    overrides: Mapping[str, Any],
    out_dir: Path,
    *,
    max_runs: int = 80,
    max_cpu_s: float = 600.0,
    check_invariants: bool = True,
    run_timeout_s: float | None = None,
    steps: Sequence[str] = ("time", "faults", "numbers"),
    original: Path | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> ShrinkResult:
    """Shrink the failing run of `overrides` (see the module doc); ValueError when it does
    not fail. `original`: the run directory of that run if it exists already (its schedule
    and outcome are read from it instead of running it again)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = overrides_of(overrides)
    work = Path(tempfile.mkdtemp(prefix="shrink-", dir=out_dir))
    try:
        if original is None:
            first = run_isolated(
                base,
                work / "original",
                None,
                timeout_s=run_timeout_s or 600.0,
                check_invariants=check_invariants,
            )
            original = Path(first.run_dir)
        else:
            first = _outcome_of(Path(original))
        if not first.failed:
            raise ValueError(f"the run does not fail (valid {first.valid}, no violation)")
        history = _history(original)
        schedule = schedule_of(history)
        start_ns = min((int(o["time"]) for o in history), default=0)
        target = first.kinds()
        log(f"original: faults {first.faults}, ops {first.ops}, fails with {sorted(target)}")
        from isrlab.harness.sim.run import sim_config

        cfg = sim_config(base)
        best = Candidate(
            time_limit=float(cfg.time_limit),
            concurrency=int(cfg.concurrency),
            rate=float(cfg.rate or 0),
            key_count=int(cfg.key_count or 1),
            schedule=schedule,
        )
        if run_timeout_s is None:
            # a candidate that runs much longer than the original is taken as hung (a run
            # whose virtual time stopped advancing never ends)
            run_timeout_s = max(20.0, 5 * first.cpu_s)
        s = _Search(base, target, work, max_runs, max_cpu_s, check_invariants, log, run_timeout_s)
        # the explicit schedule as given must fail as the generated one did (it is the same
        # run); if it does not, shrinking from it would be meaningless
        stopped_by: str | None = None
        try:
            if not s.fails(best, "replay"):
                raise ValueError("replaying the run's own schedule does not fail as it did")
            for _round in range(3):
                before = best.key()
                for step in steps:
                    if step == "time":
                        best = _shrink_time(s, best, start_ns)
                    elif step == "faults":
                        best = _shrink_faults(s, best)
                    elif step == "numbers":
                        best = _shrink_numbers(s, best)
                    else:
                        raise ValueError(f"unknown shrinking step {step!r}")
                if best.key() == before:
                    break
        except _Budget as e:
            stopped_by = str(e)
            log(f"stopped: budget of {e}")
        # the minimal run through the normal checker path (report.html)
        run_dir = out_dir / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(out_dir / "data", ignore_errors=True)
        final = run_isolated(
            best.overrides(base),
            out_dir,
            best.schedule,
            timeout_s=run_timeout_s,
            report=True,
            check_invariants=check_invariants,
        )
        result = ShrinkResult(
            before={
                "faults": first.faults,
                "ops": first.ops,
                "time_limit": float(cfg.time_limit),
                "concurrency": int(cfg.concurrency),
                "rate": float(cfg.rate or 0),
                "key_count": int(cfg.key_count or 1),
                "schedule_ops": len(schedule),
                "kinds": sorted(target),
            },
            after={
                "faults": final.faults,
                "ops": final.ops,
                "time_limit": best.time_limit,
                "concurrency": best.concurrency,
                "rate": best.rate,
                "key_count": best.key_count,
                "schedule_ops": len(best.schedule),
                "kinds": sorted(final.kinds()),
            },
            overrides=best.overrides(base),
            schedule=best.schedule,
            target=sorted(target),
            runs=s.runs,
            cpu_s=round(first.cpu_s + s.cpu + final.cpu_s, 2),
            out_dir=str(out_dir),
            run_dir=str(run_dir),
            outcome=asdict(final),
            tried=s.tried,
            stopped_by=stopped_by,
        )
        _write_summary(result, base, schedule)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _outcome_of(run_dir: Path) -> Outcome:
    results = json.loads((run_dir / "results.json").read_text())
    history = _history(run_dir)
    return Outcome(
        valid=results.get("valid"),
        anomalies=sorted(results.get("anomaly_types") or []),
        violation=(results.get("sim") or {}).get("violation"),
        ops=sum(1 for o in history if o.get("type") == "invoke" and o.get("process") != "nemesis"),
        faults=sum(1 for _, op in schedule_of(history) if str(op["f"]).startswith("start-")),
        history_sha256=(results.get("sim") or {}).get("history_sha256"),
        cpu_s=0.0,
        run_dir=str(run_dir),
    )


def _with(c: Candidate, **kw: Any) -> Candidate:
    d = {**c.__dict__, **kw}
    return Candidate(**d)


def _shrink_time(s: _Search, best: Candidate, start_ns: int) -> Candidate:
    """The shortest time limit (whole seconds, bisected) that still fails."""
    lo, hi = 1, int(best.time_limit)
    if hi != best.time_limit:
        hi = int(best.time_limit) + 1
    found = best
    while lo < hi:
        mid = (lo + hi) // 2
        c = _with(best, time_limit=float(mid), schedule=_cut(best.schedule, start_ns, mid))
        if s.fails(c, "time limit"):
            hi, found = mid, c
        else:
            lo = mid + 1
    return found


def _shrink_faults(s: _Search, best: Candidate) -> Candidate:
    """ddmin over the schedule's faults (a start with its stop)."""
    units = fault_units(best.schedule)

    def sched(keep: list[list[int]]) -> Schedule:
        idx = sorted(i for u in keep for i in u)
        return [best.schedule[i] for i in idx]

    def fails(keep: list[list[int]]) -> bool:
        return s.fails(_with(best, schedule=sched(keep)), "faults")

    if len(units) == 0:
        return best
    kept = _ddmin(units, fails)
    return _with(best, schedule=sched(kept))


def _shrink_numbers(s: _Search, best: Candidate) -> Candidate:
    """Fewer threads, a lower rate, fewer keys: the smallest that still fails (tried from
    the smallest up)."""
    for c in sorted({1, 2, best.concurrency // 2} - {0}):
        if c < best.concurrency and s.fails(_with(best, concurrency=c), "concurrency"):
            best = _with(best, concurrency=c)
            break
    if best.rate > 0:
        for r in (best.rate / 4, best.rate / 2):
            r = float(round(r, 3))
            if r > 0 and r < best.rate and s.fails(_with(best, rate=r), "rate"):
                best = _with(best, rate=r)
                break
    if best.key_count > 1 and s.fails(_with(best, key_count=1), "key count"):
        best = _with(best, key_count=1)
    return best


def _replay_call(summary: Path) -> dict[str, str]:
    return {
        "command": f"python -m isrlab.harness.sim.shrink replay {summary} REPLAY_DIR",
        "python": (
            "import json; from isrlab.harness.sim.run import simulate_queue; "
            f"s = json.load(open({str(summary)!r})); "
            "simulate_queue(s['overrides'], BASE_DIR, "
            "nemesis_schedule=[(at, op) for at, op in s['schedule']])"
        ),
    }


def _write_summary(r: ShrinkResult, base: Mapping[str, Any], schedule: Schedule) -> None:
    out = Path(r.out_dir)
    summary = out / "shrink.json"
    data = {
        **asdict(r),
        "original_overrides": dict(base),
        "original_schedule": schedule,
        "replay": _replay_call(summary),
    }
    summary.write_text(json.dumps(data, indent=2, default=str))
    rows = [
        ("faults", "faults"),
        ("client ops", "ops"),
        ("time limit (s)", "time_limit"),
        ("concurrency", "concurrency"),
        ("rate (ops/s)", "rate"),
        ("keys", "key_count"),
        ("nemesis ops", "schedule_ops"),
    ]
    lines = [
        "# Shrunk simulated run",
        "",
        f"Seed {base.get('seed')}, fails with {', '.join(r.target)}; "
        f"{r.runs} candidate runs, {r.cpu_s} CPU s"
        + (f" (stopped by the budget: {r.stopped_by})" if r.stopped_by else "")
        + ".",
        "",
        "| | before | after |",
        "|---|---|---|",
        *[f"| {name} | {r.before[k]} | {r.after[k]} |" for name, k in rows],
        f"| fails with | {', '.join(r.before['kinds'])} | {', '.join(r.after['kinds'])} |",
        "",
        "Minimal schedule (virtual s on the history's clock):",
        "",
        *[f"- {at / NS:.3f} `{op['f']}` `{json.dumps(op.get('value'))}`" for at, op in r.schedule],
        "",
        f"Run directory with report.html: `{r.run_dir}`",
        "",
        "Replay:",
        "",
        f"    {_replay_call(summary)['command']}",
        "",
    ]
    (out / "shrink.md").write_text("\n".join(lines))


def replay(
    summary: Path, base_dir: Path, *, report: bool = True, check_invariants: bool = True
) -> Outcome:
    """The shrunk run of a shrink.json again, into `base_dir`/run."""
    data = json.loads(Path(summary).read_text())
    sched = [(int(at), op) for at, op in data["schedule"]]
    return run_once(
        data["overrides"], Path(base_dir), sched, report=report, check_invariants=check_invariants
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m isrlab.harness.sim.shrink", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("shrink", help="shrink a failing simulated run")
    a.add_argument("overrides", type=Path, help="a JSON object of overrides, or a test.json")
    a.add_argument("out", type=Path)
    a.add_argument("--max-runs", type=int, default=80)
    a.add_argument("--max-cpu-s", type=float, default=600.0)
    b = sub.add_parser("replay", help="run a shrink.json's minimal run again")
    b.add_argument("summary", type=Path)
    b.add_argument("base_dir", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "shrink":
        r = shrink(
            json.loads(args.overrides.read_text()),
            args.out,
            max_runs=args.max_runs,
            max_cpu_s=args.max_cpu_s,
            log=print,
        )
        print((Path(r.out_dir) / "shrink.md").read_text())
        return 0
    out = replay(args.summary, args.base_dir)
    print(json.dumps(asdict(out), indent=2))
    return 0 if out.failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
