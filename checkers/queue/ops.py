"""Compact per-op records for the queue checker, parsed once from the spec's op dicts.

A `QueueOp` is one completed (or never-completed, hence `info`) client op of f `send`,
`poll`, `txn`, `assign` or `subscribe`, with its micro-ops flattened:

- `sends`: ``[(key, offset | None, value), ...]`` in micro-op order;
- `reads`: ``{key: [[offset, value], ...]}``, the reads of every poll micro-op of the op
  concatenated per key in order (Jepsen's op-reads);
- `inv` / `pos`: positions in the history of the invoke and of the completion, so
  "A completed before B was invoked" is ``A.pos < B.inv`` (the history is in the order
  the control node saw events). Ops left open at the end get positions past the end.

Malformed micro-ops raise `HistoryError` naming the op's line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from isrlab.checkers.history import HistoryError

__all__ = [
    "FAIL",
    "INFO",
    "OK",
    "QueueOp",
    "check_pairs",
    "close_pending",
    "invoked_sends",
    "parse_ops",
    "take_op_fields",
]

OK, INFO, FAIL = 0, 1, 2
_KIND = {"ok": OK, "info": INFO, "fail": FAIL}
DATA_FS = frozenset(("send", "poll", "txn"))
ASSIGN_FS = frozenset(("assign", "subscribe"))
_NO_INVOKE: tuple[int, None] = (-1, None)
# Never mutated: `_parse_mops` replaces them with fresh containers before adding.
_NO_SENDS: list[tuple[Any, Any, Any]] = []
_NO_READS: dict[Any, list[Any]] = {}


class QueueOp:
    __slots__ = (
        "committed",
        "f",
        "idem",
        "index",
        "inv",
        "inv_index",
        "kind",
        "pos",
        "process",
        "reads",
        "sends",
        "value",
        "wm",
    )

    def __init__(self, f: str, kind: int, pos: int, index: int, inv: int, process: Any) -> None:
        self.f = f
        self.kind = kind
        self.pos = pos
        self.index = index
        self.inv = inv
        self.inv_index = -1
        self.process = process
        # Shared empties until `_parse_mops` finds a send or a poll: most ops have only
        # one of the two, and a million empty containers cost time to make and to free.
        self.sends: list[tuple[Any, Any, Any]] = _NO_SENDS
        self.reads: dict[Any, list[Any]] = _NO_READS
        self.wm: dict[str, Any] | None = None
        self.idem = False
        self.committed = kind == OK
        self.value: Any = None

    @property
    def type_name(self) -> str:
        return ("ok", "info", "fail")[self.kind]

    def describe(self) -> str:
        return f"op {self.index} (process {self.process}, {self.type_name} {self.f})"


def _parse_mops(rec: QueueOp, value: Any, line: int, with_reads: bool) -> None:
    if value is None:
        return
    if type(value) is not list:
        raise HistoryError(f"{rec.f} value must be a list of micro-ops, got {value!r}", line)
    sends = rec.sends
    reads = rec.reads
    for mop in value:
        if type(mop) is not list or not mop:
            raise HistoryError(f"micro-op must be a non-empty list, got {mop!r}", line)
        name = mop[0]
        if name == "send":
            if len(mop) != 3:
                raise HistoryError(f"send micro-op must be [send, key, value], got {mop!r}", line)
            x = mop[2]
            if type(x) is list:
                if len(x) != 2:
                    raise HistoryError(f"send result must be [offset, value], got {x!r}", line)
                item = (mop[1], x[0], x[1])
            else:
                item = (mop[1], None, x)
            if sends is _NO_SENDS:
                rec.sends = sends = [item]
            else:
                sends.append(item)
        elif name == "poll":
            if not with_reads or len(mop) < 2 or mop[1] is None:
                continue
            m = mop[1]
            if type(m) is not dict:
                raise HistoryError(
                    f"poll result must be an object of key -> pairs, got {m!r}", line
                )
            if reads is _NO_READS:
                rec.reads = reads = {}
            for k, pairs in m.items():
                if type(pairs) is not list:
                    raise HistoryError(f"poll result for {k!r} must be a list of pairs", line)
                have = reads.get(k)
                if have is None:
                    reads[k] = pairs
                else:
                    reads[k] = have + pairs
        else:
            raise HistoryError(f"unknown micro-op {name!r} (expected send or poll)", line)


def take_op_fields(rec: QueueOp, op: dict[str, Any]) -> None:
    """The completion's optional fields a data op's record keeps: watermarks, idempotence."""
    rec.wm = op.get("watermarks")
    producer = op.get("producer")
    if producer:
        rec.idem = bool(producer.get("idempotent"))


def check_pairs(ops: Sequence[dict[str, Any]]) -> None:
    """Strict check of every micro-op (run only to locate an error the fast path hit)."""
    for pos, op in enumerate(ops):
        value = op.get("value")
        if op.get("f") not in DATA_FS or type(value) is not list:
            continue
        line = pos + 1
        for mop in value:
            if type(mop) is list and len(mop) >= 2 and mop[0] == "poll" and type(mop[1]) is dict:
                for pairs in mop[1].values():
                    for pair in pairs:
                        if type(pair) is not list or len(pair) != 2:
                            raise HistoryError(
                                f"poll pair must be [offset, value], got {pair!r}", line
                            )
                        _check_pair(pair[0], pair[1], line)
            if type(mop) is list and len(mop) == 3 and mop[0] == "send":
                x = mop[2]
                if type(x) is list:
                    if len(x) != 2:
                        raise HistoryError(f"send result must be [offset, value], got {x!r}", line)
                    _check_pair(x[0], x[1], line)
                else:
                    _check_pair(None, x, line)


def _check_pair(offset: Any, value: Any, line: int) -> None:
    if offset is not None and type(offset) is not int:
        raise HistoryError(f"offset must be an integer or null, got {offset!r}", line)
    if type(value) in (list, dict):
        raise HistoryError(f"values must be JSON scalars, got {value!r}", line)


def parse_ops(ops: Sequence[dict[str, Any]]) -> tuple[list[QueueOp], bool]:
    """Parse client ops into `QueueOp`s in completion order.

    Returns (records, saw_subscribe).
    """
    records: list[QueueOp] = []
    pending: dict[Any, tuple[int, dict[str, Any]]] = {}
    saw_subscribe = False
    kinds = _KIND
    for pos, op in enumerate(ops):
        process = op["process"]
        if process == "nemesis":
            continue
        typ = op["type"]
        f = op["f"]
        if typ == "invoke":
            pending[process] = (pos, op)
            continue
        inv_pos, inv_op = pending.pop(process, _NO_INVOKE)
        if f in DATA_FS:
            rec = QueueOp(f, kinds.get(typ, INFO), pos, op.get("index", pos), inv_pos, process)
            if inv_op is not None:
                rec.inv_index = inv_op.get("index", inv_pos)
            value = op.get("value")
            if value is not None:
                _parse_mops(rec, value, pos + 1, True)
            take_op_fields(rec, op)
            records.append(rec)
        elif f in ASSIGN_FS:
            if f == "subscribe":
                saw_subscribe = True
            rec = QueueOp(f, kinds.get(typ, INFO), pos, op.get("index", pos), inv_pos, process)
            rec.value = op.get("value")
            records.append(rec)
    return records, close_pending(pending, len(ops), records) or saw_subscribe


def close_pending(
    pending: dict[Any, tuple[int, dict[str, Any]]], end: int, records: list[QueueOp]
) -> bool:
    """Append a record for every invoke never completed, placed from position `end` on:
    it counts as info, as it may have happened at any later time. True if one of them is
    a subscribe."""
    saw_subscribe = False
    for process, (inv_pos, inv_op) in pending.items():
        f = inv_op["f"]
        if f == "subscribe":
            saw_subscribe = True
        if f not in DATA_FS:
            continue
        rec = QueueOp(f, INFO, end, inv_op.get("index", inv_pos), inv_pos, process)
        rec.inv_index = rec.index
        end += 1
        _parse_mops(rec, inv_op.get("value"), inv_pos + 1, False)
        records.append(rec)
    return saw_subscribe


def invoked_sends(ops: Iterable[dict[str, Any]]) -> dict[Any, set[Any]]:
    """key -> every value a `send` or `txn` invoke tried to send to it.

    With the values of completed sends (the checker's writers), this is everything any
    op tried to send: a value read outside both is a garbage read. Only computed when
    some read value has no writer.
    """
    attempted: dict[Any, set[Any]] = {}
    for op in ops:
        if op["process"] == "nemesis" or op["type"] != "invoke":
            continue
        f = op["f"]
        if f == "send" or f == "txn":
            value = op.get("value")
            if type(value) is list:
                for mop in value:
                    if type(mop) is list and len(mop) == 3 and mop[0] == "send":
                        k, v = mop[1], mop[2]
                        if type(v) is list and len(v) == 2:
                            v = v[1]
                        s = attempted.get(k)
                        if s is None:
                            attempted[k] = {v}
                        else:
                            s.add(v)
    return attempted
