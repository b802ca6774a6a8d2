"""Kafka's small text checkpoint files, written atomically.

Format (Kafka's CheckpointFile, version 0)::

    0                      <- version
    2                      <- number of entries
    orders 0 1234          <- one entry per line, fields separated by one space
    orders-eu 3 77

``OffsetCheckpointFile`` holds ``topic partition offset`` lines and backs the per-log-dir
``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint`` (high watermarks) and
``log-start-offset-checkpoint``. ``CheckpointFile`` is the shared reader/writer, also used by
the per-partition ``leader-epoch-checkpoint``.

A write goes to ``<name>.tmp``, is fsynced, renamed over the old file and the directory is
fsynced, so a crash leaves either the old or the new checkpoint, never a torn one; a write that
fails (a full disk) removes its ``.tmp`` and leaves the old file as it was. A file that
does not parse raises KafkaStorageError naming the file and the bad line. Writes of one file are
serialised by a lock, so a periodic write running in a worker thread (the fsyncs must not stall
the broker's event loop) cannot interleave with a write made on the loop (shutdown, retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from isrlab.broker.log import durable
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.rate_limited_log import RateLimitedLog

_log = logging.getLogger(__name__)
_failures = RateLimitedLog(_log, interval_s=60)

CHECKPOINT_VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"

T = TypeVar("T")


class CheckpointFile(Generic[T]):
    """A versioned list of entries, one per line; ``format_entry``/``parse_entry`` map a line."""

    def __init__(
        self,
        path: Path,
        format_entry: Callable[[T], str],
        parse_entry: Callable[[list[str]], T],
        version: int = CHECKPOINT_VERSION,
    ) -> None:
        self.path = path
        self._format = format_entry
        self._parse = parse_entry
        self.version = version
        self._lock = threading.Lock()
        self._taken = 0  # snapshots taken
        self._written = 0  # the newest snapshot on disk

    def write(self, entries: Iterable[T]) -> None:
        self.snapshot(entries)()

    def snapshot(self, entries: Iterable[T]) -> Callable[[], None]:
        """Take the entries now; the returned function writes them (in any thread), unless a
        newer snapshot was written first: an older one never overwrites it."""
        items = list(entries)
        lines = [str(self.version), str(len(items)), *(self._format(item) for item in items)]
        self._taken += 1
        generation = self._taken
        tmp = self.path.with_name(self.path.name + ".tmp")

        def write() -> None:
            with self._lock:
                if generation < self._written:
                    return
                self._write_locked(tmp, lines)
                self._written = generation

        return write

    def _write_locked(self, tmp: Path, lines: list[str]) -> None:
        try:
            with durable.batched():  # one fsync of the power journal for the three records
                with open(tmp, "w", encoding="utf-8") as out:
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                    durable.fsync_fd(out.fileno(), tmp)
                durable.replace(tmp, self.path)
                durable.fsync_dir(self.path.parent)
        except OSError as exc:
            # Never leave a .tmp behind (on a full disk it would hold the last free blocks); the
            # old checkpoint, if any, is still whole.
            with contextlib.suppress(OSError):
                durable.unlink(tmp, missing_ok=True)
            raise KafkaStorageError(f"cannot write checkpoint {self.path}: {exc}") from exc

    def read(self) -> list[T]:
        """The entries, or [] if the file does not exist."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise KafkaStorageError(f"cannot read checkpoint {self.path}: {exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            number = raw.count(b"\n", 0, exc.start) + 1
            line = raw.split(b"\n")[number - 1].decode("utf-8", "replace")
            raise self._malformed(number, line, f"not UTF-8 text ({exc.reason})") from None
        lines = text.splitlines()
        if len(lines) < 2:
            raise self._malformed(1, text[:80], "expected a version line and a count line")
        try:
            version = int(lines[0].strip())
        except ValueError:
            raise self._malformed(1, lines[0], "the version is not an integer") from None
        if version != self.version:
            raise self._malformed(
                1, lines[0], f"unsupported version {version} (expected {self.version})"
            )
        try:
            expected = int(lines[1].strip())
        except ValueError:
            raise self._malformed(2, lines[1], "the entry count is not an integer") from None
        body = [line for line in lines[2:] if line.strip()]
        if len(body) != expected or expected < 0:
            raise self._malformed(
                2, lines[1], f"says {expected} entries but the file has {len(body)}"
            )
        entries: list[T] = []
        for number, line in enumerate(body, start=3):
            try:
                entries.append(self._parse(line.split()))
            except (ValueError, IndexError):
                raise self._malformed(number, line, "the entry does not parse") from None
        return entries

    def _malformed(self, line_number: int, line: str, why: str) -> KafkaStorageError:
        return KafkaStorageError(
            f"malformed checkpoint file {self.path}, line {line_number} ({line!r}): {why}; "
            "delete the file to let the broker rebuild it from the logs (recovery is then slower)"
        )


TopicPartition = tuple[str, int]


def _format_offset(entry: tuple[TopicPartition, int]) -> str:
    (topic, partition), offset = entry
    return f"{topic} {partition} {offset}"


def _parse_offset(fields: list[str]) -> tuple[TopicPartition, int]:
    if len(fields) != 3:
        raise ValueError(fields)
    return (fields[0], int(fields[1])), int(fields[2])


class OffsetCheckpointFile:
    """A ``topic partition offset`` checkpoint: the log-dir-wide offset files."""

    def __init__(self, path: Path) -> None:
        self._file: CheckpointFile[tuple[TopicPartition, int]] = CheckpointFile(
            path, _format_offset, _parse_offset
        )

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file's contents with ``offsets`` (sorted, for stable diffs)."""
        self._file.write(sorted(offsets.items()))

    def snapshot(self, offsets: Mapping[TopicPartition, int]) -> Callable[[], None]:
        """``offsets`` taken now, written when the returned function runs (see CheckpointFile)."""
        return self._file.snapshot(sorted(offsets.items()))

    def read(self) -> dict[TopicPartition, int]:
        """{(topic, partition): offset}; empty if the file does not exist."""
        return dict(self._file.read())

    async def write_every(
        self, interval_s: float, offsets: Callable[[], Mapping[TopicPartition, int]]
    ) -> None:
        """Kafka's periodic checkpoint task, until cancelled: every ``interval_s`` the offsets
        are taken on the event loop and written (fsynced) in a worker thread, so a slow disk
        does not stall requests. A failed write is logged (once a minute while it keeps
        failing, on a full disk); the next one tries again."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.snapshot(offsets()))
            except KafkaStorageError as e:
                _failures.error(self.path, "%s", e)
