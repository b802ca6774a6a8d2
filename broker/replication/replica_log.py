"""What the replication core needs from a partition's log, and an in-memory log that provides it.

:class:`ReplicaLog` is the narrow interface :class:`broker.replication.partition.Partition`
drives: offsets (log start, LEO), the leader-epoch cache (``latest_epoch``,
``end_offset_for_epoch``, ``assign_epoch_start_offset``), truncation, the two append paths
(the leader stamps its epoch, a follower keeps the epochs it fetched) and the high-watermark
checkpoint (``hw_checkpoint``: the value a restarted broker starts from). Records are opaque to
the core; only the log interprets them.

:class:`MemoryLog` implements it with records as ``(value, leader_epoch)`` tuples. It also models
the page cache: ``flushed_offset`` is how far the log is durable, ``flush()`` makes everything
durable and ``crash()`` drops whatever was not, the way a power loss drops unflushed Kafka
segments (Kafka does not fsync per write; durability comes from replication).

Epoch-cache semantics follow Kafka's ``LeaderEpochFileCache``: entries are
``(epoch, start_offset)`` pairs, strictly increasing in both; ``end_offset_for_epoch(e)`` returns
``(e, LEO)`` for the latest epoch, otherwise ``(largest epoch <= e, start offset of the first
epoch > e)``, with ``(e, that start offset)`` when no smaller epoch is known and
``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`` when ``e`` is larger than every known epoch or
undefined.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Protocol

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

Record = tuple[Any, int]
"""A MemoryLog record: (value, leader epoch it was written in)."""


class TxnValue(int):
    """A MemoryLog value that belongs to a transaction: an int (so it compares like any other
    value) carrying the producer id and, for a transaction marker, "commit" or "abort"
    (None: transactional data). Opens the producer's transaction or closes it."""

    producer_id: int
    marker: str | None

    def __new__(cls, value: int, producer_id: int, marker: str | None = None) -> TxnValue:
        if marker not in (None, "commit", "abort"):
            raise ValueError(f"a transaction marker is commit or abort, not {marker!r}")
        obj = super().__new__(cls, value)
        obj.producer_id = producer_id
        obj.marker = marker
        return obj

    def __repr__(self) -> str:
        what = self.marker or "data"
        return f"TxnValue({int(self)}, pid={self.producer_id}, {what})"


class ReplicaLog(Protocol):
    """The log operations the replication core uses (adapt ``broker.log.log.Log`` to this)."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def hw_checkpoint(self) -> int:
        """The last checkpointed high watermark (what a restarted replica starts from)."""
        ...

    @hw_checkpoint.setter
    def hw_checkpoint(self, value: int) -> None: ...

    def latest_epoch(self) -> int:
        """The largest epoch in the epoch cache, UNDEFINED_EPOCH if it is empty."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """``(epoch, end offset)`` with Kafka's LeaderEpochFileCache.endOffsetFor semantics."""
        ...

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (done by a new leader)."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or above ``offset`` (and epoch entries starting there)."""
        ...

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything and restart the log empty at ``offset``."""
        ...

    def append_as_leader(self, records: Sequence[Any], leader_epoch: int) -> tuple[int, int]:
        """Assign offsets, stamp ``leader_epoch``; returns (first offset, last offset)."""
        ...

    def append_as_follower(self, records: Sequence[Any]) -> None:
        """Append records fetched from the leader, keeping their offsets and epochs."""
        ...

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction still open or whose marker the high
        watermark has not passed (the log learns the HW through ``hw_checkpoint``), None if
        there is none: the LSO is min(this, HW)."""
        ...


class MemoryLog:
    """An in-memory :class:`ReplicaLog` of ``(value, epoch)`` records with a page-cache model;
    :class:`TxnValue` values model transactions (data and markers) for the LSO."""

    def __init__(self) -> None:
        self._start = 0
        self._records: list[Record] = []
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), strictly increasing
        self._hw_checkpoint = 0
        self.flushed_offset = 0

    # -- offsets -------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def log_end_offset(self) -> int:
        return self._start + len(self._records)

    @property
    def hw_checkpoint(self) -> int:
        return self._hw_checkpoint

    @hw_checkpoint.setter
    def hw_checkpoint(self, value: int) -> None:
        self._hw_checkpoint = value

    # -- leader epoch cache --------------------------------------------------------------
    @property
    def epoch_entries(self) -> list[tuple[int, int]]:
        """A copy of the epoch cache, ``[(epoch, start_offset), ...]``."""
        return list(self._epochs)

    def latest_epoch(self) -> int:
        return self._epochs[-1][0] if self._epochs else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        if epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self._epochs[-1][0]:
            return epoch, self.log_end_offset
        epochs = [e for e, _ in self._epochs]
        higher = bisect.bisect_right(epochs, epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher_start = self._epochs[higher][1]
        if higher == 0:
            return epoch, higher_start
        return self._epochs[higher - 1][0], higher_start

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        # broker/log/leader_epoch_checkpoint.py's `assign` (Kafka's): the latest epoch again at
        # or past its start changes nothing; else the entries the new one contradicts (an
        # epoch at or above it, a start at or past it) go, an older epoch's included
        if self._epochs and epoch == self._epochs[-1][0] and start_offset >= self._epochs[-1][1]:
            return
        while self._epochs and (
            self._epochs[-1][0] >= epoch or self._epochs[-1][1] >= start_offset
        ):
            self._epochs.pop()
        self._epochs.append((epoch, start_offset))

    # -- mutation ------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        if offset >= self.log_end_offset:
            return
        offset = max(offset, self._start)
        del self._records[offset - self._start :]
        self._epochs = [(e, s) for e, s in self._epochs if s < offset]
        self.flushed_offset = min(self.flushed_offset, offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._records = []
        self._epochs = []
        self._start = offset
        self.flushed_offset = offset

    def append_as_leader(self, records: Sequence[Any], leader_epoch: int) -> tuple[int, int]:
        if not records:
            raise ValueError("append_as_leader needs at least one record")
        first = self.log_end_offset
        self.assign_epoch_start_offset(leader_epoch, first)
        self._records.extend((value, leader_epoch) for value in records)
        return first, self.log_end_offset - 1

    def append_as_follower(self, records: Sequence[Any]) -> None:
        for value, epoch in records:
            offset = self.log_end_offset
            if not self._epochs or epoch != self._epochs[-1][0]:
                self.assign_epoch_start_offset(epoch, offset)
            self._records.append((value, epoch))

    # -- transactions --------------------------------------------------------------------
    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of its transaction without a marker in this log."""
        ongoing: dict[int, int] = {}
        for offset, (value, _) in enumerate(self._records, self._start):
            if isinstance(value, TxnValue):
                if value.marker is None:
                    ongoing.setdefault(value.producer_id, offset)
                else:
                    ongoing.pop(value.producer_id, None)
        return ongoing

    def first_unstable_offset(self) -> int | None:
        """Kafka's semantics over the records: the first offset of the oldest transaction
        that is open, or whose marker is at or past the HW the core last set."""
        ongoing: dict[int, int] = {}
        unstable: list[int] = []
        for offset, (value, _) in enumerate(self._records, self._start):
            if not isinstance(value, TxnValue):
                continue
            if value.marker is None:
                ongoing.setdefault(value.producer_id, offset)
                continue
            first = ongoing.pop(value.producer_id, None)
            if first is not None and offset >= self._hw_checkpoint:
                unstable.append(first)
        return min([*unstable, *ongoing.values()], default=None)

    # -- reads ---------------------------------------------------------------------------
    def read(self, start: int, end: int) -> list[Record]:
        """Records with offsets in ``[start, end)`` (clamped to the log)."""
        lo = max(start, self._start) - self._start
        hi = max(min(end, self.log_end_offset) - self._start, lo)
        return self._records[lo:hi]

    def record_at(self, offset: int) -> Record | None:
        """The record at ``offset``, or None when the log does not hold it."""
        if self._start <= offset < self.log_end_offset:
            return self._records[offset - self._start]
        return None

    # -- page cache model ----------------------------------------------------------------
    def flush(self) -> None:
        """Make every record durable (fsync)."""
        self.flushed_offset = self.log_end_offset

    def crash(self) -> None:
        """Simulate power loss: records past ``flushed_offset`` vanish, as do epoch entries
        starting at or after the new end (Kafka's recovery does truncateFromEnd)."""
        if self.flushed_offset < self.log_end_offset:
            keep = max(self.flushed_offset, self._start)
            del self._records[keep - self._start :]
            self._epochs = [(e, s) for e, s in self._epochs if s < keep]
