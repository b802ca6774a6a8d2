"""Shrinking a failing simulated run (harness/sim/shrink.py): the explicit nemesis schedule,
its replay, and a failing acks=1 run under partitions, kills and pauses shrunk to fewer faults
and operations that still fail the same way and replay byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from isrlab.harness.generator import Context, Pending
from isrlab.harness.sim.shrink import (
    FixedSchedule,
    fault_units,
    replay,
    run_once,
    schedule_of,
    shrink,
    violation_kind,
)

#: acks=1 without idempotence under the test's own nemesis: seed 8 loses acknowledged writes
UNSAFE: dict[str, Any] = {
    "name": "sim-shrink",
    "concurrency": 2,
    "rate": 10,
    "key_count": 1,
    "recovery_time": 2,
    "final_time_limit": 15,
    "seed": 8,
    "acks": "1",
    "idempotence": False,
    "nemesis": "partition+kill+pause",
    "nemesis_interval": 2,
    "time_limit": 12,
    "op_timeout_ms": 5000,
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fixed_schedule_gives_each_op_at_its_time() -> None:
    gen = FixedSchedule([(2000, {"f": "stop-kill", "value": None}), (1000, {"f": "start-kill"})])

    def ask(t: int) -> Any:
        return gen.op(Context(time=t, thread="nemesis", process="nemesis", threads=["nemesis"]))

    assert ask(0) == Pending(1000)
    assert ask(1500) == {"f": "start-kill", "value": None}
    assert ask(1500) == Pending(2000)
    assert ask(2000) == {"f": "stop-kill", "value": None}
    later = ask(10**12)
    assert isinstance(later, Pending) and later.at is not None and later.at > 10**15


def test_fault_units_pair_each_start_with_its_stop() -> None:
    ops = [
        (1, {"f": "start-partition"}),
        (2, {"f": "start-kill"}),
        (3, {"f": "stop-partition"}),
        (4, {"f": "start-partition"}),
        (5, {"f": "stop-kill"}),
        (6, {"f": "stop-partition"}),
        (7, {"f": "start-pause"}),
    ]
    assert fault_units(ops) == [[0, 2], [1, 4], [3, 5], [6]]
    assert violation_kind("at virtual time 3.2, after x: two leaders of t0-0 at ...") == (
        "two-leaders"
    )


def test_a_failing_run_shrinks_and_its_replay_is_byte_identical(tmp_path: Path) -> None:
    # the run's own schedule, made explicit, gives the same history
    original = run_once(UNSAFE, tmp_path / "original")
    assert original.valid is False and "lost-write" in original.anomalies, original
    schedule = schedule_of(Path(original.run_dir))
    assert sum(1 for _, op in schedule if op["f"].startswith("start-")) == original.faults
    again = run_once(UNSAFE, tmp_path / "again", schedule)
    assert again.history_sha256 == original.history_sha256

    result = shrink(
        UNSAFE,
        tmp_path / "shrunk",
        max_runs=16,
        steps=("faults", "time", "numbers"),
        original=Path(original.run_dir),
    )
    before, after = result.before, result.after
    assert after["faults"] < before["faults"], (before, after)
    assert after["ops"] < before["ops"], (before, after)
    assert after["time_limit"] <= before["time_limit"]
    assert set(after["kinds"]) & set(before["kinds"]), (before, after)
    assert result.outcome["valid"] is False

    out = tmp_path / "shrunk"
    run_dir = out / "run"
    assert (run_dir / "report.html").is_file() and (run_dir / "results.json").is_file()
    summary = json.loads((out / "shrink.json").read_text())
    assert summary["after"] == after and "replay" in summary
    assert "| faults |" in (out / "shrink.md").read_text()

    replayed = replay(out / "shrink.json", tmp_path / "replay", report=False)
    assert replayed.valid is False
    assert replayed.history_sha256 == result.outcome["history_sha256"]
    assert sha256(tmp_path / "replay" / "run" / "history.jsonl") == sha256(
        run_dir / "history.jsonl"
    )
    print(f"\n{before} ->\n{after}\n{result.runs} runs, {result.cpu_s} CPU s")
