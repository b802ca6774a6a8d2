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

import multiprocessing
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from isrlab.checkers.linear.model import Model, Operation
from isrlab.checkers.linear.operations import operations_from_history
from isrlab.checkers.linear.search import SearchOutcome, StateTable, search

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


def _settles(outcome: SearchOutcome, stop_at_first_illegal: bool) -> bool:
    """Whether the remaining partitions need not be searched after this outcome."""
    return outcome.verdict == "unknown" or (outcome.verdict == "illegal" and stop_at_first_illegal)


# The job forked worker processes read (set just before the fork, so nothing is pickled
# on the way in: models are full of lambdas).
_FORK_JOB: tuple[Model, list[list[Operation]], float | None, int | None] | None = None


def _search_forked(index: int) -> tuple[int, SearchOutcome]:
    assert _FORK_JOB is not None
    model, parts, deadline, max_configs = _FORK_JOB
    return index, search(model, parts[index], deadline, None, max_configs)


def _search_in_parallel(
    model: Model,
    parts: list[list[Operation]],
    deadline: float | None,
    max_configs: int | None,
    workers: int,
    stop_at_first_illegal: bool,
) -> dict[int, SearchOutcome]:
    global _FORK_JOB
    outcomes: dict[int, SearchOutcome] = {}
    # Largest first: the longest searches start at once and the small ones fill in.
    order = sorted(range(len(parts)), key=lambda i: -len(parts[i]))
    _FORK_JOB = (model, parts, deadline, max_configs)
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(min(workers, len(parts))) as pool:
            for index, outcome in pool.imap_unordered(_search_forked, order):
                outcomes[index] = outcome
                if _settles(outcome, stop_at_first_illegal):
                    break  # leaving the block terminates the other searches
    finally:
        _FORK_JOB = None
    return outcomes


def check(
    model: Model,
    ops: Sequence[dict[str, Any]],
    timeout_s: float | None = None,
    *,
    stop_at_first_illegal: bool = True,
    max_configs: int | None = DEFAULT_MAX_CONFIGS,
    workers: int = 1,
) -> LinearizabilityResult:
    """Check a history of op dicts (history format v1) against ``model``.

    ``timeout_s`` bounds the whole check; ``max_configs`` bounds the memo of each partition's
    search (memory); either one running out makes the verdict ``unknown``.  By default the
    check stops at the first illegal partition, like Porcupine: the search of a partition
    that is not linearizable can be exponential, and one counterexample settles the verdict.
    ``workers`` > 1 searches partitions in that many forked processes (largest first), as
    Porcupine does with goroutines; the model's states must then be picklable.
    """
    started = time.monotonic()
    operations, failed, dropped = operations_from_history(model, ops)
    return check_operations(
        model,
        operations,
        timeout_s,
        stop_at_first_illegal=stop_at_first_illegal,
        max_configs=max_configs,
        workers=workers,
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
    workers: int = 1,
    failed: int = 0,
    dropped_reads: int = 0,
    started: float | None = None,
) -> LinearizabilityResult:
    """Check already-paired operations (ids dense from 0) against ``model``."""
    started = time.monotonic() if started is None else started
    deadline = None if timeout_s is None else started + timeout_s
    parts = model.partition(operations) if model.partition is not None else [list(operations)]
    parts = sorted((p for p in parts if p), key=len)
    # Forking a process that runs other threads can deadlock the child on a lock one of them
    # held (seen when Kafka clients had run earlier in the same process): search in parallel
    # only from a single-threaded process, otherwise search here, one partition after another.
    if workers > 1 and len(parts) > 1 and threading.active_count() == 1:
        outcomes = _search_in_parallel(
            model, parts, deadline, max_configs, workers, stop_at_first_illegal
        )
        # Each worker interns its own states: an upper bound on the distinct ones.
        distinct_states = sum(o.states_seen for o in outcomes.values())
    else:
        outcomes = {}
        table = StateTable(model)
        for index, part in enumerate(parts):
            outcome = search(model, part, deadline, table, max_configs)
            outcomes[index] = outcome
            if _settles(outcome, stop_at_first_illegal):
                break
        distinct_states = len(table.states)
    initial = model.init()
    results: list[PartitionResult] = []
    for index, part in enumerate(parts):
        key = part[0].key if model.partition is not None else None
        found = outcomes.get(index)
        if found is None:
            results.append(PartitionResult(key, "unknown", part, [], None, initial, checked=False))
            continue
        results.append(
            PartitionResult(
                key=key,
                verdict=found.verdict,
                operations=part,
                linearization=[part[i] for i in found.linearization],
                blocked=None if found.blocked is None else part[found.blocked],
                state=found.state,
                steps=found.steps,
                cache_size=found.cache_size,
                elapsed_s=found.elapsed_s,
            )
        )
    gave_up = any(o.verdict == "unknown" for o in outcomes.values())
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
            "distinct_states": distinct_states,
            "elapsed_s": round(elapsed, 6),
            "gave_up": gave_up,
        },
    )
