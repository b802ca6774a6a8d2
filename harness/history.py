"""The history recorder: `history.jsonl` written append-only while a test runs.

`HistoryWriter(path)` owns one history file (docs/history-format.md, v1). Every
`write(op)` stamps the op with the next dense `index` and a `time` in nanoseconds since
the writer's start on the control node's monotonic clock, then appends exactly one line.

Guarantees:

- lines appear in the order of `write` calls; `index` is dense and `time` non-decreasing
  along the file even when several threads write at once (both are assigned under the
  same lock as the append);
- each line is handed to the kernel with a single `os.write` of the whole line on an
  `O_APPEND` descriptor before `write` returns, so if the harness process dies every line
  whose `write` returned is complete and parses. Only the line being written at that
  instant can be torn (Linux stops a large write between pages when SIGKILL arrives): it
  is then the last bytes of the file and has no newline. `repair_history(path)` cuts such
  a tail off, so a history left by a crashed harness loads; call it before checking one.
  A machine crash can lose lines not yet synced: `sync()`, or close with `fsync=True`;
- the caller's dict is not modified: `write` returns the stamped copy that was recorded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

__all__ = ["HistoryWriter", "repair_history"]

_DUMP_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


class HistoryWriter:
    """Append-only, thread-safe writer of one `history.jsonl`.

    `start_ns` is the monotonic instant (time.monotonic_ns()) that counts as time 0;
    by default the moment the writer is created. Several writers (or a later reader
    computing relative times) can share one start by passing it explicitly.
    `clock` is the nanosecond clock the times are read from (default time.monotonic_ns; a
    simulation passes its virtual clock, harness/sim/interpreter.py).
    """

    def __init__(
        self,
        path: Path | str,
        start_ns: int | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.path = Path(path)
        self._clock: Callable[[], int] = clock or time.monotonic_ns
        self.start_ns = self._clock() if start_ns is None else start_ns
        self._lock = threading.Lock()
        self._next_index = 0
        self._last_time = 0
        # O_APPEND makes each write land at the end even if something else appends too;
        # O_EXCL refuses to silently mix two runs into one file.
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644
        )

    @property
    def count(self) -> int:
        """How many ops have been written."""
        return self._next_index

    def now(self) -> int:
        """Nanoseconds since the writer's start (not yet clamped to the file's order)."""
        return self._clock() - self.start_ns

    def write(self, op: dict[str, Any]) -> dict[str, Any]:
        """Stamp `op` with index and time, append it as one line, return the stamped copy."""
        with self._lock:
            fd = self._fd
            if fd is None:
                raise ValueError(f"history {self.path} is closed")
            t = self._clock() - self.start_ns
            # The monotonic clock never goes back, but two threads can read it in one
            # order and take the lock in the other: clamp so times follow the file.
            if t < self._last_time:
                t = self._last_time
            stamped = {"index": self._next_index, "time": t, **op}
            line = orjson.dumps(stamped, option=_DUMP_OPTIONS)
            _write_all(fd, line)
            self._next_index += 1
            self._last_time = t
            return stamped

    def sync(self) -> None:
        """fsync the file: lines written so far survive a machine crash too."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self, fsync: bool = True) -> None:
        """Close the file (idempotent); by default fsync it first."""
        with self._lock:
            if self._fd is None:
                return
            try:
                if fsync:
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    # A regular file takes the whole buffer in one call; loop only for the rare short
    # write (a full disk raises instead, which the caller sees).
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def repair_history(path: Path | str) -> int:
    """Truncate an incomplete last line (one without its newline), left when the process
    writing the history was killed mid-write. Returns how many bytes were cut (0 when the
    file was whole). Complete lines are never touched."""
    p = Path(path)
    with p.open("r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        # Walk back in blocks to the last newline; everything after it is the torn line.
        pos = size
        while pos > 0:
            start = max(0, pos - 65536)
            fh.seek(start)
            block = fh.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        if keep < size:
            fh.truncate(keep)
            os.fsync(fh.fileno())
        return size - keep
