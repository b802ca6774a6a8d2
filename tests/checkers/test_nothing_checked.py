"""A history that holds nothing to check is `"unknown"` with `stats["nothing-checked"]`, never valid.

The spec's rule (docs/history-format.md, "Checker output"): queue histories need an ok send, poll
or txn; register histories an ok op. Both the native screen's path and the explaining checker's
path, the op-dict API and `isrlab check` (exit 2) are held to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from isrlab.checkers import api
from isrlab.checkers.cli import check_command
from isrlab.checkers.history import write_history
from isrlab.checkers.queue import check_queue
from tests.checkers.hist import H

app = typer.Typer()
app.command()(check_command)


def only_assigns_and_failures() -> list[dict[str, Any]]:
    h = H()
    h.assign(0, ["t/0"])
    h.send(1, "t/0", 1, None, typ="fail")
    h.poll(2, {"t/0": []}, typ="info")
    h.invoke(3, "send", [["send", "t/0", 2]])  # never completed: counts as info
    return h.ops


def one_empty_ok_poll() -> list[dict[str, Any]]:
    h = H()
    h.assign(0, ["t/0"])
    h.poll(0, {"t/0": []})
    return h.ops


@pytest.mark.parametrize("screen", [True, False])
@pytest.mark.parametrize("ops", [[], only_assigns_and_failures()], ids=["empty", "no-ok-data"])
def test_queue_history_without_ok_data_ops_is_unknown(
    ops: list[dict[str, Any]], screen: bool
) -> None:
    r = check_queue(ops, screen=screen)
    assert r["valid"] == "unknown"
    assert r["stats"]["nothing-checked"] == "no ok send, poll or txn in the history"


def test_an_ok_poll_that_read_nothing_is_something_checked() -> None:
    for screen in (True, False):
        r = check_queue(one_empty_ok_poll(), screen=screen)
        assert r["valid"] is True and "nothing-checked" not in r["stats"]


def test_anomalies_keep_an_invalid_verdict() -> None:
    h = H()
    h.assign(0, ["t/0"])
    h.poll(1, {"t/0": [[0, 7]]}, typ="info")  # a value nobody sent, but no ok data op at all
    for screen in (True, False):
        r = check_queue(h.ops, screen=screen)
        assert r["valid"] is False and r["anomaly_types"] == ["garbage-read"]
        assert "nothing-checked" in r["stats"]


@pytest.mark.parametrize("workload", ["register", "cas-register", "kv"])
def test_register_history_without_ok_ops_is_unknown(workload: str) -> None:
    ops = [
        {"index": 0, "time": 1, "process": 0, "type": "invoke", "f": "write", "value": 1},
        {"index": 1, "time": 2, "process": 0, "type": "info", "f": "write", "value": 1},
    ]
    if workload == "kv":
        for op in ops:
            op["key"] = "x"
    r = api.check(ops, workload)
    assert r["valid"] == "unknown"
    assert r["stats"]["nothing-checked"] == "no ok operation in the history"


def test_isrlab_check_exits_2_on_an_empty_history(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    for workload, ops in [("queue", []), ("queue", only_assigns_and_failures()), ("register", [])]:
        write_history(ops, p)
        r = CliRunner().invoke(app, [str(p), "--workload", workload, "--json"])
        assert r.exit_code == 2, r.output
        assert '"nothing-checked"' in r.stdout


def test_a_format_that_recognises_no_line_is_an_error_naming_it(tmp_path: Path) -> None:
    """A JSONL history read as a Jepsen log parses nothing: an error, not an empty history."""
    p = tmp_path / "history.jsonl"
    write_history(only_assigns_and_failures(), p)
    log = tmp_path / "jepsen.log"
    log.write_text("INFO  jepsen.core - Running test\nINFO  jepsen.db - setting up\n")
    for path in (p, log):
        for workload in ("queue", "register"):
            r = CliRunner().invoke(
                app, [str(path), "--workload", workload, "--format", "jepsen-log", "--json"]
            )
            assert r.exit_code == 2, r.output
            assert r.stdout == "", r.stdout  # no results at all: the input was not understood
            assert "format jepsen-log recognised none" in r.stderr
            assert "Traceback" not in r.output


def test_an_empty_jepsen_log_is_nothing_checked(tmp_path: Path) -> None:
    log = tmp_path / "jepsen.log"
    log.write_text("\n")
    r = CliRunner().invoke(app, [str(log), "-w", "register", "--format", "jepsen-log", "--json"])
    assert r.exit_code == 2 and '"nothing-checked"' in r.stdout, r.output
