"""``check_workload``: the linearizability checker behind ``isrlab check --workload register|
cas-register|kv``, returning the results dict of history format v1.

``valid`` is ``True`` (linearizable), ``False`` (anomaly ``nonlinearizable``, one example per
illegal partition, each with an ``explanation``) or ``"unknown"`` (the search ran out of time or
memory budget before an answer).  ``stats`` has the search's counters.  With ``out_dir`` the
HTML visualisation is written to ``out_dir / "linear.html"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from isrlab.checkers.history import nothing_checked
from isrlab.checkers.linear.checker import LinearizabilityResult, PartitionResult, check
from isrlab.checkers.linear.html import write_html
from isrlab.checkers.linear.model import Model
from isrlab.checkers.linear.models import CAS_REGISTER, KV, REGISTER

__all__ = ["ANOMALY", "WORKLOADS", "check_workload", "results_dict"]

ANOMALY = "nonlinearizable"
WORKLOADS: dict[str, Model] = {"register": REGISTER, "cas-register": CAS_REGISTER, "kv": KV}
_PREFIX_TAIL = 10


def _example(
    result: LinearizabilityResult, part: PartitionResult, by_index: dict[Any, dict[str, Any]]
) -> dict[str, Any]:
    model = result.model
    blocked = part.blocked
    example: dict[str, Any] = {
        "key": part.key,
        "explanation": part.explanation(model),
        "operations": len(part.operations),
        "prefix_length": len(part.linearization),
        "prefix_tail": [
            {
                "op": model.describe_operation(op.input, op.output),
                "process": op.process,
                "index": op.invoke_index,
            }
            for op in part.linearization[-_PREFIX_TAIL:]
        ],
        "state_after_prefix": model.describe_state(part.state),
    }
    if blocked is not None:
        example["op"] = {
            "describe": model.describe_operation(blocked.input, blocked.output),
            "process": blocked.process,
            "invoke": by_index.get(blocked.invoke_index),
            "completion": (
                None if blocked.complete_index is None else by_index.get(blocked.complete_index)
            ),
        }
    return example


def results_dict(
    result: LinearizabilityResult, ops: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """The spec's results dict for a :class:`LinearizabilityResult` (``ops`` for examples)."""
    by_index = {op.get("index", i): op for i, op in enumerate(ops)}
    illegal = result.illegal
    valid: bool | str
    if illegal:
        valid = False
    elif result.verdict == "unknown":
        valid = "unknown"
    else:
        valid = True
    anomalies: dict[str, Any] = {}
    if illegal:
        anomalies[ANOMALY] = {
            "count": len(illegal),
            "examples": [_example(result, part, by_index) for part in illegal],
        }
    return {
        "valid": valid,
        "anomaly_types": sorted(anomalies),
        "anomalies": anomalies,
        "not_allowed": sorted(anomalies),  # no linearizability anomaly is ever allowed
        "stats": {"checker": "linearizability", "model": result.model.name, **result.stats},
    }


def check_workload(
    ops: Sequence[dict[str, Any]],
    workload: str,
    timeout_s: float | None = None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    """Check a register/cas-register/kv history; see the module docstring."""
    model = WORKLOADS.get(workload)
    if model is None:
        raise ValueError(
            f"unknown linearizability workload {workload!r}; "
            f"use one of: {', '.join(sorted(WORKLOADS))}"
        )
    result = check(model, ops, timeout_s)
    results = results_dict(result, ops)
    if not any(op.get("type") == "ok" and op.get("process") != "nemesis" for op in ops):
        nothing_checked(results, "no ok operation in the history")
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_html(result, out_dir / "linear.html", title=f"Linearizability ({workload})")
        results["stats"]["html"] = str(out_dir / "linear.html")
    return results
