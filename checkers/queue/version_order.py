"""The version order of one key: what the history proves about a partition's log.

Built from every poll of every completion type and from committed sends that report an
offset (docs/anomalies.md). Holds offset -> value (first seen) plus the
offsets that held several values (`conflicts`) and the values seen at several offsets
(`multi`). After `seal()`, *index* is the dense position of an offset once offsets nobody
observed are removed, so gaps left by transaction markers or compaction are not skips.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["VersionOrder"]

_ABSENT = object()


class VersionOrder:
    __slots__ = ("conflicts", "key", "log", "multi", "offsets", "oidx", "voff")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.log: dict[int, Any] = {}
        self.voff: dict[Any, int] = {}
        self.conflicts: dict[int, list[Any]] = {}
        self.multi: dict[Any, set[int]] = {}
        self.offsets: list[int] = []
        self.oidx: dict[int, int] = {}

    def add(self, offset: int, value: Any) -> None:
        log = self.log
        if offset in log:
            cur = log[offset]
            if cur != value:
                vals = self.conflicts.get(offset)
                if vals is None:
                    self.conflicts[offset] = [cur, value]
                elif value not in vals:
                    vals.append(value)
        else:
            log[offset] = value
        o0 = self.voff.get(value)
        if o0 is None:
            self.voff[value] = offset
        elif o0 != offset:
            s = self.multi.get(value)
            if s is None:
                self.multi[value] = {o0, offset}
            else:
                s.add(offset)

    @classmethod
    def build(cls, key: Any, pairs: Iterable[Sequence[Any]]) -> VersionOrder:
        """The sealed version order of `key` from (offset, value) pairs in observation order.

        Pairs with a null offset are ignored. The same as `extend(pairs)`, then `seal()`.
        """
        vo = cls(key)
        vo.extend(pairs)
        vo.seal()
        return vo

    def extend(self, pairs: Iterable[Sequence[Any]]) -> None:
        """`add` each (offset, value) pair with a non-null offset, in order.

        `add`'s common cases inlined: a record is usually read several times, and a pair
        already seen changes nothing, so it costs one lookup.
        """
        log = self.log
        log_get = log.get
        for o, v in pairs:
            cur = log_get(o, _ABSENT)
            if cur is v or cur == v:
                continue  # seen before at this offset: `add` would change nothing
            if o is None:
                continue
            if cur is not _ABSENT:
                self.add(o, v)  # a second value at this offset: a conflict
                continue
            log[o] = v
            o0 = self.voff.setdefault(v, o)
            if o0 != o:  # the value also sits at another offset
                s = self.multi.get(v)
                if s is None:
                    self.multi[v] = {o0, o}
                else:
                    s.add(o)

    def seal(self) -> None:
        self.offsets = sorted(self.log)
        self.oidx = dict(zip(self.offsets, range(len(self.offsets)), strict=True))

    def value_offsets(self, value: Any) -> list[int]:
        s = self.multi.get(value)
        if s is not None:
            return sorted(s)
        o = self.voff.get(value)
        return [] if o is None else [o]

    def first_index(self, value: Any) -> int | None:
        s = self.multi.get(value)
        if s is not None:
            return self.oidx[min(s)]
        o = self.voff.get(value)
        return None if o is None else self.oidx[o]

    def last_index(self, value: Any) -> int | None:
        s = self.multi.get(value)
        if s is not None:
            return self.oidx[max(s)]
        o = self.voff.get(value)
        return None if o is None else self.oidx[o]

    def index_of(self, offset: Any, value: Any) -> int | None:
        """Index of a record read or acked at `offset` (value's first index if unknown)."""
        if offset is not None:
            i = self.oidx.get(offset)
            if i is not None:
                return i
        return self.first_index(value)

    def values_at(self, offset: int) -> list[Any]:
        c = self.conflicts.get(offset)
        if c is not None:
            return c
        return [self.log[offset]] if offset in self.log else []

    def offset_at_index(self, index: int) -> int:
        return self.offsets[index]

    def all_values(self) -> list[Any]:
        return list(self.voff)
