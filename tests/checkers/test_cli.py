"""`isrlab check` through typer's CliRunner, the api dispatcher and rendered artefacts."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from isrlab.checkers import api
from isrlab.checkers.cli import check_command
from isrlab.checkers.history import write_history
from isrlab.checkers.render import render_artifacts
from isrlab.pipeline.fixtures.simulate import simulate
from tests.checkers.hist import H

app = typer.Typer()
app.command()(check_command)
runner = CliRunner()


def lossy_history() -> list[dict[str, Any]]:
    h = H()
    for i in range(3):
        h.send(0, "t/0", i, i)
    h.poll(1, {"t/0": [[0, 0], [2, 2]]}, watermarks={"t/0": {"low": 0, "high": 3}})
    return h.ops


def run(*args: str) -> Any:
    return runner.invoke(app, [*args])


def test_valid_history_exits_0_and_prints_json(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    write_history(simulate(400, seed=1), p)
    r = run(str(p), "--workload", "queue", "--json")
    assert r.exit_code == 0, r.output
    out = orjson.loads(r.stdout)
    assert out["valid"] is True and out["anomaly_types"] == []


def test_invalid_history_exits_1_and_writes_artifacts(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    write_history(lossy_history(), p)
    r = run(str(p), "--workload", "queue")
    assert r.exit_code == 1
    assert "lost-write" in r.stdout and "INVALID" in r.stdout
    out = tmp_path / "out"
    r = run(str(p), "--workload", "queue", "--json", "--out", str(out))
    assert r.exit_code == 1
    saved = orjson.loads((out / "results.json").read_bytes())
    assert saved == orjson.loads(r.stdout)
    assert "lost-write" in (out / "summary.txt").read_text()
    assert (out / "offsets-t_0.png").stat().st_size > 1000
    assert (out / "offsets-t_0.svg").read_text().lstrip().startswith("<?xml")


def test_allow_makes_it_valid_and_unknown_names_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    write_history(lossy_history(), p)
    r = run(str(p), "-w", "queue", "--allow", "lost-write,int-poll-skip,unseen")
    assert r.exit_code == 0, r.output
    r = run(str(p), "-w", "queue", "--allow", "lost-writes")
    assert r.exit_code == 2
    assert "unknown anomaly type" in r.output and "Traceback" not in r.output


def test_run_directory_uses_test_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "store" / "t" / "20260101T000000"
    run_dir.mkdir(parents=True)
    write_history(lossy_history(), run_dir / "history.jsonl")
    (run_dir / "test.json").write_bytes(
        orjson.dumps(
            {"workload": "queue", "seed": 1, "allow": ["lost-write", "int-poll-skip", "unseen"]}
        )
    )
    r = run(str(run_dir), "--save")
    assert r.exit_code == 0, r.output
    assert (run_dir / "results.json").exists() and (run_dir / "summary.txt").exists()
    r = run(str(run_dir), "--disallow", "lost-write")
    assert r.exit_code == 1


@pytest.mark.parametrize(
    ("content", "args", "words"),
    [
        (b'{"index": 0,\n', ["-w", "queue"], "line 1"),
        (b"", ["-w", "nope"], "unknown workload"),
        (b"", [], "no workload"),
        (b"", ["-w", "queue", "--format", "xml"], "unknown --format"),
    ],
)
def test_bad_input_exits_2_with_one_message(
    tmp_path: Path, content: bytes, args: list[str], words: str
) -> None:
    p = tmp_path / "history.jsonl"
    p.write_bytes(content)
    r = run(str(p), *args)
    assert r.exit_code == 2
    assert words in r.output
    assert "Traceback" not in r.output


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    r = run(str(tmp_path / "absent.jsonl"), "-w", "queue")
    assert r.exit_code == 2 and "does not exist" in r.output
    r = run(str(tmp_path), "-w", "queue")
    assert r.exit_code == 2 and "without history.jsonl" in r.output


def test_malformed_queue_value_is_located(tmp_path: Path) -> None:
    ops = lossy_history()
    ops[7]["value"] = [["poll", {"t/0": [[0, 0, 9]]}]]
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    r = run(str(p), "-w", "queue")
    assert r.exit_code == 2 and "line 8" in r.output


def test_eos_flags(tmp_path: Path) -> None:
    h = H()
    for i in range(3):
        h.send(0, "in", i, i)
    h.txn(
        1,
        [
            ["poll", {"in": [[0, 0], [1, 1], [2, 2]]}],
            ["send", "out", [0, 0]],
            ["send", "out", [1, 2]],
        ],
    )
    h.poll(2, {"out": [[0, 0], [1, 2]]})
    p = tmp_path / "history.jsonl"
    write_history(h.ops, p)
    assert run(str(p), "-w", "queue").exit_code == 0
    r = run(str(p), "-w", "queue", "--json", "--eos-input", "in", "--eos-output", "out")
    assert r.exit_code == 1
    assert orjson.loads(r.stdout)["anomaly_types"] == ["eos-missing"]


def test_api_dispatches_linear_workloads_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def check_workload(ops: Any, workload: str, timeout_s: Any = None, out_dir: Any = None) -> dict:
        calls.append((workload, timeout_s, out_dir))
        return {"valid": "unknown", "anomaly_types": [], "anomalies": {}, "stats": {}}

    mod = types.ModuleType("isrlab.checkers.linear.api")
    mod.check_workload = check_workload  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "isrlab.checkers.linear.api", mod)
    r = api.check([], "cas-register", timeout_s=5, out_dir=None)
    assert r["valid"] == "unknown" and calls == [("cas-register", 5, None)]
    with pytest.raises(ValueError, match="unknown workload"):
        api.check([], "bank")


def test_policy_from_test() -> None:
    p = api.policy_from_test(
        {
            "workload": "queue",
            "sub_via": ["subscribe"],
            "eos": {"input": ["a"], "output": ["b"]},
            "checker": {"allow": "poll-skip, unseen"},
        }
    )
    assert p == {
        "workload": "queue",
        "subscribe": True,
        "eos": {"input": ["a"], "output": ["b"]},
        "allow": {"poll-skip", "unseen"},
    }


def test_policy_from_nested_workload() -> None:
    p = api.policy_from_test({"workload": {"name": "queue", "subscribe": False, "ww_deps": False}})
    assert p == {"workload": "queue", "subscribe": False, "ww_deps": False}


def test_render_without_anomalies_writes_only_summary(tmp_path: Path) -> None:
    ops = simulate(200, seed=2)
    written = render_artifacts(ops, {"valid": True, "anomaly_types": [], "anomalies": {}}, tmp_path)
    assert [p.name for p in written] == ["summary.txt"]
    assert "VALID" in (tmp_path / "summary.txt").read_text()


def test_timeout_gives_unknown_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import isrlab.checkers.cli

    def slow_check(ops: Any, workload: str, **opts: Any) -> dict[str, Any]:
        time.sleep(5)
        raise AssertionError("the deadline should have fired")

    monkeypatch.setattr(isrlab.checkers.cli, "check", slow_check)
    p = tmp_path / "history.jsonl"
    write_history(lossy_history(), p)
    r = run(str(p), "-w", "queue", "--json", "--timeout", "0.2")
    assert r.exit_code == 2
    out = orjson.loads(r.stdout)
    assert out["valid"] == "unknown" and "did not finish" in out["error"]


def test_unhashable_value_is_a_located_error(tmp_path: Path) -> None:
    ops = lossy_history()
    ops[7]["value"] = [["poll", {"t/0": [[0, [1, 2]]]}]]
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    r = run(str(p), "-w", "queue")
    assert r.exit_code == 2 and "line 8" in r.output and "scalars" in r.output


def test_edn_register_history_end_to_end(tmp_path: Path) -> None:
    p = tmp_path / "history.edn"
    p.write_text(
        "{:index 0 :time 0 :type :invoke :process 0 :f :write :value 1}\n"
        "{:index 1 :time 1 :type :ok :process 0 :f :write :value 1}\n"
        "{:index 2 :time 2 :type :invoke :process 1 :f :read :value nil}\n"
        "{:index 3 :time 3 :type :ok :process 1 :f :read :value 1}\n"
    )
    r = run(str(tmp_path), "-w", "register", "--format", "edn", "--json")
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout)["valid"] is True
    p.write_text("{:index 0 :time 0 :type :invoke\n")
    r = run(str(p), "-w", "register", "--format", "edn")
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_read_uncommitted_transactions_allow_what_the_level_permits() -> None:
    ru = {"workload": "queue", "txn": True, "isolation_level": "read_uncommitted"}
    assert api.policy_from_test(ru)["allow"] == api.READ_UNCOMMITTED_ALLOWED
    # read_committed, or no transactions (a failed plain send is never readable): nothing more
    assert "allow" not in api.policy_from_test({**ru, "isolation_level": "read_committed"})
    assert "allow" not in api.policy_from_test({**ru, "txn": False})
    # added to the test's own allow list; its disallow still wins in the checker
    p = api.policy_from_test({**ru, "allow": ["unseen"], "disallow": ["G1a"]})
    assert p["allow"] == api.READ_UNCOMMITTED_ALLOWED | {"unseen"} and p["disallow"] == {"G1a"}


def test_an_aborted_read_is_invalid_under_read_committed_only() -> None:
    from tests.checkers.hist import H

    h = H()
    h.send(0, "k", 1, 0, typ="fail")  # an aborted transaction's send
    h.poll(1, {"k": [[0, 1]]})
    test = {"workload": "queue", "txn": True, "isolation_level": "read_committed"}
    rc = api.check(h.ops, **api.policy_from_test(test))
    assert rc["valid"] is False and rc["not_allowed"] == ["G1a"]
    ru = api.check(h.ops, **api.policy_from_test({**test, "isolation_level": "read_uncommitted"}))
    assert ru["valid"] is True and ru["anomaly_types"] == ["G1a"]  # still reported
    strict = {**test, "isolation_level": "read_uncommitted", "disallow": ["G1a"]}
    assert api.check(h.ops, **api.policy_from_test(strict))["valid"] is False
