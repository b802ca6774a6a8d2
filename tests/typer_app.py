"""A Typer app around one command, for tests that invoke that command as users type it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer


def subcommand_app(name: str, command: Callable[..., Any]) -> typer.Typer:
    """An app whose subcommand ``name`` is ``command`` (``isrlab <name> ...``)."""
    app = typer.Typer()
    app.command(name)(command)
    app.command("other")(lambda: None)  # a second command keeps ``name`` a subcommand
    return app
