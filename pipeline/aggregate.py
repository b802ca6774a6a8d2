"""Per-configuration figures: anomaly rates per 10,000 acknowledged writes with intervals.

A configuration is one value of `pipeline.store.CONFIG_COLUMNS`. Spark computes the
sums (`pipeline.analyze`); this module turns them into the published figures:

- ``rate`` of an anomaly type = count / acked writes x 10,000;
- its 95 % interval: Wilson's score interval for the proportion count / acked writes
  (valid when every case involves a distinct acknowledged write, as lost writes do);
  when a type counts more cases than there are acked writes (it counts reads or
  offsets) the proportion model does not apply and a Poisson normal interval
  count +- 1.96 sqrt(count) is used;
- ``invalid`` = the cases of every type not allowed by default (DEFAULT_ALLOWED of
  checkers.queue.policy): the headline number of the matrix;
- worst cases: per configuration, the runs with the highest invalid-anomaly rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from isrlab.checkers.queue.policy import DEFAULT_ALLOWED
from isrlab.pipeline.store import CONFIG_COLUMNS

__all__ = ["PER", "Z95", "config_key", "rate_interval", "summarize"]

PER = 10_000
Z95 = 1.959963984540054
HEADLINE = "invalid"


def rate_interval(count: int, acked: int, z: float = Z95) -> tuple[float, float, float] | None:
    """(rate, low, high) per 10,000 acked writes; None when nothing was acknowledged."""
    if acked <= 0:
        return None
    rate = count / acked * PER
    if count <= acked:
        p = count / acked
        denom = 1 + z * z / acked
        centre = (p + z * z / (2 * acked)) / denom
        half = z * math.sqrt(p * (1 - p) / acked + z * z / (4 * acked * acked)) / denom
        low = 0.0 if count == 0 else max(0.0, centre - half) * PER  # exact, not 1e-14
        return rate, low, min(1.0, centre + half) * PER
    half = z * math.sqrt(count)
    return rate, max(0.0, count - half) / acked * PER, (count + half) / acked * PER


def config_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[c] for c in CONFIG_COLUMNS)


def _rate_dict(count: int, acked: int) -> dict[str, Any]:
    r = rate_interval(count, acked)
    if r is None:
        return {"count": count, "rate": None, "low": None, "high": None}
    return {"count": count, "rate": r[0], "low": r[1], "high": r[2]}


def summarize(
    configs: Iterable[Mapping[str, Any]],
    type_counts: Iterable[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    worst: int = 3,
    unseen_classes: Iterable[Mapping[str, Any]] = (),
    contested_classes: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One dict per configuration from Spark's sums, sorted by configuration.

    configs (checked runs only): CONFIG_COLUMNS + runs, valid, invalid, unknown,
    acked_writes. type_counts: CONFIG_COLUMNS + type, count, runs_with. runs: per-run
    rows with CONFIG_COLUMNS + run_id, path, valid, acked_writes, invalid_count.
    unseen_classes: CONFIG_COLUMNS + class, count (checkers.unseen's classes of unread
    acknowledged writes), summed into each configuration's ``unseen_classes``.
    contested_classes: the same for the values of committed-truncation and inconsistent-offsets
    cases classed at their offset (checkers.unseen.classify_offsets), summed into each
    configuration's ``contested_classes``.
    """
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in configs:
        entry = {col: c[col] for col in CONFIG_COLUMNS}
        entry["runs"] = int(c["runs"] or 0)
        for f in ("valid", "invalid", "unknown"):
            entry[f"runs_{f}"] = int(c[f] or 0)
        entry["acked_writes"] = int(c["acked_writes"] or 0)
        entry["anomalies"] = {}
        entry["unseen_classes"] = {}
        entry["contested_classes"] = {}
        entry["worst"] = []
        out[config_key(c)] = entry
    for t in type_counts:
        entry = out[config_key(t)]
        slot = _rate_dict(int(t["count"]), entry["acked_writes"])
        slot["runs_with"] = int(t["runs_with"])
        slot["allowed_by_default"] = t["type"] in DEFAULT_ALLOWED
        entry["anomalies"][t["type"]] = slot
    for u in unseen_classes:
        entry = out[config_key(u)]
        entry["unseen_classes"][u["class"]] = int(u["count"])
    for u in contested_classes:
        entry = out[config_key(u)]
        entry["contested_classes"][u["class"]] = int(u["count"])
    for entry in out.values():
        entry["unseen_classes"] = dict(sorted(entry["unseen_classes"].items()))
        entry["contested_classes"] = dict(sorted(entry["contested_classes"].items()))
        invalid = sum(
            a["count"] for name, a in entry["anomalies"].items() if name not in DEFAULT_ALLOWED
        )
        entry[HEADLINE] = _rate_dict(invalid, entry["acked_writes"])
        entry["anomalies"] = dict(sorted(entry["anomalies"].items()))
    by_config: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in runs:
        if r.get("valid") is not None:
            by_config.setdefault(config_key(r), []).append(r)
    for key, members in by_config.items():
        ranked = sorted(
            members,
            key=lambda r: (
                -(int(r["invalid_count"] or 0) / max(1, int(r["acked_writes"] or 0))),
                r["run_id"],
            ),
        )
        out[key]["worst"] = [
            {
                "run_id": r["run_id"],
                "path": r["path"],
                "valid": r["valid"],
                "invalid_count": int(r["invalid_count"] or 0),
                "acked_writes": int(r["acked_writes"] or 0),
                "rate": (int(r["invalid_count"] or 0) / int(r["acked_writes"]) * PER)
                if r["acked_writes"]
                else None,
            }
            for r in ranked[:worst]
            if int(r["invalid_count"] or 0) > 0
        ]
    return [out[k] for k in sorted(out, key=lambda k: tuple(str(x) for x in k))]
