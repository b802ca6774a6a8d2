"""The run store as the pipeline sees it: finding runs and reducing their configuration.

A store is a directory of run directories ``<test-name>/<timestamp>/`` (see
docs/history-format.md, "Run directory"); a run is any directory below the store
holding a ``test.json``. `discover_runs` returns the well-formed runs and, separately,
the malformed ones with the reason (unreadable or non-object test.json, missing
history.jsonl), so that the pipeline reports and skips them instead of failing.

`config_of(test)` reduces a test configuration to the columns the published report
groups by: workload (``queue``, or ``eos``: consume-transform-produce; a test.json without
the key ran the queue workload), mode (``real``, or ``sim`` for `isrlab sim`'s runs, whose
test.json says ``"mode": "sim"``; a test.json without the key is a real run's), acks, consumer (how the processes took keys: ``assign``, ``subscribe`` or
``mixed``, `harness.testconfig.consumer_mode`; a test.json from before consumer groups reads
as ``assign``), nemesis (one fault kind; ``combined`` for the matrix's schedule of all
four kinds; kinds joined by ``+``, e.g. ``kill+partition``, for other compositions;
``none``), the switches idempotence, txn, isolation_level, min_insync_replicas,
unclean_leader_election and truncation_mode, and the two timings that decide how fast the ISR shrinks and how fast a
dead broker's leadership moves (replica_lag_time_max_ms, zk_session_timeout_ms). The columns
are the options of the harness's test table (``harness.testconfig``) that have a report
column; a test.json without a key gets the value that run actually used (`ABSENT`, the
table's ``absent``: Kafka's min.insync.replicas of 1, not the harness's default of 2).
The nemesis label, the ``combined`` schedule and `config_name` (a configuration's file-safe
name) are facts about test configurations: they live with the test table and are re-exported
here; the pipeline depends on the harness's table, never the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from isrlab.harness.testconfig import (
    COLUMNS,
    COMBINED_KINDS,
    TIMINGS,
    config_name,
    consumer_mode,
    nemesis_label,
)

__all__ = [
    "ABSENT",
    "COMBINED_KINDS",
    "CONFIG_COLUMNS",
    "SWITCHES",
    "TIMINGS",
    "BadRun",
    "Run",
    "StoreError",
    "config_name",
    "config_of",
    "discover_runs",
    "run_mode",
]

SWITCHES = tuple(o.name for o in COLUMNS if o.switch)
CONFIG_COLUMNS = ("workload", "mode", "acks", "consumer", "nemesis", *SWITCHES, *TIMINGS)
#: how a run ran: "real" (brokers on nodes; a test.json without ``mode``) or "sim" (`isrlab sim`)
MODES = ("real", "sim")
# What a run whose test.json lacks a key ran with (the brokers' setting then).
ABSENT: dict[str, Any] = {o.name: o.absent for o in COLUMNS if o.name in (*SWITCHES, *TIMINGS)}
_COERCE = {"boolean": bool, "int": int, "bigint": int, "string": str}


class StoreError(Exception):
    """The store cannot be analysed at all (missing, or no runs in it)."""


@dataclass(frozen=True)
class Run:
    run_id: str  # the run directory relative to the store, "<test-name>/<timestamp>"
    path: Path
    test: dict[str, Any]


@dataclass(frozen=True)
class BadRun:
    run_id: str
    path: Path
    reason: str


def run_mode(test: Mapping[str, Any]) -> str:
    """``sim`` for a simulated run's test.json (``"mode": "sim"``, or the older
    ``"simulated": true``), ``real`` otherwise (absent: every run before the simulator)."""
    mode = test.get("mode")
    if mode is None:
        return "sim" if test.get("simulated") is True else "real"
    return str(mode)


def config_of(test: Mapping[str, Any]) -> dict[str, Any]:
    """The report's grouping columns for one test configuration (see the module doc)."""
    workload = test.get("workload") or "queue"
    if isinstance(workload, Mapping):  # (Jepsen's {"name": ..., options})
        workload = workload.get("name") or "queue"
    out: dict[str, Any] = {
        "workload": str(workload),
        "mode": run_mode(test),
        "acks": str(test.get("acks", "all")).lower().replace("-1", "all"),
        "consumer": consumer_mode(test),
        "nemesis": nemesis_label(test.get("nemesis")),
    }
    for opt in COLUMNS:
        if opt.name in ABSENT:
            value = test.get(opt.name)
            out[opt.name] = _COERCE[opt.column or "string"](
                ABSENT[opt.name] if value is None else value
            )
    return out


def discover_runs(store: Path) -> tuple[list[Run], list[BadRun]]:
    """Every run directory below `store`, sorted by run id; malformed ones listed apart."""
    store = Path(store)
    if not store.is_dir():
        raise StoreError(
            f"store {store} is not a directory; pass the directory `isrlab test` "
            "writes runs into (store/<test-name>/<timestamp>/)"
        )
    runs: list[Run] = []
    bad: list[BadRun] = []
    for test_json in sorted(store.rglob("test.json")):
        run_dir = test_json.parent
        run_id = run_dir.relative_to(store).as_posix()
        try:
            test = orjson.loads(test_json.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            bad.append(BadRun(run_id, run_dir, f"test.json unreadable: {e}"))
            continue
        if not isinstance(test, dict):
            bad.append(BadRun(run_id, run_dir, "test.json is not a JSON object"))
            continue
        if not (run_dir / "history.jsonl").is_file():
            bad.append(BadRun(run_id, run_dir, "no history.jsonl"))
            continue
        try:
            config_of(test)
        except (TypeError, ValueError) as e:
            bad.append(BadRun(run_id, run_dir, f"test.json has a bad switch value: {e}"))
            continue
        runs.append(Run(run_id, run_dir.resolve(), test))
    if not runs and not bad:
        raise StoreError(
            f"no runs in {store}: a run is a directory with test.json and history.jsonl; "
            "create some with `isrlab test` or `isrlab matrix`"
        )
    return runs, bad
