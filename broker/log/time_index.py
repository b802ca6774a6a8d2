"""The ``.timeindex`` file: a sparse map from record timestamps to offsets, for ListOffsets.

Format (Kafka's TimeIndex): 12-byte big-endian entries ``(timestamp i64, relative offset
u32)``. Timestamps are strictly increasing: an entry is only added when the segment's largest
timestamp so far grew, and it points at the (last) offset of the batch holding that
timestamp. Searching for time T finds the last entry with timestamp <= T and scans forward.
The index is full one entry early so that a final entry with the segment's largest timestamp
always fits when the segment rolls or closes; a reopened segment reads its largest timestamp
from that last entry.
"""

from __future__ import annotations

import struct
from pathlib import Path

from isrlab.broker.log.abstract_index import AbstractIndex, CorruptIndexError

_ENTRY = struct.Struct(">qI")
NO_TIMESTAMP = -1


class TimeIndex(AbstractIndex):
    ENTRY_SIZE = 12

    def __init__(
        self,
        path: Path,
        base_offset: int,
        max_index_size: int = 10 * 1024 * 1024,
        writable: bool = True,
    ) -> None:
        super().__init__(path, base_offset, max_index_size, writable)

    @property
    def is_full(self) -> bool:
        # One slot stays free for the final entry written on roll/close.
        return self._entries >= self.max_entries - 1

    def entry(self, slot: int) -> tuple[int, int]:
        """The (timestamp, absolute offset) stored in ``slot``."""
        assert self._mmap is not None
        timestamp, relative = _ENTRY.unpack_from(self._mmap, slot * self.ENTRY_SIZE)
        return timestamp, self.base_offset + relative

    def _key_at(self, slot: int) -> int:
        return self.entry(slot)[0]

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last (timestamp, offset), or (NO_TIMESTAMP, base_offset) when empty."""
        if self._entries == 0:
            return NO_TIMESTAMP, self.base_offset
        return self.entry(self._entries - 1)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's; True if added."""
        if not skip_full_check and self.is_full:
            raise CorruptIndexError(f"attempt to append to a full time index {self.path}")
        if self._entries >= self.max_entries:
            return False
        last_timestamp, last_offset = self.last_entry
        if self._entries > 0 and offset < last_offset:
            raise CorruptIndexError(
                f"time index entry ({timestamp}, {offset}) has an offset below the last "
                f"entry's {last_offset} in {self.path}"
            )
        if timestamp <= last_timestamp:
            return False
        self._write_entry(self._entries, _ENTRY.pack(timestamp, self.relative_offset(offset)))
        self._entries += 1
        return True

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The entry with the largest timestamp <= ``timestamp``; (NO_TIMESTAMP, base) if none."""
        slot = self._largest_lower_bound_slot(timestamp)
        if slot < 0:
            return NO_TIMESTAMP, self.base_offset
        return self.entry(slot)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry pointing at an offset >= ``offset``."""
        keep = self._entries
        while keep > 0 and self.entry(keep - 1)[1] >= offset:
            keep -= 1
        self._truncate_to_entries(keep)

    def sanity_check(self) -> None:
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"time index {self.path} length {self._length} is not a multiple of 12"
            )
        if self._entries == 0:
            return
        first_timestamp = self.entry(0)[0]
        last_timestamp, last_offset = self.last_entry
        # A zero-filled tail left by a crash shows up as a last timestamp below the first.
        if last_timestamp < first_timestamp or last_timestamp < 0:
            raise CorruptIndexError(
                f"time index {self.path} is corrupt: last timestamp {last_timestamp} is below "
                f"the first {first_timestamp}"
            )
        if (last_timestamp, last_offset) == (0, self.base_offset):
            raise CorruptIndexError(
                f"time index {self.path} ends in a zero-filled (never written) entry"
            )
        if last_offset < self.base_offset:
            raise CorruptIndexError(
                f"time index {self.path} is corrupt: last offset {last_offset} below base"
            )

    def entries_list(self) -> list[tuple[int, int]]:
        return [self.entry(slot) for slot in range(self._entries)]
