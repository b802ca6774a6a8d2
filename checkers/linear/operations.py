"""Pairing a history's op dicts into :class:`~checkers.linear.model.Operation` values.

Rules (history format v1): an invoke starts an operation of its process; the process's next
completion ends it.  ``ok`` gives a determinate operation over ``[invoke time, ok time]``;
``fail`` means it never happened and drops it; ``info`` (or no completion by the end of the
history) makes it indeterminate: output ``UNKNOWN``, return time ``+inf``.  Nemesis operations
are not operations of the checked object and are skipped.  Indeterminate operations the model
calls read-only are dropped too: they can be linearized anywhere without changing anything.

When any op lacks ``time``, every op's position in the history stands in for its time (the
order of events is all the check needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from isrlab.checkers.linear.model import INFINITY, UNKNOWN, Model, Operation

__all__ = ["HistoryError", "operations_from_history"]


class HistoryError(ValueError):
    """The history cannot be read as a sequence of operations (with a reason and op index)."""


def operations_from_history(
    model: Model, ops: Sequence[dict[str, Any]]
) -> tuple[list[Operation], int, int]:
    """Pair invokes with completions; returns (operations, failed count, dropped reads)."""
    use_index_as_time = any("time" not in op for op in ops)
    pending: dict[Any, tuple[int, dict[str, Any]]] = {}
    paired: list[tuple[int, dict[str, Any], int | None, dict[str, Any] | None]] = []
    failed = 0
    for position, op in enumerate(ops):
        try:
            process = op["process"]
            kind = op["type"]
        except KeyError as missing:
            raise HistoryError(
                f"op {position}: missing field {missing}; every op needs process and type"
            ) from None
        if process == "nemesis":
            continue
        if kind == "invoke":
            if process in pending:
                raise HistoryError(
                    f"op {position}: process {process!r} invokes again before op "
                    f"{pending[process][0]} completed; a process runs one op at a time"
                )
            if "f" not in op:
                raise HistoryError(f"op {position}: an invoke needs an f")
            pending[process] = (position, op)
        elif kind in ("ok", "fail", "info"):
            started = pending.pop(process, None)
            if started is None:
                raise HistoryError(
                    f"op {position}: {kind} completion of process {process!r} "
                    "without a preceding invoke"
                )
            if kind == "fail":
                failed += 1
                continue
            paired.append((started[0], started[1], position, op))
        else:
            raise HistoryError(f"op {position}: type {kind!r} is not one of invoke, ok, fail, info")
    for position, op in pending.values():
        paired.append((position, op, None, None))
    paired.sort(key=lambda item: item[0])

    result: list[Operation] = []
    dropped = 0
    for invoke_position, invoke, complete_position, completion in paired:
        call = float(invoke_position if use_index_as_time else invoke["time"])
        indeterminate = completion is None or completion["type"] == "info"
        model_input = model.input_of(invoke)
        if indeterminate and model.read_only is not None and model.read_only(model_input):
            dropped += 1
            continue
        if indeterminate:
            ret = INFINITY
            output = UNKNOWN
        else:
            assert completion is not None and complete_position is not None
            ret = float(complete_position if use_index_as_time else completion["time"])
            output = model.output_of(invoke, completion)
        result.append(
            Operation(
                id=len(result),
                process=invoke["process"],
                f=str(invoke["f"]),
                key=invoke.get("key"),
                call=call,
                ret=ret,
                input=model_input,
                output=output,
                invoke_index=invoke.get("index", invoke_position),
                complete_index=(
                    None if completion is None else completion.get("index", complete_position)
                ),
                error=None if completion is None else completion.get("error"),
            )
        )
    return result, failed, dropped
