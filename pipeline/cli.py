"""`isrlab analyze`: the typer-annotated command mounted on `isrlab` (`isrlab matrix`, which
runs tests, is harness.matrix's).

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

__all__ = ["analyze_command"]


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
