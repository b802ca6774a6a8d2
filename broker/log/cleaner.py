"""Log compaction: Kafka's LogCleaner, LogCleanerManager and cleaner-offset-checkpoint.

A log whose ``cleanup.policy`` includes ``compact`` keeps at least the latest record of every
key. Its segments split into a *clean* section (already compacted, from the log start to the
offset in ``cleaner-offset-checkpoint``) and a *dirty* section after it. A cleaner thread
(``log.cleaner.threads``, woken every ``log.cleaner.backoff.ms``) picks the log with the
largest dirty share of its bytes, if that share is above ``min.cleanable.dirty.ratio``, and:

1. builds an offset map (key -> offset of its latest record) over the dirty segments. Never
   the active segment, nothing at or past the high watermark, no segment holding records newer
   than ``min.compaction.lag.ms``; the map holds at most ``log.cleaner.dedupe.buffer.size`` /
   24 keys (shared by the threads), a larger dirty section is cleaned over several passes;
2. rewrites every segment from the log start up to the mapped offset, in groups that fit one
   segment (``segment.bytes``, ``segment.index.bytes``), into ``.cleaned`` segments named after
   each group's first base offset: a record is dropped when the map holds a later offset for
   its key. Kept records are copied byte for byte and keep their offsets, so the log has gaps
   and its log start offset does not move. A batch keeps its base and last offset (and so its
   producer sequence range) whatever records it loses; a batch that loses all of them goes,
   except control batches (kept: transactions are not cleaned yet) and the last batch of an
   idempotent producer, kept whole so that its producer state survives a reload (Kafka keeps
   it emptied; a batch here holds at least one record) unless one of its keys now ends in a
   tombstone, whose removal would bring the old value back;
3. tombstones (null values): the first cleaning that keeps one stamps its batch with a delete
   horizon, now + ``delete.retention.ms`` (KIP-534: attribute bit 6 and the horizon in
   baseTimestamp, record timestamp deltas re-encoded so every timestamp stays the same); a
   cleaning after the horizon drops them;
4. swaps each group in (``Log.replace_segments``: ``.cleaned`` -> ``.swap``, old segments
   ``.deleted``, ``.swap`` -> final name, each step on disk before the next; ``Log.open``
   finishes or undoes an interrupted swap) and records the new first dirty offset in
   ``cleaner-offset-checkpoint``.

Threads: the logs belong to the broker's event-loop thread (``broker.log.log``). A cleaner
thread reads the segments through its own descriptors, opened on the owner thread with the
plan, and writes the ``.cleaned`` files itself; choosing a log, planning and every swap run on
the owner thread (``run_on_owner``), where a swap first checks that the cleaning was not
aborted and that the segments it replaces are still the log's (retention or a truncation may
have got there first; the cleaning is then dropped). A truncation below the active segment
(``Log.on_truncate``, Kafka's LogManager.truncateTo) aborts a cleaning in flight, whatever
segments it left (they may hold other records by then), and moves the log's checkpoint back
to the active segment's base offset. Without an event loop (tests, benchmarks) ``clean_once``
runs everything in the calling thread. When the broker's clock allows no worker threads
(``broker.clock.worker_threads`` false: a simulation's virtual clock, which a thread waiting
in real time would not see move) ``LogCleaner.start`` runs one task on the event loop instead: ``clean_once`` (the owner-thread
work called directly, as it runs there already), then ``asyncio.sleep`` for the backoff when
nothing was cleaned. A cleaning is then one step of the loop, unless ``LogCleaner.interleave``
is set: the task awaits it at each point where a cleaner thread lets the owner run
(``Cleaner.clean_steps``: before the map, after it, before each swap), and the simulator
sets it to a seeded pause, so that the rest of the broker runs between a cleaning's plan and
its swaps as it does beside a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
import threading
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from crc32c import crc32c

from isrlab.broker import clock as broker_clock
from isrlab.broker.log import cleaner_records, durable
from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.errors import KafkaStorageError, LogError, SegmentsChangedError
from isrlab.broker.log.log import Log
from isrlab.broker.log.record_batch import (
    ATTRIBUTES_OFFSET,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    check_crc,
    check_header,
    iter_batches,
)
from isrlab.broker.log.segment import (
    CLEANED_SUFFIX,
    LogSegment,
    log_path,
    offset_index_path,
    time_index_path,
)
from isrlab.broker.log.txn_index import txn_index_path

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
#: KIP-534: the batch's baseTimestamp holds the delete horizon of its tombstones.
DELETE_HORIZON_MASK = 0x40
#: Bytes Kafka counts per offset map entry (a 16-byte MD5 of the key and an 8-byte offset).
BYTES_PER_MAP_ENTRY = 24
#: Kafka's log.cleaner.io.buffer.load.factor.
MAP_LOAD_FACTOR = 0.9
_INT32_MAX = 0x7FFFFFFF
_BATCH_LENGTH = struct.Struct(">i")

TopicPartition = tuple[str, int]
T = TypeVar("T")


def _direct(fn: Callable[[], T]) -> T:
    return fn()


#: a cleaning as the steps of a cleaner thread: it yields the name of each point where the
#: owner thread may run in the meantime, and returns its result
Steps = Generator[str, None, T]


def run_through(steps: Steps[T]) -> T:
    """Run the steps of a cleaning to their end, in the calling thread (a cleaner thread's own
    pace: the owner thread runs beside it as it will)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


class CleaningAborted(Exception):
    """The cleaning of a log was abandoned (shutdown, log deleted, segments changed)."""


@dataclass(frozen=True)
class CleanerConfig:
    """The broker's log.cleaner.* keys."""

    enable: bool = True
    threads: int = 1
    backoff_ms: int = 15000
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_size: int = 512 * 1024

    @classmethod
    def from_broker(cls, config: Mapping[str, Any]) -> CleanerConfig:
        return cls(
            enable=bool(config["log.cleaner.enable"]),
            threads=int(config["log.cleaner.threads"]),
            backoff_ms=int(config["log.cleaner.backoff.ms"]),
            dedupe_buffer_size=int(config["log.cleaner.dedupe.buffer.size"]),
            io_buffer_size=int(config["log.cleaner.io.buffer.size"]),
        )

    @property
    def map_entries_per_thread(self) -> int:
        threads = max(self.threads, 1)
        return max(
            int(self.dedupe_buffer_size * MAP_LOAD_FACTOR / BYTES_PER_MAP_ENTRY / threads), 1
        )


@dataclass(frozen=True)
class LogToClean:
    """How dirty a compacted log is (Kafka's LogToClean)."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def cleanable(
    log: Log, checkpoint: int | None, high_watermark: int | None, now_ms: int
) -> LogToClean:
    """Where the dirty section of ``log`` starts and ends, and its share of the bytes.

    The first dirty offset is the checkpointed one, reset to the log start when it is outside
    the log (as Kafka does). The dirty section ends at the first uncleanable offset: the active
    segment's base offset, the high watermark (the broker passes the last stable offset, so an
    open transaction is never cleaned), or the first segment holding a record newer than
    ``min.compaction.lag.ms``, whichever comes first; only whole segments below it count.
    """
    segments = log.segments
    start, end = log.log_start_offset, log.log_end_offset
    first_dirty = checkpoint if checkpoint is not None and start <= checkpoint <= end else start
    uncleanable = segments[-1].base_offset
    if high_watermark is not None:
        uncleanable = min(uncleanable, high_watermark)
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for segment in segments[:-1]:
            if segment.base_offset >= first_dirty and segment.largest_timestamp > now_ms - lag:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    clean = dirty = 0
    for segment, following in itertools.pairwise(segments):
        if following.base_offset <= first_dirty:
            clean += segment.size
        elif segment.base_offset >= first_dirty and following.base_offset <= uncleanable:
            dirty += segment.size
    return LogToClean(first_dirty, uncleanable, clean, dirty)


@dataclass
class _Source:
    """An old segment as the cleaner thread sees it: its own descriptor and what the owner
    thread read about it when planning."""

    segment: LogSegment
    fd: int
    size: int
    base_offset: int
    next_base: int  # the following segment's base offset
    index_bytes: int
    mtime_ns: int


@dataclass
class _Plan:
    log: Log
    tp: TopicPartition
    sources: list[_Source]  # every segment from the log start to the last dirty one
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    #: (producer id, first offset) of the aborted transactions overlapping the dirty section
    aborted: list[tuple[int, int]] = field(default_factory=list)

    def close(self) -> None:
        for source in self.sources:
            with contextlib.suppress(OSError):
                os.close(source.fd)
        self.sources = []


@dataclass
class CleanerStats:
    """What one cleaning did (Kafka's CleanerStats)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    map_records: int = 0
    map_bytes: int = 0
    batches_rewritten: int = 0
    segments_in: int = 0
    segments_out: int = 0
    elapsed_s: float = 0.0
    start: float = field(default_factory=broker_clock.monotonic)

    @property
    def mb_per_s(self) -> float:
        return (self.bytes_read + self.map_bytes) / 1e6 / self.elapsed_s if self.elapsed_s else 0.0


@dataclass(frozen=True)
class CleanResult:
    tp: TopicPartition
    first_dirty_offset: int
    end_offset: int  # the new first dirty offset
    stats: CleanerStats


class _AbortedTxns:
    """Which batches belong to aborted transactions, walking a log in offset order (Kafka's
    cleaner tracks the same): a producer's batches from the first offset of one of its aborted
    transactions up to its next marker (the abort)."""

    def __init__(self, aborted: list[tuple[int, int]]) -> None:
        self._pending = sorted(aborted, key=lambda t: t[1])
        self._next = 0
        self._active: set[int] = set()

    def skip(self, header: BatchHeader) -> bool:
        while (
            self._next < len(self._pending) and self._pending[self._next][1] <= header.base_offset
        ):
            self._active.add(self._pending[self._next][0])
            self._next += 1
        if header.is_control:
            self._active.discard(header.producer_id)
            return False
        return header.is_transactional and header.producer_id in self._active


def _batch_at(
    fd: int, size: int, position: int, data: bytes, at: int
) -> tuple[BatchHeader | None, bytes]:
    """The batch at file ``position`` (``at`` in ``data``, read from there if it is not whole in
    ``data``): its header, positioned in the returned buffer; (None, b"") at a torn tail.
    Raises CorruptRecordError/InvalidRecordError for a malformed batch."""
    if len(data) - at >= LOG_OVERHEAD:
        length = _BATCH_LENGTH.unpack_from(data, at + 8)[0] + LOG_OVERHEAD
        if at + length <= len(data):
            return check_header(data, at, len(data)), data
    head = os.pread(fd, LOG_OVERHEAD, position)
    if len(head) < LOG_OVERHEAD:
        return None, b""
    length = max(_BATCH_LENGTH.unpack_from(head, 8)[0] + LOG_OVERHEAD, LOG_OVERHEAD)
    if position + length > size:
        return None, b""
    batch = os.pread(fd, length, position)
    if len(batch) < length:
        return None, b""
    return check_header(batch, 0, len(batch)), batch


class Cleaner:
    """Cleans one log at a time (Kafka's Cleaner): builds the offset map, rewrites and swaps.

    ``run_on_owner`` runs a function on the thread that owns the logs and returns its result;
    ``step`` is called with the name of each step reached (tests inject crashes there):
    ``mapped``, ``cleaned`` (a group's ``.cleaned`` files are written and flushed), then
    ``swap``, ``deleted``, ``renamed`` from ``Log.replace_segments``.
    """

    def __init__(
        self,
        *,
        map_entries: int,
        io_buffer_size: int = 512 * 1024,
        clock: Callable[[], float] = broker_clock.time,
        run_on_owner: Callable[[Callable[[], Any]], Any] = _direct,
        step: Callable[[str], None] | None = None,
        should_abort: Callable[[TopicPartition], bool] = lambda tp: False,
    ) -> None:
        self.map_entries = map_entries
        self.io_buffer_size = max(io_buffer_size, HEADER_SIZE)
        self.clock = clock
        self.run_on_owner = run_on_owner
        self.step = step
        self.should_abort = should_abort

    # -- planning (owner thread) ------------------------------------------------------------

    def plan(self, log: Log, tp: TopicPartition, to_clean: LogToClean) -> _Plan | None:
        """Open the segments the cleaning may read; None if there is nothing dirty."""
        segments = log.segments
        sources: list[_Source] = []
        has_dirty = False
        try:
            for segment, following in itertools.pairwise(segments):
                if following.base_offset > to_clean.first_uncleanable_offset:
                    break
                path = segment.log_file
                fd = os.open(path, os.O_RDONLY)
                stat = os.fstat(fd)
                sources.append(
                    _Source(
                        segment,
                        fd,
                        segment.size,
                        segment.base_offset,
                        following.base_offset,
                        segment.offset_index.entries * 8,
                        stat.st_mtime_ns,
                    )
                )
                has_dirty = has_dirty or segment.base_offset >= to_clean.first_dirty_offset
        except BaseException:
            for source in sources:
                os.close(source.fd)
            raise
        plan = _Plan(
            log,
            tp,
            sources,
            to_clean.first_dirty_offset,
            to_clean.first_uncleanable_offset,
            int(self.clock() * 1000),
            log.collect_aborted_transactions(
                to_clean.first_dirty_offset, to_clean.first_uncleanable_offset
            ),
        )
        if not has_dirty:
            plan.close()
            return None
        return plan

    # -- cleaning (any thread) --------------------------------------------------------------

    def clean(self, plan: _Plan) -> CleanResult:
        """Map the dirty section, rewrite and swap in the cleaned groups; closes the plan."""
        return run_through(self.clean_steps(plan))

    def clean_steps(self, plan: _Plan) -> Steps[CleanResult]:
        """`clean` as a cleaner thread's steps: it yields ``planned`` before the map,
        ``mapped`` after it and ``cleaned`` before each group's swap, the points where the
        owner thread runs the rest of the broker beside a real cleaner thread (appends,
        rolls, truncations, retention: what each swap checks for). A simulation's cleaner task
        lets the loop run there (`LogCleaner.interleave`)."""
        stats = CleanerStats()
        try:
            yield "planned"
            offsets = cleaner_records.OffsetMap()
            last_batches: dict[int, int] = {}
            end_offset = self._build_offset_map(plan, offsets, last_batches, stats)
            self._step("mapped")
            yield "mapped"
            to_clean = [s for s in plan.sources if s.next_base <= end_offset]
            for group in self._groups(plan.log, to_clean):
                self._check_abort(plan.tp)
                yield from self._clean_group(plan, group, offsets, last_batches, stats)
            stats.elapsed_s = broker_clock.monotonic() - stats.start
            return CleanResult(plan.tp, plan.first_dirty, end_offset, stats)
        finally:
            plan.close()

    def _step(self, name: str) -> None:
        if self.step is not None:
            self.step(name)

    def _check_abort(self, tp: TopicPartition) -> None:
        if self.should_abort(tp):
            raise CleaningAborted(f"cleaning of {tp[0]}-{tp[1]} aborted")

    def _build_offset_map(
        self,
        plan: _Plan,
        offsets: cleaner_records.PyOffsetMap,
        last_batches: dict[int, int],
        stats: CleanerStats,
    ) -> int:
        """Map the dirty segments, whole segments only, until the map would overflow (at least
        one segment is mapped). Returns the offset after the last mapped segment.

        With aborted transactions in the dirty section, their records are left out of the map
        (Kafka's cleaner does the same): a key whose latest record was aborted keeps its last
        committed value, and the aborted record stays too (read_committed consumers skip it
        through the .txnindex; removing aborted records is not implemented)."""
        end_offset = plan.first_dirty
        aborted = _AbortedTxns(plan.aborted) if plan.aborted else None
        for source in plan.sources:
            if source.base_offset < plan.first_dirty:
                continue
            # A segment adds at most one key per offset it spans.
            if (
                end_offset > plan.first_dirty
                and len(offsets) + (source.next_base - source.base_offset) > self.map_entries
            ):
                break
            if aborted is not None:
                self._map_segment_skipping_aborted(
                    plan, source, offsets, last_batches, stats, aborted
                )
                stats.map_bytes += source.size
                end_offset = source.next_base
                continue
            position = 0
            while position < source.size:
                self._check_abort(plan.tp)  # a stop waits for one read's work at most
                data = os.pread(
                    source.fd, min(self.io_buffer_size, source.size - position), position
                )
                # Whole uncompressed batches in one call (C when built) ...
                consumed, mapped = cleaner_records.map_batches(data, offsets, last_batches)
                stats.map_records += mapped
                if consumed == len(data):
                    position += consumed
                    continue
                # ... then the one it stopped at: compressed, larger than the read, torn or bad.
                header, batch = _batch_at(
                    source.fd, source.size, position + consumed, data, consumed
                )
                if header is None:
                    break  # a torn tail: the rewrite stops there too
                if header.producer_id >= 0:
                    last_batches[header.producer_id] = header.last_offset
                records = self._records(header, batch, header.position)
                if records is not None and not header.is_control:
                    try:
                        stats.map_records += cleaner_records.map_records(
                            records[0], records[1], records[2], header.base_offset, offsets
                        )
                    except ValueError:
                        pass  # malformed records: the rewrite keeps this batch whole
                position += consumed + header.size
            stats.map_bytes += source.size
            end_offset = source.next_base
        return end_offset

    def _map_segment_skipping_aborted(
        self,
        plan: _Plan,
        source: _Source,
        offsets: cleaner_records.PyOffsetMap,
        last_batches: dict[int, int],
        stats: CleanerStats,
        aborted: _AbortedTxns,
    ) -> None:
        """The map pass over one segment, batch by batch in Python, without the records of
        aborted transactions (only used when the dirty section holds some)."""
        position = 0
        while position < source.size:
            self._check_abort(plan.tp)
            data = os.pread(source.fd, min(self.io_buffer_size, source.size - position), position)
            at = 0
            while at < len(data):
                header, batch = _batch_at(source.fd, source.size, position + at, data, at)
                if header is None:
                    return  # a torn tail: the rewrite stops there too
                if header.producer_id >= 0:
                    last_batches[header.producer_id] = header.last_offset
                skip = aborted.skip(header)
                records = (
                    None
                    if skip or header.is_control
                    else self._records(header, batch, header.position)
                )
                if records is not None:
                    try:
                        stats.map_records += cleaner_records.map_records(
                            records[0], records[1], records[2], header.base_offset, offsets
                        )
                    except ValueError:
                        pass  # malformed records: the rewrite keeps this batch whole
                at += header.size
                if batch is not data:
                    break  # read past this buffer: continue from the file
            position += at

    @staticmethod
    def _records(header: BatchHeader, data: bytes, at: int) -> tuple[bytes, int, int] | None:
        return batch_records(header, data, at)

    def _groups(self, log: Log, sources: list[_Source]) -> list[list[_Source]]:
        """Consecutive segments whose cleaned output fits one segment (Kafka's
        groupSegmentsBySize: segment.bytes, segment.index.bytes, 32-bit relative offsets)."""
        groups: list[list[_Source]] = []
        config = log.config
        i = 0
        while i < len(sources):
            group = [sources[i]]
            size, index_bytes = sources[i].size, sources[i].index_bytes
            i += 1
            while (
                i < len(sources)
                and size + sources[i].size <= config.segment_bytes
                and index_bytes + sources[i].index_bytes <= config.segment_index_bytes
                and sources[i].next_base - 1 - group[0].base_offset <= _INT32_MAX
            ):
                size += sources[i].size
                index_bytes += sources[i].index_bytes
                group.append(sources[i])
                i += 1
            groups.append(group)
        return groups

    def _clean_group(
        self,
        plan: _Plan,
        group: list[_Source],
        offsets: cleaner_records.PyOffsetMap,
        last_batches: dict[int, int],
        stats: CleanerStats,
    ) -> Steps[None]:
        log = plan.log
        directory = log.dir
        base = group[0].base_offset
        for path in (
            log_path(directory, base, CLEANED_SUFFIX),
            offset_index_path(directory, base, CLEANED_SUFFIX),
            time_index_path(directory, base, CLEANED_SUFFIX),
            txn_index_path(directory, base, CLEANED_SUFFIX),
        ):
            durable.unlink(path, missing_ok=True)
        cleaned = LogSegment(
            directory,
            base,
            index_interval_bytes=log.config.index_interval_bytes,
            max_index_size=log.config.segment_index_bytes,
            clock=self.clock,
            file_suffix=CLEANED_SUFFIX,
        )
        try:
            out = _Output(cleaned, self.io_buffer_size)
            for source in group:
                self._check_abort(plan.tp)
                self._clean_into(plan, source, out, offsets, last_batches, stats)
                stats.bytes_read += source.size
                stats.segments_in += 1
            out.flush()
            # Control batches (markers) are always kept, so the aborted transactions the old
            # segments indexed still hold; the cleaned segment takes them over.
            for source in group:
                for aborted in source.segment.txn_index.entries:
                    cleaned.txn_index.append(aborted)
            stats.bytes_written += cleaned.size
            # Finish the segment as a roll would (final time index entry, trimmed indexes),
            # make it durable, and give it the old segments' modification time, as Kafka does.
            cleaned.time_index.maybe_append(
                cleaned.max_timestamp_so_far,
                cleaned.offset_of_max_timestamp_so_far,
                skip_full_check=True,
            )
            cleaned.offset_index.trim_to_valid_size()
            cleaned.time_index.trim_to_valid_size()
            cleaned.flush()
            mtime = max(source.mtime_ns for source in group)
            os.utime(cleaned.log_file, ns=(mtime, mtime))
            self._step("cleaned")
            yield "cleaned"
            self._check_abort(plan.tp)
            old = [source.segment for source in group]
            # checked again on the owner thread, in the step that swaps: a truncation there
            # (LogCleaner.truncated) may have come after the check above
            self.run_on_owner(lambda: self._swap(plan.tp, log, cleaned, old))
            stats.segments_out += 1
        except Exception:
            # Abandoned before the swap (a SegmentsChangedError from replace_segments changed
            # nothing either): the .cleaned files go. A crash leaves them to Log.open instead.
            if cleaned.log_file.name.endswith(CLEANED_SUFFIX):
                cleaned.delete()
            raise

    def _swap(
        self, tp: TopicPartition, log: Log, cleaned: LogSegment, old: list[LogSegment]
    ) -> None:
        """On the owner thread: swap a cleaned group in, unless the cleaning was aborted."""
        self._check_abort(tp)
        log.replace_segments(cleaned, old, step=self.step)

    def _clean_into(
        self,
        plan: _Plan,
        source: _Source,
        out: _Output,
        offsets: cleaner_records.PyOffsetMap,
        last_batches: dict[int, int],
        stats: CleanerStats,
    ) -> None:
        position = 0
        while position < source.size:
            self._check_abort(plan.tp)
            data = os.pread(source.fd, min(self.io_buffer_size, source.size - position), position)
            # Whole uncompressed batches in one call (C when built) ...
            consumed, kept, read, kept_records, rewritten = cleaner_records.filter_batches(
                data, offsets, last_batches, plan.now_ms, crc32c
            )
            out.append_raw(kept)
            stats.records_read += read
            stats.records_kept += kept_records
            stats.batches_rewritten += rewritten
            if consumed == len(data):
                position += consumed
                continue
            # ... then the one it stopped at: compressed, control, a first delete horizon to
            # stamp, larger than the read, torn or bad.
            header, batch = _batch_at(source.fd, source.size, position + consumed, data, consumed)
            if header is None:
                break  # a torn tail (the active segment's only; never here)
            self._clean_batch(plan, header, batch, out, offsets, last_batches, stats)
            position += consumed + header.size

    def _clean_batch(
        self,
        plan: _Plan,
        header: BatchHeader,
        data: bytes,
        out: _Output,
        offsets: cleaner_records.PyOffsetMap,
        last_batches: dict[int, int],
        stats: CleanerStats,
    ) -> None:
        """One batch the bulk pass left: the general case, in Python."""
        now = plan.now_ms
        retention = plan.log.config.delete_retention_ms
        at = header.position
        stats.records_read += header.records_count
        check_crc(data, header)
        if header.is_control:
            out.append(header, data, at)
            stats.records_kept += header.records_count
            return
        records = self._records(header, data, at)
        if records is None:
            out.append(header, data, at)
            stats.records_kept += header.records_count
            return
        has_horizon = bool(header.attributes & DELETE_HORIZON_MASK)
        drop_tombstones = has_horizon and now >= header.base_timestamp
        try:
            kept, count, kept_tombstones = cleaner_records.filter_records(
                records[0], records[1], records[2], header.base_offset, offsets, drop_tombstones
            )
        except ValueError as exc:
            logger.warning(
                "keeping the batch at offset %d of %s as it is: %s",
                header.base_offset,
                plan.log.dir.name,
                exc,
            )
            out.append(header, data, at)
            stats.records_kept += header.records_count
            return
        new_horizon = kept_tombstones > 0 and not has_horizon
        if count == header.records_count and not new_horizon:
            out.append(header, data, at)
        elif count == 0:
            # Kafka keeps the last batch of a producer, emptied, so that its sequence
            # numbers survive a reload; this log cannot store empty batches, so the batch
            # stays whole, unless a key of it now ends in a tombstone: then its old value
            # could outlive the tombstone, and the batch goes.
            if (
                header.producer_id >= 0
                and last_batches.get(header.producer_id, header.last_offset) == header.last_offset
                and not cleaner_records.any_key_tombstoned(*records, offsets)
            ):
                out.append(header, data, at)
                count = header.records_count
            else:
                return
        else:
            base_timestamp = header.base_timestamp
            attributes = header.attributes
            if new_horizon:
                base_timestamp = now + retention
                attributes |= DELETE_HORIZON_MASK
                kept = cleaner_records.rebase_timestamps(
                    kept, header.base_timestamp, base_timestamp
                )
            batch = _rebuild(header, kept, count, attributes, base_timestamp)
            out.append(BatchHeader(0, *HEADER.unpack_from(batch, 0)), batch, 0)
            stats.batches_rewritten += 1
        stats.records_kept += count


def _at(header: BatchHeader, position: int) -> BatchHeader:
    """``header`` at another position (where a batch lands in the output buffer)."""
    return BatchHeader(
        position,
        header.base_offset,
        header.batch_length,
        header.partition_leader_epoch,
        header.magic,
        header.crc,
        header.attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
    )


def batch_records(
    header: BatchHeader, data: bytes, at: int | None = None
) -> tuple[bytes, int, int] | None:
    """(buffer, start, end) of the records of the batch at ``at`` (default: its position) in
    ``data``, decompressed; None if they cannot be read (an unavailable codec): the cleaner
    keeps such a batch as it is and maps nothing of it."""
    at = header.position if at is None else at
    if header.compression_type == 0:
        return data, at + HEADER_SIZE, at + header.size
    decoded = _decompress(header.compression_type, data[at + HEADER_SIZE : at + header.size])
    if decoded is None:
        return None
    return decoded, 0, len(decoded)


def _decompress(codec: int, payload: bytes) -> bytes | None:
    from kafka import codec as kafka_codec

    try:
        if codec == 1:
            return bytes(kafka_codec.gzip_decode(payload))
        if codec == 2 and kafka_codec.has_snappy():
            return bytes(kafka_codec.snappy_decode(payload))
        if codec == 3 and kafka_codec.has_lz4():
            return bytes(kafka_codec.lz4_decode(payload))
        if codec == 4 and kafka_codec.has_zstd():
            return bytes(kafka_codec.zstd_decode(payload))
    except Exception as exc:  # a corrupt payload: keep the batch, never drop what we cannot read
        logger.warning("cannot decompress a batch (codec %d): %s", codec, exc)
    return None


def _compress(codec: int, payload: bytes) -> bytes:
    from kafka import codec as kafka_codec

    if codec == 1:
        return bytes(kafka_codec.gzip_encode(payload))
    if codec == 2:
        return bytes(kafka_codec.snappy_encode(payload))
    if codec == 3:
        return bytes(kafka_codec.lz4_encode(payload))
    return bytes(kafka_codec.zstd_encode(payload))


def _rebuild(
    header: BatchHeader, records: bytes, count: int, attributes: int, base_timestamp: int
) -> bytes:
    """A batch with ``header``'s offsets, producer fields and max timestamp holding ``records``
    (``count`` of them, uncompressed), compressed with the batch's codec; CRC recomputed."""
    if header.compression_type:
        records = _compress(header.compression_type, records)
    batch = bytearray(HEADER_SIZE + len(records))
    HEADER.pack_into(
        batch,
        0,
        header.base_offset,
        HEADER_SIZE + len(records) - LOG_OVERHEAD,
        header.partition_leader_epoch,
        header.magic,
        0,
        attributes,
        header.last_offset_delta,
        base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    batch[HEADER_SIZE:] = records
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


class _Output:
    """Batches collected into ``io_buffer_size`` writes to the cleaned segment."""

    def __init__(self, segment: LogSegment, io_buffer_size: int) -> None:
        self.segment = segment
        self.limit = io_buffer_size
        self.buffer = bytearray()
        self.headers: list[BatchHeader] = []
        self.max_timestamp = -1
        self.offset_of_max = -1

    def append_raw(self, batches: bytes) -> None:
        """Whole batches, back to back."""
        if not batches:
            return
        base = len(self.buffer)
        self.buffer += batches
        for header in iter_batches(batches):
            self.headers.append(_at(header, base + header.position))
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp, self.offset_of_max = header.max_timestamp, header.last_offset
        if len(self.buffer) >= self.limit:
            self.flush()

    def append(self, header: BatchHeader, data: bytes, at: int) -> None:
        position = len(self.buffer)
        self.buffer += memoryview(data)[at : at + header.size]
        self.headers.append(_at(header, position))
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max = header.max_timestamp, header.last_offset
        if len(self.buffer) >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.headers:
            return
        self.segment.append(
            self.headers[-1].last_offset,
            self.max_timestamp,
            self.offset_of_max,
            self.buffer,
            batches=self.headers,
        )
        self.buffer = bytearray()
        self.headers = []
        self.max_timestamp = self.offset_of_max = -1


class LogCleaner:
    """The broker's cleaner threads and their checkpoint (Kafka's LogCleaner + LogCleanerManager).

    ``logs`` lists the broker's logs and ``high_watermark`` gives a partition's high
    watermark (None: no limit but the active segment); both, like the logs themselves, are
    only used on the owner thread through ``run_on_owner``.
    """

    def __init__(
        self,
        log_dir: Path,
        config: CleanerConfig,
        *,
        logs: Callable[[], Mapping[TopicPartition, Log]],
        high_watermark: Callable[[TopicPartition], int | None] = lambda tp: None,
        run_on_owner: Callable[[Callable[[], Any]], Any] = _direct,
        clock: Callable[[], float] = broker_clock.time,
        step: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._logs = logs
        self._high_watermark = high_watermark
        self._clock = clock
        self._checkpoint_file = OffsetCheckpointFile(log_dir / CLEANER_OFFSET_CHECKPOINT)
        try:
            self._checkpoints: dict[TopicPartition, int] = self._checkpoint_file.read()
        except KafkaStorageError as exc:
            logger.warning("%s; cleaning every compacted log from its start", exc)
            self._checkpoints = {}
        self._lock = threading.Lock()
        self._in_progress: set[TopicPartition] = set()
        self._aborted: set[TopicPartition] = set()
        self._uncleanable: set[TopicPartition] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._task: asyncio.Task[None] | None = None
        self.cleaner = Cleaner(
            map_entries=config.map_entries_per_thread,
            io_buffer_size=config.io_buffer_size,
            clock=clock,
            run_on_owner=run_on_owner,
            step=step,
            should_abort=self._should_abort,
        )
        self.last_results: list[CleanResult] = []
        #: where a cleaning on the loop (no worker threads) lets the rest of the broker run:
        #: awaited with the name of each step of `Cleaner.clean_steps`. None: a cleaning is
        #: one step of the loop. A simulation sets it to a seeded pause, so that appends,
        #: rolls, truncations and crashes land between a cleaning's plan and its swaps as
        #: they do beside a real cleaner thread.
        self.interleave: Callable[[str], Awaitable[None]] | None = None

    @property
    def checkpoints(self) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._checkpoints)

    def _should_abort(self, tp: TopicPartition) -> bool:
        return self._stop.is_set() or tp in self._aborted

    # -- choosing and cleaning --------------------------------------------------------------

    def _grab_filthiest(self) -> _Plan | None:
        """On the owner thread: the compacted log with the largest cleanable ratio above its
        min.cleanable.dirty.ratio, planned and marked in progress."""
        now_ms = int(self._clock() * 1000)
        best: tuple[float, TopicPartition, Log, LogToClean] | None = None
        with self._lock:
            for tp, log in self._logs().items():
                if not log.config.compact or tp in self._in_progress or tp in self._uncleanable:
                    continue
                try:
                    to_clean = cleanable(
                        log, self._checkpoints.get(tp), self._high_watermark(tp), now_ms
                    )
                except (KafkaStorageError, OSError) as exc:
                    logger.warning("cannot inspect %s-%d for cleaning: %s", *tp, exc)
                    continue
                if to_clean.cleanable_bytes == 0:
                    continue
                ratio = to_clean.cleanable_ratio
                if ratio > log.config.min_cleanable_dirty_ratio and (
                    best is None or ratio > best[0]
                ):
                    best = (ratio, tp, log, to_clean)
            if best is None:
                return None
            _, tp, log, to_clean = best
            plan = self.cleaner.plan(log, tp, to_clean)
            if plan is not None:
                self._in_progress.add(tp)
                self._aborted.discard(tp)
            return plan

    def clean_once(self) -> CleanResult | None:
        """Clean the filthiest log, if any is dirty enough; None otherwise."""
        return run_through(self.clean_once_steps())

    def clean_once_steps(self) -> Steps[CleanResult | None]:
        """`clean_once` as a cleaner thread's steps (`Cleaner.clean_steps`)."""
        plan: _Plan | None = self.cleaner.run_on_owner(self._grab_filthiest)
        if plan is None:
            return None
        tp = plan.tp
        try:
            result = yield from self.cleaner.clean_steps(plan)
            with self._lock:
                # truncated or deleted since it was planned: the checkpoint stays where the
                # truncation put it (a cleaning it aborted after its last swap still counts)
                if tp not in self._aborted:
                    self._checkpoints[tp] = result.end_offset
        except (CleaningAborted, LogError, OSError) as exc:
            if isinstance(exc, CleaningAborted) or self._should_abort(tp):
                logger.info("cleaning of %s-%d aborted", *tp)
            elif isinstance(exc, SegmentsChangedError):  # try again later
                logger.info("cleaning of %s-%d dropped: %s", *tp, exc)
            else:
                with self._lock:
                    self._uncleanable.add(tp)
                logger.error(
                    "cannot clean %s-%d, leaving it uncompacted until restart: %s", *tp, exc
                )
            return None
        finally:
            with self._lock:
                self._in_progress.discard(tp)
        self.write_checkpoint()
        stats = result.stats
        logger.info(
            "Cleaned %s-%d up to offset %d: %d segments into %d, %.1f MB read, %.1f MB written, "
            "%d of %d records kept, %.1f MB/s",
            *tp,
            result.end_offset,
            stats.segments_in,
            stats.segments_out,
            stats.bytes_read / 1e6,
            stats.bytes_written / 1e6,
            stats.records_kept,
            stats.records_read,
            stats.mb_per_s,
        )
        self.last_results = [*self.last_results[-9:], result]
        return result

    def write_checkpoint(self) -> None:
        """Write cleaner-offset-checkpoint for the logs that still exist (a deleted log's entry
        goes); a failure is logged (the next cleaning only starts earlier)."""
        with self._lock:
            existing = set(self._logs())
            entries = {tp: offset for tp, offset in self._checkpoints.items() if tp in existing}
        try:
            self._checkpoint_file.write(entries)
        except KafkaStorageError as exc:
            logger.error("%s", exc)

    def truncated(self, tp: TopicPartition, active_base: int) -> None:
        """On the owner thread: the log of ``tp`` was truncated below its active segment, now
        based at ``active_base`` (Kafka's abortAndPauseCleaning and
        maybeTruncateCleanerCheckpointToActiveSegmentBaseOffset). A cleaning in flight is
        dropped: the segments it read may hold other records now, under the same segment
        objects once the log has rolled past them again, so its swap would put back records
        the truncation removed. A checkpoint past ``active_base`` moves back to it: what was
        appended there since has never been cleaned."""
        with self._lock:
            if tp in self._in_progress:
                self._aborted.add(tp)
            checkpoint = self._checkpoints.get(tp)
            moved = checkpoint is not None and checkpoint > active_base
            if moved:
                self._checkpoints[tp] = active_base
        if moved:
            self.write_checkpoint()

    def abort(self, tp: TopicPartition) -> None:
        """Stop cleaning ``tp`` (it is being deleted): a running cleaning drops its work; the
        checkpoint entry goes."""
        with self._lock:
            if tp in self._in_progress:
                self._aborted.add(tp)
            self._checkpoints.pop(tp, None)
            self._uncleanable.discard(tp)

    # -- threads (or one task) ----------------------------------------------------------------

    def start(self) -> None:
        """Clean in the background: ``log.cleaner.threads`` threads, each looping ``clean_once``
        and waiting ``log.cleaner.backoff.ms`` when nothing was cleaned; or, when the broker's
        clock allows no worker threads, one task on the running event loop doing the same
        (see the module docstring)."""
        if not self.config.enable or self.config.threads <= 0:
            return
        self._stop.clear()
        if not broker_clock.worker_threads():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run_on_loop(), name="kafka-log-cleaner")
            return
        for i in range(self.config.threads):
            thread = threading.Thread(
                target=self._run, name=f"kafka-log-cleaner-thread-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _pass(self) -> bool:
        """One pass of a cleaner thread or task: whether a log was cleaned."""
        try:
            return self.clean_once() is not None
        except Exception:
            return self._pass_failed()

    def _pass_failed(self) -> bool:
        """In the except block of a failed pass: logged with its traceback unless stopping
        (a stop abandons a cleaning by raising); nothing was cleaned."""
        if not self._stop.is_set():
            logger.exception("log cleaner pass failed")
        return False

    def _run(self) -> None:
        backoff = self.config.backoff_ms / 1000
        while not self._stop.is_set():
            if not self._pass():
                self._stop.wait(backoff)

    async def _run_on_loop(self) -> None:
        backoff = self.config.backoff_ms / 1000
        while not self._stop.is_set():
            cleaned = self._pass() if self.interleave is None else await self._pass_interleaved()
            # after a cleaning, the loop runs what is ready before the next one
            await asyncio.sleep(0 if cleaned else backoff)

    async def _pass_interleaved(self) -> bool:
        """`_pass` with ``interleave`` awaited at each step of the cleaning."""
        assert self.interleave is not None
        steps = self.clean_once_steps()
        try:
            step = next(steps)
            while True:
                await self.interleave(step)
                step = steps.send(None)
        except StopIteration as done:
            return done.value is not None
        except Exception:
            return self._pass_failed()
        finally:
            steps.close()  # a cancelled task: the plan's descriptors closed, the log's mark cleared

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the threads to stop (a running cleaning is abandoned at its next batch of
        work, its ``.cleaned`` files removed) and wait for them; the task is cancelled (it
        waits between cleanings, never in one)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            loop = task.get_loop()
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                task.cancel()
            else:
                loop.call_soon_threadsafe(task.cancel)
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = [thread for thread in self._threads if thread.is_alive()]

    @property
    def alive(self) -> bool:
        task = self._task
        return (task is not None and not task.done()) or any(
            thread.is_alive() for thread in self._threads
        )


__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "DELETE_HORIZON_MASK",
    "CleanResult",
    "Cleaner",
    "CleanerConfig",
    "CleanerStats",
    "CleaningAborted",
    "LogCleaner",
    "LogToClean",
    "cleanable",
]
