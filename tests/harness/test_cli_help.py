"""`-h` is `--help` for `isrlab`, `isrlab-broker` and every subcommand; `isrlab` builds a command
only when it runs (start-up), yet `isrlab --help` lists them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from isrlab.broker.cli import app as broker_app
from isrlab.harness.cli import COMMANDS, GROUPS, app

runner = CliRunner()

ISRLAB = [[], *([c] for c in COMMANDS), ["cluster"], ["cluster", "up"], ["cluster", "down"]]
ISRLAB += [["cluster", "status"]]
BROKER = [[], ["start"], ["dump-log"], ["config-doc"]]


@pytest.mark.parametrize("args", ISRLAB, ids=lambda a: " ".join(a) or "isrlab")
def test_isrlab_h_is_help(args: list[str]) -> None:
    short = runner.invoke(app, [*args, "-h"])
    long = runner.invoke(app, [*args, "--help"])
    assert short.exit_code == 0, short.output
    assert short.output == long.output and "Usage:" in short.output


@pytest.mark.parametrize("args", BROKER, ids=lambda a: " ".join(a) or "isrlab-broker")
def test_isrlab_broker_h_is_help(args: list[str]) -> None:
    short = runner.invoke(broker_app, [*args, "-h"])
    assert short.exit_code == 0, short.output
    assert short.output == runner.invoke(broker_app, [*args, "--help"]).output


def test_the_cluster_cli_on_its_own_takes_h() -> None:
    from isrlab.harness.cluster.cli import app as cluster_app

    r = runner.invoke(cluster_app, ["up", "-h"])
    assert r.exit_code == 0 and r.output == runner.invoke(cluster_app, ["up", "--help"]).output


def test_help_lists_every_command() -> None:
    out = runner.invoke(app, ["--help"]).output
    for name in [*COMMANDS, *GROUPS]:
        assert f" {name} " in out, name


def test_a_misspelt_command_is_suggested() -> None:
    r = runner.invoke(app, ["chek"])
    assert r.exit_code == 2 and "Did you mean 'check'" in r.output


HEAVY = (
    "isrlab.harness.runner",
    "isrlab.harness.matrix",
    "isrlab.harness.serve",
    "isrlab.harness.cluster",
    "isrlab.pipeline",
    "paramiko",
    "rich.table",
    "rich.markdown",
)


@pytest.mark.parametrize("argv", [["check", "--help"], ["check", "-h"]])
def test_check_starts_without_the_other_commands_modules(argv: list[str]) -> None:
    """`isrlab check` may run once per history: it must not import the runner, SSH, the matrix,
    the pipeline or rich's help renderers (the start-up budget, docs/benchmarks.md)."""
    code = (
        "import sys\n"
        f"sys.argv = ['isrlab', *{argv!r}]\n"
        "from isrlab.harness.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: isrlab check" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED []", out.stdout[-500:]


def test_a_queue_check_starts_without_networkx_or_the_other_commands(tmp_path: Path) -> None:
    """A valid history has no cycle to search: networkx (a tenth of a second) stays unloaded,
    and so do the other commands' modules and rich (the --json output needs none of them)."""
    from isrlab.checkers.history import write_history
    from tests.checkers.hist import H

    h = H()
    h.send(0, "t/0", 1, 0)
    h.poll(1, {"t/0": [[0, 1]]})
    p = tmp_path / "history.jsonl"
    write_history(h.ops, p)
    argv = ["check", str(p), "-w", "queue", "--json"]
    code = (
        "import sys\n"
        f"sys.argv = ['isrlab', *{argv!r}]\n"
        "from isrlab.harness.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        f"print('LOADED', [m for m in {(*HEAVY, 'networkx', 'rich')!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-2:] == ["EXIT 0", "LOADED []"], out.stdout[-500:]
