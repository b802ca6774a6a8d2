"""`isrlab check`: check one history (or run directory) and report the verdict.

`check_command` is a plain typer-annotated function; the lead registers it on the
`isrlab` app. Behaviour (docs/history-format.md):

- PATH is a history file or a run directory (then its history file is used, and
  test.json supplies workload, policy and eos keys; command-line options win);
- prints a rich summary, or with `--json` exactly the results JSON;
- `--out DIR` (or `--save` for a run directory: into the run directory) writes
  results.json, summary.txt and offset diagrams;
- exit code 0 valid, 1 invalid, 2 unknown (e.g. `--timeout` hit) or bad input. Bad input
  gives one line on stderr, never a traceback.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from isrlab.checkers.api import FORMATS, WORKLOADS, check, load_for_check, policy_from_test
from isrlab.checkers.history import HistoryError

__all__ = ["check_command", "exit_code", "find_history"]

_HISTORY_NAMES = {
    "jsonl": ("history.jsonl",),
    "edn": ("history.edn",),
    "jepsen-log": ("jepsen.log", "history.txt", "history.log"),
}


class _BadInput(Exception):
    pass


class _TimedOut(Exception):
    pass


def exit_code(results: dict[str, Any]) -> int:
    v = results.get("valid")
    return 0 if v is True else 1 if v is False else 2


def find_history(path: Path, fmt: str) -> tuple[Path, Path | None]:
    """(history file, run directory or None) for a PATH argument."""
    if path.is_dir():
        for name in _HISTORY_NAMES.get(fmt, ()):
            if (path / name).is_file():
                return path / name, path
        names = " or ".join(_HISTORY_NAMES.get(fmt, ("history",)))
        raise _BadInput(f"{path} is a directory without {names}; pass the history file itself")
    if not path.exists():
        raise _BadInput(f"{path} does not exist")
    return path, None


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


def _print_summary(results: dict[str, Any], console: Console, source: Path) -> None:
    valid = results.get("valid")
    style = "bold green" if valid is True else "bold red" if valid is False else "bold yellow"
    verdict = "valid" if valid is True else "INVALID" if valid is False else "unknown"
    console.print(f"[{style}]{verdict}[/]  {source}")
    anomalies = results.get("anomalies", {})
    if anomalies:
        bad = set(results.get("not_allowed", ()))
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
        console.print(f"[yellow]{results['error']}[/]")
    stats = results.get("stats") or {}
    if stats:
        console.print(", ".join(f"{k}={v}" for k, v in stats.items()), style="dim")


def check_command(
    path: Annotated[Path, typer.Argument(help="history file or run directory")],
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="queue | register | cas-register | kv"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the results JSON")] = False,
    fmt: Annotated[
        str, typer.Option("--format", help="history format: jsonl | edn | jepsen-log")
    ] = "jsonl",
    out: Annotated[
        Path | None, typer.Option("--out", help="write results.json and artefacts here")
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
        float | None, typer.Option(help="give up after this many seconds (verdict unknown)")
    ] = None,
) -> None:
    """Check a history for anomalies; exit 0 valid, 1 invalid, 2 unknown or bad input."""
    err = Console(stderr=True)
    try:
        if fmt not in FORMATS:
            raise _BadInput(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
        history_path, run_dir = find_history(path, fmt)
        policy: dict[str, Any] = {}
        if run_dir is not None and (run_dir / "test.json").is_file():
            try:
                policy = policy_from_test(orjson.loads((run_dir / "test.json").read_bytes()))
            except (orjson.JSONDecodeError, AttributeError, TypeError) as e:
                raise _BadInput(
                    f"{run_dir / 'test.json'} is not a valid test configuration: {e}"
                ) from None
        wl = workload or policy.pop("workload", None)
        policy.pop("workload", None)
        if wl is None:
            raise _BadInput("no workload: pass --workload queue|register|cas-register|kv")
        if wl not in WORKLOADS:
            raise _BadInput(f"unknown workload {wl!r}; use one of {', '.join(WORKLOADS)}")
        opts: dict[str, Any] = dict(policy)
        if wl == "queue":
            from isrlab.checkers.queue.policy import ALL_TYPES

            for flag, value in (("--allow", allow), ("--disallow", disallow)):
                names = _split(value)
                if names:
                    unknown = sorted(names - ALL_TYPES)
                    if unknown:
                        raise _BadInput(
                            f"{flag}: unknown anomaly type(s) {', '.join(unknown)}; "
                            "see docs/anomalies.md"
                        )
                    opts[flag.strip("-")] = names
            if eos_input or eos_output:
                eos = dict(opts.get("eos") or {})
                if eos_input:
                    eos["input"] = sorted(_split(eos_input) or ())
                if eos_output:
                    eos["output"] = sorted(_split(eos_output) or ())
                opts["eos"] = eos
        else:
            opts = {"timeout_s": timeout}
        write_to = out if out is not None else (run_dir if save and run_dir else None)
        if save and write_to is None:
            write_to = history_path.parent
        if write_to is not None and wl != "queue":
            opts["out_dir"] = write_to
        ops = load_for_check(history_path, fmt, wl)
        try:
            with _deadline(timeout if wl == "queue" else None):
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
                "error": f"analysis did not finish within {timeout} s",
            }
    except (_BadInput, HistoryError) as e:
        err.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ImportError as e:
        err.print(
            f"[red]error:[/] a component this check needs is missing: {escape(str(e))}",
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    except OSError as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if write_to is not None:
        from isrlab.checkers.render import render_artifacts

        write_to.mkdir(parents=True, exist_ok=True)
        (write_to / "results.json").write_bytes(
            orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        )
        render_artifacts(ops, results, write_to)
    if json_out:
        typer.echo(orjson.dumps(results, option=orjson.OPT_NON_STR_KEYS).decode())
    else:
        _print_summary(results, Console(), history_path)
    raise typer.Exit(exit_code(results))
