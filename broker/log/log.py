"""One partition's log: an ordered list of segments in the directory ``<topic>-<partition>``.

``Log`` owns offsets (log start offset, log end offset, recovery point), appends as leader or
follower, reads whole batches for fetches, rolls segments, applies retention, truncates for
replication and recovers after a crash. Replication policy (high watermark, ISR) lives in
``broker/replication``; this module only stores.

Directory layout::

    orders-0/
      00000000000000000000.log        record batches, exactly as served to fetchers
      00000000000000000000.index      offset -> position, sparse
      00000000000000000000.timeindex  timestamp -> offset, sparse
      00000000000000000000.txnindex   aborted transactions whose marker is in the segment
                                      (only once there is one; see broker.log.txn_index)
      00000000000000004096.log ...    next segment, named by its base offset
      leader-epoch-checkpoint         (epoch, start offset) pairs
      .kafka_cleanshutdown            present only between a clean close and the next open
      *.deleted                       segments waiting for file.delete.delay.ms before removal

Durability (fsync) semantics, as in Kafka:

- By default nothing is fsynced per append (``flush_interval_messages`` and
  ``flush_interval_ms`` are None): an append is a ``pwrite`` into the page cache. A killed
  broker process (kill -9) loses nothing the OS already has; a power loss, kernel panic or VM
  crash may lose any append after the last flush. Durability comes from replication.
- ``flush_interval_messages=N`` fsyncs when N messages are unflushed; ``flush_interval_ms=T``
  fsyncs from the timer-driven ``maybe_flush``; ``flush()`` fsyncs explicitly. A rolled
  segment is fsynced at the roll (Kafka does that asynchronously). Every flush advances the
  recovery point: the offset below which the files are known durable.
- The leader-epoch checkpoint is rewritten atomically and fsynced on every change.
- ``close()`` flushes everything and writes ``.kafka_cleanshutdown``. ``open()`` deletes the
  marker. Without it, every segment from the one holding the recovery point is rescanned
  ("Recovering unflushed segment"): CRCs are checked, the indexes rebuilt, and a torn or
  corrupt tail is truncated. With it, and for flushed segments below the recovery point, only
  each segment's tail past its last index entry and the indexes' last entries are checked;
  a segment that fails is rescanned the same way. Recovery never truncates records that must
  be kept (a corrupt batch with valid batches behind it): the log is refused instead
  (``LogDirFailure``); see ``broker.log.recovery`` and docs/durability.md.

Not thread-safe by design: the broker calls one Log from its single asyncio thread.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from isrlab.broker.log import durable, recovery
from isrlab.broker.log.cleaner_records import first_keyless
from isrlab.broker.log.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
    SegmentsChangedError,
    UnexpectedAppendOffsetError,
)
from isrlab.broker.log.leader_epoch_checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochFileCache
from isrlab.broker.log.record_batch import NO_TIMESTAMP, BatchHeader, parse_header, stamp, validate
from isrlab.broker.log.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    FileRegion,
    LogSegment,
    log_path,
    offset_index_path,
    time_index_path,
)
from isrlab.broker.log.txn_index import (
    TXN_INDEX_SUFFIX,
    AbortedTxn,
    CorruptTxnIndexError,
    txn_index_path,
)

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
#: ListOffsets' special timestamps (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
_DAY_MS = 24 * 60 * 60 * 1000


@dataclass
class LogConfig:
    """Per-topic log settings: Kafka's topic config keys in snake_case, with Kafka's defaults."""

    segment_bytes: int = 1024 * 1024 * 1024  # segment.bytes
    segment_ms: int = 7 * _DAY_MS  # segment.ms
    segment_index_bytes: int = 10 * 1024 * 1024  # segment.index.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    retention_ms: int = 7 * _DAY_MS  # retention.ms, -1 = unlimited
    retention_bytes: int = -1  # retention.bytes, -1 = unlimited
    flush_interval_messages: int | None = None  # flush.messages, None = never (page cache)
    flush_interval_ms: int | None = None  # flush.ms, None = never
    max_message_bytes: int = 1048588  # max.message.bytes
    file_delete_delay_ms: int = 60000  # file.delete.delay.ms
    cleanup_policy: tuple[str, ...] = ("delete",)  # cleanup.policy
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    delete_retention_ms: int = _DAY_MS  # delete.retention.ms

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the log cleaner keeps the latest record per key."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention by time and size applies."""
        return "delete" in self.cleanup_policy


class AppendOrigin(enum.Enum):
    """Who appends: clients may not write control batches, the coordinator (txn markers) may."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


@dataclass(slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    num_records: int
    num_batches: int
    valid_bytes: int
    log_append_time: int = -1
    #: the appended batches' headers as stored (offsets and leader epoch stamped, positions
    #: relative to the appended buffer)
    batches: list[BatchHeader] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True)
class FetchDataInfo:
    """What a read found: file regions to send in order (possibly from several segments)."""

    regions: list[FileRegion] = field(default_factory=list)
    fetch_offset: int = -1
    #: the offset of the first batch after the data (a read_committed fetch's bound for the
    #: aborted transactions it returns); -1 when nothing was read
    upper_bound_offset: int = -1

    @property
    def size(self) -> int:
        regions = self.regions
        if len(regions) == 1:  # (most reads: one segment)
            return regions[0].size
        return sum(region.size for region in regions)

    def read_bytes(self) -> bytes:
        regions = self.regions
        if len(regions) == 1:
            return regions[0].read_bytes()
        return b"".join(region.read_bytes() for region in regions)


def parse_topic_partition(directory: Path) -> tuple[str, int]:
    """``orders-eu-3`` -> ("orders-eu", 3): the partition is after the last dash."""
    topic, dash, partition = directory.name.rpartition("-")
    if not dash or not topic or not partition.isdigit():
        raise KafkaStorageError(
            f"log directory {directory} is not named <topic>-<partition> (for example orders-0)"
        )
    return topic, int(partition)


class Log:
    """A partition's segments plus its offsets; see the module docstring for the contract."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        leader_epoch_cache: LeaderEpochFileCache,
        clock: Callable[[], float],
    ) -> None:
        self._dir = directory
        self._topic, self._partition = parse_topic_partition(directory)
        self.config = config
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._epoch_cache = leader_epoch_cache
        # a failed rewrite of the leader-epoch file, whoever asked for it (an append in a new
        # epoch, a leader's new epoch, a truncation): the log dir goes offline
        leader_epoch_cache.on_write_failure = self._storage_failed
        self._clock = clock
        self._last_flush_ms = self._now_ms()
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._closed = False
        #: the offset from which the .txnindex files must be rebuilt by replaying producer
        #: state (segments recovery rescanned), None when they are complete
        self.txn_index_rebuild_from: int | None = None
        #: called with the new segment's base offset when the log rolls (before anything is
        #: appended to it): the partition snapshots its producer state there, as Kafka does
        self.on_roll: Callable[[int], None] | None = None
        #: told when a read meets damage no recovery checked (``recovery.CorruptLogData``) or
        #: an fsync of a segment fails: the log manager takes the log directory offline
        self.on_storage_failure: Callable[[KafkaStorageError], None] | None = None
        #: called with the active segment's base offset after a truncation that reached below
        #: the active segment (Kafka's LogManager.truncateTo): the log cleaner drops a cleaning
        #: in flight, whose segments may since hold other records, and moves its checkpoint back
        self.on_truncate: Callable[[int], None] | None = None

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Log:
        """Load (and if needed recover) the log in ``dir``, creating the directory if absent."""
        directory = Path(dir)
        parse_topic_partition(directory)
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        _complete_swaps(directory)
        base_offsets = _remove_strays_and_list_segments(directory)

        segments: list[LogSegment] = []
        try:
            recovered = False
            rebuild_txn_from: int | None = None
            # has_records_after[i]: a segment after the i-th one holds records
            has_records_after = [False] * len(base_offsets)
            for i in range(len(base_offsets) - 2, -1, -1):
                has_records_after[i] = (
                    has_records_after[i + 1]
                    or log_path(directory, base_offsets[i + 1]).stat().st_size > 0
                )
            for position, base_offset in enumerate(base_offsets):
                indexes_missing = not (
                    offset_index_path(directory, base_offset).exists()
                    and time_index_path(directory, base_offset).exists()
                )
                segment = cls._new_segment(directory, base_offset, config, clock)
                segments.append(segment)
                next_base = base_offsets[position + 1] if position + 1 < len(base_offsets) else None
                unflushed = next_base is None or next_base > recovery_point
                trusted = clean or not unflushed
                truncated = _load_segment(
                    segment,
                    trusted=trusted,
                    indexes_missing=indexes_missing,
                    next_base=next_base,
                    later_has_records=has_records_after[position],
                )
                # An unflushed segment's .txnindex may miss entries a crash lost with the page
                # cache, and a damaged one is dropped: both are rebuilt by replaying producer
                # state from there (the partition does it, see ProducerStateManager.load).
                try:
                    segment.txn_index.sanity_check()
                    damaged = False
                except CorruptTxnIndexError as exc:
                    logger.warning("%s; rebuilding it from the producer state", exc)
                    segment.txn_index.reset()
                    damaged = True
                if (damaged or not trusted) and rebuild_txn_from is None:
                    rebuild_txn_from = base_offset
                if truncated is None:
                    continue
                recovered = True
                if truncated > 0 and next_base is not None and segment.next_offset < next_base:
                    # Only empty segments follow (recovery refuses otherwise): drop them so the
                    # log continues right after the last valid batch.
                    for later in base_offsets[position + 1 :]:
                        for path in (
                            log_path(directory, later),
                            offset_index_path(directory, later),
                            time_index_path(directory, later),
                            txn_index_path(directory, later),
                        ):
                            durable.unlink(path, missing_ok=True)
                    break
            if clean:
                # Forget the marker durably before any write: a crash from here on must recover.
                durable.unlink(marker)
                _fsync_dir(directory)
            if not segments:
                start = log_start_offset if log_start_offset is not None else 0
                segments.append(cls._new_segment(directory, start, config, clock))
            segments[-1].resize_indexes(config.segment_index_bytes)

            start = (
                segments[0].base_offset
                if log_start_offset is None
                else max(log_start_offset, segments[0].base_offset)
            )
            cache = _load_or_rebuild_epoch_cache(directory, segments, start, config.compact)
            log = cls(
                directory,
                config,
                segments,
                log_start_offset=start,
                recovery_point=0,
                leader_epoch_cache=cache,
                clock=clock,
            )
            if start > log.log_end_offset:
                # The checkpointed log start is past the data that survived: start empty there.
                log.truncate_fully_and_start_at(start)
            if recovered:
                # What recovery may have rewritten lies past the old recovery point (segments
                # below it were flushed before the stop): fsync those, then move the point.
                log._recovery_point = min(recovery_point, log.log_end_offset)
                log.flush()
            log._recovery_point = log.log_end_offset
            if rebuild_txn_from is not None:
                log.txn_index_rebuild_from = max(
                    min(rebuild_txn_from, log.log_end_offset), log.log_start_offset
                )
            cache.truncate_from_end(log.log_end_offset)
            cache.truncate_from_start(log.log_start_offset)
            return log
        except BaseException:
            for segment in segments:  # do not leak file handles and mappings on a failed open
                segment.close_handlers()
            raise

    @staticmethod
    def _new_segment(
        directory: Path, base_offset: int, config: LogConfig, clock: Callable[[], float]
    ) -> LogSegment:
        return LogSegment(
            directory,
            base_offset,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            clock=clock,
        )

    # -- properties --------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def leader_epoch_cache(self) -> LeaderEpochFileCache:
        return self._epoch_cache

    @property
    def latest_epoch(self) -> int:
        return self._epoch_cache.latest_epoch

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- appending ---------------------------------------------------------------------------

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        validated: list[BatchHeader] | None = None,
    ) -> LogAppendInfo:
        """Validate every batch, give them offsets from the log end offset and append them.

        Raises InvalidRecordError/CorruptRecordError/RecordTooLargeError/
        RecordBatchTooLargeError and appends nothing if any batch is bad.

        ``validated``: what ``validate(records, strict_offsets=True)`` returned for these very
        bytes, from a caller that validated them already (the broker's leader append checks
        producer state between the two); the batches are then not validated again. The
        other checks (sizes, control batches, keys of a compacted topic) are made either way.
        """
        self._ensure_open()
        headers = validate(records, strict_offsets=True) if validated is None else validated
        self._check_sizes(headers, len(records))
        if origin is AppendOrigin.CLIENT:
            for header in headers:
                if header.is_control:
                    raise InvalidRecordError(
                        f"batch at position {header.position} is a control batch; clients may not write those"
                    )
        if self.config.compact:
            self._check_keys(records, headers)
        buffer = bytearray(records)  # our own copy: the caller's buffer is never modified
        next_offset = self.log_end_offset
        stamped: list[BatchHeader] = []
        for header in headers:
            stamp(buffer, header.position, next_offset, leader_epoch)
            stamped.append(parse_header(buffer, header.position))
            next_offset += header.last_offset_delta + 1
        return self._append(buffer, stamped)

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> LogAppendInfo:
        """Append batches fetched from the leader, keeping their offsets and leader epochs.

        The first batch must start at the log end offset (else UnexpectedAppendOffsetError,
        a LogError: the replica must truncate or reset first) and offsets must grow; CRCs are verified.
        On a compacted log (cleanup.policy=compact) the first batch may also start past the log
        end offset, as in Kafka: the leader's cleaner removed the batches between.
        """
        self._ensure_open()
        if len(records) == 0:
            leo = self.log_end_offset
            return LogAppendInfo(leo, leo - 1, NO_TIMESTAMP, -1, 0, 0, 0)
        headers = validate(records, strict_offsets=False)
        self._check_sizes(headers, len(records))
        expected = self.log_end_offset
        first = headers[0].base_offset
        if first < expected or (first > expected and not self.config.compact):
            raise UnexpectedAppendOffsetError(
                f"follower append to {self._dir.name} starts at offset {headers[0].base_offset} "
                f"but the log end offset is {expected}: truncate or reset the replica first",
                headers[0].base_offset,
                headers[-1].last_offset,
            )
        for previous, header in itertools.pairwise(headers):
            if header.base_offset < previous.next_offset:
                raise LogError(
                    f"follower append to {self._dir.name} has out-of-order offsets: batch at "
                    f"{header.base_offset} follows one ending at {previous.last_offset}"
                )
        return self._append(records, headers)

    def _check_keys(
        self, records: bytes | bytearray | memoryview, headers: list[BatchHeader]
    ) -> None:
        """A compacted topic takes only records with a key (Kafka's LogValidator)."""
        from isrlab.broker.log.cleaner import batch_records

        data = bytes(records)
        for header in headers:
            if header.is_control:
                continue
            try:
                found = batch_records(header, data)
                keyless = -1 if found is None else first_keyless(*found)
            except ValueError as exc:
                raise InvalidRecordError(
                    f"batch at position {header.position} has malformed records: {exc}"
                ) from None
            if keyless >= 0:
                raise InvalidRecordError(
                    f"Compacted topic cannot accept message without key in topic partition "
                    f"{self._topic}-{self._partition} (record {keyless} of the batch at position "
                    f"{header.position})"
                )

    def _check_sizes(self, headers: list[BatchHeader], total: int) -> None:
        for header in headers:
            if header.size > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {header.size} bytes exceeds max.message.bytes "
                    f"{self.config.max_message_bytes} of {self._dir.name}"
                )
        if total > self.config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"append of {total} bytes exceeds segment.bytes {self.config.segment_bytes} of {self._dir.name}"
            )

    def _append(
        self, records: bytes | bytearray | memoryview, headers: list[BatchHeader]
    ) -> LogAppendInfo:
        first_offset = headers[0].base_offset
        last_offset = headers[-1].last_offset
        max_timestamp, offset_of_max = NO_TIMESTAMP, -1
        num_records = 0
        for header in headers:
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = header.max_timestamp, header.last_offset
            num_records += header.records_count
        segment = self._maybe_roll(len(records), last_offset)
        # A write that fails is undone by the segment (nothing appended, the produce refused
        # with KAFKA_STORAGE_ERROR, the broker goes on: a full disk). What fails after it, the
        # leader-epoch checkpoint or the flush policy's fsync, leaves the batch in the log
        # unacknowledged: the log dir goes offline (`_storage_failed`).
        segment.append(
            last_offset, max_timestamp, offset_of_max, memoryview(records), batches=headers
        )
        latest_epoch = self._epoch_cache.latest_epoch
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch != latest_epoch:  # (an older one too: `assign`)
                self._epoch_cache.assign(epoch, header.base_offset)
                latest_epoch = self._epoch_cache.latest_epoch
        flush_messages = self.config.flush_interval_messages
        if flush_messages is not None and last_offset + 1 - self._recovery_point >= flush_messages:
            self.flush()
        return LogAppendInfo(
            first_offset,
            last_offset,
            max_timestamp,
            offset_of_max,
            num_records,
            len(headers),
            len(records),
            batches=headers,
        )

    def _maybe_roll(self, messages_size: int, max_offset: int) -> LogSegment:
        segment = self._segments[-1]
        size = segment.size
        if size == 0:
            return segment
        config = self.config
        reasons = (
            size > config.segment_bytes - messages_size
            or self._now_ms() - segment.rolling_based_ms > config.segment_ms
            or segment.is_full
            or not segment.can_convert_to_relative_offset(max_offset)
        )
        return self.roll() if reasons else segment

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty).

        The old segment gets its final time index entry, gives back its preallocated index
        space and is fsynced.
        """
        self._ensure_open()
        old = self.active_segment
        if old.size == 0:
            return old
        new_base = self.log_end_offset
        old.on_become_inactive()
        segment = self._new_segment(self._dir, new_base, self.config, self._clock)
        self._segments.append(segment)
        self._bases.append(new_base)
        old.flush()  # its data, final time index entry and trimmed indexes are now durable
        self.flush(new_base)
        if self.on_roll is not None:
            self.on_roll(new_base)
        return segment

    # -- reading -----------------------------------------------------------------------------

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchDataInfo:
        """Whole batches from the one holding ``start_offset``, possibly from several segments.

        Stops before the batch holding ``max_offset`` (exclusive, e.g. the high watermark)
        and within ``max_bytes``, except that ``min_one_message`` returns the first batch even
        if it is larger. OffsetOutOfRangeError below the log start or past the log end;
        an empty result at the log end.
        """
        self._ensure_open()
        leo = self.log_end_offset
        if start_offset < self._log_start_offset or start_offset > leo:
            raise OffsetOutOfRangeError(
                f"fetch offset {start_offset} of {self._dir.name} is outside "
                f"[{self._log_start_offset}, {leo}]: reset to the log start or end offset"
            )
        if start_offset == leo or (max_offset is not None and start_offset >= max_offset):
            return FetchDataInfo(fetch_offset=start_offset)
        regions: list[FileRegion] = []
        remaining = max_bytes
        first = max(bisect.bisect_right(self._bases, start_offset) - 1, 0)
        last: tuple[LogSegment, FileRegion] | None = None
        for segment in self._segments[first:]:
            if max_offset is not None and segment.base_offset >= max_offset:
                break
            region = segment.read(
                max(start_offset, segment.base_offset),
                max(remaining, 0),
                min_one_message=min_one_message and not regions,
                max_offset=max_offset,
            )
            if region is None:
                continue  # nothing at or after the offset in this segment
            if region.size == 0:
                break  # out of budget or at max_offset
            try:
                recovery.verify_read(segment, region.position, region.size)
            except recovery.CorruptLogData as exc:
                if self.on_storage_failure is not None:
                    self.on_storage_failure(exc)
                raise
            regions.append(region)
            last = (segment, region)
            remaining -= region.size
            if remaining <= 0 or region.position + region.size < segment.size:
                break  # a batch did not fit: later segments must not be read past it
        if last is not None:
            segment, region = last
            following = segment.offset_at_position(region.position + region.size)
            return FetchDataInfo(regions, start_offset, following)
        return FetchDataInfo(regions, start_offset)

    # -- transactions ------------------------------------------------------------------------

    def append_aborted_txn(
        self, producer_id: int, first_offset: int, last_offset: int, last_stable_offset: int
    ) -> None:
        """Index an aborted transaction in the segment holding its marker (``last_offset``)."""
        self._ensure_open()
        position = max(bisect.bisect_right(self._bases, last_offset) - 1, 0)
        self._segments[position].txn_index.append(
            AbortedTxn(producer_id, first_offset, last_offset, last_stable_offset)
        )

    def truncate_txn_indexes(self, offset: int) -> None:
        """Drop the .txnindex entries of markers at or past ``offset`` (before a rebuild)."""
        self._ensure_open()
        for segment in self._segments:
            if segment.next_offset > offset or segment.base_offset >= offset:
                segment.txn_index.truncate_to(offset)

    def collect_aborted_transactions(
        self, start_offset: int, upper_bound_offset: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction overlapping
        [start_offset, upper_bound_offset), from the segment holding ``start_offset`` on, as
        Kafka's UnifiedLog.collectAbortedTransactions (what a read_committed fetch returns)."""
        self._ensure_open()
        out: list[tuple[int, int]] = []
        first = max(bisect.bisect_right(self._bases, start_offset) - 1, 0)
        for segment in self._segments[first:]:
            found, complete = segment.txn_index.collect_aborted(start_offset, upper_bound_offset)
            out.extend((t.producer_id, t.first_offset) for t in found)
            if complete:
                break
        return out

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets: (offset, timestamp) of the earliest record with timestamp >= ``timestamp``.

        EARLIEST_TIMESTAMP (-2) gives (log start offset, -1), LATEST_TIMESTAMP (-1) gives
        (log end offset, -1). None if no record is that recent.
        """
        self._ensure_open()
        if timestamp == EARLIEST_TIMESTAMP:
            return self._log_start_offset, NO_TIMESTAMP
        if timestamp == LATEST_TIMESTAMP:
            return self.log_end_offset, NO_TIMESTAMP
        if timestamp < 0:
            raise ValueError(f"unsupported ListOffsets timestamp {timestamp}")
        for segment in self._segments:
            if (
                segment.next_offset <= self._log_start_offset
                or segment.max_timestamp_so_far < timestamp
            ):
                continue
            found = segment.find_offset_by_timestamp(timestamp, self._log_start_offset)
            if found is not None:
                return found
        return None

    # -- truncation --------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Drop every batch at and past ``offset`` (a batch holding it is dropped whole).

        Deletes whole segments as needed and truncates the leader epoch cache too. Returns
        True if anything was removed.
        """
        self._ensure_open()
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        if offset >= self.log_end_offset:
            return False
        if self._segments[0].base_offset > offset:
            self.truncate_fully_and_start_at(offset)
            return True
        below_active = offset < self._bases[-1]
        keep = bisect.bisect_right(self._bases, offset)
        doomed = self._segments[keep:]
        del self._segments[keep:]
        del self._bases[keep:]
        self._schedule_delete(doomed)
        active = self.active_segment
        active.truncate_to(offset)
        active.resize_indexes(self.config.segment_index_bytes)
        leo = self.log_end_offset
        self._epoch_cache.truncate_from_end(leo)
        self._log_start_offset = min(self._log_start_offset, leo)
        self._recovery_point = min(self._recovery_point, leo)
        if below_active and self.on_truncate is not None:
            self.on_truncate(active.base_offset)
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at ``offset`` (log start = end = offset)."""
        self._ensure_open()
        doomed = self._segments
        self._segments, self._bases = [], []
        self._schedule_delete(doomed)
        segment = self._new_segment(self._dir, offset, self.config, self._clock)
        self._segments.append(segment)
        self._bases.append(offset)
        self._epoch_cache.clear_and_flush()
        self._log_start_offset = offset
        self._recovery_point = offset
        if self.on_truncate is not None:
            self.on_truncate(offset)

    # -- flushing ----------------------------------------------------------------------------

    def flush(self, up_to: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, ``up_to``) (default: all)."""
        self._ensure_open()
        target = self.log_end_offset if up_to is None else min(up_to, self.log_end_offset)
        if target <= self._recovery_point:
            return
        for position, segment in enumerate(self._segments):
            next_base = self._bases[position + 1] if position + 1 < len(self._bases) else None
            if segment.base_offset < target and (
                next_base is None or next_base > self._recovery_point
            ):
                try:
                    segment.flush()
                except KafkaStorageError as exc:
                    self._storage_failed(exc)
                    raise
        self._recovery_point = target
        self._last_flush_ms = self._now_ms()

    def _storage_failed(self, exc: KafkaStorageError) -> None:
        """A failed fsync (of a segment, or of the leader-epoch checkpoint, whoever changed
        it) leaves the page cache untrustworthy: the kernel may have dropped the dirty pages or
        marked them clean ("fsyncgate"), so a retry could call durable what is not on disk.
        Kafka's LogDirFailureChannel takes the log dir offline; so does the log manager
        (``on_storage_failure``)."""
        if self.on_storage_failure is not None:
            self.on_storage_failure(exc)

    def maybe_flush(self) -> bool:
        """Timer hook: flush if ``flush_interval_ms`` elapsed, and finish delayed file deletions."""
        self._ensure_open()
        now = self._now_ms()
        self._delete_due_segments(now)
        interval = self.config.flush_interval_ms
        if interval is None or now - self._last_flush_ms < interval:
            return False
        if self.log_end_offset > self._recovery_point:
            self.flush()
            return True
        self._last_flush_ms = now
        return False

    # -- retention ---------------------------------------------------------------------------

    def delete_old_segments(self, high_watermark: int | None = None) -> int:
        """Apply retention; returns how many segments were deleted.

        Deletes, oldest first and never the active segment: segments wholly below the log
        start offset, and, when cleanup.policy includes delete, segments whose largest
        timestamp is older than ``retention_ms`` and oldest segments while the log exceeds
        ``retention_bytes``. With ``high_watermark``
        only segments wholly below it are eligible (Kafka never deletes uncommitted data).
        Advances the log start offset to the first remaining segment.
        """
        self._ensure_open()
        now = self._now_ms()

        def eligible() -> bool:
            if len(self._segments) < 2:
                return False
            return high_watermark is None or self._bases[1] <= high_watermark

        deleted: list[LogSegment] = []
        while eligible() and self._bases[1] <= self._log_start_offset:
            deleted.append(self._pop_oldest())
        retention_ms = self.config.retention_ms if self.config.delete else -1
        if retention_ms >= 0:
            while eligible() and now - self._segments[0].largest_timestamp > retention_ms:
                deleted.append(self._pop_oldest())
        # cleanup.policy=compact alone: no retention by time or size (the cleaner keeps the
        # latest record of every key instead); compact,delete applies both.
        retention_bytes = self.config.retention_bytes if self.config.delete else -1
        if retention_bytes >= 0:
            excess = self.size_in_bytes - retention_bytes
            while eligible() and excess - self._segments[0].size >= 0:
                excess -= self._segments[0].size
                deleted.append(self._pop_oldest())
        if deleted:
            self._schedule_delete(deleted)
            self.maybe_increment_log_start_offset(self._bases[0])
        self._delete_due_segments(now)
        return len(deleted)

    def _pop_oldest(self) -> LogSegment:
        self._bases.pop(0)
        return self._segments.pop(0)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Raise the log start offset (retention, DeleteRecords); True if it moved."""
        self._ensure_open()
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the log start of {self._dir.name} to {offset}, past the log end "
                f"offset {self.log_end_offset}"
            )
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self._epoch_cache.truncate_from_start(offset)
        return True

    # -- compaction --------------------------------------------------------------------------

    def replace_segments(
        self,
        cleaned: LogSegment,
        old: list[LogSegment],
        *,
        step: Callable[[str], None] | None = None,
    ) -> None:
        """Swap the log cleaner's ``cleaned`` segment in for ``old`` (consecutive segments of
        this log, not the active one), crash-safely as Kafka's ``replaceSegments`` does.

        ``cleaned`` has ``.cleaned`` files, flushed, named after ``old[0]``'s base offset. Steps,
        each durable before the next (``open`` completes or undoes an interrupted swap):
        rename the cleaned files to ``.swap``; rename the old segments to ``.deleted`` (and
        drop them after ``file.delete.delay.ms``); rename the ``.swap`` files to their final
        names. ``step(name)`` is called after each (tests inject crashes there). Raises
        LogError, changing nothing, if ``old`` is no longer a run of this log's segments
        (retention or truncation got there first): SegmentsChangedError.
        """
        self._ensure_open()
        if not old:
            raise ValueError("replace_segments needs at least one old segment")
        try:
            first = next(i for i, segment in enumerate(self._segments) if segment is old[0])
        except StopIteration:
            raise SegmentsChangedError(
                f"segment {old[0].base_offset} of {self._dir.name} is gone; cleaning aborted"
            ) from None
        current = self._segments[first : first + len(old)]
        if len(current) != len(old) or any(a is not b for a, b in zip(current, old, strict=True)):
            raise SegmentsChangedError(f"segments of {self._dir.name} changed while cleaning")
        if first + len(old) >= len(self._segments):
            raise SegmentsChangedError(f"the active segment of {self._dir.name} is never cleaned")
        if cleaned.base_offset != old[0].base_offset:
            raise ValueError("a cleaned segment keeps the base offset of the first one it replaces")

        def done(name: str) -> None:
            if step is not None:
                step(name)

        cleaned.change_file_suffix(SWAP_SUFFIX)
        _fsync_dir(self._dir)
        done("swap")
        self._segments[first : first + len(old)] = [cleaned]
        self._bases[first : first + len(old)] = [cleaned.base_offset]
        self._schedule_delete(old)
        _fsync_dir(self._dir)
        done("deleted")
        cleaned.change_file_suffix("")
        cleaned.on_become_inactive()  # no longer pinned: its files join the handle pool
        _fsync_dir(self._dir)
        done("renamed")

    # -- deletion ----------------------------------------------------------------------------

    def _schedule_delete(self, segments: list[LogSegment]) -> None:
        """Rename to ``.deleted`` now and remove after ``file.delete.delay.ms``.

        The delay lets file regions already handed to the network layer still be sent.
        """
        due = self._now_ms() + self.config.file_delete_delay_ms
        for segment in segments:
            segment.change_file_suffix(DELETED_SUFFIX)
            if self.config.file_delete_delay_ms <= 0:
                segment.delete()
            else:
                self._pending_deletes.append((due, segment))

    def _delete_due_segments(self, now_ms: int | None = None) -> None:
        keep: list[tuple[int, LogSegment]] = []
        for due, segment in self._pending_deletes:
            if now_ms is None or due <= now_ms:
                segment.delete()
            else:
                keep.append((due, segment))
        self._pending_deletes = keep

    def _ensure_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self._dir} is closed")

    def close(self) -> None:
        """Flush, trim the indexes, close files and write the clean-shutdown marker."""
        if self._closed:
            return
        self.flush()
        self._delete_due_segments()
        # Rolled segments were finalized and fsynced at the roll; the active one is done now,
        # so that its trimmed indexes are durable before the marker says "trust these files".
        active = self.active_segment
        active.on_become_inactive()
        active.flush()
        for segment in self._segments:
            segment.close()
        self._closed = True
        (self._dir / CLEAN_SHUTDOWN_FILE).touch()
        _fsync_dir(self._dir)

    def close_without_flush(self) -> None:
        """Release files as a crash would leave them: no flush, no trim, no marker (tests, kill)."""
        for segment in self._segments:
            segment.close_handlers()
        for _, segment in self._pending_deletes:
            segment.close_handlers()
        self._pending_deletes = []
        self._closed = True

    def delete(self) -> None:
        """Close every file and remove the partition directory."""
        for segment in self._segments:
            segment.close_handlers()
        self._delete_due_segments()
        self._closed = True
        durable.rmtree(self._dir)

    def __repr__(self) -> str:
        return (
            f"Log({self._dir.name}, start={self._log_start_offset}, end={self.log_end_offset}, "
            f"segments={len(self._segments)})"
        )


def _load_segment(
    segment: LogSegment,
    *,
    trusted: bool,
    indexes_missing: bool,
    next_base: int | None,
    later_has_records: bool,
) -> int | None:
    """Validate one segment at open; recover it if needed. Returns the bytes truncated, or None
    if the segment was used as it is. Raises LogDirFailure instead of truncating records that
    must be kept (see ``broker.log.recovery``).

    ``trusted``: the log was shut down cleanly, or the segment is wholly below the recovery
    point (flushed): only its tail and the last index entries are checked, and it is rescanned
    only if they do not check out. Otherwise the whole segment is rescanned, as Kafka does
    after an unclean shutdown.
    """
    directory = segment.dir

    def refuse_if_needed(
        invalid: recovery.InvalidBatch, next_offset: int, index_position: int | None
    ) -> None:
        why = recovery.refusal(
            segment,
            invalid,
            next_offset,
            next_base=next_base,
            later_has_records=later_has_records,
            index_position=index_position,
        )
        if why is not None:
            raise recovery.refuse(segment, invalid, why)

    if not trusted:
        logger.info("Recovering unflushed segment %d in %s", segment.base_offset, directory)
        return segment.recover(
            lambda position, reason, next_offset: refuse_if_needed(
                recovery.InvalidBatch(position, reason), next_offset, None
            )
        )
    index_problem: str | None = "the offset index or time index file is missing"
    invalid: recovery.InvalidBatch | None = None
    if not indexes_missing:
        index_problem, invalid = recovery.check_tail(segment)
    if index_problem is None and invalid is None:
        # the batches before the tail were not checked: the first read of them checks them
        recovery.mark_unchecked(segment, segment.offset_index.last_entry[1])
        return None
    whole = recovery.scan(segment)
    if whole.invalid is not None:
        index_position = None if index_problem else segment.offset_index.last_entry[1]
        refuse_if_needed(whole.invalid, whole.next_offset, index_position)
    damage = whole.invalid or invalid
    if index_problem is None and damage is not None:
        index_problem = f"invalid data at byte offset {damage.position} of the log file"
    logger.warning("Rebuilding index files for segment %s: %s", segment.log_file, index_problem)
    return segment.recover()


def _load_or_rebuild_epoch_cache(
    directory: Path, segments: list[LogSegment], log_start_offset: int, compacted: bool = False
) -> LeaderEpochFileCache:
    """The leader-epoch-checkpoint, or, if it contradicts the batches (see
    ``recovery.epoch_cache_problem``), the cache rebuilt from the batches.

    Every batch carries its partitionLeaderEpoch, so the cache is derived data like the indexes.
    A file that cannot be read or does not parse is Kafka's KafkaStorageException while the log
    loads: the log dir goes offline (LogDirFailure: the broker does not start), with one line
    saying how to have it rebuilt (delete it) or to restore the partition from a replica.
    """
    path = directory / LEADER_EPOCH_CHECKPOINT
    try:
        loaded = LeaderEpochFileCache(path)
        problem = recovery.epoch_cache_problem(
            loaded.epoch_entries(), segments, log_start_offset, gaps=compacted
        )
        if problem is None:
            return loaded
        logger.warning("%s does not match the record batches: %s; rebuilding it", path, problem)
    except KafkaStorageError as exc:
        raise recovery.LogDirFailure(
            f"the log dir goes offline, as in Kafka: {exc}; or move {directory} away and start "
            "again to restore the partition from a replica"
        ) from exc
    durable.unlink(path, missing_ok=True)
    cache = LeaderEpochFileCache(path)
    for segment in segments:
        for header in segment.batches():
            if header.partition_leader_epoch != cache.latest_epoch:
                cache.assign(header.partition_leader_epoch, header.base_offset)
    return cache


def _fsync_dir(directory: Path) -> None:
    durable.fsync_dir(directory)


def _complete_swaps(directory: Path) -> set[int]:
    """Finish cleanings interrupted after their ``.swap`` files were written (Kafka's LogLoader).

    A ``<base>.log.swap`` is a whole, flushed cleaned segment (the cleaner fsyncs it before
    the rename) that replaces every segment whose base offset lies in [base, its next offset):
    those are deleted (they may still be there, or already ``.deleted``), and the ``.swap``
    takes its final name. Its swapped offset and time indexes are dropped (rebuilt from the
    log); its ``.txnindex``, if any, is kept. An empty ``.swap`` (the cleaning kept nothing of its group) replaces the segment of its
    own base offset, so the log keeps its first offsets. A ``.swap`` that is not whole valid
    batches is no finished cleaning: it is deleted and the old segments stay. Returns the bases
    of the completed swaps.
    """
    swapped: set[int] = set()
    for path in sorted(directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}")):
        stem = path.name.split(".", 1)[0]
        if len(stem) != 20 or not stem.isdigit():
            continue
        base = int(stem)
        next_offset = recovery.next_offset_of_file(path, base)
        if next_offset is None:
            logger.warning("Deleting %s: not a whole cleaned segment", path)
            durable.unlink(path)
            continue
        for other in list(directory.iterdir()):
            other_stem, _, suffix = other.name.partition(".")
            if (
                len(other_stem) == 20
                and other_stem.isdigit()
                and base <= int(other_stem) < max(next_offset, base + 1)
                and f".{suffix}" in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
            ):
                durable.unlink(other)
        for index in (offset_index_path(directory, base), time_index_path(directory, base)):
            durable.unlink(index, missing_ok=True)
        # the cleaned segment's .txnindex (the aborted transactions of the segments it
        # replaces) cannot be rebuilt from its batches alone: it is kept
        swapped_txn_index = txn_index_path(directory, base, SWAP_SUFFIX)
        if swapped_txn_index.exists():
            durable.replace(swapped_txn_index, txn_index_path(directory, base))
        durable.replace(path, log_path(directory, base))
        logger.info(
            "Completed an interrupted log cleaning swap of segment %d in %s", base, directory
        )
        swapped.add(base)
    if swapped:
        _fsync_dir(directory)
    return swapped


def _remove_strays_and_list_segments(directory: Path) -> list[int]:
    """Delete leftovers of interrupted deletes/cleanings and orphan indexes; list segment bases.

    Run after ``_complete_swaps``: the ``.swap`` files left are indexes of swapped segments (and
    the ``.cleaned`` files are unfinished cleanings), all dropped.
    """
    logs: set[int] = set()
    indexes: list[tuple[Path, str]] = []
    for path in directory.iterdir():
        name = path.name
        if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, ".tmp")):
            durable.unlink(path, missing_ok=True)
            continue
        stem, _, _ = name.partition(".")
        suffix = name[len(stem) :]
        if len(stem) != 20 or not stem.isdigit():
            continue
        if suffix == LOG_SUFFIX:
            logs.add(int(stem))
        elif suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            indexes.append((path, stem))
    for path, stem in indexes:
        if int(stem) not in logs:
            durable.unlink(path, missing_ok=True)
    return sorted(logs)


__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "AppendOrigin",
    "FetchDataInfo",
    "Log",
    "LogAppendInfo",
    "LogConfig",
]
