"""Checking one run the way `isrlab check RUN_DIR` does, as a row of the ``results`` table.

`check_run(path, test)` loads the run's history with `checkers.history.load_history`,
takes the checker options from test.json with `checkers.api.policy_from_test` and calls
`checkers.api.check`: the checkers' own functions, so a run's verdict in the published
report is the verdict `isrlab check` gives. The Spark job calls it once per run inside
its tasks; the benchmark's baseline loops over it in one process.

A run the checker cannot read (malformed history, unknown workload) becomes a row with
``status = "malformed"`` and the reason in ``error``: reported and skipped, not fatal.

``results`` schema: ``run_id``, ``status`` (checked | malformed), ``error``, ``valid``
(``"true"`` | ``"false"`` | ``"unknown"``, null when malformed), ``ops`` (history lines),
``acked_writes`` (sends in ``ok`` completions: the denominator of every rate),
``anomaly_counts`` (type -> count), ``anomaly_examples`` (type -> the first example's
explanation), ``not_allowed`` (types that invalidate the run), ``unseen_classes`` (what the
replicas say of the acknowledged writes no ok op read, class -> count, `checkers.unseen`; empty
when the run has no collected replica records), ``contested_classes`` (what the replicas hold at
the offsets of the run's committed-truncation and inconsistent-offsets cases, class -> count over
every value those cases name, `checkers.unseen.classify_offsets`; empty without collected
replica records or without such cases) and ``results_json`` (the checker's whole results dict, exactly as `isrlab check --json`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from isrlab.checkers.api import WORKLOADS, check, policy_from_test
from isrlab.checkers.history import HistoryError, load_history
from isrlab.checkers.queue.codec import sends_in
from isrlab.checkers.unseen import annotate as annotate_unseen

__all__ = ["RESULTS_DDL", "RESULTS_SCHEMA", "acked_writes", "check_run", "results_table"]

RESULTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("valid", pa.string()),
        ("ops", pa.int64()),
        ("acked_writes", pa.int64()),
        ("anomaly_counts", pa.map_(pa.string(), pa.int64())),
        ("anomaly_examples", pa.map_(pa.string(), pa.string())),
        ("not_allowed", pa.list_(pa.string())),
        ("unseen_classes", pa.map_(pa.string(), pa.int64())),
        ("contested_classes", pa.map_(pa.string(), pa.int64())),
        ("results_json", pa.string()),
    ]
)
RESULTS_DDL = (
    "run_id string, status string, error string, valid string, ops bigint, "
    "acked_writes bigint, anomaly_counts map<string, bigint>, "
    "anomaly_examples map<string, string>, not_allowed array<string>, "
    "unseen_classes map<string, bigint>, contested_classes map<string, bigint>, "
    "results_json string"
)


def acked_writes(ops: Sequence[dict[str, Any]]) -> int:
    """Sends acknowledged to the client: send micro-ops in ``ok`` completions."""
    n = 0
    for op in ops:
        if op.get("type") != "ok" or op.get("f") not in ("send", "txn"):
            continue
        n += sum(1 for _ in sends_in(op.get("value")))
    return n


def _first_explanation(anomaly: Mapping[str, Any]) -> str:
    examples = anomaly.get("examples") or []
    if not examples:
        return ""
    ex = examples[0]
    if isinstance(ex, Mapping) and "explanation" in ex:
        return str(ex["explanation"])
    return orjson.dumps(ex, option=orjson.OPT_NON_STR_KEYS).decode()[:500]


def _valid_text(v: Any) -> str:
    return "true" if v is True else "false" if v is False else "unknown"


def check_run(
    run_id: str,
    path: Path | str,
    test: Mapping[str, Any],
    on_history: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """The ``results`` row of one run (see the module doc); never raises for bad input.

    `on_history` sees the loaded, validated history before it is checked (the Spark job
    flattens it into the records table there, so each history is parsed once).
    """
    row: dict[str, Any] = {
        "run_id": run_id,
        "status": "malformed",
        "error": None,
        "valid": None,
        "ops": None,
        "acked_writes": None,
        "anomaly_counts": [],
        "anomaly_examples": [],
        "not_allowed": [],
        "unseen_classes": [],
        "contested_classes": [],
        "results_json": None,
    }
    policy = policy_from_test(test)
    workload = policy.pop("workload", None) or "queue"
    if workload not in WORKLOADS:
        row["error"] = f"unknown workload {workload!r} in test.json"
        return row
    try:
        ops = load_history(Path(path) / "history.jsonl")
        if on_history is not None:
            on_history(ops)
        results = check(ops, workload, **policy)
        if workload == "queue":
            annotate_unseen(results, ops, Path(path))
    except HistoryError as e:
        row["error"] = f"history.jsonl: {e}"
        return row
    except Exception as e:
        # One run's checker failure must not end the whole analysis: report it instead.
        row["error"] = f"the {workload} checker failed on this run: {e!r}"
        return row
    anomalies = results.get("anomalies") or {}
    row.update(
        status="checked",
        valid=_valid_text(results.get("valid")),
        ops=len(ops),
        acked_writes=acked_writes(ops),
        anomaly_counts=[(name, int(a.get("count", 0))) for name, a in sorted(anomalies.items())],
        anomaly_examples=[(name, _first_explanation(a)) for name, a in sorted(anomalies.items())],
        not_allowed=list(results.get("not_allowed") or []),
        unseen_classes=sorted((results.get("unseen_writes") or {}).get("classes", {}).items()),
        contested_classes=sorted(
            (results.get("contested_values") or {}).get("classes", {}).items()
        ),
        results_json=orjson.dumps(results, option=orjson.OPT_NON_STR_KEYS).decode(),
    )
    return row


def results_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows of `check_run` as an Arrow table of RESULTS_SCHEMA."""
    cols = {name: [r[name] for r in rows] for name in RESULTS_SCHEMA.names}
    return pa.table(cols, schema=RESULTS_SCHEMA)
