"""The per-partition ``leader-epoch-checkpoint`` file and its in-memory cache (KIP-101).

File format (Kafka's LeaderEpochCheckpointFile, a version-0 checkpoint)::

    0
    2
    3 0          <- epoch 3 started at offset 0
    5 1200       <- epoch 5 started at offset 1200

Entries are strictly increasing in both epoch and start offset. The leader adds an entry the
first time it appends in a new epoch; a follower adds one when it appends a batch stamped with
a new partitionLeaderEpoch. ``end_offset_for`` answers OffsetsForLeaderEpoch, which a follower
uses to truncate to the point where its log and the leader's agree. The file is rewritten
(atomically) on every change, as Kafka does.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path

from isrlab.broker.log.checkpoint import CheckpointFile
from isrlab.broker.log.errors import KafkaStorageError

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

EpochEntry = tuple[int, int]


def _format(entry: EpochEntry) -> str:
    return f"{entry[0]} {entry[1]}"


def _parse(fields: list[str]) -> EpochEntry:
    if len(fields) != 2:
        raise ValueError(fields)
    return int(fields[0]), int(fields[1])


class LeaderEpochFileCache:
    """(epoch, start offset) pairs of one partition's log, backed by ``leader-epoch-checkpoint``."""

    def __init__(self, path: Path) -> None:
        self._checkpoint: CheckpointFile[EpochEntry] = CheckpointFile(path, _format, _parse)
        self._entries: list[EpochEntry] = sorted(self._checkpoint.read())
        #: told when a rewrite of the file fails (a failed fsync): the log takes its log dir
        #: offline, as Kafka's checkpoint files with a LogDirFailureChannel do. The change is
        #: already in memory, and the broker must not go on with a cache its disk lacks.
        self.on_write_failure: Callable[[KafkaStorageError], None] | None = None

    @property
    def path(self) -> Path:
        return self._checkpoint.path

    def epoch_entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The largest epoch, or UNDEFINED_EPOCH (-1) when the cache is empty."""
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that the record at ``start_offset`` is of ``epoch`` (Kafka's assign).

        Nothing changes when ``epoch`` is the latest epoch and starts at or before
        ``start_offset``. Otherwise, as in Kafka, the entries the new one contradicts are
        dropped from the end (an epoch at or above ``epoch``, or a start at or past
        ``start_offset``) and the new entry appended, so the cache stays monotonic and never
        names, for an offset, an epoch other than its record's. That includes a batch of an
        *older* epoch than the latest entry: a broker that led an epoch and appended nothing
        in it keeps that epoch's entry at its log end, and a batch then fetched from the next
        leader at that offset, stamped with an older epoch, must replace it; a stale entry made
        this broker, leading again, answer OffsetsForLeaderEpoch with that offset as the older
        epoch's end, and a follower in the ISR cut committed records (the simulator's
        invariants caught it). Negative epochs or offsets (no epoch) are ignored. Returns True
        if the cache changed."""
        if epoch < 0 or start_offset < 0:
            return False
        if self._entries:
            latest_epoch, latest_start = self._entries[-1]
            if epoch == latest_epoch and start_offset >= latest_start:
                return False
        entries = self._entries
        while entries and (entries[-1][0] >= epoch or entries[-1][1] >= start_offset):
            entries.pop()
        entries.append((epoch, start_offset))
        self._flush()
        return True

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the record at ``offset`` belongs to, or UNDEFINED_EPOCH if before every entry."""
        slot = bisect.bisect_right([start for _, start in self._entries], offset) - 1
        return self._entries[slot][0] if slot >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= requested, its end offset).

        - undefined requested epoch, empty cache, or requested above the latest: (-1, -1)
        - requested == latest: (latest, log_end_offset)
        - otherwise the end offset is the start offset of the first epoch above the requested
          one, paired with the largest known epoch <= requested (or the requested epoch itself
          if it is below every known epoch).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self.latest_epoch:
            return requested_epoch, log_end_offset
        epochs = [epoch for epoch, _ in self._entries]
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher_start = self._entries[higher][1]
        if higher == 0:
            return requested_epoch, higher_start
        return self._entries[higher - 1][0], higher_start

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        if end_offset < 0:
            return
        kept = [entry for entry in self._entries if entry[1] < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below ``start_offset``; the epoch covering it now starts there."""
        below = [entry for entry in self._entries if entry[1] <= start_offset]
        if not below:
            return
        covering_epoch = below[-1][0]
        kept = [(covering_epoch, start_offset)] + [
            entry for entry in self._entries if entry[1] > start_offset
        ]
        if kept != self._entries:
            self._entries = kept
            self._flush()

    def clear_and_flush(self) -> None:
        self._entries = []
        self._flush()

    def _flush(self) -> None:
        try:
            self._checkpoint.write(self._entries)
        except KafkaStorageError as exc:
            if self.on_write_failure is not None:
                self.on_write_failure(exc)
            raise
