import os
from pathlib import Path

from isrlab.broker.log.record_batch import BatchHeader, iter_batches, stamp
from isrlab.broker.log.segment import LogSegment, log_path
from tests.log.batches import decode_values, make_batch


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def filled_segment(
    tmp_path: Path, batches: int = 10, base: int = 100, interval: int = 200
) -> LogSegment:
    segment = LogSegment(
        tmp_path, base, index_interval_bytes=interval, max_index_size=4096, clock=FakeClock()
    )
    offset = base
    for i in range(batches):
        data = bytearray(make_batch(4, timestamp=10_000 + 10 * i, tag=i))
        stamp(data, 0, offset, 0)
        segment.append(offset + 3, 10_000 + 10 * i + 3, offset + 3, memoryview(data))
        offset += 4
    return segment


def test_file_names_are_padded_base_offsets(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path, batches=1, base=42)
    assert segment.log_file.name == "00000000000000000042.log"
    assert segment.offset_index.path.name == "00000000000000000042.index"
    assert segment.time_index.path.name == "00000000000000000042.timeindex"
    assert log_path(tmp_path, 42) == segment.log_file


def test_append_indexes_every_interval_bytes(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    size = len(make_batch(4))
    entries = segment.offset_index.entries_list()
    assert entries, "an interval of 200 bytes with batches of ~150 must index"
    batch_positions = {h.position: h.last_offset for h in segment.batches()}
    for offset, position in entries:
        assert batch_positions[position] == offset  # (batch last offset, batch position)
    assert segment.size == 10 * size
    assert segment.next_offset == 140
    assert segment.max_timestamp_so_far == 10_093 and segment.offset_of_max_timestamp_so_far == 139


def test_read_from_the_batch_holding_the_offset(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    size = len(make_batch(4))
    region = segment.read(105, 10 * size)
    assert region is not None
    assert region.position == size  # batch 104..107
    records = decode_values(region.read_bytes())
    assert records[0][0] == 104 and records[-1][0] == 139
    assert segment.read(140, 1000) is None  # past the last batch


def test_read_respects_max_size_whole_batches_and_min_one(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    size = len(make_batch(4))
    region = segment.read(100, 2 * size + size // 2)
    assert region is not None and region.size == 2 * size
    assert segment.read(100, 10).size == 0  # type: ignore[union-attr]
    one = segment.read(100, 10, min_one_message=True)
    assert one is not None and one.size == size


def test_read_stops_before_max_offset_and_max_position(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    size = len(make_batch(4))
    region = segment.read(100, 100 * size, max_offset=110)  # 108..111 holds 110: excluded
    assert region is not None and region.size == 2 * size
    region = segment.read(100, 100 * size, max_position=3 * size)
    assert region is not None and region.size == 3 * size
    at_limit = segment.read(112, 100 * size, max_offset=112, min_one_message=True)
    assert at_limit is not None and at_limit.size == 0


def test_find_offset_by_timestamp_is_record_precise(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    assert segment.find_offset_by_timestamp(0) == (100, 10_000)
    assert segment.find_offset_by_timestamp(10_052) == (122, 10_052)  # batch 5 (120..123), record 2
    assert segment.find_offset_by_timestamp(10_055) == (124, 10_060)
    assert segment.find_offset_by_timestamp(20_000) is None
    assert segment.find_offset_by_timestamp(0, starting_offset=130) == (130, 10_072)


def test_truncate_to_drops_the_batch_holding_the_offset(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    size = len(make_batch(4))
    removed = segment.truncate_to(118)  # batch 116..119
    assert removed == 6 * size
    assert segment.size == 4 * size and segment.next_offset == 116
    assert all(offset < 118 for offset, _ in segment.offset_index.entries_list())
    assert segment.max_timestamp_so_far == 10_033
    assert segment.truncate_to(500) == 0


def test_recover_rebuilds_indexes_and_cuts_torn_tail(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    entries = segment.offset_index.entries_list()
    size = len(make_batch(4))
    with open(segment.log_file, "ab") as out:
        out.write(make_batch(4)[:50])  # a torn write
    segment.close_handlers()
    reopened = LogSegment(
        tmp_path, 100, index_interval_bytes=200, max_index_size=4096, clock=FakeClock()
    )
    reopened.offset_index.reset()
    assert reopened.recover() == 50
    assert reopened.size == 10 * size
    assert reopened.offset_index.entries_list() == entries
    assert reopened.max_timestamp_so_far == 10_093
    assert [h.base_offset for h in iter_batches(reopened.read(100, 10**6).read_bytes())][-1] == 136  # type: ignore[union-attr]


def test_close_trims_indexes_and_keeps_largest_timestamp(tmp_path: Path) -> None:
    segment = filled_segment(tmp_path)
    segment.close()
    assert segment.offset_index.path.stat().st_size == 8 * segment.offset_index.entries
    reopened = LogSegment(
        tmp_path, 100, index_interval_bytes=200, max_index_size=4096, clock=FakeClock()
    )
    reopened.sanity_check()
    assert reopened.max_timestamp_so_far == 10_093
    assert reopened.next_offset == 140


def _scan(segment: LogSegment, offset: int) -> BatchHeader | None:
    return next((h for h in segment.batches() if h.last_offset >= offset), None)


def test_recent_batch_cache_agrees_with_the_index_scan(tmp_path: Path) -> None:
    # 600 batches of 4 (offsets 100..2499): more than the in-memory tail keeps, so lookups
    # take both the cached path and the index + scan path.
    segment = filled_segment(tmp_path, batches=600, interval=4096)
    probes = [99, 100, 101, 1_000, 1_503, 1_504, 2_299, 2_396, 2_499, 2_500, 5_000]
    boundary = list(segment.batches())[30].position  # a starting position is a batch boundary
    for probe in probes:
        assert segment.translate_offset(probe) == _scan(segment, probe), probe
        assert segment.translate_offset(probe, boundary) == _scan_from(segment, probe, boundary)
    # Truncation forgets the cache; appends after it build a new one on the shorter file.
    segment.truncate_to(2_300)
    offset = 2_300
    for i in range(40):
        data = bytearray(make_batch(4, timestamp=20_000 + i, tag=i))
        stamp(data, 0, offset, 0)
        segment.append(offset + 3, 20_000 + i, offset + 3, memoryview(data))
        offset += 4
    for probe in [*range(2_280, 2_470, 3), 100, 2_459, 2_460]:
        assert segment.translate_offset(probe) == _scan(segment, probe), probe
    region = segment.read(2_305, 1 << 20)
    assert region is not None and decode_values(region.read_bytes())[0][0] == 2_304


def _scan_from(segment: LogSegment, offset: int, position: int) -> BatchHeader | None:
    return next(
        (h for h in segment.batches() if h.position >= position and h.last_offset >= offset), None
    )


def test_next_offset_of_a_torn_indexed_batch_comes_from_the_last_whole_batch(
    tmp_path: Path,
) -> None:
    """Issue 12 point 1: the index's last entry points at a batch cut mid-way; the end of the
    segment is after the whole batch before it, not back at the base offset."""
    segment = filled_segment(tmp_path)
    _, position = segment.offset_index.last_entry
    assert position > 0
    last = next(h for h in segment.batches() if h.position == position)
    segment.close()
    os.truncate(segment.log_file, last.position + last.size // 2)
    reopened = LogSegment(
        tmp_path, 100, index_interval_bytes=200, max_index_size=4096, clock=FakeClock()
    )
    assert reopened.offset_index.last_entry[1] == position  # the entry survives the cut
    assert reopened.next_offset == last.base_offset
    reopened.close_handlers()
