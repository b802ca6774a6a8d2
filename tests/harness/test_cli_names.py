"""One option name, one meaning (issue 15): --node-count is a count and --nodes a host list
everywhere, --key-count is test.json's key_count, and --nemesis has one grammar in `isrlab
test` and `isrlab matrix` (kinds joined by +, combined, none; the matrix's comma lists cells).
Old spellings are refused with a message naming the new one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from isrlab.harness import matrix, runner
from isrlab.harness.testconfig import COMBINED_KINDS, ConfigError, TestConfig, nemesis_kinds
from tests.typer_app import subcommand_app


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[TestConfig]:
    """The configurations `isrlab test` would run (nothing runs)."""
    configs: list[TestConfig] = []

    def fake_run(config: TestConfig) -> Any:
        configs.append(config)
        raise runner.SetupError("stop here")

    monkeypatch.setattr(runner, "run_test", fake_run)
    return configs


def isrlab_test(args: list[str], tmp_path: Path) -> tuple[int, str]:
    app = subcommand_app("test", runner.test_command)
    res = CliRunner().invoke(app, ["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, " ".join(res.output.split())


def test_key_count_is_one_name(seen: list[TestConfig], tmp_path: Path) -> None:
    code, _ = isrlab_test(["--key-count", "3"], tmp_path)
    assert code == 2 and seen[-1].key_count == 3 and seen[-1].to_test()["key_count"] == 3
    assert matrix.parse_settings(["key_count=3"]) == {"key_count": 3}
    code, out = isrlab_test(["--keys", "3"], tmp_path)
    assert code == 2 and "--key-count" in out and len(seen) == 1


@pytest.mark.parametrize(
    ("spec", "kinds"),
    [
        ("kill", ("kill",)),
        ("partition+kill", ("partition", "kill")),
        ("combined", COMBINED_KINDS),
        ("none", ()),
    ],
)
def test_one_nemesis_grammar(
    seen: list[TestConfig], tmp_path: Path, spec: str, kinds: tuple[str, ...]
) -> None:
    assert nemesis_kinds(spec) == kinds
    code, _ = isrlab_test(["--nemesis", spec], tmp_path)
    assert code == 2 and seen[-1].nemesis == kinds
    # the matrix reads the same spec as one cell with the same kinds
    (cell,) = matrix.grid(matrix.base_test(), acks=["all"], nemeses=[spec])
    assert tuple(cell["nemesis"]) == kinds


def test_a_comma_in_a_test_nemesis_is_refused_naming_plus(
    seen: list[TestConfig], tmp_path: Path
) -> None:
    code, out = isrlab_test(["--nemesis", "partition,kill"], tmp_path)
    assert code == 2 and "partition+kill" in out and seen == []
    with pytest.raises(ConfigError, match=r"partition\+kill"):
        TestConfig.from_mapping({"nemesis": "partition,kill"})
    # test.json's list stays what it always was
    assert TestConfig.from_mapping({"nemesis": ["partition", "kill"]}).nemesis == (
        "partition",
        "kill",
    )


def test_the_default_nemesis_reads_in_the_grammar(seen: list[TestConfig], tmp_path: Path) -> None:
    code, _ = isrlab_test([], tmp_path)
    assert code == 2 and seen[-1].nemesis == ("partition", "kill")


def test_cluster_up_takes_node_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from isrlab.harness.cluster import cli, embedded

    calls: list[tuple[Any, ...]] = []

    def fake_up(name: str, n: int, subnet: str | None) -> Any:
        calls.append((name, n, subnet))
        raise embedded.ClusterError("stop here")

    monkeypatch.setattr(embedded, "up", fake_up)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for args in (["up", "--node-count", "3"], ["up", "-n", "3"]):
        res = CliRunner().invoke(cli.app, args)
        assert res.exit_code == 2 and calls[-1][1] == 3, res.output
    res = CliRunner().invoke(cli.app, ["up", "--nodes", "3"])
    assert res.exit_code == 2 and "--node-count" in res.output and len(calls) == 2
