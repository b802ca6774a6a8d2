"""report.html and results.json say how available the system was around each fault (issue 15),
count ops as the checker does, list each nemesis op once and tell fault kinds apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.api import check
from isrlab.checkers.availability import availability, nemesis_ops, op_counts
from isrlab.harness.report import fault_color, render_report

NS = 1_000_000_000


class Hist:
    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def add(self, t_s: float, process: Any, typ: str, f: str, value: Any = None) -> None:
        self.ops.append(
            {"time": int(t_s * NS), "process": process, "type": typ, "f": f, "value": value}
        )

    def done(self) -> list[dict[str, Any]]:
        self.ops.sort(key=lambda o: o["time"])
        for i, op in enumerate(self.ops):
            op["index"] = i
        return self.ops


def outage_history() -> list[dict[str, Any]]:
    """Processes 0-2 send one record every 0.1 s from 0 to 10 s and from 23 s to 30 s; a
    partition from 10 s to 20 s stops everything; process 3 invokes at 5 s and never
    completes (stuck while the others progress)."""
    h = Hist()
    value = 0
    for p in range(3):
        for start, stop in ((0.0, 10.0), (23.0, 30.0)):
            t = start + 0.01 * (p + 1)
            while t < stop:
                value += 1
                h.add(t, p, "invoke", "send", [["send", "t/0", value]])
                h.add(t + 0.05, p, "ok", "send", [["send", "t/0", [None, value]]])
                t += 0.1
    h.add(5.0, 3, "invoke", "send", [["send", "t/0", -1]])
    h.add(10.0, "nemesis", "info", "start-partition", {"shape": "halves"})
    h.add(10.2, "nemesis", "info", "start-partition", {"n1": ["n2"], "n2": ["n1"]})
    h.add(20.0, "nemesis", "info", "stop-partition", None)
    h.add(20.1, "nemesis", "info", "stop-partition", {"n1": [], "n2": []})
    return h.done()


def test_availability_windows_recovery_and_stuck() -> None:
    a = availability(outage_history(), bin_s=0.5, stuck_s=10.0)
    assert a["baseline_ok_per_s"] == pytest.approx(30.0, rel=0.05)
    [w] = a["windows"]
    assert (w["fault"], w["start_s"], w["end_s"]) == ("partition", 10.0, 20.1)
    assert w["relative"] == pytest.approx(0.0, abs=0.01)
    after = w["after_heal"]
    # Nothing from the heal at 20.1 s until 23 s: back above half the baseline ~2.9 s later.
    assert after["recovery_s"] == pytest.approx(2.9, abs=0.5)
    assert after["relative"] == pytest.approx(7 / 9.9, rel=0.1)
    stuck = {s["process"]: s for s in a["stuck"]}
    assert set(stuck) == {3}
    assert stuck[3]["open_at_end"] and stuck[3]["from_s"] == 5.0
    json.dumps(a)  # JSON-ready


def test_no_recovery_is_reported_as_none() -> None:
    ops = [o for o in outage_history() if not (o["time"] > 20.5 * NS and o["process"] != 3)]
    a = availability(ops, bin_s=0.5)
    assert (
        a["windows"][0]["after_heal"] is None or a["windows"][0]["after_heal"]["recovery_s"] is None
    )


def test_a_stall_of_everyone_is_not_a_stuck_process() -> None:
    ops = [o for o in outage_history() if o["process"] != 3]
    assert availability(ops, stuck_s=5.0)["stuck"] == []


def test_nemesis_ops_pair_invocation_and_completion() -> None:
    rows = nemesis_ops(outage_history())
    assert [(r["f"], r["start_s"], r["end_s"]) for r in rows] == [
        ("start-partition", 10.0, 10.2),
        ("stop-partition", 20.0, 20.1),
    ]
    assert rows[0]["value"] == {"n1": ["n2"], "n2": ["n1"]}
    assert rows[1]["value"] == {"n1": [], "n2": []}


def queue_history_with_crash() -> list[dict[str, Any]]:
    h = Hist()
    h.add(0.1, 0, "invoke", "send", [["send", "t/0", 1]])
    h.add(0.2, 0, "ok", "send", [["send", "t/0", [0, 1]]])
    h.add(0.3, 1, "invoke", "send", [["send", "t/0", 2]])
    h.add(0.4, 1, "info", "send", [["send", "t/0", 2]])
    h.add(0.5, 2, "invoke", "crash", None)
    h.add(0.6, 2, "info", "crash", None)
    h.add(0.7, 3, "invoke", "poll", [["poll"]])
    h.add(0.8, 3, "ok", "poll", [["poll", {"t/0": [[0, 1]]}]])
    h.add(0.9, 4, "invoke", "send", [["send", "t/0", 3]])
    h.add(1.0, 4, "fail", "send", [["send", "t/0", 3]])
    h.add(0.85, "nemesis", "info", "kill", None)
    h.add(0.95, "nemesis", "info", "kill", {"nodes": ["n1"]})
    return h.done()


def test_op_counts_are_the_queue_checkers() -> None:
    ops = queue_history_with_crash()
    stats = check(ops, "queue")["stats"]
    assert op_counts(ops) == {k: stats[k] for k in ("ops", "ok", "fail", "info")}


def _run_dir(tmp_path: Path, ops: list[dict[str, Any]], results: dict[str, Any]) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "test.json").write_text(json.dumps({"name": "t", "workload": "queue"}))
    (d / "history.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
    (d / "results.json").write_text(json.dumps(results))
    return d


def test_report_header_counts_agree_with_the_checker(tmp_path: Path) -> None:
    ops = queue_history_with_crash()
    results = check(ops, "queue")
    html = render_report(_run_dir(tmp_path, ops, results)).read_text()
    s = results["stats"]
    assert (
        f"{s['ops']} client operations in 1.0 s "
        f"({s['ok']} ok, {s['fail']} fail, {s['info']} info)" in html
    )


def test_report_faults_table_has_no_null_rows(tmp_path: Path) -> None:
    ops = queue_history_with_crash()
    html = render_report(_run_dir(tmp_path, ops, check(ops, "queue"))).read_text()
    faults = html[html.index("<h2>Faults</h2>") : html.index("<h2>Files</h2>")]
    rows = re.findall(r"<tr><td>.*?</tr>", faults, re.S)
    assert len(rows) == 1
    assert "null" not in faults
    assert "kill" in rows[0] and "n1" in rows[0]


def test_report_shows_availability_and_results_json_keeps_it(tmp_path: Path) -> None:
    ops = outage_history()
    results = check(ops, "queue")
    d = _run_dir(tmp_path, ops, results)
    html = render_report(d).read_text()
    section = html[html.index('id="availability"') : html.index("<h2>Operations per process")]
    assert "Baseline: 30." in section
    assert "partition" in section and "back to half" in section.lower()
    assert re.search(r"<td>3</td><td>5\.00</td>", section)  # the stuck process
    stored = json.loads((d / "results.json").read_text())
    assert stored["availability"]["windows"][0]["fault"] == "partition"
    assert {k: stored[k] for k in results} == json.loads(json.dumps(results, default=str))
    assert "ok baseline (pre-fault)" in html  # the rate plot marks it


def _rgb(c: str) -> tuple[int, ...]:
    return tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))


def test_fault_kinds_have_distinct_colours_and_a_legend(tmp_path: Path) -> None:
    kinds = ["partition", "kill", "pause", "clock", "packet", "partition-iptables", "odd"]
    colors = [_rgb(fault_color(k, kinds)) for k in kinds]
    for i, a in enumerate(colors):
        for b in colors[i + 1 :]:
            assert sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5 > 60
    h = Hist()
    h.add(0.0, 0, "invoke", "send", [["send", "t/0", 1]])
    h.add(0.1, 0, "ok", "send", [["send", "t/0", [0, 1]]])
    for f, t in (
        ("start-kill", 1),
        ("stop-kill", 2),
        ("start-partition", 3),
        ("stop-partition", 4),
    ):
        h.add(t, "nemesis", "info", f, None)
        h.add(t + 0.1, "nemesis", "info", f, None)
    ops = h.done()
    html = render_report(_run_dir(tmp_path, ops, check(ops, "queue"))).read_text()
    assert "fault: kill" in html and "fault: partition" in html
