"""The aborted-transaction index of a segment: ``<base offset>.txnindex`` (Kafka's TransactionIndex).

One entry per transaction aborted in the segment (the abort marker lies in it), in marker
order, 34 bytes each, big-endian, exactly Kafka's AbortedTxn:

    offset  size  field
         0     2  version            i16  0
         2     8  producerId         i64
        10     8  firstOffset        i64  the transaction's first data offset in this partition
        18     8  lastOffset         i64  the offset of the abort marker
        26     8  lastStableOffset   i64  the partition's LSO right after the marker

A read_committed fetch asks for the aborted transactions overlapping what it returns
(``collect_aborted``): the consumer drops those producers' records between a transaction's first
offset and its abort marker. ``lastStableOffset`` lets that search stop early: once an entry's
LSO is at or past the upper bound, no later segment can hold a transaction overlapping the range.

The file is absent while the segment has no aborted transaction (as in Kafka, where it is
created lazily). It holds no open descriptor: aborts are rare, so each append opens, writes and
closes it, and reads load the (small) file into memory once.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from isrlab.broker.log import durable
from isrlab.broker.log.errors import KafkaStorageError

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
CURRENT_VERSION = 0


class CorruptTxnIndexError(KafkaStorageError):
    """The file is not whole version-0 entries with increasing last offsets."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = CURRENT_VERSION

    def encode(self) -> bytes:
        return ENTRY.pack(
            self.version,
            self.producer_id,
            self.first_offset,
            self.last_offset,
            self.last_stable_offset,
        )

    @classmethod
    def decode(cls, buf: bytes | memoryview, position: int = 0) -> AbortedTxn:
        version, pid, first, last, lso = ENTRY.unpack_from(buf, position)
        return cls(pid, first, last, lso, version)


def txn_index_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}{suffix}"


def decode_entries(data: bytes, path: Path | str = "<buffer>") -> list[AbortedTxn]:
    """Every entry of a ``.txnindex`` image; CorruptTxnIndexError if it is not whole,
    version-0 entries with strictly increasing last offsets."""
    if len(data) % ENTRY_SIZE:
        raise CorruptTxnIndexError(
            f"transaction index {path} has {len(data)} bytes, not a multiple of the "
            f"{ENTRY_SIZE}-byte entry"
        )
    out: list[AbortedTxn] = []
    for position in range(0, len(data), ENTRY_SIZE):
        entry = AbortedTxn.decode(data, position)
        if entry.version != CURRENT_VERSION:
            raise CorruptTxnIndexError(
                f"transaction index {path}: entry at byte {position} has version "
                f"{entry.version}; only version {CURRENT_VERSION} exists"
            )
        if out and entry.last_offset <= out[-1].last_offset:
            raise CorruptTxnIndexError(
                f"transaction index {path}: entry at byte {position} ends at offset "
                f"{entry.last_offset}, not after {out[-1].last_offset}"
            )
        out.append(entry)
    return out


class TransactionIndex:
    """The ``.txnindex`` of one segment (see the module docstring)."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] | None = None  # loaded on first use
        self._unflushed = False

    @property
    def entries(self) -> list[AbortedTxn]:
        """The entries, loaded from the file on first use (CorruptTxnIndexError if bad)."""
        if self._entries is None:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            except OSError as exc:
                raise KafkaStorageError(f"cannot read {self.path}: {exc}") from exc
            self._entries = decode_entries(data, self.path)
        return self._entries

    def sanity_check(self) -> None:
        """Raise CorruptTxnIndexError if the file is damaged (forces a reload from disk)."""
        self._entries = None
        _ = self.entries

    def append(self, entry: AbortedTxn) -> None:
        entries = self.entries
        if entries and entry.last_offset <= entries[-1].last_offset:
            raise ValueError(
                f"the last offset {entry.last_offset} of an aborted transaction of "
                f"{self.path.name} is not after the previous one, {entries[-1].last_offset}"
            )
        try:
            with open(self.path, "ab") as f:
                f.write(entry.encode())
        except OSError as exc:
            raise KafkaStorageError(f"cannot append to {self.path}: {exc}") from exc
        entries.append(entry)
        self._unflushed = True

    def flush(self) -> None:
        if not self._unflushed:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._unflushed = False
            return
        try:
            durable.fsync_fd(fd, self.path)
        finally:
            os.close(fd)
        self._unflushed = False

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        try:
            if entries:
                with open(self.path, "r+b") as f:
                    f.truncate(len(entries) * ENTRY_SIZE)
                durable.truncated(self.path, len(entries) * ENTRY_SIZE)
            else:
                durable.unlink(self.path, missing_ok=True)
        except OSError as exc:
            raise KafkaStorageError(f"cannot truncate {self.path}: {exc}") from exc
        self._entries = entries
        self._unflushed = bool(entries)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose abort marker is at or past ``offset`` (Kafka's truncateTo)."""
        entries = self.entries
        keep = next((i for i, e in enumerate(entries) if e.last_offset >= offset), len(entries))
        if keep < len(entries):
            self._rewrite(entries[:keep])

    def reset(self) -> None:
        """Drop every entry (recovery rebuilds them)."""
        self._entries = []
        durable.unlink(self.path, missing_ok=True)
        self._unflushed = False

    def collect_aborted(
        self, fetch_offset: int, upper_bound_offset: int
    ) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping [fetch_offset, upper_bound_offset), and whether
        the search is complete (an entry's LSO reached the upper bound: later segments cannot
        add any), as Kafka's TransactionIndex.collectAbortedTxns."""
        found: list[AbortedTxn] = []
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound_offset:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound_offset:
                return found, True
        return found, False

    def rename_to(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            durable.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        durable.unlink(self.path, missing_ok=True)
        self._entries = []
        self._unflushed = False

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path})"
