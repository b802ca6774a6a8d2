"""The run store as the pipeline sees it: finding runs and naming their configuration.

A store is a directory of run directories ``<test-name>/<timestamp>/`` (see
docs/history-format.md, "Run directory"); a run is any directory below the store
holding a ``test.json``. `discover_runs` returns the well-formed runs and, separately,
the malformed ones with the reason (unreadable or non-object test.json, missing
history.jsonl), so that the pipeline reports and skips them instead of failing.

`config_of(test)` reduces a test configuration to the columns the published report
groups by: acks, nemesis (one fault kind; ``combined`` for the matrix's schedule of all
four kinds; kinds joined by ``+``, e.g. ``kill+partition``, for other compositions;
``none``), the switches idempotence, txn, min_insync_replicas, unclean_leader_election and
truncation_mode, and the two timings that decide how fast the ISR shrinks and how fast a
dead broker's leadership moves (replica_lag_time_max_ms, zk_session_timeout_ms). The columns
are the options of the harness's test table (``harness.testconfig``) that have a report
column; a test.json without a key gets the value that run actually used (`ABSENT`, the
table's ``absent``: Kafka's min.insync.replicas of 1, not the harness's default of 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from isrlab.harness.testconfig import COLUMNS

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
]

SWITCHES = tuple(o.name for o in COLUMNS if o.switch)
TIMINGS = tuple(o.name for o in COLUMNS if o.kind is int and not o.switch)
CONFIG_COLUMNS = ("acks", "nemesis", *SWITCHES, *TIMINGS)
# What a run whose test.json lacks a key ran with (the brokers' setting then).
ABSENT: dict[str, Any] = {o.name: o.absent for o in COLUMNS if o.name in (*SWITCHES, *TIMINGS)}
_COERCE = {"boolean": bool, "int": int, "bigint": int, "string": str}
# The "combined" schedule of the matrix and of synthetic stores: every fault kind at once.
COMBINED_KINDS = ("partition", "kill", "pause", "clock")


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


def _nemesis_label(kinds: Any) -> str:
    if kinds is None or kinds == [] or kinds == "":
        return "none"
    if isinstance(kinds, str):
        kinds = [kinds]
    names = sorted({str(k) for k in kinds if str(k) != "none"})
    if not names:
        return "none"
    if set(names) == set(COMBINED_KINDS):
        return "combined"
    return "+".join(names)


def config_of(test: Mapping[str, Any]) -> dict[str, Any]:
    """The report's grouping columns for one test configuration (see the module doc)."""
    out: dict[str, Any] = {
        "acks": str(test.get("acks", "all")).lower().replace("-1", "all"),
        "nemesis": _nemesis_label(test.get("nemesis")),
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


def config_name(test: Mapping[str, Any]) -> str:
    """A file-name-safe name for a configuration: acks, nemesis and the switches that are on."""
    parts = [f"acks-{test.get('acks', 'all')}", _nemesis_label(test.get("nemesis"))]
    if test.get("idempotence"):
        parts.append("idem")
    if test.get("txn"):
        parts.append("txn")
    if test.get("min_insync_replicas") is not None:
        parts.append(f"isr{test['min_insync_replicas']}")
    if test.get("unclean_leader_election"):
        parts.append("unclean")
    if test.get("truncation_mode") not in (None, "leader-epoch"):
        parts.append(str(test["truncation_mode"]))
    for name, short in zip(TIMINGS, ("lag", "zk"), strict=True):
        if test.get(name) is not None and int(test[name]) != ABSENT[name]:
            parts.append(f"{short}{int(test[name])}")
    if test.get("repeat") is not None:
        parts.append(f"r{test['repeat']}")
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", "_".join(parts))
