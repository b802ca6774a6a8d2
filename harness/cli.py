"""`isrlab`: the harness command line.

isrlab test ...            run one Jepsen-style fault-injection test (see `isrlab test --help`)
isrlab demo                the main job: a 5-node embedded-cluster test, then its report
isrlab check PATH ...      check recorded histories (queue, register, cas-register, kv)
isrlab cluster up|down|status    the embedded network-namespace cluster
isrlab serve [STORE]       browse the run store in a web browser
isrlab matrix / analyze    many runs, and the Spark analysis of them
isrlab sim --seeds N ...   many seeds of the queue test on the simulator, in parallel processes

Every command's module is imported only when that command runs (or when `isrlab --help` lists
them all): `isrlab check` starts without the test runner, SSH, the matrix or Spark's side.
`-h` is `--help` everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches
from typing import Any

import typer
from typer._click.exceptions import UsageError
from typer.core import TyperGroup

# `-h` is `--help`, here and in every subcommand (their contexts inherit it)
HELP_OPTIONS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
_Click = Any  # a click command (typer's vendored click); typed loosely on purpose


def _check() -> tuple[Callable[..., Any], str | None]:
    from isrlab.checkers.cli import check_command

    return check_command, check_command.__doc__


def _test() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness import runner

    return runner.test_command, runner.test_command.__doc__


def _demo() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness import runner

    return runner.demo_command, runner.demo_command.__doc__


def _seeds() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness import seeds

    return seeds.seeds_command, seeds.seeds_command.__doc__


def _sim() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness.sim import cli as sim_cli

    return sim_cli.sim_command, sim_cli.sim_command.__doc__


def _serve() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness import serve

    return serve.serve_command, serve.serve_command.__doc__


def _matrix() -> tuple[Callable[..., Any], str | None]:
    from isrlab.harness import matrix

    return matrix.matrix_command, matrix.matrix_command.__doc__


def _analyze() -> tuple[Callable[..., Any], str | None]:
    from isrlab.pipeline import cli as pipeline_cli

    return pipeline_cli.analyze_command, pipeline_cli.analyze_command.__doc__


def _cluster() -> typer.Typer:
    from isrlab.harness.cluster.cli import app as cluster_app

    return cluster_app


# name -> loader, in the order `isrlab --help` lists them
COMMANDS: dict[str, Callable[[], tuple[Callable[..., Any], str | None]]] = {
    "check": _check,
    "test": _test,
    "demo": _demo,
    "seeds": _seeds,
    "sim": _sim,
    "serve": _serve,
    "matrix": _matrix,
    "analyze": _analyze,
}
GROUPS: dict[str, tuple[Callable[[], typer.Typer], str]] = {
    "cluster": (_cluster, "The embedded network-namespace cluster."),
}


# Commands whose help is plain text: typer's rich help imports rich's markdown and syntax
# renderers, ~60 ms of a start-up that `isrlab check` pays per invocation (docs/benchmarks.md).
PLAIN_HELP = frozenset({"check"})


def _command(name: str) -> _Click:
    function, help_text = COMMANDS[name]()
    one = typer.Typer(add_completion=False, context_settings=HELP_OPTIONS)
    if name in PLAIN_HELP:
        one.rich_markup_mode = None
    one.command(name, help=help_text)(function)
    cmd = typer.main.get_command(one)
    cmd.name = name
    return cmd


def _group(name: str) -> _Click:
    loader, help_text = GROUPS[name]
    group = typer.main.get_group(loader())
    group.name = name
    group.help = help_text
    return group


class LazyGroup(TyperGroup):
    """The `isrlab` group: commands are built from their modules on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *GROUPS]

    def get_command(self, ctx: Any, cmd_name: str) -> _Click | None:
        cmd = self.commands.get(cmd_name)
        if cmd is None and (cmd_name in COMMANDS or cmd_name in GROUPS):
            cmd = _command(cmd_name) if cmd_name in COMMANDS else _group(cmd_name)
            self.commands[cmd_name] = cmd
        return cmd

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:
            # typer suggests close matches among the commands built so far: use every name
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches and "Did you mean" not in e.message:
                suggestions = ", ".join(repr(m) for m in matches)
                e.message = f"{e.message.rstrip('.')}. Did you mean {suggestions}?"
            raise


app = typer.Typer(
    cls=LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    context_settings=HELP_OPTIONS,
    help="isrlab: Jepsen-style fault-injection tests of Kafka-like replicated logs.",
)


@app.callback()
def _root() -> None:
    """isrlab: Jepsen-style fault-injection tests of Kafka-like replicated logs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
