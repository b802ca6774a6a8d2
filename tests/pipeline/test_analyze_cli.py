"""`isrlab analyze` on the command line: errors a user can cause end in a message, exit 2."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from isrlab.pipeline.cli import analyze_command


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("other")(lambda: None)  # a second command keeps "analyze" a subcommand
    return app


def test_cli_analyze_without_runs_is_a_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(_app(), ["analyze", str(tmp_path)])
    assert r.exit_code == 2
    assert "no runs" in r.output and "Traceback" not in r.output
