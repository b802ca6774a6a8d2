from pathlib import Path

import pytest

from isrlab.broker.log.abstract_index import CorruptIndexError
from isrlab.broker.log.offset_index import OffsetIndex
from isrlab.broker.log.time_index import TimeIndex


def test_offset_index_lookup_is_largest_entry_at_or_below(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000100.index", 100, max_index_size=80)
    assert index.lookup(150) == (100, 0)  # empty: the segment start
    for offset, position in [(105, 400), (110, 900), (120, 1500)]:
        index.append(offset, position)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(104) == (100, 0)
    assert index.lookup(105) == (105, 400)
    assert index.lookup(119) == (110, 900)
    assert index.lookup(10_000) == (120, 1500)
    index.sanity_check()


def test_offset_index_rejects_non_increasing_entries(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000000.index", 0, max_index_size=80)
    index.append(5, 100)
    with pytest.raises(CorruptIndexError):
        index.append(5, 200)
    with pytest.raises(CorruptIndexError):
        index.append(6, 50)


def test_offset_index_fills_up_and_trims_on_close(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, max_index_size=30)  # rounds down to 3 entries
    assert path.stat().st_size == 24 and index.max_entries == 3
    for i in range(1, 4):
        assert not index.is_full
        index.append(i, i * 10)
    assert index.is_full
    with pytest.raises(CorruptIndexError, match="full"):
        index.append(9, 90)
    index.truncate_to(3)
    assert index.entries == 2 and not index.is_full
    index.close()
    assert path.stat().st_size == 16
    reopened = OffsetIndex(path, 0, max_index_size=30)
    assert reopened.entries_list() == [(1, 10), (2, 20)]
    assert reopened.is_full  # a trimmed index must be resized before it takes appends again
    reopened.resize(800)
    assert not reopened.is_full and reopened.entries == 2
    reopened.close()


def test_offset_index_truncate_to_removes_entries_at_and_above(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000000.index", 0, max_index_size=800)
    for offset in (3, 7, 11):
        index.append(offset, offset * 100)
    index.truncate_to(8)
    assert index.entries_list() == [(3, 300), (7, 700)]
    index.truncate_to(7)
    assert index.entries_list() == [(3, 300)]
    index.truncate_to(0)
    assert index.entries_list() == []


def test_zero_filled_offset_index_fails_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000050.index"
    path.write_bytes(b"\0" * 80)  # a preallocated index after a crash
    index = OffsetIndex(path, 50)
    with pytest.raises(CorruptIndexError):
        index.sanity_check()
    path2 = tmp_path / "00000000000000000060.index"
    path2.write_bytes(b"\0" * 13)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path2, 60).sanity_check()


def test_time_index_keeps_timestamps_increasing(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "00000000000000000010.timeindex", 10, max_index_size=120)
    assert index.lookup(5) == (-1, 10)
    assert index.maybe_append(1_000, 12)
    assert not index.maybe_append(1_000, 14)  # not larger: skipped
    assert not index.maybe_append(900, 15)
    assert index.maybe_append(2_000, 20)
    assert index.lookup(999) == (-1, 10)
    assert index.lookup(1_500) == (1_000, 12)
    assert index.lookup(5_000) == (2_000, 20)
    index.truncate_to(20)
    assert index.entries_list() == [(1_000, 12)]
    index.sanity_check()


def test_time_index_is_full_one_entry_early(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0, max_index_size=36)
    assert index.max_entries == 3
    index.maybe_append(1, 1)
    index.maybe_append(2, 2)
    assert index.is_full
    with pytest.raises(CorruptIndexError):
        index.maybe_append(3, 3)
    assert index.maybe_append(3, 3, skip_full_check=True)  # the final entry on roll
    assert index.entries == 3


def test_zero_tail_time_index_fails_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.timeindex"
    index = TimeIndex(path, 0, max_index_size=120)
    index.maybe_append(5_000, 4)
    index.flush()
    index.close_handler()  # crash: the preallocated zero tail stays
    with pytest.raises(CorruptIndexError):
        TimeIndex(path, 0).sanity_check()
