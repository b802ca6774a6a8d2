"""One log segment: a ``.log`` file of record batches plus its ``.index`` and ``.timeindex``.

Files are named by the segment's base offset padded to 20 digits
(``00000000000000000042.log``). The ``.log`` file is record batches back to back, exactly as
they are served to fetchers; the segment only appends whole batches and only truncates at
batch boundaries. Every append of more than ``index.interval.bytes`` since the last index
entry adds an offset index entry (batch last offset -> batch position) and, if the largest
timestamp grew, a time index entry (largest timestamp -> offset of that batch), as Kafka's
LogSegment does.

A segment can be renamed with a suffix (``.deleted``) so that files being deleted are told
apart from live ones; the open file handles keep working across the rename, which lets reads
handed out before a deletion still be sent.

Open files: the active segment (the one appended to) keeps its three files open and both
indexes mapped, ``FDS_PER_SEGMENT`` descriptors. Any other segment opens its files only when
used, and at most ``SEGMENT_HANDLE_POOL_SIZE`` of them keep them open at once, broker-wide
(``HANDLE_POOL``, least recently used released first). So a partition costs one active
segment's descriptors however many segments it has, and ``broker.partition_limit`` can bound
the partitions a broker hosts by its open-file limit. A released ``.log`` file stays open
while a ``FileRegion`` handed out for it is still being sent, and closes with its last one.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import logging
import mmap
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar, cast

from isrlab.broker.log import durable
from isrlab.broker.log.abstract_index import CorruptIndexError
from isrlab.broker.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    LogError,
)
from isrlab.broker.log.offset_index import OffsetIndex
from isrlab.broker.log.record_batch import (
    HEADER,
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    BatchHeader,
    at_position,
    check_crc,
    check_header,
    iter_batches,
)
from isrlab.broker.log.time_index import TimeIndex
from isrlab.broker.log.txn_index import TransactionIndex, txn_index_path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
RECENT_BATCHES = 256  # batch headers the active end of a segment keeps in memory
_INT32_MAX = 0x7FFFFFFF

logger = logging.getLogger(__name__)
#: Descriptors of a segment with open files: the ``.log`` file and the descriptor Python's
#: ``mmap`` keeps for each of the two index mappings (index files are not kept open).
FDS_PER_SEGMENT = 3
#: Segments other than the active ones that may keep their files open at once (per process).
SEGMENT_HANDLE_POOL_SIZE = 16


def filename_prefix(offset: int) -> str:
    """Kafka's segment file name stem: the base offset zero-padded to 20 digits."""
    return f"{offset:020d}"


def log_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix(base_offset)}{LOG_SUFFIX}{suffix}"


def offset_index_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix(base_offset)}{INDEX_SUFFIX}{suffix}"


def time_index_path(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix(base_offset)}{TIME_INDEX_SUFFIX}{suffix}"


@dataclass(frozen=True, slots=True)
class FileRegion:
    """``size`` bytes at ``position`` of an open segment file: what a fetch sends, zero-copy.

    Pass ``file``, ``position`` and ``size`` to ``loop.sendfile(transport, file, position,
    size)`` or ``os.sendfile``; ``read_bytes`` copies them into memory instead.
    """

    file: BinaryIO
    position: int
    size: int

    def fileno(self) -> int:
        return self.file.fileno()

    def read_bytes(self) -> bytes:
        return pread_fully(self.file.fileno(), self.size, self.position)


class _SegmentFile(io.FileIO):
    """A ``.log`` file that closes when its last user lets go of it, without a ResourceWarning:
    a released segment drops it while fetch responses may still be sending regions of it."""

    def __del__(self) -> None:
        if not self.closed:
            self.close()


class SegmentHandlePool:
    """Inactive segments whose files are open, least recently used first; past ``capacity``
    the oldest one releases its files (they reopen on its next use)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._open: OrderedDict[int, LogSegment] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, segment: LogSegment) -> None:
        key = id(segment)
        if key in self._open:
            self._open.move_to_end(key)
            return
        self._open[key] = segment
        while len(self._open) > self.capacity:
            _, oldest = self._open.popitem(last=False)
            oldest._release_handles()

    def discard(self, segment: LogSegment) -> None:
        self._open.pop(id(segment), None)


HANDLE_POOL = SegmentHandlePool(SEGMENT_HANDLE_POOL_SIZE)


def pread_fully(fd: int, size: int, position: int) -> bytes:
    """Read exactly ``size`` bytes at ``position`` (fewer only at end of file)."""
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = os.pread(fd, remaining, position)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        position += len(chunk)
    return b"".join(chunks)


def _pwrite_fully(fd: int, data: memoryview, position: int) -> None:
    while len(data) > 0:
        written = os.pwrite(fd, data, position)
        data = data[written:]
        position += written


_Handle = TypeVar("_Handle")


class LogSegment:
    """A ``.log`` file and its two indexes; the unit of rolling, retention and recovery."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int = 4096,
        max_index_size: int = 10 * 1024 * 1024,
        clock: Callable[[], float],
        file_suffix: str = "",
    ) -> None:
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self._clock = clock
        self._suffix = file_suffix
        path = log_path(directory, base_offset, file_suffix)
        self._path = path
        self._log_file: BinaryIO | None = None
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        #: aborted transactions whose marker is in this segment (the .txnindex file)
        self.txn_index = TransactionIndex(
            txn_index_path(directory, base_offset, file_suffix), base_offset
        )
        self._closed = False
        # A new segment is the log's active one: its files are created now and stay open. An
        # existing one opens them when first used (see the module docstring); the log pins the
        # one it appends to with resize_indexes().
        self._pinned = not path.exists()
        if self._pinned:
            self._log_file = _SegmentFile(path, "w+")
        self._size = path.stat().st_size
        if self._pinned:
            _ = self.offset_index, self.time_index  # create the preallocated index files
        self._bytes_since_last_index_entry = 0
        self._max_timestamp: int | None = None  # loaded lazily from the time index, as Kafka does
        self._offset_of_max_timestamp = -1
        self.created_ms = int(clock() * 1000)
        self._first_append_ms: int | None = None
        self._next_offset: int | None = None
        # The newest batches of the file (absolute positions), contiguous up to its end: the
        # reads of caught-up followers and consumers land here and skip the index + scan.
        self._recent: list[BatchHeader] = []
        self._recent_last: list[int] = []
        # an offset index entry was found pointing elsewhere than at the batch it names: the
        # index is not used for lookups any more (see translate_offset)
        self._index_distrusted = False

    # -- open files --------------------------------------------------------------------------

    def _used(self) -> bool:
        """Note a use of the files; False once the segment is closed (its closed file objects
        still answer ``path`` and the like, any IO on them fails)."""
        if self._closed:
            return False
        if not self._pinned:
            HANDLE_POOL.touch(self)
        return True

    def _reopened(self, name: str, open_: Callable[[], _Handle]) -> _Handle:
        """The file held in attribute ``name``, opened again with ``open_`` if the handle pool
        released it (an inactive segment); KafkaStorageError once the segment is closed."""
        if self._used() and getattr(self, name) is None:
            setattr(self, name, open_())
        handle = getattr(self, name)
        if handle is None:
            raise KafkaStorageError(f"segment {self._path} is closed")
        return cast(_Handle, handle)

    @property
    def _file(self) -> BinaryIO:
        f = self._log_file
        if f is None or not self._pinned:
            f = self._reopened("_log_file", lambda: _SegmentFile(self._path, "r+"))
        return f

    @property
    def offset_index(self) -> OffsetIndex:
        index = self._offset_index
        if index is None or not self._pinned:
            index = self._reopened(
                "_offset_index",
                lambda: OffsetIndex(
                    offset_index_path(self.dir, self.base_offset, self._suffix),
                    self.base_offset,
                    self.max_index_size,
                ),
            )
        return index

    @property
    def time_index(self) -> TimeIndex:
        index = self._time_index
        if index is None or not self._pinned:
            index = self._reopened(
                "_time_index",
                lambda: TimeIndex(
                    time_index_path(self.dir, self.base_offset, self._suffix),
                    self.base_offset,
                    self.max_index_size,
                ),
            )
        return index

    @property
    def has_open_files(self) -> bool:
        return not self._closed and not (
            self._log_file is None and self._offset_index is None and self._time_index is None
        )

    def _release_handles(self) -> None:
        """Close the files of an inactive segment (the pool's eviction); they reopen on use.

        The ``.log`` file is only dropped: a FileRegion still being sent keeps it open.
        """
        self._log_file = None
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close()  # an inactive index is already trimmed: this only unmaps
        self._offset_index = self._time_index = None

    # -- properties --------------------------------------------------------------------------

    @property
    def log_file(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        """Bytes in the ``.log`` file."""
        return self._size

    def _load_max_timestamp(self) -> None:
        if self._max_timestamp is None:
            self._max_timestamp, self._offset_of_max_timestamp = self.time_index.last_entry

    @property
    def max_timestamp_so_far(self) -> int:
        self._load_max_timestamp()
        assert self._max_timestamp is not None
        return self._max_timestamp

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        self._load_max_timestamp()
        return self._offset_of_max_timestamp

    @property
    def last_modified_ms(self) -> int:
        return int(self._path.stat().st_mtime * 1000)

    @property
    def largest_timestamp(self) -> int:
        """Largest record timestamp in the segment (ms), or the file's mtime if none is known."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return self.last_modified_ms

    @property
    def rolling_based_ms(self) -> int:
        """When this segment's age for ``segment.ms`` starts: its first append (broker clock).

        A segment reopened from disk with data counts from when it was opened. Kafka uses the
        first batch's record timestamp instead; mixing client timestamps with the broker clock
        would make rolling depend on producers' clocks (and on fake clocks in tests).
        """
        if self._first_append_ms is None:
            return self.created_ms
        return self._first_append_ms

    def time_waited_for_roll_ms(self, now_ms: int) -> int:
        return now_ms - self.rolling_based_ms if self._size > 0 else 0

    @property
    def next_offset(self) -> int:
        """Offset after the segment's last batch, or its base offset when it is empty."""
        if self._next_offset is None:
            self._next_offset = self._read_next_offset()
        return self._next_offset

    def _read_next_offset(self) -> int:
        _, position = self.offset_index.last_entry
        last: BatchHeader | None = None
        for header in self._iter_headers(position):
            last = header
        if last is None and position > 0:
            # The indexed batch is not whole (a torn tail the log has not recovered yet): the
            # end is after the last whole batch before it, never back at the base offset.
            for header in self._iter_headers(0, position):
                last = header
        return last.next_offset if last is not None else self.base_offset

    # -- scanning ----------------------------------------------------------------------------

    def _iter_headers(
        self, start_position: int, end_position: int | None = None
    ) -> Iterator[BatchHeader]:
        """Headers of the whole batches stored from ``start_position`` (a batch boundary)."""
        end = self._size if end_position is None else min(end_position, self._size)
        # The generator holds the file object: if the pool releases this segment while a caller
        # is still iterating, the file stays open (a bare fd could be closed and reused).
        file = self._file
        fd = file.fileno()
        position = start_position
        while position + HEADER_SIZE <= end:
            raw = os.pread(fd, HEADER_SIZE, position)
            if len(raw) < HEADER_SIZE:
                return
            header = BatchHeader(position, *HEADER.unpack_from(raw))
            if header.batch_length < MIN_BATCH_LENGTH or header.end_position > end:
                return
            yield header
            position += header.size

    def offset_at_position(self, position: int) -> int:
        """The base offset of the batch at ``position`` (a batch boundary), or the segment's
        next offset at its end."""
        if position + HEADER_SIZE > self._size:  # (a read up to the end: no header to read)
            return self.next_offset
        header = next(self._iter_headers(position), None)
        return header.base_offset if header is not None else self.next_offset

    def batches(self, start_position: int = 0) -> Iterator[BatchHeader]:
        """Every whole batch's header from ``start_position`` to the end of the file."""
        return self._iter_headers(start_position)

    def translate_offset(self, offset: int, starting_position: int = 0) -> BatchHeader | None:
        """The first batch whose last offset is >= ``offset`` (searching from the index hint)."""
        recent = self._recent
        if recent and offset >= recent[0].base_offset:
            i = bisect.bisect_left(self._recent_last, offset)
            if i == len(recent):
                return None  # past the last batch
            if recent[i].position >= starting_position:
                return recent[i]
        entry_offset, position = self.offset_index.lookup(offset)
        if self._index_distrusted:
            position = 0
        # An entry names a batch's last offset and its position: the batch found there must be
        # that one. A damaged entry would otherwise skip records silently (Kafka's index sanity
        # check looks at the last entry only); the segment scans from its start instead.
        check = position > 0 and position >= starting_position
        for header in self._iter_headers(max(position, starting_position)):
            if check:
                check = False
                if header.last_offset != entry_offset:
                    self._distrust_index(entry_offset, position, header)
                    return self.translate_offset(offset, starting_position)
            if header.last_offset >= offset:
                return header
        if check:  # no whole batch where the entry points
            self._distrust_index(entry_offset, position, None)
            return self.translate_offset(offset, starting_position)
        return None

    def _distrust_index(self, offset: int, position: int, found: BatchHeader | None) -> None:
        self._index_distrusted = True
        what = (
            f"the batch of offsets {found.base_offset}..{found.last_offset}"
            if found is not None
            else "no whole batch"
        )
        logger.warning(
            "Found a corrupted index file %s: entry (%d, %d) points at %s; lookups in segment "
            "%s scan it from its start (to rebuild the index, stop the broker, delete the "
            "index file and start it)",
            self.offset_index.path,
            offset,
            position,
            what,
            self._path,
        )

    # -- appending ---------------------------------------------------------------------------

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    def append(
        self,
        largest_offset: int,
        largest_timestamp: int,
        offset_of_largest_timestamp: int,
        records: memoryview | bytes | bytearray,
        *,
        batches: list[BatchHeader] | None = None,
    ) -> None:
        """Append whole, already validated batches; positions in ``batches`` are relative to ``records``."""
        view = memoryview(records)
        if len(view) == 0:
            return
        if not self.can_convert_to_relative_offset(largest_offset):
            raise LogError(
                f"offset {largest_offset} cannot be stored in segment {self.base_offset}: "
                "relative offsets are 4 bytes (the log should have rolled)"
            )
        if batches is None:
            batches = list(iter_batches(view))
        if self._size == 0:
            self._first_append_ms = int(self._clock() * 1000)
        physical_position = self._size
        try:
            _pwrite_fully(self._file.fileno(), view, physical_position)
        except OSError as exc:  # disk full, I/O error: the server answers KAFKA_STORAGE_ERROR
            with contextlib.suppress(
                OSError
            ):  # drop a partial write so the file stays whole batches
                os.ftruncate(self._file.fileno(), physical_position)
            raise KafkaStorageError(f"cannot append to {self._path}: {exc}") from exc
        self._load_max_timestamp()
        for header in batches:
            self._index_batch(header, physical_position + header.position)
        self._remember(batches, physical_position)
        self._size = physical_position + len(view)
        self._next_offset = largest_offset + 1

    def _remember(self, batches: list[BatchHeader], physical_position: int) -> None:
        if self._recent and self._recent[-1].end_position != physical_position:
            self._forget_recent()
        for header in batches:
            self._recent.append(at_position(header, physical_position + header.position))
            self._recent_last.append(header.last_offset)
        if len(self._recent) > 2 * RECENT_BATCHES:
            del self._recent[:-RECENT_BATCHES]
            del self._recent_last[:-RECENT_BATCHES]

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_last.clear()

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        assert self._max_timestamp is not None
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp, self._offset_of_max_timestamp = (
                header.max_timestamp,
                header.last_offset,
            )
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            # A full index only makes later lookups scan further; the log rolls before the next append.
            if not self.offset_index.is_full:
                self.offset_index.append(header.last_offset, position)
            if not self.time_index.is_full:
                self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size

    # -- reading -----------------------------------------------------------------------------

    def read(
        self,
        start_offset: int,
        max_size: int,
        max_position: int | None = None,
        min_one_message: bool = False,
        *,
        max_offset: int | None = None,
    ) -> FileRegion | None:
        """Whole batches from the one holding ``start_offset``, within ``max_size`` bytes.

        Stops at ``max_position`` (a batch boundary) and before the batch holding
        ``max_offset``; ``min_one_message`` returns the first batch even if it exceeds
        ``max_size`` (never past ``max_position``/``max_offset``). None if ``start_offset``
        is past the segment's last batch.
        """
        first = self.translate_offset(start_offset)
        if first is None:
            return None
        limit = self._size if max_position is None else min(max_position, self._size)
        if max_offset is not None:
            stop = self.translate_offset(max_offset, first.position)
            if stop is not None:
                limit = min(limit, stop.position)
        start = first.position
        if limit <= start:
            return FileRegion(self._file, start, 0)
        if limit - start <= max_size:
            return FileRegion(self._file, start, limit - start)
        end = start
        for header in self._iter_headers(start, limit):
            if header.end_position - start > max_size:
                if end == start and min_one_message:
                    end = header.end_position
                break
            end = header.end_position
        return FileRegion(self._file, start, end - start)

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int = 0
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``starting_offset`` with timestamp >= ``timestamp``."""
        _, time_offset = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(max(time_offset, starting_offset))
        for header in self._iter_headers(position):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                return self._search_batch(header, timestamp, starting_offset)
        return None

    def _search_batch(
        self, header: BatchHeader, timestamp: int, starting_offset: int
    ) -> tuple[int, int]:
        # Decoding records is rare (ListOffsets by time), so kafka-python's decoder is fine here.
        from kafka.record.default_records import DefaultRecordBatch

        data = pread_fully(self._file.fileno(), header.size, header.position)
        try:
            for record in DefaultRecordBatch(data):
                if record.timestamp >= timestamp and record.offset >= starting_offset:
                    return record.offset, record.timestamp
        except Exception:  # an unsupported codec: fall back to batch granularity
            pass
        return max(header.base_offset, starting_offset), header.max_timestamp

    # -- recovery and truncation -------------------------------------------------------------

    def sanity_check(self) -> None:
        """Raise CorruptIndexError if either index does not fit this log file."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()
        if self.offset_index.last_entry[1] > self._size:
            raise CorruptIndexError(
                f"index {self.offset_index.path} points past the end of {self._path} ({self._size} bytes)"
            )

    def recover(self, on_invalid: Callable[[int, str, int], None] | None = None) -> int:
        """Re-read every batch, check structure and CRC, rebuild both indexes; truncate at the first bad batch.

        Before truncating, ``on_invalid(position, reason, next_offset)`` may raise to keep the
        file as it is (``broker.log.recovery`` decides what may be cut off). Returns how many
        bytes were cut off the end of the ``.log`` file.
        """
        self._forget_recent()
        self.offset_index.reset()
        self.time_index.reset()
        self.offset_index.resize(self.max_index_size)
        self.time_index.resize(self.max_index_size)
        self._bytes_since_last_index_entry = 0
        self._max_timestamp, self._offset_of_max_timestamp = NO_TIMESTAMP, -1
        self._first_append_ms = None
        valid = 0
        next_offset = self.base_offset
        reason = ""
        if self._size > 0:
            with mmap.mmap(self._file.fileno(), self._size, access=mmap.ACCESS_READ) as mapped:
                while valid < self._size:
                    try:
                        header = check_header(mapped, valid, self._size)
                        check_crc(mapped, header)
                    except (CorruptRecordError, InvalidRecordError) as exc:
                        reason = str(exc)
                        break
                    if header.base_offset < next_offset or not self.can_convert_to_relative_offset(
                        header.last_offset
                    ):
                        # offsets must grow and fit the segment: anything else is garbage
                        reason = (
                            f"batch at position {valid} has offsets {header.base_offset}.."
                            f"{header.last_offset}, not after {next_offset - 1} within segment "
                            f"{self.base_offset}"
                        )
                        break
                    self._index_batch(header, header.position)
                    next_offset = header.next_offset
                    valid = header.end_position
        truncated = self._size - valid
        if truncated > 0:
            if on_invalid is not None:
                on_invalid(valid, reason, next_offset)
            logger.warning(
                "Found invalid messages in log segment %s at byte offset %d: %s; truncating %d bytes",
                self._path,
                valid,
                reason,
                truncated,
            )
            os.ftruncate(self._file.fileno(), valid)
            durable.truncated(self._path, valid)
            self._size = valid
        self._next_offset = next_offset
        self.time_index.maybe_append(
            self._max_timestamp, self._offset_of_max_timestamp, skip_full_check=True
        )
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        # Aborted transactions come from producer state, not from the batches: entries past
        # the valid data go; the log has the rest rebuilt (Log.txn_index_rebuild_from) when
        # the segment was unflushed, and a damaged file is rebuilt whole.
        try:
            self.txn_index.truncate_to(next_offset)
        except KafkaStorageError:
            self.txn_index.reset()
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= ``offset``; returns the bytes removed."""
        header = self.translate_offset(offset)
        if header is None:
            return 0
        self._forget_recent()
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        # Kafka keeps the preallocated size so the segment can take appends again.
        self.offset_index.resize(self.max_index_size)
        self.time_index.resize(self.max_index_size)
        removed = self._size - header.position
        os.ftruncate(self._file.fileno(), header.position)
        durable.truncated(self._path, header.position)
        self._size = header.position
        # Rescan rather than trust the sparse time index, so retention and timestamp search
        # see the exact largest timestamp left (truncation is rare: leader changes only).
        self._max_timestamp, self._offset_of_max_timestamp = NO_TIMESTAMP, -1
        for remaining in self._iter_headers(0):
            if remaining.max_timestamp > self._max_timestamp:
                self._max_timestamp, self._offset_of_max_timestamp = (
                    remaining.max_timestamp,
                    remaining.last_offset,
                )
        self._bytes_since_last_index_entry = self._size - self.offset_index.last_entry[1]
        self._next_offset = None
        if self._size == 0:
            self._first_append_ms = None
            self.created_ms = int(self._clock() * 1000)
        return removed

    # -- lifecycle ---------------------------------------------------------------------------

    def resize_indexes(self, size: int) -> None:
        """Preallocate the indexes for appends: the log calls this on its active segment, which
        keeps its files open from now on."""
        HANDLE_POOL.discard(self)
        self._pinned = True
        self.offset_index.resize(size)
        self.time_index.resize(size)

    def on_become_inactive(self) -> None:
        """Called on roll: record the final largest timestamp and give back the preallocated index space.

        From now on the segment's files may be released when other segments need descriptors.
        """
        self.time_index.maybe_append(
            self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far, skip_full_check=True
        )
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        if self._pinned:
            self._pinned = False
            HANDLE_POOL.touch(self)

    @property
    def is_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    def flush(self) -> None:
        """fsync the ``.log`` file and its indexes."""
        try:
            with durable.batched():
                durable.fsync_fd(self._file.fileno(), self._path)
                self.offset_index.flush()
                self.time_index.flush()
                self.txn_index.flush()
        except OSError as exc:
            raise KafkaStorageError(f"cannot flush segment {self._path}: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        if self._pinned:  # an inactive segment was finalized when it became inactive
            self.on_become_inactive()
        HANDLE_POOL.discard(self)
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close()
        if self._log_file is not None:
            self._log_file.close()
        self._closed = True

    def close_handlers(self) -> None:
        """Close files without trimming or writing anything (before deleting them)."""
        HANDLE_POOL.discard(self)
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close_handler()
        if self._log_file is not None:
            self._log_file.close()
        self._closed = True

    def change_file_suffix(self, new_suffix: str) -> None:
        """Rename the files (log, indexes, .txnindex if any) from the current suffix to
        ``new_suffix`` (e.g. ``.deleted``)."""
        new_log = log_path(self.dir, self.base_offset, new_suffix)
        durable.replace(self._path, new_log)
        self._path = new_log
        for index, old, new in (
            (
                self._offset_index,
                offset_index_path(self.dir, self.base_offset, self._suffix),
                offset_index_path(self.dir, self.base_offset, new_suffix),
            ),
            (
                self._time_index,
                time_index_path(self.dir, self.base_offset, self._suffix),
                time_index_path(self.dir, self.base_offset, new_suffix),
            ),
        ):
            if index is not None:
                index.rename_to(new)
            else:
                with contextlib.suppress(FileNotFoundError):
                    durable.replace(old, new)
        self.txn_index.rename_to(txn_index_path(self.dir, self.base_offset, new_suffix))
        self._suffix = new_suffix

    def delete(self) -> None:
        """Close and remove the segment's files."""
        self.close_handlers()
        durable.unlink(self._path, missing_ok=True)
        durable.unlink(offset_index_path(self.dir, self.base_offset, self._suffix), missing_ok=True)
        durable.unlink(time_index_path(self.dir, self.base_offset, self._suffix), missing_ok=True)
        self.txn_index.delete()

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self._size}, path={self._path})"
