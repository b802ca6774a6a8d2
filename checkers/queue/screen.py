"""The native screen: proving a queue history anomaly-free without building the checker's records.

Most histories a nightly suite checks have no anomaly at all, and for those the whole
explaining machinery of `checkers.queue.analysis` (per-op records, version-order dicts,
case builders) is spent on finding nothing. The screen (`_screen.pyx`, compiled
Cython/C++) reads the spec's op dicts into flat arrays and runs the same passes as
detectors. It answers one of two things:

- the history has no anomaly: `ScreenResult.stats` holds the checker's stats, exactly
  as `QueueAnalysis` computes them, and the results are built from them (valid, no
  anomaly types);
- some pass of the checker would record an anomaly, or the history is outside what
  the screen reads (among them any `commit` op or `rebalance` field: the subscribe-mode
  rules of `checkers.queue.group` are the checker's alone) (non-integer values or offsets, reads without offsets, anything the
  fast loader would not accept): `ScreenResult.needs_checker` says which, and the
  caller runs the explaining checker, which gives the verdict and its explanations.

Asked to (`max_examples`), the screen also explains a history with anomalies itself
(`ScreenResult.explained`, from `checkers.queue.native`), with the checker's results.

So the screen decides nothing on its own: it may send a history to the checker for no
reason (that costs time, never correctness), but must never call a history clean that
the checker would flag. tests/checkers/test_queue_screen.py holds it to that on
simulated, mutated and hand-written histories.

The compiled module is built by `pip install -e .` (setup.py); without it `AVAILABLE`
is False and every history goes to the checker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from isrlab.checkers.history import gc_paused
from isrlab.checkers.queue.load import parse_blocks

try:
    from isrlab.checkers.queue._screen import GiveUp, Screen
except ImportError:  # not built: the checker alone
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "ScreenResult", "screen_file", "screen_ops"]


def _reread_all(path: Path) -> Iterable[Any]:
    for ops, _size in parse_blocks(path):
        yield from ops


@dataclass(frozen=True)
class ScreenResult:
    """`stats` when the history has no anomaly; otherwise why the checker must look."""

    stats: dict[str, Any] | None
    saw_subscribe: bool = False
    n_ops: int = 0
    needs_checker: str = ""
    # With `explain`: the checker's findings, made by the native core
    # (`checkers.queue.native.NativeAnalysis`), when the history has anomalies.
    explained: Any = None


# What `_run` needs to explain a history with anomalies natively: the example budget,
# and the history's op dicts again (`checkers.queue.native.explain`).
Explain = tuple[int, Callable[[], Iterable[Any]]]


# What the screen finds in a prefix of a history and more ops cannot undo, so that the
# screen of the whole history would send it to the checker as well: an offset with two
# values, a value at two offsets, order broken between indexes that more observations
# only push further apart, a dependency cycle.
PERSISTENT = frozenset(
    (
        "inconsistent-offsets",
        "duplicate",
        "int-poll-skip or int-nonmonotonic-poll",
        "poll-skip or nonmonotonic-poll",
        "nonmonotonic-send",
        "int-send-skip",
        "int-nonmonotonic-send",
        "realtime-send-order",
        "hw-regression",
        "dependency cycle",
        "consumer-group commits or rebalances",
    )
)
PROBE_OPS = 8192  # ops screened on their own first (`_run`)
_SLICE = 8192  # ops per feed of a list


def _run(
    batches: Iterable[list[Any]], ww_deps: bool, explain: Explain | None = None
) -> ScreenResult:
    """Feed the screen, and answer.

    A history with anomalies costs the screen and then the checker. Many such histories
    show an anomaly all along (interleaved transactions: dependencies against
    completion order everywhere), so the first `PROBE_OPS` ops are also screened on
    their own: if they show an anomaly in `PERSISTENT`, the whole history is sent to
    the checker at once. The probe only chooses the path; results are the checker's or
    the whole screen's either way.

    With `explain`, a history with anomalies is not handed over: the whole history is
    fed, and the native core finds and counts every case (`checkers.queue.native`);
    only what it leaves to the checker is handed over.
    """
    if not AVAILABLE:
        return ScreenResult(None, needs_checker="the native screen is not built")
    sc = Screen()
    probe: Screen | None = Screen()
    try:
        with gc_paused():  # op dicts hold no cycles: nothing for the collector to find
            for ops in batches:
                sc.feed(ops)
                if probe is not None:
                    probe.feed(ops)
                    if probe.pos >= PROBE_OPS:
                        early = probe.finish(ww_deps, True)
                        probe = None
                        if isinstance(early, str) and early in PERSISTENT and not explain:
                            return ScreenResult(
                                None, needs_checker=f"{early} (in the first {PROBE_OPS:,} ops)"
                            )
            verdict = sc.finish(ww_deps)
            if isinstance(verdict, str) and explain is not None and not sc.saw_group:
                from isrlab.checkers.queue.native import explain as explain_natively

                explained = explain_natively(sc, ww_deps, explain[0], explain[1])
                if explained is not None:
                    return ScreenResult(
                        None, sc.saw_subscribe, sc.pos, needs_checker=verdict, explained=explained
                    )
    except GiveUp:
        return ScreenResult(None, needs_checker="outside what the screen reads")
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        # An op shape the screen did not expect: the checker words what is wrong.
        return ScreenResult(None, needs_checker=f"outside what the screen reads ({e!r})")
    if isinstance(verdict, str):
        return ScreenResult(None, sc.saw_subscribe, sc.pos, needs_checker=verdict)
    return ScreenResult(verdict, sc.saw_subscribe, sc.pos)


def screen_ops(
    ops: list[dict[str, Any]], *, ww_deps: bool = True, max_examples: int | None = None
) -> ScreenResult:
    """Screen a history given as the spec's op dicts (with `max_examples`, explain one with
    anomalies natively)."""
    explain = None if max_examples is None else (max_examples, lambda: ops)
    return _run((ops[i : i + _SLICE] for i in range(0, len(ops), _SLICE)), ww_deps, explain)


def screen_file(
    path: Path, *, ww_deps: bool = True, max_examples: int | None = None
) -> ScreenResult:
    """Screen a history.jsonl file; any blank or malformed line sends it to the checker
    (whose loader says what and where). With `max_examples`, explain one with anomalies
    natively."""
    if not AVAILABLE:
        return _run((), ww_deps)
    explain = None if max_examples is None else (max_examples, lambda: _reread_all(Path(path)))
    try:
        return _run((ops for ops, _size in parse_blocks(Path(path))), ww_deps, explain)
    except (orjson.JSONDecodeError, OSError) as e:
        return ScreenResult(None, needs_checker=f"unreadable here ({e.__class__.__name__})")
