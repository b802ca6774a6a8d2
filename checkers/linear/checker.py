"""``check(model, ops, timeout_s)``: is a history linearizable with respect to a model?

Pairs the op dicts into operations (:mod:`checkers.linear.operations`), splits them with the
model's ``partition`` (P-compositionality: the history is linearizable iff every partition is),
searches each partition (:mod:`checkers.linear.search`) and combines the verdicts: ``illegal``
if any partition is, else ``unknown`` if any search ran out of time, else ``ok``.  One timeout
covers the whole check.  Partitions are searched smallest first, so that a cheap illegal
partition is found before an expensive one; with ``stop_at_first_illegal`` the remaining
partitions are then skipped (their verdict is ``unknown``, since nobody looked).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from checkers.linear.model import Model, Operation
from checkers.linear.operations import operations_from_history
from checkers.linear.search import StateTable, search

__all__ = ["LinearizabilityResult", "PartitionResult", "check", "check_operations"]

Verdict = Literal["ok", "illegal", "unknown"]

# About 1.5 GB of memo at the sizes measured on the bench histories.
DEFAULT_MAX_CONFIGS = 4_000_000


@dataclass
class PartitionResult:
    """The verdict on one partition and, unless ok, its counterexample.

    ``linearization`` holds the operations of a full linearization (ok) or of the longest
    linearizable prefix found (illegal/unknown), in linearization order; ``blocked`` is the
    operation that cannot be placed after that prefix; ``state`` is the model state after it.
    """

    key: Any
    verdict: Verdict
    operations: list[Operation]
    linearization: list[Operation]
    blocked: Operation | None
    state: Any
    steps: int = 0
    cache_size: int = 0
    elapsed_s: float = 0.0
    checked: bool = True

    def explanation(self, model: Model) -> str:
        """A one-paragraph account of why this partition is not linearizable."""
        where = "" if self.key is None else f"key {self.key!r}: "
        if self.verdict == "ok":
            return f"{where}linearizable ({len(self.operations)} operations)"
        if not self.checked:
            return f"{where}not checked: an earlier partition settled the verdict"
        if self.verdict == "unknown":
            return (
                f"{where}search stopped before an answer; the longest linearizable prefix "
                f"found has {len(self.linearization)} of {len(self.operations)} operations"
            )
        assert self.blocked is not None
        op = self.blocked
        prefix = len(self.linearization)
        last = self.linearization[-3:]
        tail = "; ".join(_describe(model, o) for o in last)
        return (
            f"{where}no order of the operations is consistent with {model.name}. "
            f"The longest linearizable prefix has {prefix} of {len(self.operations)} "
            f"operations{' (ending ' + tail + ')' if last else ''} and leaves the state at "
            f"{model.describe_state(self.state)}; after it, {_describe(model, op)} "
            f"(process {op.process}, op index {op.invoke_index}) cannot be linearized "
            "before it returns, whatever concurrent operations are placed first."
        )


def _describe(model: Model, op: Operation) -> str:
    return model.describe_operation(op.input, op.output)


@dataclass
class LinearizabilityResult:
    """The verdict on a whole history, with one :class:`PartitionResult` per partition."""

    verdict: Verdict
    model: Model
    partitions: list[PartitionResult]
    operations: int
    failed: int
    dropped_reads: int
    elapsed_s: float
    gave_up: bool = False
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def illegal(self) -> list[PartitionResult]:
        return [p for p in self.partitions if p.verdict == "illegal"]

    @property
    def counterexamples(self) -> list[PartitionResult]:
        return self.illegal


def check(
    model: Model,
    ops: Sequence[dict[str, Any]],
    timeout_s: float | None = None,
    *,
    stop_at_first_illegal: bool = True,
    max_configs: int | None = DEFAULT_MAX_CONFIGS,
) -> LinearizabilityResult:
    """Check a history of op dicts (history format v1) against ``model``.

    ``timeout_s`` bounds the whole check; ``max_configs`` bounds the memo of each partition's
    search (memory); either one running out makes the verdict ``unknown``.  By default the
    check stops at the first illegal partition, like Porcupine: the search of a partition
    that is not linearizable can be exponential, and one counterexample settles the verdict.
    """
    started = time.monotonic()
    operations, failed, dropped = operations_from_history(model, ops)
    return check_operations(
        model,
        operations,
        timeout_s,
        stop_at_first_illegal=stop_at_first_illegal,
        max_configs=max_configs,
        failed=failed,
        dropped_reads=dropped,
        started=started,
    )


def check_operations(
    model: Model,
    operations: Sequence[Operation],
    timeout_s: float | None = None,
    *,
    stop_at_first_illegal: bool = True,
    max_configs: int | None = DEFAULT_MAX_CONFIGS,
    failed: int = 0,
    dropped_reads: int = 0,
    started: float | None = None,
) -> LinearizabilityResult:
    """Check already-paired operations (ids dense from 0) against ``model``."""
    started = time.monotonic() if started is None else started
    deadline = None if timeout_s is None else started + timeout_s
    parts = model.partition(operations) if model.partition is not None else [list(operations)]
    parts = sorted((p for p in parts if p), key=len)
    table = StateTable(model)
    results: list[PartitionResult] = []
    give_up = False
    gave_up = False
    for part in parts:
        key = part[0].key if model.partition is not None else None
        if give_up:
            results.append(
                PartitionResult(key, "unknown", part, [], None, table.states[0], checked=False)
            )
            continue
        outcome = search(model, part, deadline, table, max_configs)
        results.append(
            PartitionResult(
                key=key,
                verdict=outcome.verdict,
                operations=part,
                linearization=[part[i] for i in outcome.linearization],
                blocked=None if outcome.blocked is None else part[outcome.blocked],
                state=outcome.state,
                steps=outcome.steps,
                cache_size=outcome.cache_size,
                elapsed_s=outcome.elapsed_s,
            )
        )
        if outcome.verdict == "unknown":
            gave_up = True
            give_up = True
        elif outcome.verdict == "illegal" and stop_at_first_illegal:
            give_up = True
    verdicts = {r.verdict for r in results}
    verdict: Verdict = (
        "illegal" if "illegal" in verdicts else "unknown" if "unknown" in verdicts else "ok"
    )
    elapsed = time.monotonic() - started
    return LinearizabilityResult(
        verdict=verdict,
        model=model,
        partitions=results,
        operations=len(operations),
        failed=failed,
        dropped_reads=dropped_reads,
        elapsed_s=elapsed,
        gave_up=gave_up,
        stats={
            "operations": len(operations),
            "failed_dropped": failed,
            "indeterminate_reads_dropped": dropped_reads,
            "partitions": len(results),
            "illegal_partitions": sum(r.verdict == "illegal" for r in results),
            "unknown_partitions": sum(r.verdict == "unknown" and r.checked for r in results),
            "unchecked_partitions": sum(not r.checked for r in results),
            "backtracks": sum(r.steps for r in results),
            "cache_entries": sum(r.cache_size for r in results),
            "distinct_states": len(table.states),
            "elapsed_s": round(elapsed, 6),
            "gave_up": gave_up,
        },
    )
