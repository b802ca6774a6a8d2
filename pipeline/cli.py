"""`isrlab matrix` and `isrlab analyze`: typer-annotated commands the lead mounts on `isrlab`.

- `matrix_command`: runs the grid of pipeline.matrix into a store (resumable);
  exit 0 when every run completed (whatever its verdict), 1 when some run failed, 2 on
  bad options.
- `analyze_command`: the Spark analysis of pipeline.analyze; exit 0 on success, 2 when
  the store or Spark cannot be used (missing Java, no runs...), with one message saying
  what to do, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["analyze_command", "matrix_command"]


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def matrix_command(
    store: Annotated[Path, typer.Option(help="store directory the runs go into")] = Path("store"),
    acks: Annotated[str, typer.Option(help="acks settings, comma-separated")] = "0,1,all",
    nemesis: Annotated[
        str,
        typer.Option(
            help="faults, comma-separated: partition, kill, pause, clock, combined (all four), "
            "none, or kinds joined by + (partition+kill)"
        ),
    ] = "partition,kill,pause,clock,combined",
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
            help="a base-test setting for every cell, NAME=VALUE: replica_lag_time_max_ms, "
            "zk_session_timeout_ms, key_count, concurrency, nemesis_interval, recovery_time, "
            "final_time_limit; repeat for several",
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="runs per cell")] = 1,
    time_limit: Annotated[float, typer.Option(help="seconds of workload per run")] = 60.0,
    nodes: Annotated[
        str | None, typer.Option(help="node names (default: the harness's embedded cluster)")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="list the cells and exit")] = False,
) -> None:
    """Run acks x fault x switches x repeats into STORE; finished cells are skipped."""
    from isrlab.harness.testconfig import option
    from isrlab.pipeline.matrix import (
        HISTORIC_SWITCHES,
        base_test,
        grid,
        nemesis_kinds,
        parse_settings,
        parse_switches,
    )

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
        overrides: dict[str, object] = parse_settings(settings or ())
        variants: list[dict[str, object]] = [{}]
        variants += [parse_switches(s) for s in switch or ()]
        if historic:
            variants += [dict(v) for v in HISTORIC_SWITCHES if v not in variants]
    except ValueError as e:
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
    )
    console = Console()
    if dry_run:
        for t in tests:
            console.print(t["name"], highlight=False)
        console.print(f"{len(tests)} cells")
        return
    from isrlab.pipeline.matrix import run_matrix

    try:
        summary = run_matrix(tests, store, console=console)
    except RuntimeError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    raise typer.Exit(0 if summary.ok else 1)


def analyze_command(
    store: Annotated[Path, typer.Argument(help="store of run directories")],
    master: Annotated[
        str, typer.Option(help="Spark master: local[*] (embedded), local[N], spark://host:7077")
    ] = "local[*]",
    out: Annotated[
        Path | None, typer.Option(help="report directory (default: STORE/analysis)")
    ] = None,
) -> None:
    """Ingest, check and aggregate every run of STORE on Spark; publish index.html."""
    from isrlab.pipeline.spark import SparkUnavailable
    from isrlab.pipeline.store import StoreError

    err = Console(stderr=True)
    out_dir = out if out is not None else Path(store) / "analysis"
    try:
        from isrlab.pipeline.analyze import analyze

        analysis = analyze(Path(store), out_dir, master, console=err)
    except (StoreError, SparkUnavailable) as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ImportError as e:
        err.print(
            f"[red]error:[/] the Spark pipeline needs pyspark and pyarrow "
            f"(pip install 'isrlab[spark]'): {escape(str(e))}"
        )
        raise typer.Exit(2) from None
    console = Console()
    console.print(
        f"{analysis.runs} runs: {analysis.checked} checked, {len(analysis.malformed)} malformed "
        f"skipped; {len(analysis.configs)} configurations "
        f"in {analysis.seconds.get('total', 0):.1f} s",
        highlight=False,
    )
    console.print(f"report: {analysis.out / 'index.html'}", highlight=False)
