"""`isrlab check` over several histories in one process, and verdict tables that agree with the
verdict (issue 15)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from isrlab.checkers.cli import check_command
from isrlab.checkers.history import write_history
from isrlab.checkers.render import not_allowed_types, summary_text
from tests.checkers.hist import H

app = typer.Typer()
app.command()(check_command)
runner = CliRunner()

NONLINEAR = [
    {"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "write", "value": 1},
    {"index": 1, "time": 1, "process": 0, "type": "ok", "f": "write", "value": 1},
    {"index": 2, "time": 2, "process": 1, "type": "invoke", "f": "read", "value": None},
    {"index": 3, "time": 3, "process": 1, "type": "ok", "f": "read", "value": 2},
]


def good() -> list[dict[str, Any]]:
    h = H()
    h.send(0, "t/0", 1, 0)
    h.poll(1, {"t/0": [[0, 1]]})
    return h.ops


def lossy() -> list[dict[str, Any]]:
    h = H()
    for i in range(3):
        h.send(0, "t/0", i, i)
    h.poll(1, {"t/0": [[0, 0], [2, 2]]}, watermarks={"t/0": {"low": 0, "high": 3}})
    return h.ops


def run_dir(root: Path, name: str, ops: list[dict[str, Any]]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    write_history(ops, d / "history.jsonl")
    (d / "test.json").write_text('{"workload": "queue"}')
    (d / "n1").mkdir()
    (d / "n1" / "notes.jsonl").write_text("not a history\n")  # below a run dir: not walked
    return d


def test_nonlinearizable_is_not_allowed_in_table_summary_and_results(tmp_path: Path) -> None:
    p = tmp_path / "h.jsonl"
    write_history(NONLINEAR, p)
    r = runner.invoke(app, [str(p), "-w", "register"])
    assert r.exit_code == 1 and "INVALID" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("│ nonlinearizable"))
    assert row.split("│")[3].strip() == "no", row
    r = runner.invoke(app, [str(p), "-w", "register", "--json", "--out", str(tmp_path / "o")])
    results = orjson.loads(r.stdout)
    assert results["not_allowed"] == ["nonlinearizable"]
    assert "nonlinearizable: 1  (not allowed)" in (tmp_path / "o" / "summary.txt").read_text()
    # results written before `not_allowed` existed: whatever a linearizability check found
    old = {k: v for k, v in results.items() if k != "not_allowed"}
    assert not_allowed_types(old) == {"nonlinearizable"}
    assert "(not allowed)" in summary_text(old)


def test_several_files_one_line_each_and_the_worst_exit_code(tmp_path: Path) -> None:
    paths = []
    for name, ops in (("a", good()), ("b", lossy()), ("c", [])):
        paths.append(tmp_path / f"{name}.jsonl")
        write_history(ops, paths[-1])
    r = runner.invoke(app, [*map(str, paths[:2]), "-w", "queue"])
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["valid", str(paths[0])],
        ["INVALID", str(paths[1])],
    ]
    assert "lost-write: 1" in lines[1]
    assert "2 histories: 1 valid, 1 INVALID" in r.stderr
    r = runner.invoke(app, [*map(str, paths), "-w", "queue"])
    assert r.exit_code == 2 and r.stdout.splitlines()[2].startswith("unknown ")
    r = runner.invoke(app, [str(paths[0]), str(paths[0]), "-w", "queue"])  # the same file once
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1


def test_bad_input_in_one_history_does_not_stop_the_others(tmp_path: Path) -> None:
    ok = tmp_path / "ok.jsonl"
    write_history(good(), ok)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    r = runner.invoke(app, [str(broken), str(tmp_path / "absent.jsonl"), str(ok), "-w", "queue"])
    assert r.exit_code == 2
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"error    {broken}") and "line 1" in lines[0]
    assert "does not exist" in lines[1] and lines[2].startswith("valid ")
    assert "Traceback" not in r.output


def test_a_directory_of_runs_and_histories(tmp_path: Path) -> None:
    store = tmp_path / "store"
    a = run_dir(store / "queue", "20260101T000000", good())
    b = run_dir(store / "queue", "20260102T000000", lossy())
    os.symlink(b, store / "queue" / "latest")  # not followed: b is checked once
    os.symlink(b / "history.jsonl", store / "linked.jsonl")
    write_history(NONLINEAR, store / "loose.jsonl")
    (store / "notes.txt").write_text("not a jsonl history\n")
    r = runner.invoke(app, [str(store), "--json"])
    rows = [orjson.loads(line) for line in r.stdout.splitlines()]
    assert [row["path"] for row in rows] == [
        str(store / "loose.jsonl"),
        str(a / "history.jsonl"),
        str(b / "history.jsonl"),
    ]
    # run directories take their workload from test.json; the loose file has none
    assert [row["valid"] for row in rows] == ["unknown", True, False]
    assert "no workload" in rows[0]["error"]
    assert r.exit_code == 2
    r = runner.invoke(app, [str(store / "queue")])
    assert r.exit_code == 1 and len(r.stdout.splitlines()) == 2


def test_out_gives_each_history_its_own_folder(tmp_path: Path) -> None:
    paths = []
    for name, ops in (("a", good()), ("b", lossy())):
        paths.append(tmp_path / name / "history.jsonl")
        paths[-1].parent.mkdir()
        write_history(ops, paths[-1])
    out = tmp_path / "out"
    r = runner.invoke(app, [*map(str, paths), "-w", "queue", "--out", str(out)])
    assert r.exit_code == 1, r.output
    written = sorted(p.relative_to(out).parts[0] for p in out.glob("*/results.json"))
    assert len(written) == 2 and written[0] != written[1]
    verdicts = sorted(orjson.loads(p.read_bytes())["valid"] for p in out.glob("*/results.json"))
    assert verdicts == [False, True]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_out_is_one_line_and_exit_2_as_non_root(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    p = tmp_path / "h.jsonl"
    write_history(lossy(), p)
    r = runner.invoke(app, [str(p), "-w", "queue", "--out", str(locked / "out")])
    assert r.exit_code == 2 and "cannot write results" in r.stderr


def test_an_unusable_out_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "h.jsonl"
    write_history(lossy(), p)  # INVALID: the old code exited 1 after its traceback
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "out", blocker):
        r = runner.invoke(app, [str(p), "-w", "queue", "--out", str(out)])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
        assert "Traceback" not in r.output


@pytest.mark.parametrize("value", ["-5", "0"])
def test_a_timeout_that_is_not_positive_is_refused(tmp_path: Path, value: str) -> None:
    p = tmp_path / "h.jsonl"
    write_history(good(), p)
    r = runner.invoke(app, [str(p), "-w", "queue", "--timeout", value])
    assert r.exit_code == 2 and "--timeout must be a positive" in r.stderr
