"""`isrlab analyze` on the command line: errors a user can cause end in a message, exit 2."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from isrlab.pipeline.cli import analyze_command
from tests.typer_app import subcommand_app


def _app() -> typer.Typer:
    return subcommand_app("analyze", analyze_command)


def test_cli_analyze_without_runs_is_a_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(_app(), ["analyze", str(tmp_path)])
    assert r.exit_code == 2
    assert "no runs" in r.output and "Traceback" not in r.output
