"""Compact per-op records for the queue checker, parsed once from the spec's op dicts.

A `QueueOp` is one completed (or never-completed, hence `info`) client op of f `send`,
`poll`, `txn`, `assign`, `subscribe` or `commit`, with its micro-ops flattened:

- `sends`: ``[(key, offset | None, value), ...]`` in micro-op order;
- `reads`: ``{key: [[offset, value], ...]}``, the reads of every poll micro-op of the op
  concatenated per key in order (Jepsen's op-reads);
- `inv` / `pos`: positions in the history of the invoke and of the completion, so
  "A completed before B was invoked" is ``A.pos < B.inv`` (the history is in the order
  the control node saw events). Ops left open at the end get positions past the end;
- `value`: an assign/subscribe's keys, a commit's ``{key: offset}`` (`commit_offsets`);
- `reb`: the completion's consumer-group `rebalance` field (`Rebalance`), or None.

Micro-ops are decoded by `checkers.queue.codec.decode_into`; malformed ones raise
`HistoryError` naming the op's line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from isrlab.checkers.history import HistoryError
from isrlab.checkers.queue.codec import (
    ASSIGN_FS,
    DATA_FS,
    NO_READS,
    NO_SENDS,
    Commit,
    check_pairs_of,
    decode,
    decode_into,
    sends_in,
)

__all__ = [
    "ASSIGN_FS",
    "DATA_FS",
    "FAIL",
    "GROUP_FS",
    "INFO",
    "OK",
    "QueueOp",
    "Rebalance",
    "check_pairs",
    "close_pending",
    "commit_offsets",
    "invoked_sends",
    "parse_ops",
    "parse_rebalance",
    "take_group_op",
    "take_op_fields",
]

OK, INFO, FAIL = 0, 1, 2
# Op fs that are recorded without micro-ops to decode: assign, subscribe, commit.
GROUP_FS = ASSIGN_FS | {"commit"}
_KIND = {"ok": OK, "info": INFO, "fail": FAIL}
_NO_INVOKE: tuple[int, None] = (-1, None)


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
        "reb",
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
        # The codec's shared empties until `decode_into` finds a send or a poll.
        self.sends: list[tuple[Any, Any, Any]] = NO_SENDS
        self.reads: dict[Any, list[Any]] = NO_READS
        self.wm: dict[str, Any] | None = None
        self.idem = False
        self.committed = kind == OK
        self.value: Any = None
        self.reb: Rebalance | None = None

    @property
    def type_name(self) -> str:
        return ("ok", "info", "fail")[self.kind]

    def describe(self) -> str:
        return f"op {self.index} (process {self.process}, {self.type_name} {self.f})"


class Rebalance:
    """A completion's ``rebalance`` field (docs/history-format.md, subscribe mode): the
    consumer-group rebalances the client saw since its previous op, taken to have
    happened during this op. `committed` (optional): the group's committed offsets the
    client fetched for the keys it was assigned, None meaning no committed offset."""

    __slots__ = ("assigned", "committed", "generation", "revoked")

    def __init__(
        self,
        generation: int | None,
        assigned: tuple[Any, ...],
        revoked: tuple[Any, ...],
        committed: dict[Any, int | None] | None,
    ) -> None:
        self.generation = generation
        self.assigned = assigned
        self.revoked = revoked
        self.committed = committed


def _keys_field(x: Any, name: str, line: int) -> tuple[Any, ...]:
    if x is None:
        return ()
    if type(x) is not list:
        raise HistoryError(f"rebalance {name!r} must be a list of keys, got {x!r}", line)
    for k in x:
        if type(k) in (list, dict):
            raise HistoryError(f"rebalance {name!r} keys must be scalars, got {k!r}", line)
    return tuple(x)


def parse_rebalance(x: Any, line: int) -> Rebalance:
    """A completion's ``rebalance`` object, checked; HistoryError saying what is wrong."""
    if type(x) is not dict:
        raise HistoryError(
            f"rebalance must be an object {{generation, assigned, revoked}}, got {x!r}", line
        )
    gen = x.get("generation")
    if gen is not None and type(gen) is not int:
        raise HistoryError(f"rebalance generation must be an integer, got {gen!r}", line)
    committed = x.get("committed")
    if committed is not None:
        if type(committed) is not dict:
            raise HistoryError(
                f"rebalance committed must be an object of key -> offset, got {committed!r}", line
            )
        for k, o in committed.items():
            if o is not None and type(o) is not int:
                raise HistoryError(
                    f"rebalance committed offset of {k!r} must be an integer or null, got {o!r}",
                    line,
                )
    return Rebalance(
        gen,
        _keys_field(x.get("assigned"), "assigned", line),
        _keys_field(x.get("revoked"), "revoked", line),
        committed,
    )


def commit_offsets(value: Any, line: int) -> dict[Any, int]:
    """A `commit` op's ``[["commit", {k: offset}], ...]``, merged into one ``{k: offset}``."""
    if type(value) is not list:
        raise HistoryError(f"commit value must be a list of micro-ops, got {value!r}", line)
    out: dict[Any, int] = {}
    for mop in value:
        try:
            m = decode(mop)
        except ValueError as e:
            raise HistoryError(str(e), line) from None
        if not isinstance(m, Commit):
            raise HistoryError(f"a commit op holds commit micro-ops only, got {mop!r}", line)
        out.update(m.offsets)
    return out


def take_op_fields(rec: QueueOp, op: dict[str, Any], line: int) -> None:
    """The completion's optional fields a data op's record keeps: watermarks, idempotence,
    the rebalance."""
    rec.wm = op.get("watermarks")
    producer = op.get("producer")
    if producer:
        rec.idem = bool(producer.get("idempotent"))
    reb = op.get("rebalance")
    if reb is not None:
        rec.reb = parse_rebalance(reb, line)


def take_group_op(
    f: str,
    kind: int,
    pos: int,
    index: int,
    inv_pos: int,
    process: Any,
    op: dict[str, Any],
    inv_op: dict[str, Any] | None,
) -> QueueOp:
    """The record of a completed assign, subscribe or commit op (and its rebalance)."""
    rec = QueueOp(f, kind, pos, index, inv_pos, process)
    value = op.get("value")
    if f == "commit":
        if value is None and inv_op is not None:
            value = inv_op.get("value")  # a fail may leave the value out
        rec.value = {} if value is None else commit_offsets(value, pos + 1)
        rec.committed = False  # "committed" is about sends: a commit is no graph node
        if inv_op is not None:
            rec.inv_index = inv_op.get("index", inv_pos)
    else:
        rec.value = value
    reb = op.get("rebalance")
    if reb is not None:
        rec.reb = parse_rebalance(reb, pos + 1)
    return rec


def check_pairs(ops: Sequence[dict[str, Any]]) -> None:
    """Strict check of every micro-op (run only to locate an error the fast path hit)."""
    for pos, op in enumerate(ops):
        if op.get("f") in DATA_FS:
            check_pairs_of(op.get("value"), pos + 1)


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
                decode_into(rec, value, pos + 1, True)
            take_op_fields(rec, op, pos + 1)
            records.append(rec)
        elif f in GROUP_FS:
            if f == "subscribe":
                saw_subscribe = True
            records.append(
                take_group_op(
                    f,
                    kinds.get(typ, INFO),
                    pos,
                    op.get("index", pos),
                    inv_pos,
                    process,
                    op,
                    inv_op,
                )
            )
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
        decode_into(rec, inv_op.get("value"), inv_pos + 1, False)
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
            for _, k, _, v in sends_in(op.get("value")):
                s = attempted.get(k)
                if s is None:
                    attempted[k] = {v}
                else:
                    s.add(v)
    return attempted
