"""The per-key offsets diagram highlights the values an anomaly is about (issue 15): an unseen
value has no offset in its example, a cycle names its writes by value in its steps; both must
be ringed and labelled where they were sent or read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from isrlab.checkers.api import check
from isrlab.checkers.render import _anomalous_values, render_artifacts


def _history() -> list[dict[str, Any]]:
    """Values 1..3 sent to t/0 (offsets 0..2); a poll reads 1 and 2 only: 3 is unseen."""
    ops: list[dict[str, Any]] = []

    def add(p: int, typ: str, f: str, value: Any) -> None:
        ops.append(
            {
                "index": len(ops),
                "time": len(ops) * 1000,
                "process": p,
                "type": typ,
                "f": f,
                "value": value,
            }
        )

    for v in (1, 2, 3):
        add(0, "invoke", "send", [["send", "t/0", v]])
        add(0, "ok", "send", [["send", "t/0", [v - 1, v]]])
    add(1, "invoke", "poll", [["poll"]])
    add(1, "ok", "poll", [["poll", {"t/0": [[0, 1], [1, 2]]}]])
    return ops


def test_values_named_by_examples_and_cycle_steps() -> None:
    results = {
        "anomalies": {
            "unseen": {"examples": [{"key": "t/0", "values": [3], "writers": [4]}]},
            "G0": {
                "examples": [
                    {
                        "cycle": [1, 2],
                        "steps": [
                            {"key": "a/0", "values": [7, 8], "type": "ww"},
                            {"key": "b/0", "value": 9, "type": "wr"},
                            {"type": "process"},
                        ],
                    }
                ]
            },
            "int-poll-skip": {"examples": [{"key": "t/0", "values": [1, 5], "skipped": [4]}]},
        }
    }
    assert _anomalous_values(results) == {"t/0": {1, 3, 4, 5}, "a/0": {7, 8}, "b/0": {9}}


def test_the_diagram_rings_and_labels_an_unseen_value(tmp_path: Path) -> None:
    ops = _history()
    results = check(ops, "queue")
    assert results["anomalies"]["unseen"]["examples"][0]["values"] == [3]
    written = render_artifacts(ops, results, tmp_path)
    svg = tmp_path / "offsets-t_0.svg"
    assert svg in written
    text = svg.read_text()
    assert "anomaly values" in text  # the legend entry of the ringed points
    # The label drawn next to the ringed send of value 3 (matplotlib keeps text as a comment).
    assert "<!-- 3 -->" in text
    json.dumps(results)
