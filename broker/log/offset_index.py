"""The ``.index`` file: a sparse map from offsets to byte positions in the segment's ``.log``.

Format (Kafka's OffsetIndex): a sequence of 8-byte big-endian entries ``(relative offset u32,
position u32)``, where relative offset = offset - segment base offset. Entries are strictly
increasing in both fields. The segment adds one entry each time more than
``index.interval.bytes`` have been appended since the last one, so a lookup lands within about
4 KiB of the target and the rest is a scan of batch headers. Entries never have relative
offset 0 (the first batch sits at position 0 and needs none), which the sanity check uses to
detect a zero-filled (preallocated, never written) tail after a crash.
"""

from __future__ import annotations

import struct
from pathlib import Path

from isrlab.broker.log.abstract_index import AbstractIndex, CorruptIndexError

_ENTRY = struct.Struct(">II")


class OffsetIndex(AbstractIndex):
    ENTRY_SIZE = 8

    def __init__(
        self,
        path: Path,
        base_offset: int,
        max_index_size: int = 10 * 1024 * 1024,
        writable: bool = True,
    ) -> None:
        super().__init__(path, base_offset, max_index_size, writable)

    def entry(self, slot: int) -> tuple[int, int]:
        """The absolute (offset, position) stored in ``slot``."""
        assert self._mmap is not None
        relative, position = _ENTRY.unpack_from(self._mmap, slot * self.ENTRY_SIZE)
        return self.base_offset + relative, position

    def _key_at(self, slot: int) -> int:
        return self.entry(slot)[0]

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last (offset, position), or (base_offset, 0) when empty."""
        if self._entries == 0:
            return self.base_offset, 0
        return self.entry(self._entries - 1)

    @property
    def last_offset(self) -> int:
        return self.last_entry[0]

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must grow (Kafka's InvalidOffsetException)."""
        if self.is_full:
            raise CorruptIndexError(
                f"attempt to append to a full index {self.path} ({self._entries} entries)"
            )
        if self._entries > 0:
            last_offset, last_position = self.last_entry
            if offset <= last_offset or position < last_position:
                raise CorruptIndexError(
                    f"index entry ({offset}, {position}) is not after the last entry "
                    f"({last_offset}, {last_position}) in {self.path}"
                )
        self._write_entry(self._entries, _ENTRY.pack(self.relative_offset(offset), position))
        self._entries += 1

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """The entry with the largest offset <= target, or (base_offset, 0) if there is none."""
        slot = self._largest_lower_bound_slot(target_offset)
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        slot = self._largest_lower_bound_slot(offset)
        if slot < 0:
            self._truncate_to_entries(0)
        elif self.entry(slot)[0] == offset:
            self._truncate_to_entries(slot)
        else:
            self._truncate_to_entries(slot + 1)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the file length is whole entries and entries look real."""
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"index {self.path} length {self._length} is not a multiple of 8"
            )
        if self._entries > 0 and self.last_offset <= self.base_offset:
            raise CorruptIndexError(
                f"index {self.path} is corrupt: last offset {self.last_offset} is not above "
                f"the base offset {self.base_offset}"
            )

    def entries_list(self) -> list[tuple[int, int]]:
        return [self.entry(slot) for slot in range(self._entries)]
