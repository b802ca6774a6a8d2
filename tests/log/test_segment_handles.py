"""Open files of segments: the active segment keeps its own, older ones share a bounded pool.

What the pool must never break: data read before a segment's files were released is still sent
whole, a released segment reopens on its next use, and renames, deletes, truncation into an old
segment and a restart all work on segments whose files are closed.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.segment import FDS_PER_SEGMENT, HANDLE_POOL, SEGMENT_HANDLE_POOL_SIZE

from .batches import decode_values, make_batch

Opener = Callable[..., Log]
CONFIG = LogConfig(
    segment_bytes=600, index_interval_bytes=100, file_delete_delay_ms=0, retention_ms=-1
)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fill(log: Log, batches: int) -> list[bytes]:
    written = []
    for i in range(batches):
        batch = make_batch(3, value_size=100, tag=i)
        log.append_as_leader(batch, leader_epoch=0)
        written.append(batch)
    return written


def read_all(log: Log) -> list[tuple[int, bytes]]:
    return decode_values(log.read(log.log_start_offset, 1 << 30).read_bytes())


def test_descriptors_stay_bounded_however_many_segments(open_log: Opener) -> None:
    before = open_fds()
    log = open_log(CONFIG)
    fill(log, 3 * SEGMENT_HANDLE_POOL_SIZE)
    assert len(log.segments) > 2 * SEGMENT_HANDLE_POOL_SIZE
    values = read_all(log)  # touches every segment
    assert [o for o, _ in values] == list(range(log.log_end_offset))
    open_segments = [s for s in log.segments if s.has_open_files]
    assert len(open_segments) <= SEGMENT_HANDLE_POOL_SIZE + 1  # the pool and the active one
    assert log.active_segment.has_open_files
    assert open_fds() - before <= (SEGMENT_HANDLE_POOL_SIZE + 1) * FDS_PER_SEGMENT


def test_a_region_outlives_the_release_of_its_segment(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 3 * SEGMENT_HANDLE_POOL_SIZE)
    oldest = log.segments[0]
    region_data = log.read(0, 1 << 30)
    expected = region_data.read_bytes()
    # reading every other segment releases the oldest one's files
    for segment in log.segments[1:]:
        log.read(segment.base_offset, 100)
    assert not oldest.has_open_files
    assert region_data.read_bytes() == expected  # the regions keep their files open
    file = weakref.ref(region_data.regions[0].file)
    del region_data
    assert file() is None  # closed with its last region
    # and the released segment reopens on its next use
    assert log.read(0, 1 << 30).read_bytes() == expected


def test_released_segments_can_be_deleted_truncated_into_and_reopened(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 3 * SEGMENT_HANDLE_POOL_SIZE)
    read_all(log)
    released = [s for s in log.segments if not s.has_open_files]
    assert released
    # retention of released segments (rename to .deleted, then delete)
    log.maybe_increment_log_start_offset(log.segments[3].base_offset)
    assert log.delete_old_segments() == 3
    assert not list(log.dir.glob("*.deleted"))
    # truncation into a released segment makes it the active one, which takes appends
    target = next(s for s in log.segments if not s.has_open_files)
    cut = target.base_offset + 1
    log.truncate_to(cut)
    assert log.active_segment is target
    assert log.log_end_offset <= cut
    fill(log, 2)
    values = read_all(log)
    assert [o for o, _ in values] == list(range(log.log_start_offset, log.log_end_offset))
    end = log.log_end_offset
    log.close()
    reopened = Log.open(log.dir, CONFIG)
    try:
        assert reopened.log_end_offset == end
        assert read_all(reopened) == values
        fill(reopened, 1)
    finally:
        reopened.close()


def test_closing_a_log_leaves_nothing_in_the_pool(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 3 * SEGMENT_HANDLE_POOL_SIZE)
    read_all(log)
    log.close()
    assert not any(s.has_open_files for s in log.segments)
    assert all(id(s) not in HANDLE_POOL._open for s in log.segments)


def test_iterating_a_segment_survives_its_release(open_log: Opener) -> None:
    log = open_log(CONFIG)
    for i in range(20 * SEGMENT_HANDLE_POOL_SIZE):  # small batches: several per segment
        log.append_as_leader(make_batch(1, value_size=20, tag=i), leader_epoch=0)
    assert len(log.segments) > SEGMENT_HANDLE_POOL_SIZE + 1
    oldest = log.segments[0]
    expected = list(oldest.batches())
    assert len(expected) > 2
    headers = oldest.batches()
    first = next(headers)
    for segment in log.segments[1:]:  # releases the oldest segment's files meanwhile
        log.read(segment.base_offset, 100)
    assert not oldest.has_open_files
    assert [first, *headers] == expected
