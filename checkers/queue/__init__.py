"""The queue (Kafka-like log) checker: `check_queue(ops) -> results dict`.

Per-key use (the Spark pipeline, when no transaction spans keys): `keys_of(ops)`, then
`check_queue(project_key(ops, k))` for each key, then `merge_results([...])`. Cross-key
cycles (G0/G1c...) are only visible to a whole-history check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from isrlab.checkers.queue.analysis import QueueAnalysis, check_queue
from isrlab.checkers.queue.codec import (
    ASSIGN_FS,
    COMMIT,
    POLL,
    SEND,
    poll_result,
    polls_in,
    sends_in,
)
from isrlab.checkers.queue.policy import ALL_TYPES, DEFAULT_ALLOWED, allowed_types
from isrlab.checkers.queue.results import merge_results

__all__ = [
    "ALL_TYPES",
    "DEFAULT_ALLOWED",
    "QueueAnalysis",
    "allowed_types",
    "check_queue",
    "keys_of",
    "merge_results",
    "project_key",
]


def keys_of(ops: Sequence[dict[str, Any]]) -> list[Any]:
    """Every key a queue history sends to, polls or assigns, sorted by str."""
    keys: set[Any] = set()
    for op in ops:
        if op.get("process") == "nemesis":
            continue
        value = op.get("value")
        if not isinstance(value, list):
            continue
        if op.get("f") in ASSIGN_FS:
            keys.update(value)
            continue
        if op.get("f") == "commit":
            for mop in value:
                if isinstance(mop, list) and len(mop) == 2 and isinstance(mop[1], dict):
                    keys.update(mop[1])
            continue
        keys.update(k for _, k, _, _ in sends_in(value))
        for _, reads in polls_in(value):
            keys.update(reads)
    return sorted(keys, key=str)


def _project_value(f: str, value: Any, key: Any) -> Any:
    if not isinstance(value, list):
        return value
    if f in ASSIGN_FS:
        return [k for k in value if k == key]
    if f == "commit":
        return [
            [COMMIT, {key: mop[1][key]} if key in mop[1] else {}]
            if isinstance(mop, list) and len(mop) == 2 and isinstance(mop[1], dict)
            else mop
            for mop in value
        ]
    out = []
    for mop in value:
        if not isinstance(mop, list) or not mop:
            out.append(mop)
        elif mop[0] == SEND:
            if len(mop) >= 2 and mop[1] == key:
                out.append(mop)
        elif mop[0] == POLL and len(mop) >= 2 and isinstance(mop[1], dict):
            out.append(poll_result({key: mop[1][key]} if key in mop[1] else {}))
        else:
            out.append(mop)
    return out


def _project_rebalance(reb: dict[str, Any], key: Any) -> dict[str, Any]:
    out = dict(reb)
    for name in ("assigned", "revoked"):
        if isinstance(reb.get(name), list):
            out[name] = [k for k in reb[name] if k == key]
    committed = reb.get("committed")
    if isinstance(committed, dict):
        out["committed"] = {key: committed[key]} if key in committed else {}
    return out


def project_key(ops: Sequence[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    """The history as seen by one key: every client op with micro-ops of other keys removed.

    Op indexes are kept (examples still name the original ops); watermarks, commits and
    rebalances keep only `key` (a rebalance stays, emptied, so the key's history still
    records rebalances).
    """
    out: list[dict[str, Any]] = []
    for op in ops:
        if op.get("process") == "nemesis":
            continue
        p = dict(op)
        p["value"] = _project_value(op.get("f", ""), op.get("value"), key)
        wm = op.get("watermarks")
        if wm:
            p["watermarks"] = {key: wm[key]} if key in wm else {}
        reb = op.get("rebalance")
        if isinstance(reb, dict):
            p["rebalance"] = _project_rebalance(reb, key)
        out.append(p)
    return out
