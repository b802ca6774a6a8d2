"""Collecting anomaly cases into the spec's results dict, and merging per-key results.

`Anomalies` counts every case and keeps the first `max_examples` per name; building an
example is only built when `hit()` says there is room, so that a history with a million
cases does not format a million explanations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Anomalies", "merge_results", "results_dict"]


class Anomalies:
    __slots__ = ("counts", "examples", "max_examples")

    def __init__(self, max_examples: int = 32) -> None:
        self.max_examples = max_examples
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[dict[str, Any]]] = {}

    def hit(self, name: str, count: int = 1) -> bool:
        """Count `count` cases of `name`; True when the caller should record an example."""
        self.counts[name] = self.counts.get(name, 0) + count
        ex = self.examples.setdefault(name, [])
        return len(ex) < self.max_examples

    def example(self, name: str, case: dict[str, Any]) -> None:
        self.examples.setdefault(name, []).append(case)

    def add(self, name: str, case: dict[str, Any], count: int = 1) -> None:
        if self.hit(name, count):
            self.example(name, case)

    def add_all(self, name: str, cases: Iterable[dict[str, Any]]) -> None:
        for case in cases:
            self.add(name, case)

    def types(self) -> list[str]:
        return sorted(n for n, c in self.counts.items() if c > 0)


def results_dict(
    anomalies: Anomalies, allowed: frozenset[str], stats: Mapping[str, Any]
) -> dict[str, Any]:
    types = anomalies.types()
    bad = [t for t in types if t not in allowed]
    return {
        "valid": not bad,
        "anomaly_types": types,
        "anomalies": {
            t: {"count": anomalies.counts[t], "examples": anomalies.examples.get(t, [])}
            for t in types
        },
        "not_allowed": bad,
        "stats": dict(stats),
    }


def merge_results(results: Iterable[Mapping[str, Any]], max_examples: int = 32) -> dict[str, Any]:
    """Combine results of independent parts (e.g. one per key) into one results dict.

    valid is false if any part is invalid, else "unknown" if any part is unknown; counts
    and numeric stats add up; examples are concatenated up to `max_examples` per name.
    """
    valid: bool | str = True
    anomalies: dict[str, dict[str, Any]] = {}
    stats: dict[str, Any] = {}
    not_allowed: set[str] = set()
    for r in results:
        v = r.get("valid")
        if v is False:
            valid = False
        elif v == "unknown" and valid is True:
            valid = "unknown"
        not_allowed.update(r.get("not_allowed", ()))
        for name, a in r.get("anomalies", {}).items():
            slot = anomalies.setdefault(name, {"count": 0, "examples": []})
            slot["count"] += a.get("count", 0)
            room = max_examples - len(slot["examples"])
            if room > 0:
                slot["examples"].extend(a.get("examples", [])[:room])
        for k, x in r.get("stats", {}).items():
            if isinstance(x, int | float) and not isinstance(x, bool):
                stats[k] = stats.get(k, 0) + x
    return {
        "valid": valid,
        "anomaly_types": sorted(anomalies),
        "anomalies": dict(sorted(anomalies.items())),
        "not_allowed": sorted(not_allowed),
        "stats": stats,
    }
