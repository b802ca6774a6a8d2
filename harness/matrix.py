"""`isrlab matrix`: run a grid of `isrlab test` runs into a store, resumably (the pipeline then
analyses the store: `isrlab analyze`).

The grid is acks x nemesis x consumer mode x switch variants x repeats (`grid`), and
optionally workload x idempotence x txn x isolation level. The consumer
mode is how the processes take keys: ``assign`` (every run before consumer groups) or
``subscribe`` (every process joins the test's consumer group, ``--subscribe``); the eos
workload's copiers always form a group, so its cells take no consumer mode. The
transaction dimensions (``--idempotence``, ``--txn``, ``--isolation-level``, each a comma
list) are left to the base test and the switch variants unless given; a txn cell is
idempotent (a transactional producer is), so idempotence=false x txn=true is not a cell of
its own. Unless a dimension or variant says otherwise, a cell's idempotence is Kafka 3.x's
default, as `isrlab test`'s: on with acks=all, off with acks 0 and 1; an idempotent cell with
acks 0 or 1 is not a cell (Kafka's producer refuses it). A nemesis is one fault
kind, ``combined`` (all four on their own schedules) or a composition such as
``partition+kill``; `parse_settings` reads ``--set`` overrides of the base test (the
timings that decide how fast the ISR shrinks and leadership moves, key and process
counts), which apply to every cell. Every cell is a plain
test configuration (the harness's test.json keys, notes/harness-api.md) named by
`harness.testconfig.config_name`, e.g. ``acks-all_partition_isr2_unclean_r0``, so the
cell's runs live in ``STORE/<name>/<timestamp>/``.

`run_matrix(tests, store)` runs the cells one after the other with the harness's
``harness.runner.run_test(config) -> run_dir`` (imported lazily; tests inject a fake as
`run_test`). A cell is finished when one of its run directories has a results.json;
finished cells are skipped, so a nightly job that was cut off resumes where it stopped.
Each run prints one line of progress (position, cell, verdict, seconds, run dir); a
failing run is reported and the matrix goes on; the end prints a summary table.

`matrix_command` is ``isrlab matrix``: exit 0 when every run completed (whatever its verdict),
1 when some run failed, 2 on bad options.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from isrlab.harness.testconfig import (
    SETTINGS,
    SWITCHES,
    ConfigError,
    TestConfig,
    config_name,
    option,
)
from isrlab.harness.testconfig import nemesis_kinds as test_nemesis_kinds

__all__ = [
    "ACKS",
    "HISTORIC_SWITCHES",
    "ISOLATION_LEVELS",
    "MATRIX_CONSUMERS",
    "NEMESES",
    "WORKLOADS",
    "CellResult",
    "MatrixSummary",
    "base_test",
    "finished_run",
    "grid",
    "matrix_command",
    "nemesis_kinds",
    "parse_settings",
    "parse_switches",
    "run_matrix",
]

ACKS = option("acks").choices
WORKLOADS = option("workload").choices
ISOLATION_LEVELS = option("isolation_level").choices
# The consumer modes a matrix runs (harness.testconfig.consumer_mode; "mixed" is --sub-p's).
MATRIX_CONSUMERS = ("assign", "subscribe")
NEMESES = ("partition", "kill", "pause", "clock", "combined")
# The settings that lost acknowledged data in Kafka's history: each one a variant.
HISTORIC_SWITCHES: tuple[dict[str, Any], ...] = (
    {"unclean_leader_election": True},
    {"truncation_mode": "high-watermark"},
    {"min_insync_replicas": 1},
)
# `--switch` and `--set` names: the test table's switches and settings (types and bounds there).
SWITCH_NAMES = tuple(o.name for o in SWITCHES)
SETTING_NAMES = tuple(o.name for o in SETTINGS)
# Fault kinds a nemesis spec may compose with "+" (nemeses.compose.KINDS).
FAULT_KINDS = tuple(k for k in option("nemesis").choices if k != "none")

RunTest = Callable[[dict[str, Any]], Any]


def base_test(time_limit: float = 60.0, **overrides: Any) -> dict[str, Any]:
    """The configuration every cell starts from: a 3-broker queue test, acks=all, RF 3
    (idempotence unset: each cell takes Kafka 3.x's default for its acks, `grid`)."""
    # The table's defaults for the switches (a cell names them all, so its name and
    # test.json say what ran); the matrix's own shorter final phase and one partition per topic.
    defaults = TestConfig()
    test: dict[str, Any] = {
        "workload": defaults.workload,
        "concurrency": defaults.concurrency,
        "rate": defaults.rate,
        "time_limit": time_limit,
        "final_time_limit": 30,
        "recovery_time": defaults.recovery_time,
        "nemesis_interval": defaults.nemesis_interval,
        "acks": defaults.acks,
        **{name: getattr(defaults, name) for name in SWITCH_NAMES},
        "replication_factor": defaults.replication_factor,
        "partitions_per_topic": 1,
    }
    test.update(overrides)
    return test


def parse_switches(text: str) -> dict[str, Any]:
    """``"unclean_leader_election=true,min_insync_replicas=1"`` -> a switch variant dict."""
    out: dict[str, Any] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip().replace(".", "_").replace("-", "_")
        if name == "min_insync":
            name = "min_insync_replicas"
        if name not in SWITCH_NAMES:
            raise ValueError(
                f"unknown switch {name!r}; use one of {', '.join(SWITCH_NAMES)} (as name=value)"
            )
        raw = raw.strip() if sep else "true"
        try:
            out[name] = option(name).check(raw)
        except ConfigError as e:
            raise ValueError(f"switch {e}") from None
    return out


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """``["replica_lag_time_max_ms=4000", "key_count=4"]`` -> base-test overrides."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip().replace(".", "_").replace("-", "_")
        if name not in SETTING_NAMES or not sep:
            raise ValueError(
                f"--set takes NAME=VALUE with NAME one of {', '.join(SETTING_NAMES)}, not {item!r}"
            )
        try:
            out[name] = option(name).check(raw.strip())
        except ConfigError as e:
            raise ValueError(f"--set {e}") from None
    return out


def nemesis_kinds(spec: str) -> list[str]:
    """A cell's nemesis spec -> its fault kinds: the grammar of ``isrlab test --nemesis``
    (`harness.testconfig.nemesis_kinds`: a kind, ``+`` compositions, ``combined``, ``none``);
    ValueError (`ConfigError`) names an unknown kind."""
    return list(test_nemesis_kinds(spec))


def grid(
    base: Mapping[str, Any],
    *,
    acks: Sequence[str] = ACKS,
    nemeses: Sequence[str] = NEMESES,
    variants: Sequence[Mapping[str, Any]] = ({},),
    repeats: int = 1,
    consumers: Sequence[str] = ("assign",),
    workloads: Sequence[str] = ("queue",),
    idempotence: Sequence[bool] | None = None,
    txn: Sequence[bool] | None = None,
    isolation_levels: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Every cell's test configuration, in a stable order (seed = position in the grid).

    ``idempotence``, ``txn`` and ``isolation_levels`` are dimensions when given (None: the
    base test's and the variants' values); see the module docstring for the eos workload
    and for txn without idempotence."""
    bad = [c for c in consumers if c not in MATRIX_CONSUMERS]
    if bad:
        raise ValueError(
            f"unknown consumer mode {', '.join(map(repr, bad))}; use {', '.join(MATRIX_CONSUMERS)}"
        )
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(
            f"unknown workload {', '.join(map(repr, bad))}; use {', '.join(WORKLOADS)}"
        )
    bad = [i for i in isolation_levels or () if i not in ISOLATION_LEVELS]
    if bad:
        raise ValueError(
            f"unknown isolation level {', '.join(map(repr, bad))}; use {', '.join(ISOLATION_LEVELS)}"
        )
    tests = []
    combos = itertools.product(
        variants,
        workloads,
        consumers,
        idempotence or (None,),
        txn or (None,),
        isolation_levels or (None,),
        nemeses,
        acks,
        range(repeats),
    )
    position = 0
    names: set[str] = set()
    for variant, workload, consumer, idem, tx, iso, nemesis, a, repeat in combos:
        if workload != "queue" and consumer != consumers[0]:
            continue  # (the eos copiers are a group whatever the consumer mode)
        if tx is True and idem is False:
            continue  # the same cell as idempotence=true, txn=true
        test = dict(base)
        test.update(variant)
        if workload != "queue":
            test["workload"] = workload
        elif consumer == "subscribe":
            test["subscribe"] = True
        for key, value in (("idempotence", idem), ("txn", tx), ("isolation_level", iso)):
            if value is not None:
                test[key] = value
        if test.get("txn"):
            test["idempotence"] = True
        if test.get("isolation_level") is None and test.get("workload") == "eos":
            test["isolation_level"] = "read_committed"  # (the eos workload's default)
        test["acks"] = str(a)
        if test.get("idempotence") is None:
            test["idempotence"] = test["acks"] == "all"  # (Kafka 3.x's default, as a test's)
        elif test["idempotence"] and test["acks"] != "all":
            continue  # Kafka's producer refuses idempotence with acks 0 or 1
        test["nemesis"] = nemesis_kinds(nemesis)
        test["repeat"] = repeat
        test["seed"] = int(base.get("seed", 0)) + position
        test["name"] = config_name(test)
        if test["name"] in names:
            continue  # (a variant that the dimensions made equal to another cell)
        names.add(test["name"])
        position += 1
        tests.append(test)
    return tests


def finished_run(store: Path, name: str) -> Path | None:
    """A run directory of cell `name` that has results.json, if any."""
    cell = Path(store) / name
    if not cell.is_dir():
        return None
    for results in sorted(cell.glob("*/results.json")):
        return results.parent
    return None


@dataclass
class CellResult:
    name: str
    status: str  # "valid" | "invalid" | "unknown" | "skipped" | "error"
    run_dir: Path | None = None
    seconds: float = 0.0
    detail: str = ""


@dataclass
class MatrixSummary:
    cells: list[CellResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for c in self.cells if c.status == status)

    @property
    def ok(self) -> bool:
        """True when no run failed to complete (invalid verdicts are results, not failures)."""
        return self.count("error") == 0


def _verdict(run_dir: Path | None) -> tuple[str, str]:
    if run_dir is None:
        return "unknown", "run_test returned no run directory"
    path = Path(run_dir) / "results.json"
    try:
        results = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        return "unknown", f"no readable results.json ({e})"
    valid = results.get("valid") if isinstance(results, dict) else None
    types = ", ".join(results.get("anomaly_types") or []) if isinstance(results, dict) else ""
    from isrlab.harness.runner import idle_warning

    if isinstance(results, dict) and idle_warning(results):
        types = (types + "; " if types else "") + "NOTHING acknowledged or read"
    return ("valid" if valid is True else "invalid" if valid is False else "unknown"), types


class HarnessRunner:
    """The real cell runner: `harness.runner.run_test` on a cell's configuration (the runner's
    defaults fill what the cell does not say). The embedded cluster is kept between cells, so
    nodes keep their venvs, and torn down by `close()` at the end of the matrix."""

    def __init__(self) -> None:
        try:
            from isrlab.harness import runner
        except ImportError as e:
            raise RuntimeError(
                f"the harness's runner is not available ({e}); `isrlab matrix` needs "
                "isrlab.harness.runner.run_test"
            ) from None
        self._runner = runner
        self._cluster: str | None = None

    def __call__(self, cell: dict[str, Any]) -> Path:
        config = self._runner.make_test(dict(cell, keep_cluster=True))
        if not (config.nodes or config.nodes_file):
            self._cluster = config.cluster_name
        run_dir, _results = self._runner.run_test(config, progress=False)
        return Path(run_dir)

    def close(self) -> None:
        if self._cluster is not None:
            from isrlab.harness.cluster import embedded

            embedded.down(self._cluster)
            self._cluster = None


def _default_run_test() -> RunTest:
    return HarnessRunner()


def run_matrix(
    tests: Iterable[dict[str, Any]],
    store: Path,
    *,
    run_test: RunTest | None = None,
    console: Console | None = None,
) -> MatrixSummary:
    """Run every unfinished cell into `store`; one progress line per cell, then a summary."""
    console = console or Console()
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    cells = list(tests)
    summary = MatrixSummary()
    width = len(str(len(cells)))
    runner: RunTest | None = run_test
    try:
        for i, test in enumerate(cells, 1):
            name = str(test["name"])
            pos = f"[{i:>{width}}/{len(cells)}]"
            done = finished_run(store, name)
            if done is not None:
                summary.cells.append(CellResult(name, "skipped", done, detail="already finished"))
                console.print(f"{pos} {name}: [dim]skipped, finished in {done}[/]", highlight=False)
                continue
            if runner is None:
                runner = _default_run_test()
            test = dict(test, store=str(store))
            t0 = time.monotonic()
            try:
                run_dir = runner(test)
            except KeyboardInterrupt:
                console.print(f"{pos} {name}: [yellow]interrupted[/]; run again to resume")
                raise
            except Exception as e:
                # One broken run must not cost the rest of a nightly matrix.
                seconds = time.monotonic() - t0
                summary.cells.append(CellResult(name, "error", None, seconds, repr(e)))
                console.print(
                    f"{pos} {name}: [red]error[/] after {seconds:.1f} s: {escape(repr(e))}",
                    highlight=False,
                )
                continue
            seconds = time.monotonic() - t0
            status, detail = _verdict(Path(run_dir) if run_dir is not None else None)
            summary.cells.append(
                CellResult(name, status, Path(run_dir) if run_dir else None, seconds, detail)
            )
            style = {"valid": "green", "invalid": "red"}.get(status, "yellow")
            console.print(
                f"{pos} {name}: [{style}]{status}[/] {escape(detail)} ({seconds:.1f} s) -> {run_dir}",
                highlight=False,
            )
    finally:
        # the real runner keeps the embedded cluster between cells: tear it down, also on ^C
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    _print_summary(summary, console)
    return summary


def _print_summary(summary: MatrixSummary, console: Console) -> None:
    table = Table("status", "cells", title="matrix summary")
    for status in ("valid", "invalid", "unknown", "skipped", "error"):
        table.add_row(status, str(summary.count(status)))
    console.print(table)
    errors = [c for c in summary.cells if c.status == "error"]
    for c in errors:
        console.print(f"[red]failed:[/] {c.name}: {escape(c.detail)}", highlight=False)


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def matrix_command(
    store: Annotated[Path, typer.Option(help="store directory the runs go into")] = Path("store"),
    acks: Annotated[str, typer.Option(help="acks settings, comma-separated")] = "0,1,all",
    nemesis: Annotated[
        str,
        typer.Option(
            help="faults, comma-separated, one cell each: a kind (partition, kill, pause, "
            "clock, ...), combined (all four), none, or kinds joined by + (partition+kill); "
            "each cell's spec is what `isrlab test --nemesis` takes"
        ),
    ] = "partition,kill,pause,clock,combined",
    consumer: Annotated[
        str,
        typer.Option(
            help="how processes take keys, comma-separated: assign, subscribe (every process "
            "in the test's consumer group)"
        ),
    ] = "assign",
    workload: Annotated[
        str,
        typer.Option(
            help="workloads, comma-separated: queue, eos (consume-transform-produce; no "
            "consumer mode)"
        ),
    ] = "queue",
    idempotence: Annotated[
        str | None,
        typer.Option(help="a dimension: idempotent producers, comma-separated (false,true)"),
    ] = None,
    txn: Annotated[
        str | None,
        typer.Option(help="a dimension: transactions, comma-separated (false,true)"),
    ] = None,
    isolation_level: Annotated[
        str | None,
        typer.Option(
            help="a dimension: consumer isolation, comma-separated "
            "(read_uncommitted,read_committed)"
        ),
    ] = None,
    switch: Annotated[
        list[str] | None,
        typer.Option(
            "--switch",
            help="a switch variant, e.g. 'unclean_leader_election=true' or "
            "'idempotence=true,txn=true'; repeat for several (the baseline always runs)",
        ),
    ] = None,
    historic: Annotated[
        bool,
        typer.Option(
            help="add the historic data-loss variants: unclean election, high-watermark "
            "truncation, min.insync.replicas=1"
        ),
    ] = False,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="a base-test setting for every cell, NAME=VALUE: "
            f"{', '.join(SETTING_NAMES)}; repeat for several",
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="runs per cell")] = 1,
    time_limit: Annotated[float, typer.Option(help="seconds of workload per run")] = 60.0,
    nodes: Annotated[
        str | None, typer.Option(help="node names (default: the harness's embedded cluster)")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="list the cells and exit")] = False,
) -> None:
    """Run acks x fault x consumer mode x switches x repeats (and workload x idempotence x txn
    x isolation level) into STORE; finished cells are skipped."""
    err = Console(stderr=True)
    try:
        acks_list = [str(option("acks").check(a)) for a in _split(acks)]
        if not acks_list:
            raise ValueError("--acks is empty; give some of 0, 1, all")
        nemeses = _split(nemesis)
        if not nemeses:
            raise ValueError("--nemesis is empty; use partition, kill, pause, clock, combined")
        for n in nemeses:
            nemesis_kinds(n)
        consumers = _split(consumer)
        if not consumers:
            raise ValueError(f"--consumer is empty; use {', '.join(MATRIX_CONSUMERS)}")
        grid({}, acks=["all"], nemeses=["none"], consumers=consumers)  # checks the modes
        workloads = _split(workload)
        if not workloads:
            raise ValueError(f"--workload is empty; use {', '.join(WORKLOADS)}")
        dims = {
            name: None if text is None else [option(name).check(v) for v in _split(text)]
            for name, text in (
                ("idempotence", idempotence),
                ("txn", txn),
                ("isolation_level", isolation_level),
            )
        }
        grid(
            {},
            acks=["all"],
            nemeses=["none"],
            workloads=workloads,
            isolation_levels=dims["isolation_level"],
        )  # checks the workloads and levels
        option("time_limit").check(time_limit)
        if nodes is not None and not _split(nodes):
            raise ValueError(
                "--nodes takes SSH hosts, comma-separated (n1,n2,n3): give at least one, or "
                "leave it out to run on the embedded cluster"
            )
        overrides: dict[str, object] = parse_settings(settings or ())
        variants: list[dict[str, object]] = [{}]
        variants += [parse_switches(s) for s in switch or ()]
        if historic:
            variants += [dict(v) for v in HISTORIC_SWITCHES if v not in variants]
    except ValueError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    if not dry_run:
        from isrlab.harness.runner import SetupError, check_store

        try:
            check_store(store)
        except SetupError as e:
            err.print(f"[red]error:[/] {escape(str(e))}")
            raise typer.Exit(2) from None
    if nodes:
        overrides["nodes"] = _split(nodes)
    tests = grid(
        base_test(time_limit, **overrides),
        acks=acks_list,
        nemeses=nemeses,
        variants=variants,
        repeats=repeats,
        consumers=consumers,
        workloads=workloads,
        idempotence=dims["idempotence"],
        txn=dims["txn"],
        isolation_levels=dims["isolation_level"],
    )
    console = Console()
    if dry_run:
        for t in tests:
            console.print(t["name"], highlight=False)
        console.print(f"{len(tests)} cells")
        return
    try:
        summary = run_matrix(tests, store, console=console)
    except RuntimeError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    raise typer.Exit(0 if summary.ok else 1)
