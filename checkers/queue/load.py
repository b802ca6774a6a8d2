"""Loading a queue history file straight into `QueueOp` records (what `isrlab check` uses).

`load_history` builds every op of the file as the spec's op dict, validates them and
hands the list to the checker, which converts them into compact `QueueOp` records and
from then on only reads those. For a million ops the dicts are gigabytes of small
objects whose allocation (page faults) costs more than parsing them. `load_queue` reads
the file in small blocks instead, parses each block with one orjson call, validates and
converts its ops as `validate` and `parse_ops` would, and lets the dicts die with the
block: only the records (and the few invokes still open) stay.

The result is a `QueueHistory`, which `check_queue` accepts in place of a list of op
dicts and checks to the same results. Anything the fast path does not handle exactly as
the dict path (blank lines, malformed JSON, any validation or micro-op error: anything
raised) makes `load_queue` give up and return `load_history`'s op dicts instead, so
errors are the dict path's own, word for word; `check_queue` likewise checks the op
dicts again when the check of the records fails. Op dicts are re-read from the file on
demand (iterating a `QueueHistory`) for what needs them: the garbage-read check's
invoked values (only when some value read has no writer) and rendered artefacts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from isrlab.checkers.history import OP_TYPES, gc_paused, load_history
from isrlab.checkers.queue.codec import DATA_FS, decode_into
from isrlab.checkers.queue.ops import (
    GROUP_FS,
    QueueOp,
    close_pending,
    take_group_op,
    take_op_fields,
)

__all__ = ["QueueFile", "QueueHistory", "load_queue", "parse_blocks"]

_BLOCK = 1 << 16  # bytes per orjson call: small enough that its objects stay in cache
_KIND = {"ok": 0, "info": 1, "fail": 2}


class _GiveUp(Exception):
    """The fast path cannot vouch for this file; load it the ordinary way."""


class QueueHistory:
    """A validated queue history as `QueueOp` records (see the module doc).

    `len()` is the number of ops (history lines); iterating yields the spec's op dicts,
    re-read from the file.
    """

    __slots__ = ("n_ops", "path", "records", "saw_subscribe", "size")

    def __init__(
        self, path: Path, records: list[QueueOp], saw_subscribe: bool, n_ops: int, size: int
    ) -> None:
        self.path = path
        self.records = records
        self.saw_subscribe = saw_subscribe
        self.n_ops = n_ops
        self.size = size  # bytes of the file that were read

    def __len__(self) -> int:
        return self.n_ops

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _reread(self.path, self.size)

    def op_dicts(self) -> list[dict[str, Any]]:
        """The whole history as op dicts, as `load_history` gives it."""
        return load_history(self.path)


class QueueFile:
    """A queue history file not loaded yet: what `isrlab check` hands `check_queue`.

    `check_queue` first screens the file natively (`checkers.queue.screen`); only a
    history the screen cannot prove clean is loaded (`load`, once) and checked by the
    explaining checker. Iterating yields the spec's op dicts, re-read from the file.
    """

    __slots__ = ("_loaded", "n_ops", "path")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.n_ops: int | None = None  # known once screened or loaded
        self._loaded: QueueHistory | list[dict[str, Any]] | None = None

    def load(self) -> QueueHistory | list[dict[str, Any]]:
        """`load_queue` of the file, made once."""
        if self._loaded is None:
            self._loaded = load_queue(self.path)
            self.n_ops = len(self._loaded)
        return self._loaded

    def __len__(self) -> int:
        if self.n_ops is None:
            self.n_ops = sum(1 for _ in self)
        return self.n_ops

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._loaded is not None:
            return iter(self._loaded)
        return _reread(self.path, self.path.stat().st_size)


def _reread(path: Path, size: int) -> Iterator[dict[str, Any]]:
    """The op dicts of the first `size` bytes of the file (what `load_queue` read)."""
    done = 0
    with Path(path).open("rb") as fh:
        for raw in fh:
            done += len(raw)
            if done > size:
                raw = raw[: len(raw) - (done - size)]
            if raw.strip():
                yield orjson.loads(raw)
            if done >= size:
                return


def load_queue(path: Path) -> QueueHistory | list[dict[str, Any]]:
    """A queue history file as a `QueueHistory`, or else as `load_history` loads it.

    Raises `HistoryError` exactly where `load_history` does; a history whose records
    the checker would reject is returned as op dicts, for the checker to say why.
    """
    path = Path(path)
    try:
        with gc_paused():
            return _load_fast(path)
    except _GiveUp:
        pass
    except OSError:
        pass  # load_history words the error
    return load_history(path)


def _blocks(path: Path) -> Iterator[tuple[bytes, int, int]]:
    """(lines without their last newline, how many, bytes of the file they take).

    The last block is the file's tail after its last newline (a last line without one).
    """
    with path.open("rb") as fh:
        carry = b""
        while True:
            data = fh.read(_BLOCK)
            if not data:
                break
            cut = data.rfind(b"\n")
            if cut < 0:
                carry += data
                continue
            block = carry + data[:cut]
            carry = data[cut + 1 :]
            yield block, block.count(b"\n") + 1, len(block) + 1
        if carry:
            yield carry, 1, len(carry)


def parse_blocks(path: Path) -> Iterator[tuple[list[Any], int]]:
    """The file's lines parsed, a block at a time: (their values, bytes of the file).

    One orjson call per block of lines joined by commas. Raises ValueError (orjson's
    JSONDecodeError) on malformed JSON or a blank line, and also when a line holds other
    than one JSON value. The blocks' objects die with them unless kept.
    """
    loads = orjson.loads
    for block, n_lines, n_bytes in _blocks(path):
        ops = loads(b"[" + block.replace(b"\n", b",") + b"]")
        if len(ops) != n_lines:
            raise ValueError("not one JSON value per line")
        yield ops, n_bytes


def _load_fast(path: Path) -> QueueHistory:
    records: list[QueueOp] = []
    append = records.append
    # process -> (position, op dict) of its open invoke; processes that completed `info`.
    pending: dict[Any, tuple[int, dict[str, Any]]] = {}
    dead: set[Any] = set()
    op_types = OP_TYPES
    kinds = _KIND
    data_fs = DATA_FS
    group_fs = GROUP_FS
    saw_subscribe = False
    pos = 0
    last_time = -(2**63)
    size = 0
    blocks = parse_blocks(path)
    while True:
        try:
            ops, n_bytes = next(blocks)
        except StopIteration:
            break
        except ValueError:
            raise _GiveUp() from None  # blank line, malformed JSON: the dict path says where
        size += n_bytes
        try:
            for op in ops:
                # The structural checks of `checkers.history.validate`: on any doubt, give
                # up (the dict path then names the fault).
                index = op["index"]
                time = op["time"]
                typ = op["type"]
                f = op["f"]
                process = op["process"]
                if type(index) is not int or index != pos:
                    raise _GiveUp()
                if type(time) is not int or time < last_time:
                    raise _GiveUp()
                last_time = time
                if type(typ) is not str or typ not in op_types or type(f) is not str:
                    raise _GiveUp()
                if process == "nemesis":
                    pos += 1
                    continue
                if type(process) is not int or process in dead:
                    raise _GiveUp()
                if typ == "invoke":
                    if process in pending:
                        raise _GiveUp()
                    pending[process] = (pos, op)
                    pos += 1
                    continue
                inv_pos, inv_op = pending.pop(process)
                if inv_op["f"] != f:
                    raise _GiveUp()
                if typ == "info":
                    dead.add(process)
                # What `parse_ops` makes of a completion (index == position, checked above).
                if f in data_fs:
                    rec = QueueOp(f, kinds[typ], pos, pos, inv_pos, process)
                    rec.inv_index = inv_pos
                    value = op.get("value")
                    if type(value) is list and len(value) == 1:
                        # One micro-op: the codec's `decode_into` inlined for its two
                        # commonest shapes (tests/checkers/test_queue_load.py holds them equal).
                        mop = value[0]
                        if type(mop) is not list:
                            raise _GiveUp()
                        n = len(mop)
                        name = mop[0] if n else None
                        if name == "send" and n == 3 and type(mop[2]) is list:
                            x = mop[2]
                            if len(x) != 2:
                                raise _GiveUp()
                            rec.sends = [(mop[1], x[0], x[1])]
                        elif name == "poll" and n == 2 and type(mop[1]) is dict:
                            m = mop[1]
                            for pairs in m.values():
                                if type(pairs) is not list:
                                    raise _GiveUp()
                            rec.reads = m  # the op dict dies: its poll result is free
                        else:
                            decode_into(rec, value, pos + 1, True)
                    elif value is not None:
                        decode_into(rec, value, pos + 1, True)
                    take_op_fields(rec, op, pos + 1)
                    append(rec)
                elif f in group_fs:
                    if f == "subscribe":
                        saw_subscribe = True
                    append(take_group_op(f, kinds[typ], pos, pos, inv_pos, process, op, inv_op))
                pos += 1
        except _GiveUp:
            raise
        except Exception:  # a missing field, a HistoryError of a micro-op, anything
            raise _GiveUp() from None
    # Invokes never completed count as info (as in `parse_ops`).
    try:
        saw_subscribe = close_pending(pending, pos, records) or saw_subscribe
    except Exception:
        raise _GiveUp() from None
    return QueueHistory(path, records, saw_subscribe, pos, size)
