"""What the ``.index`` and ``.timeindex`` files share: a memory-mapped array of fixed-size entries.

Like Kafka's AbstractIndex, an index file is preallocated to ``segment.index.bytes`` (rounded
down to a whole number of entries) while its segment is active, so appends are plain writes
into the mapping; the number of valid entries lives in memory. When the segment rolls or the
log closes, the file is trimmed to exactly its entries, so a reopened index knows its entry
count from its length. After a crash an active index still has its preallocated zero tail;
the sanity checks then fail and the index is rebuilt from the log, because indexes are derived
data and never the source of truth.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import ClassVar

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
        newly_created = not path.exists()
        self._file = open(path, "r+b" if not newly_created else "w+b")  # noqa: SIM115
        length = os.fstat(self._file.fileno()).st_size
        if newly_created and writable:
            length = self._round_down(max_index_size)
            os.ftruncate(self._file.fileno(), length)
            self._entries = 0
        else:
            self._entries = length // self.ENTRY_SIZE
        self._length = length
        self._mmap: mmap.mmap | None = None
        self._map()

    # -- sizing ------------------------------------------------------------------------------

    def _round_down(self, size: int) -> int:
        return max(0, size) // self.ENTRY_SIZE * self.ENTRY_SIZE

    def _map(self) -> None:
        self._mmap = mmap.mmap(self._file.fileno(), self._length) if self._length > 0 else None

    def _unmap(self) -> None:
        if self._mmap is not None:
            self._mmap.flush()
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
        os.ftruncate(self._file.fileno(), rounded)
        self._length = rounded
        self._entries = min(self._entries, self.max_entries)
        self._map()
        return True

    def trim_to_valid_size(self) -> None:
        self.resize(self.size_in_bytes)

    # -- entries -----------------------------------------------------------------------------

    def _write_entry(self, slot: int, entry: bytes) -> None:
        assert self._mmap is not None
        position = slot * self.ENTRY_SIZE
        self._mmap[position : position + self.ENTRY_SIZE] = entry

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
        if self._mmap is not None:
            self._mmap.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Trim to the valid entries and release the mapping and the file."""
        if self._file.closed:
            return
        self.trim_to_valid_size()
        self._unmap()
        self._file.close()

    def close_handler(self) -> None:
        """Release the mapping and file without trimming (the file is about to be deleted)."""
        if self._file.closed:
            return
        self._mmap_close_quietly()
        self._file.close()

    def _mmap_close_quietly(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def rename_to(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close_handler()
        self.path.unlink(missing_ok=True)
