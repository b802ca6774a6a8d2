"""Reading, writing and validating `history.jsonl` (docs/history-format.md, v1).

This module owns the on-disk history file and its structural contract; it knows nothing
of any workload. A history is a list of op dicts exactly as the spec describes them.

Validation rules (each violation raises `HistoryError` naming the 1-based file line):

- every line is a JSON object with `index` (int, equal to its 0-based position: dense),
  `time` (int, non-decreasing), `type` (invoke/ok/fail/info), `f` (string) and
  `process` (int or ``"nemesis"``);
- a client process runs one op at a time: an invoke while the process still has an open
  invoke is an error, and so is a completion without an open invoke or whose `f`
  differs from its invoke's;
- after an `info` completion a process is never used again.

Nemesis ops are not paired (both their start and end are `info`). Blank lines are
skipped but still counted for line numbers. Loading parses the whole file with one
orjson call for speed and falls back to line-by-line parsing only to locate an error.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "OP_TYPES",
    "HistoryError",
    "gc_paused",
    "iter_history",
    "load_history",
    "nothing_checked",
    "validate",
    "write_history",
]

OP_TYPES = frozenset(("invoke", "ok", "fail", "info"))

# bytes.strip()'s whitespace; a line of only these is blank.
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
_BLANK_FIRST = re.compile(rb"[ \t\r\x0b\x0c]*\n")
_BLANK_INNER = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")
_OPEN, _CLOSE, _NEWLINE = ord("["), ord("]"), ord("\n")


class HistoryError(ValueError):
    """A history that does not follow the spec; `line` is the 1-based line (or op position+1)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line

    def __str__(self) -> str:
        if self.line is None:
            return self.message
        return f"line {self.line}: {self.message}"


def nothing_checked(results: dict[str, Any], reason: str) -> dict[str, Any]:
    """Mark `results` as checking nothing: ``valid`` becomes ``"unknown"`` (exit 2) and
    ``stats["nothing-checked"]`` says why. An empty or mis-read history must never pass as
    valid (Jepsen fails it too: ``empty-transaction-graph``). Anomalies found still count:
    an invalid verdict stays invalid."""
    if results.get("valid") is True:
        results["valid"] = "unknown"
    results.setdefault("stats", {})["nothing-checked"] = reason
    return results


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of small containers.

    Histories are trees of dicts and lists with no reference cycles, yet every few
    hundred allocations the collector would walk all of them: pausing it makes loading
    about twice as fast. The previous state is restored on exit.

    On exit everything the collector tracks moves to its oldest generation (freeze then
    unfreeze: two list splices). Otherwise the millions of objects built while paused
    sit in the youngest generation, and the first allocation after re-enabling walks
    them all, then again when they are promoted: measured, as much CPU as parsing the
    file. The oldest generation is only walked by a full collection, which Python runs
    rarely (once the objects promoted since the last one exceed a quarter of the rest).
    Cyclic garbage made meanwhile waits for that full collection. A process that froze
    objects itself (gc.freeze, e.g. before forking) is left as it is.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class _Validator:
    """Incremental structural checks; `feed` one op at a time in file order."""

    __slots__ = ("dead", "expected", "last_time", "open")

    def __init__(self) -> None:
        self.expected = 0
        self.last_time = -(2**63)
        self.open: dict[Any, tuple[int, str]] = {}
        self.dead: dict[Any, int] = {}

    def feed(self, op: Any, line: int) -> None:
        if type(op) is not dict:
            raise HistoryError(f"expected a JSON object, got {type(op).__name__}", line)
        try:
            index = op["index"]
            time = op["time"]
            typ = op["type"]
            f = op["f"]
            process = op["process"]
        except KeyError as e:
            raise HistoryError(f"missing required field {e.args[0]!r}", line) from None
        if type(index) is not int:
            raise HistoryError(f"index must be an integer, got {index!r}", line)
        if index != self.expected:
            raise HistoryError(
                f"index {index} is not dense: expected {self.expected} (indexes count 0, 1, 2, ...)",
                line,
            )
        self.expected = index + 1
        if type(time) is not int:
            raise HistoryError(f"time must be integer nanoseconds, got {time!r}", line)
        if time < self.last_time:
            raise HistoryError(
                f"time {time} goes backwards (previous op had {self.last_time})", line
            )
        self.last_time = time
        if type(typ) is not str or typ not in OP_TYPES:
            raise HistoryError(f"type must be one of invoke/ok/fail/info, got {typ!r}", line)
        if type(f) is not str:
            raise HistoryError(f"f must be a string, got {f!r}", line)
        if process == "nemesis":
            return
        if type(process) is not int:
            raise HistoryError(f'process must be an integer or "nemesis", got {process!r}', line)
        died = self.dead.get(process)
        if died is not None:
            raise HistoryError(
                f"process {process} is used again after its info completion on line {died}; "
                "a thread whose op timed out must continue as a new process id",
                line,
            )
        if typ == "invoke":
            pending = self.open.get(process)
            if pending is not None:
                raise HistoryError(
                    f"process {process} invokes {f!r} while its {pending[1]!r} invoked on "
                    f"line {pending[0]} has not completed",
                    line,
                )
            self.open[process] = (line, f)
            return
        pending = self.open.pop(process, None)
        if pending is None:
            raise HistoryError(
                f"{typ} completion of {f!r} by process {process} without a preceding invoke", line
            )
        if pending[1] != f:
            raise HistoryError(
                f"completion f {f!r} does not match the invoke of {pending[1]!r} on line "
                f"{pending[0]}",
                line,
            )
        if typ == "info":
            self.dead[process] = line


def validate(ops: Iterable[Any]) -> None:
    """Check ops against the spec; raise `HistoryError` (line = position + 1) on the first fault."""
    v = _Validator()
    for i, op in enumerate(ops):
        v.feed(op, i + 1)


def _parse_line(raw: bytes, line: int) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HistoryError(f"malformed JSON: {e}", line) from None


def iter_history(path: Path) -> Iterator[dict[str, Any]]:
    """Stream a history file op by op, validating as it goes (constant memory)."""
    v = _Validator()
    try:
        with Path(path).open("rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                op = _parse_line(raw, lineno)
                v.feed(op, lineno)
                yield op
    except OSError as e:
        raise HistoryError(f"cannot read history {path}: {e.strerror or e}") from None


def load_history(path: Path) -> list[dict[str, Any]]:
    """Load and validate a whole history file into the spec's op dicts."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # "[" + file + "]" in one buffer, so that the file is copied once, by replace.
            buf = bytearray(size + 2)
            got = fh.readinto(memoryview(buf)[1 : size + 1])
    except OSError as e:
        raise HistoryError(f"cannot read history {path}: {e.strerror or e}") from None
    if got != size:  # the file changed under us: take what is there
        del buf[got + 1 : size + 1]
        size = got
    end = size + 1  # one past the last byte of the file in buf
    while end > 1 and buf[end - 1] in _WHITESPACE:
        end -= 1
    if end == 1:
        return []
    buf[0] = _OPEN
    if _BLANK_FIRST.match(buf, 1) or _BLANK_INNER.search(buf, 1, end):
        # Blank lines inside the file: keep exact line numbers with the streaming path.
        return list(iter_history(path))
    n_lines = buf.count(b"\n", 1, end) + 1
    complete = buf[size] == _NEWLINE
    # The last line's own trailing whitespace, for error messages that quote columns.
    stop = buf.find(b"\n", end, size + 1)
    last_tail = bytes(buf[end : size + 1 if stop < 0 else stop])
    buf[end] = _CLOSE
    buf[end + 1 :] = b" " * (len(buf) - end - 1)
    ops: Any = None
    try:
        # One C call for the whole file is several times faster than a call per line.
        with gc_paused():
            ops = orjson.loads(buf.replace(b"\n", b","))
            if len(ops) == n_lines:
                validate(ops)
    except orjson.JSONDecodeError:
        lines = (bytes(buf[1:end]) + last_tail).split(b"\n")
        for lineno, raw in enumerate(lines, 1):
            try:
                _parse_line(raw, lineno)
            except HistoryError as e:
                if lineno == len(lines) and not complete:
                    raise HistoryError(
                        f"{e.message}; the last line is incomplete (the recorder probably "
                        "stopped while writing it): remove it to check the rest",
                        lineno,
                    ) from None
                raise
        raise HistoryError("malformed JSON (unlocated)") from None
    if len(ops) != n_lines:
        # A line held two values separated by a comma; find it.
        for lineno, raw in enumerate((bytes(buf[1:end]) + last_tail).split(b"\n"), 1):
            op = _parse_line(raw, lineno)
            if type(op) is not dict:
                raise HistoryError(f"expected one JSON object, got {type(op).__name__}", lineno)
        raise HistoryError("line count does not match the number of JSON values")
    return ops  # type: ignore[no-any-return]


def write_history(ops: Iterable[dict[str, Any]], path: Path) -> None:
    """Write ops as history.jsonl (one object per line, newline-terminated)."""
    dumps = orjson.dumps
    opt = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
    with Path(path).open("wb") as fh:
        buf: list[bytes] = []
        for op in ops:
            buf.append(dumps(op, option=opt))
            if len(buf) >= 8192:
                fh.write(b"".join(buf))
                buf.clear()
        fh.write(b"".join(buf))
