"""The pipeline's Parquet tables and how a run becomes rows of them.

Two explicit schemas (Arrow here, Spark DDL alongside so both sides agree):

- ``runs``: one row per run: ``run_id`` (``<test-name>/<timestamp>``), ``path``,
  ``name``, the grouping columns of `pipeline.store.config_of` (workload, mode, acks, consumer,
  nemesis, idempotence, txn, isolation_level, min_insync_replicas, unclean_leader_election,
  truncation_mode, replica_lag_time_max_ms, zk_session_timeout_ms), ``seed`` and the whole
  ``test_json``;
- ``records``: one row per micro-op that touched a record, i.e. per send and per
  record read: ``run_id``, ``index`` (the completion's history index; the invoke's when
  the op never completed), ``invoke_index``, ``process``, ``type`` (ok/fail/info; an
  invoke without completion counts as info), ``f``, ``kind`` (``send`` | ``read``),
  ``mop`` (position of the micro-op in the op), ``key``, ``offset`` (null when
  unknown), ``value`` (the JSON text of the scalar), ``invoke_time``,
  ``complete_time`` (ns since test start; null without completion) and ``node``.

`records_of(run_id, ops)` does the flattening of one validated history; it knows the
queue workload's micro-op shapes (docs/history-format.md) and nothing of
anomalies. Other workloads produce no records (their ops are not micro-op lists).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa

from isrlab.checkers.queue.codec import ASSIGN_FS, entries_in
from isrlab.harness.testconfig import COLUMNS
from isrlab.pipeline.store import CONFIG_COLUMNS, Run, config_of

__all__ = [
    "RECORDS_DDL",
    "RECORDS_SCHEMA",
    "RUNS_DDL",
    "RUNS_SCHEMA",
    "records_of",
    "run_row",
]

# The config columns' types come from the harness's test table (Spark DDL name -> Arrow type).
_ARROW = {"string": pa.string(), "boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64()}
_CONFIG_TYPES = {
    "workload": "string",
    "mode": "string",
    "consumer": "string",
    "nemesis": "string",
    **{o.name: o.column or "string" for o in COLUMNS},
}
_RUN_COLUMNS = (
    ("run_id", "string"),
    ("path", "string"),
    ("name", "string"),
    *((name, _CONFIG_TYPES[name]) for name in CONFIG_COLUMNS),  # (workload first)
    ("seed", "bigint"),
    ("test_json", "string"),
)
RUNS_SCHEMA = pa.schema([(name, _ARROW[ddl]) for name, ddl in _RUN_COLUMNS])
RUNS_DDL = ", ".join(f"{name} {ddl}" for name, ddl in _RUN_COLUMNS)

RECORDS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("index", pa.int64()),
        ("invoke_index", pa.int64()),
        ("process", pa.int64()),
        ("type", pa.string()),
        ("f", pa.string()),
        ("kind", pa.string()),
        ("mop", pa.int32()),
        ("key", pa.string()),
        ("offset", pa.int64()),
        ("value", pa.string()),
        ("invoke_time", pa.int64()),
        ("complete_time", pa.int64()),
        ("node", pa.string()),
    ]
)
RECORDS_DDL = (
    "run_id string, index bigint, invoke_index bigint, process bigint, type string, "
    "f string, kind string, mop int, key string, offset bigint, value string, "
    "invoke_time bigint, complete_time bigint, node string"
)


def run_row(run: Run) -> dict[str, Any]:
    """The ``runs`` row of one run."""
    test = run.test
    seed = test.get("seed")
    return {
        "run_id": run.run_id,
        "path": str(run.path),
        "name": str(test.get("name") or run.run_id.split("/")[0]),
        **config_of(test),
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "test_json": orjson.dumps(test, option=orjson.OPT_NON_STR_KEYS).decode(),
    }


class _Columns:
    __slots__ = ("cols", "run_id")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.cols: dict[str, list[Any]] = {name: [] for name in RECORDS_SCHEMA.names}

    def add(
        self,
        comp: dict[str, Any],
        inv: tuple[int, int] | None,
        typ: str,
        kind: str,
        mop: int,
        key: Any,
        offset: Any,
        value: Any,
    ) -> None:
        c = self.cols
        c["index"].append(comp["index"])
        c["invoke_index"].append(inv[0] if inv else None)
        c["process"].append(comp["process"])
        c["type"].append(typ)
        c["f"].append(comp["f"])
        c["kind"].append(kind)
        c["mop"].append(mop)
        c["key"].append(str(key))
        c["offset"].append(offset if type(offset) is int else None)
        c["value"].append(orjson.dumps(value).decode())
        c["invoke_time"].append(inv[1] if inv else comp["time"])
        c["complete_time"].append(comp["time"] if comp["type"] != "invoke" else None)
        c["node"].append(comp.get("node"))

    def table(self) -> pa.Table:
        self.cols["run_id"] = [self.run_id] * len(self.cols["index"])
        return pa.table(self.cols, schema=RECORDS_SCHEMA)


def _emit(out: _Columns, comp: dict[str, Any], inv: tuple[int, int] | None, typ: str) -> None:
    if comp.get("f") in ASSIGN_FS:
        return
    for i, kind, key, offset, value in entries_in(comp.get("value")):
        out.add(comp, inv, typ, kind, i, key, offset, value)


def records_of(run_id: str, ops: Sequence[dict[str, Any]]) -> pa.Table:
    """The ``records`` rows of one validated history (see the module doc)."""
    out = _Columns(run_id)
    open_invokes: dict[Any, dict[str, Any]] = {}
    invoked_at: dict[Any, tuple[int, int]] = {}
    for op in ops:
        process = op["process"]
        if process == "nemesis":
            continue
        if op["type"] == "invoke":
            open_invokes[process] = op
            invoked_at[process] = (op["index"], op["time"])
            continue
        open_invokes.pop(process, None)
        _emit(out, op, invoked_at.pop(process, None), op["type"])
    for process, inv in open_invokes.items():
        # Never completed: counts as info; the invoke's value is all that is known.
        _emit(out, inv, invoked_at[process], "info")
    return out.table()
