"""`isrlab`: the harness command line.

isrlab test ...            run one Jepsen-style fault-injection test (see `isrlab test --help`)
isrlab demo                the main job: a 5-node embedded-cluster test, then its report
isrlab check PATH ...      check a recorded history (queue, register, cas-register, kv)
isrlab cluster up|down|status    the embedded network-namespace cluster
isrlab serve [STORE]       browse the run store in a web browser
isrlab matrix / analyze    many runs, and the Spark analysis of them
"""

from __future__ import annotations

import typer

from isrlab.checkers.cli import check_command
from isrlab.harness.cluster.cli import app as cluster_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="isrlab: Jepsen-style fault-injection tests of Kafka-like replicated logs.",
)
app.command("check", help="Check a history file or run directory for anomalies.")(check_command)
app.add_typer(cluster_app, name="cluster", help="The embedded network-namespace cluster.")


def _register_optional() -> None:
    """Commands whose modules may pull heavy dependencies are imported here, once."""
    from isrlab.harness import runner

    app.command("test", help=runner.test_command.__doc__)(runner.test_command)
    app.command("demo", help=runner.demo_command.__doc__)(runner.demo_command)
    from isrlab.harness import seeds

    app.command("seeds", help=seeds.seeds_command.__doc__)(seeds.seeds_command)
    from isrlab.harness import serve

    app.command("serve", help=serve.serve_command.__doc__)(serve.serve_command)
    from isrlab.harness import matrix
    from isrlab.pipeline import cli as pipeline_cli

    app.command("matrix", help=matrix.matrix_command.__doc__)(matrix.matrix_command)
    app.command("analyze", help=pipeline_cli.analyze_command.__doc__)(pipeline_cli.analyze_command)


def main() -> None:
    _register_optional()
    app()
