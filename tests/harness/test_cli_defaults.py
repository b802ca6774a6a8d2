"""What a new user gets from `isrlab test` without options (issue 15): the producers Kafka 3.x
gives (acks=all, enable.idempotence=true), said in --help; --no-idempotence for the
at-least-once study; idempotence with acks 0 or 1 refused as Kafka's producer refuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from isrlab.harness import runner
from isrlab.harness.matrix import base_test, grid
from isrlab.harness.testconfig import ConfigError, TestConfig, config_name, option
from tests.typer_app import subcommand_app


def _app() -> typer.Typer:
    return subcommand_app("test", runner.test_command)


def test_a_default_test_has_idempotent_acks_all_producers() -> None:
    t = TestConfig.from_mapping({})
    assert t.acks == "all" and t.idempotence is True
    assert t.to_test()["idempotence"] is True


@pytest.mark.parametrize(
    ("values", "idempotent"),
    [
        ({"idempotence": False}, False),  # the at-least-once study
        ({"acks": "1"}, False),  # Kafka 3.x: not enabled by default with acks 0/1
        ({"acks": "0"}, False),
        ({"acks": "-1"}, True),
        ({"acks": "all", "txn": True}, True),
    ],
)
def test_idempotence_follows_kafka_3_defaults(values: dict[str, Any], idempotent: bool) -> None:
    assert TestConfig.from_mapping(values).idempotence is idempotent


@pytest.mark.parametrize("values", [{"acks": "1", "idempotence": True}, {"acks": "0", "txn": True}])
def test_idempotence_with_acks_0_or_1_is_refused(values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="acks"):
        TestConfig.from_mapping(values)


def test_stored_runs_without_the_key_were_not_idempotent() -> None:
    assert option("idempotence").absent is False


def test_help_says_what_the_producers_are() -> None:
    res = CliRunner().invoke(_app(), ["test", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.output.split())
    assert res.exit_code == 0
    assert "--no-idempotence" in text and "enable.idempotence" in text


def test_no_idempotence_reaches_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[TestConfig] = []

    def fake_run(config: TestConfig) -> Any:
        seen.append(config)
        raise runner.SetupError("stop here")

    monkeypatch.setattr(runner, "run_test", fake_run)
    for args, want in (([], True), (["--no-idempotence"], False)):
        res = CliRunner().invoke(
            _app(), ["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", *args]
        )
        assert res.exit_code == 2 and seen[-1].idempotence is want


def test_the_matrix_base_is_the_test_default() -> None:
    cells = grid(base_test(), acks=["0", "1", "all"], nemeses=["kill"])
    by_acks = {c["acks"]: c for c in cells}
    assert by_acks["all"]["idempotence"] is True and "idem" in by_acks["all"]["name"]
    assert by_acks["1"]["idempotence"] is False and by_acks["0"]["idempotence"] is False
    for c in cells:  # every cell is a test the runner accepts, with the name it ran under
        t = TestConfig.from_mapping(c)
        assert t.idempotence == c["idempotence"] and config_name(t.to_test()) == c["name"]


def test_matrix_cells_kafka_refuses_are_not_cells() -> None:
    cells = grid(base_test(), acks=["0", "1", "all"], nemeses=["kill"], idempotence=[False, True])
    assert {(c["acks"], c["idempotence"]) for c in cells} == {
        ("0", False),
        ("1", False),
        ("all", False),
        ("all", True),
    }
