"""`isrlab check`: check histories (files, run directories, directories of them) in one process.

`check_command` is a plain typer-annotated function; harness/cli.py registers it on the
`isrlab` app. Behaviour (docs/history-format.md, "What `isrlab check` produces today"):

- each PATH is a history file, a run directory (its history file is checked, and test.json
  supplies workload, policy and eos keys; command-line options win), or a directory of them:
  every run directory below it and every other history file (`*.jsonl`; `*.edn` with
  `--format edn`; `*.log` with `--format jepsen-log`), in sorted order, symbolic
  links not followed;
- one PATH that is a file or a run directory: a summary (or with `--json` exactly the
  results JSON), and bad input is one line on stderr;
- several histories: one line per history (`VERDICT  path  detail`, or with `--json` one
  results object per line with its `path`), bad input in one of them is that history's line
  (verdict `error`) and the others are still checked;
- `--out DIR` (or `--save` for a run directory: into the run directory) writes results.json,
  summary.txt and offset diagrams; with several histories each gets its own folder under DIR;
- exit code 0 valid, 1 invalid, 2 unknown (e.g. `--timeout` hit, nothing checked) or bad
  input; for several histories the worst of them (2 over 1 over 0).

Start-up is kept small (`isrlab check` may run once per file): rich and the checkers'
heavy modules are imported only when used.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from isrlab.checkers.api import FORMATS, WORKLOADS, check, load_for_check, policy_from_test
from isrlab.checkers.history import HistoryError

__all__ = ["check_command", "exit_code", "find_histories", "find_history"]

_HISTORY_NAMES = {
    "jsonl": ("history.jsonl",),
    "edn": ("history.edn",),
    "jepsen-log": ("jepsen.log", "history.txt", "history.log"),
}
# Files a directory walk takes as histories, by format.
_SUFFIXES = {"jsonl": (".jsonl",), "edn": (".edn",), "jepsen-log": (".log",)}


class _BadInput(Exception):
    pass


class _TimedOut(Exception):
    pass


def exit_code(results: dict[str, Any]) -> int:
    v = results.get("valid")
    return 0 if v is True else 1 if v is False else 2


def find_history(path: Path, fmt: str) -> tuple[Path, Path | None]:
    """(history file, run directory or None) for a PATH that is a file or a run directory."""
    if path.is_dir():
        for name in _HISTORY_NAMES.get(fmt, ()):
            if (path / name).is_file():
                return path / name, path
        names = " or ".join(_HISTORY_NAMES.get(fmt, ("history",)))
        raise _BadInput(f"{path} is a directory without {names}; pass the history file itself")
    if not path.exists():
        raise _BadInput(f"{path} does not exist")
    return path, None


@dataclass
class _Target:
    """One history to check, or why a PATH gave none (`error`)."""

    shown: Path
    history: Path | None = None
    run_dir: Path | None = None
    error: str | None = None


def _walk(root: Path, fmt: str) -> list[_Target]:
    found: list[_Target] = []
    names = _HISTORY_NAMES.get(fmt, ())
    suffixes = _SUFFIXES.get(fmt, ())
    for top, dirs, files in os.walk(root):  # symbolic links to directories are not followed
        here = Path(top)
        dirs.sort()
        run_history = next((here / n for n in names if n in files), None)
        if run_history is not None:  # a run directory: its history only, nothing below
            found.append(_Target(run_history, run_history, here))
            dirs.clear()
            continue
        for name in sorted(files):
            p = here / name
            if name.endswith(suffixes) and not p.is_symlink() and p.is_file():
                found.append(_Target(p, p, None))
    return found


def find_histories(paths: list[Path], fmt: str) -> tuple[list[_Target], bool]:
    """The histories PATHS name, and whether the output is for one history (one PATH that is
    a file or a run directory) rather than one line per history."""
    targets: list[_Target] = []
    walked = False
    for path in paths:
        if path.is_dir():
            try:
                history, run_dir = find_history(path, fmt)
            except _BadInput:
                below = _walk(path, fmt)
                walked = walked or bool(below)
                if not below:
                    names = " or ".join(_HISTORY_NAMES.get(fmt, ("history",)))
                    kinds = ", ".join(f"*{s}" for s in _SUFFIXES.get(fmt, ()))
                    targets.append(
                        _Target(
                            path,
                            error=f"{path} is a directory without {names} and "
                            f"without {kinds} histories below it",
                        )
                    )
                targets.extend(below)
            else:
                targets.append(_Target(path, history, run_dir))
        elif path.exists():
            targets.append(_Target(path, path, None))
        else:
            targets.append(_Target(path, error=f"{path} does not exist"))
    single = len(paths) == 1 and not walked
    seen: set[Path] = set()
    unique = []
    for t in targets:
        key = t.history.resolve() if t.history is not None else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        unique.append(t)
    return unique, single


def _split(s: str | None) -> set[str] | None:
    if s is None:
        return None
    return {x.strip() for x in s.split(",") if x.strip()}


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise _TimedOut in the main thread after `seconds` (no-op elsewhere)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _TimedOut()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class _Options:
    """The command line, validated once for every history."""

    fmt: str
    workload: str | None
    queue_opts: dict[str, Any] = field(default_factory=dict)
    eos_input: list[str] | None = None
    eos_output: list[str] | None = None
    timeout: float | None = None
    out: Path | None = None
    save: bool = False


def _options(
    fmt: str,
    workload: str | None,
    allow: str | None,
    disallow: str | None,
    eos_input: str | None,
    eos_output: str | None,
    timeout: float | None,
    out: Path | None,
    save: bool,
) -> _Options:
    if fmt not in FORMATS:
        raise _BadInput(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
    if workload is not None and workload not in WORKLOADS:
        raise _BadInput(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
    if timeout is not None and not timeout > 0:
        raise _BadInput(f"--timeout must be a positive number of seconds, not {timeout}")
    queue_opts: dict[str, Any] = {}
    for flag, value in (("--allow", allow), ("--disallow", disallow)):
        names = _split(value)
        if names:
            from isrlab.checkers.queue.policy import ALL_TYPES

            unknown = sorted(names - ALL_TYPES)
            if unknown:
                raise _BadInput(
                    f"{flag}: unknown anomaly type(s) {', '.join(unknown)}; see docs/anomalies.md"
                )
            queue_opts[flag.strip("-")] = names
    return _Options(
        fmt=fmt,
        workload=workload,
        queue_opts=queue_opts,
        eos_input=sorted(_split(eos_input) or ()) or None,
        eos_output=sorted(_split(eos_output) or ()) or None,
        timeout=timeout,
        out=out,
        save=save,
    )


def _prepare_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _BadInput(f"cannot write results to {path}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _BadInput(f"cannot write results to {path}: permission denied")
    return path


def _check_one(
    history_path: Path, run_dir: Path | None, o: _Options, write_to: Path | None
) -> tuple[dict[str, Any], Any]:
    """(results, ops) of one history; raises _BadInput, HistoryError, OSError, ImportError."""
    policy: dict[str, Any] = {}
    if run_dir is not None and (run_dir / "test.json").is_file():
        try:
            policy = policy_from_test(orjson.loads((run_dir / "test.json").read_bytes()))
        except (orjson.JSONDecodeError, AttributeError, TypeError) as e:
            raise _BadInput(
                f"{run_dir / 'test.json'} is not a valid test configuration: {e}"
            ) from None
    wl = o.workload or policy.pop("workload", None)
    policy.pop("workload", None)
    if wl is None:
        raise _BadInput("no workload: pass --workload queue|register|cas-register|kv")
    if wl not in WORKLOADS:
        raise _BadInput(f"unknown workload {wl!r}; use one of {', '.join(WORKLOADS)}")
    opts: dict[str, Any]
    if wl == "queue":
        opts = {**policy, **o.queue_opts}
        if o.eos_input or o.eos_output:
            eos = dict(opts.get("eos") or {})
            if o.eos_input:
                eos["input"] = o.eos_input
            if o.eos_output:
                eos["output"] = o.eos_output
            opts["eos"] = eos
    else:
        opts = {"timeout_s": o.timeout}
        if write_to is not None:
            opts["out_dir"] = write_to
    ops = load_for_check(history_path, o.fmt, wl)
    try:
        with _deadline(o.timeout if wl == "queue" else None):
            results = check(ops, wl, **opts)
    except ValueError as e:
        if isinstance(e, HistoryError):
            raise
        raise _BadInput(f"the {wl} checker rejected this history: {e}") from None
    except _TimedOut:
        results = {
            "valid": "unknown",
            "anomaly_types": [],
            "anomalies": {},
            "stats": {"ops": len(ops)},
            "error": f"analysis did not finish within {o.timeout} s",
        }
    return results, ops


def _write(write_to: Path, ops: Any, results: dict[str, Any]) -> None:
    from isrlab.checkers.render import render_artifacts

    try:
        (write_to / "results.json").write_bytes(
            orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        )
        render_artifacts(ops, results, write_to)
    except OSError as e:
        raise _BadInput(f"cannot write results to {write_to}: {e.strerror or e}") from None


def _run_one(t: _Target, o: _Options, write_to: Path | None) -> tuple[dict[str, Any] | None, str]:
    """(results or None, error message or "") of one target; never raises for bad input."""
    if t.error is not None or t.history is None:
        return None, t.error or f"{t.shown}: no history"
    try:
        if write_to is not None:
            _prepare_dir(write_to)
        results, ops = _check_one(t.history, t.run_dir, o, write_to)
        if write_to is not None:
            _write(write_to, ops, results)
        return results, ""
    except (_BadInput, HistoryError) as e:
        return None, str(e)
    except ImportError as e:
        return None, f"a component this check needs is missing: {e}"
    except OSError as e:
        return None, str(e)


def _write_dir(t: _Target, o: _Options, single: bool, used: set[str]) -> Path | None:
    """Where `--out` / `--save` put a target's results (several targets: one folder each)."""
    if t.history is None:
        return None
    if o.out is not None:
        if single:
            return o.out
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(t.run_dir or t.history).strip("/")) or "_"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        return o.out / name
    if o.save:
        return t.run_dir if t.run_dir is not None else t.history.parent
    return None


def _print_summary(results: dict[str, Any], source: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from isrlab.checkers.render import not_allowed_types

    console = Console()
    valid = results.get("valid")
    style = "bold green" if valid is True else "bold red" if valid is False else "bold yellow"
    verdict = "valid" if valid is True else "INVALID" if valid is False else "unknown"
    console.print(f"[{style}]{verdict}[/]  {escape(str(source))}")
    anomalies = results.get("anomalies", {})
    if anomalies:
        bad = not_allowed_types(results)
        table = Table("anomaly", "count", "allowed", "example")
        for name in results.get("anomaly_types", sorted(anomalies)):
            a = anomalies.get(name, {})
            ex = (a.get("examples") or [{}])[0]
            table.add_row(
                name,
                str(a.get("count", 0)),
                "no" if name in bad else "yes",
                escape(str(ex.get("explanation", "")) if isinstance(ex, dict) else str(ex)),
            )
        console.print(table)
    if results.get("error"):
        console.print(f"[yellow]{escape(str(results['error']))}[/]")
    stats = results.get("stats") or {}
    if stats:
        console.print(escape(", ".join(f"{k}={v}" for k, v in stats.items())), style="dim")


def _line(results: dict[str, Any] | None, error: str, source: Path) -> str:
    """One history's line: verdict, path, and what decided it."""
    if results is None:
        return f"error    {source}  {error}"
    from isrlab.checkers.render import not_allowed_types

    valid = results.get("valid")
    verdict = "valid" if valid is True else "INVALID" if valid is False else "unknown"
    anomalies = results.get("anomalies") or {}
    bad = not_allowed_types(results)
    counts = [
        f"{name}{'' if name in bad else ' (allowed)'}: {anomalies.get(name, {}).get('count', 0)}"
        for name in results.get("anomaly_types", sorted(anomalies))
    ]
    stats = results.get("stats") or {}
    detail = ", ".join(counts)
    reason = results.get("error") or stats.get("nothing-checked")
    if reason:
        detail = f"{detail}; {reason}" if detail else str(reason)
    ops = stats.get("ops", stats.get("operations"))
    if not detail and ops is not None:
        detail = f"{ops} ops"
    return f"{verdict:<8} {source}  {detail}".rstrip()


def check_command(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="history files, run directories, or directories holding them", show_default=False
        ),
    ],
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="queue | register | cas-register | kv"),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option("--json", help="print the results JSON (several histories: one per line)"),
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", help="history format: jsonl | edn | jepsen-log")
    ] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="write results.json and artefacts here (several histories: a folder each)",
        ),
    ] = None,
    save: Annotated[
        bool, typer.Option("--save", help="write results and artefacts into the run directory")
    ] = False,
    allow: Annotated[
        str | None, typer.Option(help="anomaly types to allow, comma-separated")
    ] = None,
    disallow: Annotated[
        str | None, typer.Option(help="anomaly types to disallow, comma-separated")
    ] = None,
    eos_input: Annotated[
        str | None, typer.Option("--eos-input", help="exactly-once input keys, comma-separated")
    ] = None,
    eos_output: Annotated[
        str | None, typer.Option("--eos-output", help="exactly-once output keys, comma-separated")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="give up on a history after this many seconds (verdict unknown)"),
    ] = None,
) -> None:
    """Check histories (files, run directories, or directories of them) for anomalies.

    Exit 0 valid, 1 invalid, 2 unknown (nothing checked, a timeout) or bad input. Several
    histories are checked in one process: one line each, and the worst exit code of them
    (2 over 1 over 0)."""
    try:
        o = _options(fmt, workload, allow, disallow, eos_input, eos_output, timeout, out, save)
        if o.out is not None and o.out.exists() and not o.out.is_dir():
            raise _BadInput(f"--out {o.out} is a file; give a directory")
    except _BadInput as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    targets, single = find_histories(list(paths), fmt)
    if single:
        t = targets[0]
        results, error = _run_one(t, o, _write_dir(t, o, True, set()))
        if results is None:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2)
        if json_out:
            typer.echo(orjson.dumps(results, option=orjson.OPT_NON_STR_KEYS).decode())
        else:
            _print_summary(results, t.history or t.shown)
        raise typer.Exit(exit_code(results))
    worst = 0
    tally = {"valid": 0, "INVALID": 0, "unknown": 0, "error": 0}
    used: set[str] = set()
    for t in targets:
        results, error = _run_one(t, o, _write_dir(t, o, False, used))
        code = 2 if results is None else exit_code(results)
        worst = max(worst, code)
        source = t.history or t.shown
        if results is None:
            tally["error"] += 1
        else:
            tally[("valid", "INVALID", "unknown")[code]] += 1
        if json_out:
            line = {"path": str(source), **(results or {"valid": "unknown", "error": error})}
            typer.echo(orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS).decode())
        else:
            typer.echo(_line(results, error, source))
    typer.echo(
        f"{len(targets)} histories: " + ", ".join(f"{n} {k}" for k, n in tally.items() if n),
        err=True,
    )
    raise typer.Exit(worst)
