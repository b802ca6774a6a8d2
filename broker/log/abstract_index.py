"""What the ``.index`` and ``.timeindex`` files share: a memory-mapped array of fixed-size entries.

Like Kafka's AbstractIndex, an index file is preallocated to ``segment.index.bytes`` (rounded
down to a whole number of entries) while its segment is active, so appends are plain writes
into the mapping; the number of valid entries lives in memory. When the segment rolls or the
log closes, the file is trimmed to exactly its entries, so a reopened index knows its entry
count from its length. After a crash an active index still has its preallocated zero tail;
the sanity checks then fail and the index is rebuilt from the log, because indexes are derived
data and never the source of truth.

Descriptors: the file is opened only to size, map, fsync or trim it and closed again; a mapped
index holds just the descriptor Python's ``mmap`` keeps (one per index, none for an empty one).

Full disks: the preallocated file is sparse, and the first store into a page that has no disk
block yet is a SIGBUS when the disk is full, which kills the process (on a stop, or while
recovery rebuilds an index at start-up). So before an entry goes into a page not yet written
through this mapping, the rest of that page (from the entry on: the bytes before it may be
valid entries) is written with zeros by ``os.pwrite``, which takes the page's blocks or fails
with ENOSPC; a full disk is then a KafkaStorageError naming the file, raised before anything
changed. (``posix_fallocate`` reserved the blocks too, but as an unwritten extent that the
first store through the mapping then converts inside the page fault: 2-20 ms a page on ext4,
against about 0.02 ms for the write; the simulator, whose brokers roll many small segments,
spent 3 % of its CPU there.)
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import ClassVar

from isrlab.broker.log import durable
from isrlab.broker.log.errors import KafkaStorageError


class CorruptIndexError(KafkaStorageError):
    """An index file failed its sanity check; the caller rebuilds it from the log."""


class AbstractIndex:
    """A file of ``ENTRY_SIZE``-byte entries sorted by key, searched by binary search."""

    ENTRY_SIZE: ClassVar[int]

    def __init__(
        self, path: Path, base_offset: int, max_index_size: int, writable: bool = True
    ) -> None:
        self.path = path
        self.base_offset = base_offset
        self._closed = False
        self._mmap: mmap.mmap | None = None
        self._reserved = 0  # bytes from the start known to have disk blocks
        newly_created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        try:
            length = os.fstat(fd).st_size
            if newly_created and writable:
                length = self._round_down(max_index_size)
                os.ftruncate(fd, length)
                self._entries = 0
            else:
                self._entries = length // self.ENTRY_SIZE
            self._length = length
            self._map(fd)
        finally:
            os.close(fd)

    # -- sizing ------------------------------------------------------------------------------

    def _round_down(self, size: int) -> int:
        return max(0, size) // self.ENTRY_SIZE * self.ENTRY_SIZE

    def _map(self, fd: int) -> None:
        self._mmap = mmap.mmap(fd, self._length) if self._length > 0 else None
        self._reserved = 0

    def _unmap(self) -> None:
        # No msync: the mapping's pages are the file's page cache, which munmap keeps and
        # flush()'s fsync writes out. (An msync here cost an fsync per index whenever a
        # segment's files were released, seconds at start-up on a busy disk.)
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._length // self.ENTRY_SIZE

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        """Bytes of valid entries (not the preallocated file length)."""
        return self._entries * self.ENTRY_SIZE

    @property
    def file_length(self) -> int:
        return self._length

    def resize(self, new_size: int) -> bool:
        """Set the file length to ``new_size`` rounded down to whole entries; keeps entries that fit.

        Returns True if the length changed. Used to preallocate an active segment's index and
        to give room back when the segment becomes inactive.
        """
        rounded = self._round_down(new_size)
        if rounded == self._length:
            return False
        self._unmap()
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.ftruncate(fd, rounded)
            durable.truncated(self.path, rounded)
            self._length = rounded
            self._entries = min(self._entries, self.max_entries)
            self._map(fd)
        finally:
            os.close(fd)
        return True

    def trim_to_valid_size(self) -> None:
        self.resize(self.size_in_bytes)

    # -- entries -----------------------------------------------------------------------------

    def _write_entry(self, slot: int, entry: bytes) -> None:
        assert self._mmap is not None
        position = slot * self.ENTRY_SIZE
        if position + self.ENTRY_SIZE > self._reserved:
            self._reserve(position, position + self.ENTRY_SIZE)
        self._mmap[position : position + self.ENTRY_SIZE] = entry

    def _reserve(self, start: int, end: int) -> None:
        """Disk blocks for bytes [start, end) and the rest of their last page, by writing zeros.

        ``start`` is where the next entry goes: nothing from there on is a valid entry, and the
        bytes before it are never written (see the module docstring).
        """
        page = mmap.PAGESIZE
        end = min(-(-end // page) * page, self._length)
        fd = os.open(self.path, os.O_RDWR)
        try:
            while start < end:  # a nearly full disk may take part of the write
                start += os.pwrite(fd, bytes(end - start), start)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write index {self.path}: {exc}") from exc
        finally:
            os.close(fd)
        self._reserved = end

    def _key_at(self, slot: int) -> int:
        raise NotImplementedError

    def _largest_lower_bound_slot(self, target: int) -> int:
        """Slot of the last entry whose key is <= target, or -1 if every key is larger."""
        lo, hi = 0, self._entries - 1
        found = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._key_at(mid) <= target:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return found

    def _truncate_to_entries(self, entries: int) -> None:
        self._entries = max(0, min(entries, self._entries))

    def reset(self) -> None:
        """Drop every entry (the file keeps its length); used before a rebuild."""
        self._entries = 0

    def relative_offset(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= 0x7FFFFFFF:
            raise KafkaStorageError(
                f"offset {offset} does not fit a 4-byte offset relative to {self.base_offset} in {self.path}"
            )
        return relative

    # -- lifecycle ---------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the file; on Linux that writes the pages dirtied through the mapping too (they
        are the file's page cache), so no separate msync."""
        durable.fsync_file(self.path)

    def close(self) -> None:
        """Trim to the valid entries and release the mapping."""
        if self._closed:
            return
        self.trim_to_valid_size()
        self._unmap()
        self._closed = True

    def close_handler(self) -> None:
        """Release the mapping without trimming (the file is about to be deleted)."""
        if self._closed:
            return
        self._mmap_close_quietly()
        self._closed = True

    def _mmap_close_quietly(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def rename_to(self, path: Path) -> None:
        durable.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close_handler()
        durable.unlink(self.path, missing_ok=True)
