"""Bad values on the harness's commands end in one line saying what to do and exit 2, never a
traceback (issue 15): ports out of range, a store that cannot be written, bad matrix values."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from isrlab.harness import matrix, runner, seeds, serve
from tests.harness.conftest import Refusals
from tests.typer_app import subcommand_app

COMMANDS: dict[str, Callable[..., Any]] = {
    "test": runner.test_command,
    "matrix": matrix.matrix_command,
    "seeds": seeds.seeds_command,
    "serve": serve.serve_command,
}


@pytest.fixture
def no_nodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any attempt to reach nodes or run a test is recorded and refused."""
    calls = Refusals(monkeypatch)
    calls.refuse(runner, "node_inventory")
    calls.refuse(seeds, "node_inventory")
    calls.refuse(matrix, "run_matrix")
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # (seeds asks for root first)
    return calls


def unwritable(tmp_path: Path) -> Path:
    """A store path no one can create (a file is in the way, whoever we are)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    return blocker / "store"


def invoke(args: list[str]) -> tuple[int, str]:
    app: typer.Typer = subcommand_app(args[0], COMMANDS[args[0]])
    res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_serve_refuses_a_port_out_of_range(tmp_path: Path, port: str) -> None:
    code, out = invoke(["serve", str(tmp_path), "--port", port])
    assert code == 2 and "--port" in out and "0-65535" in out and "Traceback" not in out


@pytest.mark.parametrize(
    "args",
    [
        ["test", "--nodes", "n1,n2,n3"],
        ["matrix", "--acks", "all", "--nemesis", "kill"],
        ["seeds"],
    ],
)
def test_an_unwritable_store_is_one_line_and_exit_2(
    no_nodes: list[str], tmp_path: Path, args: list[str]
) -> None:
    store = unwritable(tmp_path)
    code, out = invoke([*args, "--store", str(store)])
    assert code == 2 and "--store" in out and "Traceback" not in out, out
    assert no_nodes == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-limit", "-5"], "time_limit"),
        (["--time-limit", "0"], "time_limit"),
        (["--nodes", ","], "--nodes"),
        (["--repeats", "0"], "repeats"),
    ],
)
def test_matrix_refuses_bad_values(
    no_nodes: list[str], tmp_path: Path, args: list[str], message: str
) -> None:
    code, out = invoke(["matrix", "--store", str(tmp_path / "s"), *args])
    assert code == 2 and message in out and "Traceback" not in out, out
    assert no_nodes == []


def test_test_refuses_an_empty_host_list(no_nodes: list[str], tmp_path: Path) -> None:
    # an empty --nodes is not "no hosts: use the embedded cluster"
    code, out = invoke(["test", "--store", str(tmp_path), "--nodes", ","])
    assert code == 2 and "--nodes" in out, out
    assert no_nodes == []


@pytest.mark.parametrize(
    "args",
    [
        ["up", "-n", "0", "--name", "unit"],
        ["up", "-n", "3", "--name", "../x"],
        ["up", "-n", "3", "--name", "unit", "--subnet", "foo"],
    ],
)
def test_cluster_up_refuses_bad_values_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from isrlab.harness.cluster import state
    from isrlab.harness.cluster.cli import app

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the cluster was touched")

    monkeypatch.setattr(state, "cluster_lock", refuse)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "error:" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize(
    "flag",
    ["--time-limit", "--rate", "--nemesis-interval", "--recovery-time", "--final-time-limit"],
)
def test_test_refuses_numbers_that_are_not_finite(
    no_nodes: list[str], tmp_path: Path, flag: str, value: str
) -> None:
    code, out = invoke(["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", flag, value])
    assert code == 2 and flag in out and "finite" in out, out
    assert no_nodes == []
