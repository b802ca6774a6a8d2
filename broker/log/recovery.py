"""What a log may and may not cut off when it loads damaged files (part of Kafka's LogLoader).

Kafka trusts a cleanly shut down log and, after an unclean shutdown, rescans the segments past
the recovery point and truncates at the first batch that does not check out. This broker adds
two rules, so that damage never turns into reused offsets or silently dropped records:

- **Every start validates the tail** of every segment: the batches past its last offset index
  entry (at most about ``index.interval.bytes`` plus one batch) get the structure, CRC and
  offset checks of a recovery, and the last entries of the ``.index`` and ``.timeindex`` must
  point at the batches they describe. A cleanly stopped log with a torn last batch or garbage
  after it is recovered instead of trusted (``check_tail``).
- **Recovery only cuts off a tail**: it truncates at the first invalid batch only when nothing
  that must be kept lies behind it (``refusal``): no whole, CRC-valid batch after it in the
  same file, no offset index entry past it in a trusted segment, and, if a later segment holds
  records, no offsets missing before that segment. A torn write, zeros or garbage after the
  last batch, or a damaged final batch (indistinguishable from a torn write) are cut off; a
  corrupt batch with good batches behind it is media damage that truncation would turn into
  silent loss of those good batches, so the log directory is refused instead
  (``LogDirFailure``, Kafka's offline log dir) with one line naming the file and what to do.

The scans here read the ``.log`` file through their own read-only mapping and change nothing;
``LogSegment.recover`` does the truncating and index rebuilding once the caller agrees.

**Reads check what no recovery checked.** A segment used as it is at start-up (a clean stop,
or wholly below the recovery point) had only its tail checked: its batches before the last
offset index entry were never CRC-checked by this process (``mark_unchecked``). The first
read that serves them (a consumer's or a follower's fetch) checks them (``verify_read``), once
per batch (a fetch, or the producer-state replay after a start); one that fails raises
``CorruptLogData``, and the log manager takes the log
directory offline (Kafka's KafkaStorageException path: with one log dir the broker halts, so
it leaves every ISR and the controller elects elsewhere) instead of serving it. Kafka's leader
sends such a batch unchecked (sendfile) and leaves it to the follower's append and to consumers
with ``check.crcs``; a follower would then be stuck behind it and a consumer without the
check would read garbage.
"""

from __future__ import annotations

import bisect
import mmap
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from isrlab.broker.log.abstract_index import CorruptIndexError
from isrlab.broker.log.errors import CorruptRecordError, InvalidRecordError, KafkaStorageError
from isrlab.broker.log.record_batch import (
    MAGIC_OFFSET,
    MAGIC_V2,
    BatchHeader,
    ByteBuffer,
    check_crc,
    check_header,
)
from isrlab.broker.log.segment import LogSegment

_INT32_MAX = 0x7FFFFFFF


class LogDirFailure(KafkaStorageError):
    """The partition directory holds damage recovery must not truncate; the broker refuses it."""


class CorruptLogData(KafkaStorageError):
    """A read met a batch that fails the recovery checks in a region no recovery checked: the
    log directory must go offline (see the module docstring). ``segment_base`` is the base
    offset of the damaged segment: a start that rescans from there finds the damage again."""

    def __init__(self, message: str, path: Path, position: int, segment_base: int) -> None:
        super().__init__(message)
        self.path = path
        self.position = position
        self.segment_base = segment_base


# segment -> [checked up to (a batch boundary), end of the region no recovery checked]
_unchecked: weakref.WeakKeyDictionary[LogSegment, list[int]] = weakref.WeakKeyDictionary()


def mark_unchecked(segment: LogSegment, end: int) -> None:
    """The batches of ``segment`` before byte ``end`` were loaded without a CRC check."""
    if end > 0:
        _unchecked[segment] = [0, end]
    else:
        _unchecked.pop(segment, None)


def unchecked_end(segment: LogSegment) -> int:
    """How far the region no check covered yet reaches (0: every batch was checked)."""
    state = _unchecked.get(segment)
    return 0 if state is None else state[1]


def verify_read(segment: LogSegment, position: int, size: int) -> None:
    """Check the batches a read of ``size`` bytes from ``position`` (a batch boundary) serves
    from the segment's unchecked region; raise CorruptLogData at the first that fails."""
    state = _unchecked.get(segment)
    if state is None or size <= 0:
        return
    checked_to, end = state
    contiguous = position <= checked_to
    start = checked_to if contiguous else position
    stop = min(position + size, end)
    if start >= stop:
        return
    with _mapped(segment.log_file) as buf:
        stop = min(stop, len(buf))
        here = start
        while here < stop:
            try:
                header = _check_batch(buf, here, len(buf), segment.base_offset)
            except (CorruptRecordError, InvalidRecordError) as exc:
                raise CorruptLogData(
                    f"corrupt record batch in {segment.log_file} at byte offset {here} "
                    f"({exc}), met while reading it (no recovery had checked it)",
                    segment.log_file,
                    here,
                    segment.base_offset,
                ) from exc
            here = header.end_position
    if contiguous:
        state[0] = max(checked_to, here)
        if state[0] >= end:
            _unchecked.pop(segment, None)


@dataclass(frozen=True, slots=True)
class InvalidBatch:
    """The first batch of a scan that does not check out."""

    position: int
    reason: str


@dataclass(frozen=True, slots=True)
class Scan:
    """Valid batches from a starting position up to ``valid_end``; then ``invalid`` (or EOF)."""

    valid_end: int
    next_offset: int  # offset after the last valid batch (the expected offset if none)
    headers: list[BatchHeader]
    invalid: InvalidBatch | None


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap | bytes]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped:
            yield mapped


def _check_batch(buf: ByteBuffer, position: int, end: int, base_offset: int) -> BatchHeader:
    """The recovery checks of one batch: structure, CRC, and an offset that fits the segment."""
    header = check_header(buf, position, end)
    check_crc(buf, header)
    if not 0 <= header.last_offset - base_offset <= _INT32_MAX:
        raise InvalidRecordError(
            f"batch at position {position} has offsets {header.base_offset}..{header.last_offset}, "
            f"outside segment {base_offset}"
        )
    return header


def scan(segment: LogSegment, start_position: int = 0, expected_offset: int | None = None) -> Scan:
    """Check batches from ``start_position`` (a batch boundary) to the end of the ``.log`` file.

    ``expected_offset``: the first batch must not start below it (offsets must grow); defaults
    to the segment's base offset.
    """
    next_offset = segment.base_offset if expected_offset is None else expected_offset
    headers: list[BatchHeader] = []
    with _mapped(segment.log_file) as buf:
        end = len(buf)
        position = start_position
        while position < end:
            try:
                header = _check_batch(buf, position, end, segment.base_offset)
            except (CorruptRecordError, InvalidRecordError) as exc:
                return Scan(position, next_offset, headers, InvalidBatch(position, str(exc)))
            if header.base_offset < next_offset:
                reason = (
                    f"batch at position {position} starts at offset {header.base_offset}, "
                    f"below the {next_offset} that follows the previous batch"
                )
                return Scan(position, next_offset, headers, InvalidBatch(position, reason))
            headers.append(header)
            next_offset = header.next_offset
            position = header.end_position
        return Scan(position, next_offset, headers, None)


def valid_batch_after(segment: LogSegment, position: int, next_offset: int) -> int | None:
    """Position of a whole, CRC-valid batch starting after ``position`` with offsets from
    ``next_offset`` on, or None: are there records behind an invalid batch at ``position``?

    Every position whose magic byte is 2 is tried, so a batch is found even when the invalid
    one's batchLength is what the damage hit.
    """
    with _mapped(segment.log_file) as buf:
        end = len(buf)
        candidate = position + 1
        while candidate + MAGIC_OFFSET < end:
            found = buf.find(bytes([MAGIC_V2]), candidate + MAGIC_OFFSET)
            if found < 0:
                return None
            start = found - MAGIC_OFFSET
            try:
                header = _check_batch(buf, start, end, segment.base_offset)
            except (CorruptRecordError, InvalidRecordError):
                header = None
            if header is not None and header.base_offset >= next_offset:
                return start
            candidate = start + 1
        return None


def check_tail(segment: LogSegment) -> tuple[str | None, InvalidBatch | None]:
    """The cheap check of a trusted segment on every start.

    Returns (why its indexes must be rebuilt, the first invalid batch past the last offset
    index entry); (None, None) when the tail and the indexes' last entries check out.
    """
    try:
        segment.sanity_check()
    except CorruptIndexError as exc:
        return str(exc), None
    index_offset, index_position = segment.offset_index.last_entry
    tail = scan(segment, index_position)
    if tail.invalid is not None and tail.invalid.position == index_position > 0:
        # The indexed batch itself is bad: rescan the segment to tell a torn batch (log damage)
        # from an entry pointing at the wrong place (index damage).
        whole = scan(segment)
        if whole.valid_end > index_position:
            return f"offset index entry {index_position} is not at a batch boundary", None
        return None, whole.invalid
    index_problem = None
    if segment.offset_index.entries > 0 and not tail.headers and tail.invalid is None:
        index_problem = f"last offset index entry ({index_offset}, {index_position}) points at the end of the log"
    elif segment.offset_index.entries > 0 and tail.headers:
        first = tail.headers[0]
        if first.last_offset != index_offset:
            index_problem = (
                f"last offset index entry ({index_offset}, {index_position}) points at the "
                f"batch of offsets {first.base_offset}..{first.last_offset}"
            )
    if index_problem is None and segment.time_index.entries > 0:
        index_problem = _time_index_problem(segment, tail)
    return index_problem, tail.invalid


def _time_index_problem(segment: LogSegment, tail: Scan) -> str | None:
    timestamp, offset = segment.time_index.last_entry
    if offset >= tail.next_offset:
        return (
            f"last time index entry ({timestamp}, {offset}) is past the log end {tail.next_offset}"
        )
    batch = next((h for h in tail.headers if h.base_offset <= offset <= h.last_offset), None)
    if batch is None:
        batch = segment.translate_offset(offset)
    if batch is None or batch.last_offset != offset or batch.max_timestamp != timestamp:
        found = "no batch" if batch is None else f"largest timestamp {batch.max_timestamp}"
        return (
            f"last time index entry ({timestamp}, {offset}) does not match the batch ending "
            f"at that offset ({found})"
        )
    return None


def next_offset_of_file(path: Path, base_offset: int) -> int | None:
    """The offset after the last batch of a ``.log`` file that is whole valid batches with
    growing offsets (its base offset if empty), or None if it is not."""
    with _mapped(path) as buf:
        end = len(buf)
        position = 0
        next_offset = base_offset
        while position < end:
            try:
                header = _check_batch(buf, position, end, base_offset)
            except (CorruptRecordError, InvalidRecordError):
                return None
            if header.base_offset < next_offset:
                return None
            next_offset = header.next_offset
            position = header.end_position
        return next_offset


def epoch_cache_problem(
    entries: list[tuple[int, int]],
    segments: list[LogSegment],
    log_start_offset: int,
    *,
    gaps: bool = False,
) -> str | None:
    """Why the leader-epoch-checkpoint's entries contradict the record batches, or None.

    Cheap: one index lookup per entry (there is one entry per leader change). Each entry's
    start offset must be the first offset of a batch stamped with that epoch (or the log start
    offset, inside such a batch), start offsets must grow, and the last batch must carry the
    epoch the cache gives its offset. With ``gaps`` (a compacted log) an entry may also start
    where the cleaner removed batches, before a batch of the same or a later epoch.
    """
    if not segments:
        return None
    bases = [segment.base_offset for segment in segments]
    log_end = segments[-1].next_offset

    def batch_at(offset: int) -> BatchHeader | None:
        """The first batch ending at or after ``offset`` (in a later segment if the cleaner
        emptied the one holding it)."""
        index = max(bisect.bisect_right(bases, offset) - 1, 0)
        for segment in segments[index:]:
            header = segment.translate_offset(offset)
            if header is not None or not gaps:
                return header
        return None

    previous_start = -1
    for epoch, start in entries:
        if start <= previous_start:
            return f"start offset {start} of epoch {epoch} is not after {previous_start}"
        previous_start = start
        if start >= log_end or start < log_start_offset:
            continue  # trimmed to the log right after loading
        header = batch_at(start)
        if (
            gaps
            and header is not None
            and header.base_offset > start
            and header.partition_leader_epoch >= epoch
        ):
            continue  # a compacted log: the epoch's first batches were cleaned away
        if header is None or header.base_offset > start:
            return f"epoch {epoch} starts at offset {start}, where the log has no batch"
        if header.partition_leader_epoch != epoch or (
            header.base_offset != start and start != log_start_offset
        ):
            return (
                f"epoch {epoch} starts at offset {start}, but the batch there starts at "
                f"{header.base_offset} with epoch {header.partition_leader_epoch}"
            )
    if log_end > log_start_offset:
        last = batch_at(log_end - 1)
        if last is not None and last.partition_leader_epoch >= 0 and not entries:
            # a deleted file (what the broker says to do with a malformed one) is rebuilt
            return (
                f"no entries, but the last batch (offset {last.base_offset}) has epoch "
                f"{last.partition_leader_epoch}"
            )
        if last is not None and last.partition_leader_epoch >= 0:
            covering = [epoch for epoch, start in entries if start <= last.base_offset]
            expected = covering[-1] if covering else None
            if expected != last.partition_leader_epoch:
                return (
                    f"the last batch (offset {last.base_offset}) has epoch "
                    f"{last.partition_leader_epoch} but the checkpoint gives {expected}"
                )
    return None


def refusal(
    segment: LogSegment,
    invalid: InvalidBatch,
    next_offset: int,
    *,
    next_base: int | None,
    later_has_records: bool,
    index_position: int | None,
) -> str | None:
    """Why truncating ``segment`` at ``invalid`` would drop records that must be kept, or None.

    ``next_offset``: the offset after the valid batches before it; ``index_position``: the position of
    the last offset index entry when that index is trusted (a clean segment whose index
    passed its checks), else None.
    """
    behind = valid_batch_after(segment, invalid.position, next_offset)
    if behind is not None:
        return f"a valid batch follows it at byte offset {behind}"
    if index_position is not None and index_position > invalid.position:
        return f"the offset index points at a batch further on (byte offset {index_position})"
    if next_base is not None and later_has_records and next_offset < next_base:
        return (
            f"offsets {next_offset}..{next_base - 1} would go missing before the next "
            f"segment {next_base}"
        )
    return None


def refuse(segment: LogSegment, invalid: InvalidBatch, why: str) -> LogDirFailure:
    """The one line the broker stops with."""
    return LogDirFailure(
        f"corrupt record batch in {segment.log_file} at byte offset {invalid.position} "
        f"({invalid.reason}) with records behind it ({why}): recovery will not truncate "
        f"them, so {segment.dir} is not loaded; restore the partition from a replica (move "
        f"the directory away and restart, it re-replicates), or, to give up the records from "
        f"that batch on, truncate {segment.log_file.name} to {invalid.position} bytes and "
        "delete the later segments"
    )


__all__ = [
    "CorruptLogData",
    "InvalidBatch",
    "LogDirFailure",
    "Scan",
    "check_tail",
    "epoch_cache_problem",
    "mark_unchecked",
    "next_offset_of_file",
    "refusal",
    "refuse",
    "scan",
    "unchecked_end",
    "valid_batch_after",
    "verify_read",
]
