"""The .txnindex files (Kafka's TransactionIndex): format, per-segment life cycle, the
read_committed search across segments, recovery."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.producer_state import ProducerStateManager
from isrlab.broker.log.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    CorruptTxnIndexError,
    TransactionIndex,
    decode_entries,
    txn_index_path,
)
from tests.log.conftest import FakeClock
from tests.log.txn_helpers import Writer

Opener = Callable[..., Log]


def kafka_entry(version: int, pid: int, first: int, last: int, lso: int) -> bytes:
    """An AbortedTxn as Kafka writes it, field by field."""
    return (
        version.to_bytes(2, "big")
        + pid.to_bytes(8, "big", signed=True)
        + first.to_bytes(8, "big", signed=True)
        + last.to_bytes(8, "big", signed=True)
        + lso.to_bytes(8, "big", signed=True)
    )


def test_entry_format_is_kafkas() -> None:
    assert ENTRY_SIZE == 34
    raw = kafka_entry(0, 1234, 10, 20, 21)
    assert AbortedTxn(1234, 10, 20, 21).encode() == raw
    assert AbortedTxn.decode(raw) == AbortedTxn(1234, 10, 20, 21)


def test_reads_a_hand_built_file(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    path.write_bytes(kafka_entry(0, 5, 0, 4, 2) + kafka_entry(0, 9, 6, 8, 9))
    index = TransactionIndex(path, 0)
    assert index.entries == [AbortedTxn(5, 0, 4, 2), AbortedTxn(9, 6, 8, 9)]
    index.append(AbortedTxn(3, 9, 12, 13))
    assert path.read_bytes()[2 * ENTRY_SIZE :] == kafka_entry(0, 3, 9, 12, 13)


@pytest.mark.parametrize(
    "data,problem",
    [
        (kafka_entry(0, 1, 0, 4, 5)[:-1], "not a multiple"),
        (kafka_entry(1, 1, 0, 4, 5), "version 1"),
        (kafka_entry(0, 1, 0, 4, 5) + kafka_entry(0, 2, 1, 4, 5), "not after 4"),
    ],
)
def test_damaged_files_are_refused(data: bytes, problem: str) -> None:
    with pytest.raises(CorruptTxnIndexError, match=problem):
        decode_entries(data)


def test_collect_aborted_and_completeness(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "x.txnindex", 0)
    for entry in (AbortedTxn(1, 0, 5, 3), AbortedTxn(2, 3, 8, 9), AbortedTxn(3, 9, 12, 13)):
        index.append(entry)
    # overlapping [6, 9): txn 2 (3..8); txn 1 ended at 5; txn 3 starts at 9
    found, complete = index.collect_aborted(6, 9)
    assert found == [AbortedTxn(2, 3, 8, 9)] and complete  # its LSO 9 reached the bound
    found, complete = index.collect_aborted(0, 20)
    assert len(found) == 3 and not complete
    index.truncate_to(8)  # markers at 8 and later go
    assert index.entries == [AbortedTxn(1, 0, 5, 3)]
    assert index.path.stat().st_size == ENTRY_SIZE
    index.truncate_to(0)
    assert index.entries == [] and not index.path.exists()


def small(open_log: Opener) -> Log:
    return open_log(LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=0))


def test_entries_go_to_the_marker_segment_and_are_searched_across_segments(
    open_log: Opener,
) -> None:
    w = Writer(small(open_log))
    first = w.data(1, 2)  # producer 1: aborted, spanning segments
    for _ in range(6):
        w.data(2)  # producer 2: committed later
    w.marker(1, commit=False)
    w.marker(2, commit=True)
    w.data(3)
    abort3 = w.marker(3, commit=False)
    log = w.log
    assert len(log.segments) >= 3
    holders = [s.base_offset for s in log.segments if s.txn_index.entries]
    assert all(txn_index_path(log.dir, b).exists() for b in holders)
    assert not any(
        txn_index_path(log.dir, s.base_offset).exists()
        for s in log.segments
        if s.base_offset not in holders
    )
    # producer 1: 0-1, producer 2: 2-7, markers at 8 (abort 1) and 9 (commit 2): producer 2's
    # transaction was still open at the abort, so the LSO then was its first offset
    assert first == 0 and w.entries()[0] == (1, 0, 8, 2)
    assert w.entries()[1] == (3, abort3 - 1, abort3, abort3 + 1)
    leo = log.log_end_offset
    assert log.collect_aborted_transactions(0, leo) == [(1, first), (3, abort3 - 1)]
    # a fetch from the middle of producer 1's transaction still learns it was aborted
    assert log.collect_aborted_transactions(first + 3, first + 5) == [(1, first)]
    assert log.collect_aborted_transactions(abort3, leo) == [(3, abort3 - 1)]
    assert log.collect_aborted_transactions(abort3 + 1, leo) == []


def test_truncation_drops_entries_and_segment_files(open_log: Opener) -> None:
    w = Writer(small(open_log))
    for _ in range(8):
        w.data(1)
    abort = w.marker(1, commit=False)
    w.data(2)
    log = w.log
    holder = next(s for s in log.segments if s.txn_index.entries)
    path = txn_index_path(log.dir, holder.base_offset)
    assert path.exists()
    log.truncate_to(abort)
    assert w.entries() == []
    assert not path.exists() or path.stat().st_size == 0
    w.state.load(log)  # the shell reloads producer state after a truncation
    assert w.state.first_unstable_offset() == 0  # producer 1's transaction is open again


def test_deleted_with_its_segment(open_log: Opener) -> None:
    w = Writer(small(open_log))
    w.data(1)
    w.marker(1, commit=False)
    for _ in range(10):
        w.data(2, tag="x" * 20)
    log = w.log
    path = txn_index_path(log.dir, 0)
    assert path.exists()
    log.maybe_increment_log_start_offset(log.segments[2].base_offset)
    log.delete_old_segments()
    assert not path.exists()
    assert not list(log.dir.glob("*.txnindex.deleted"))


def test_unclean_recovery_rebuilds_the_index(tmp_path: Path, clock: FakeClock) -> None:
    cfg = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "orders-0", cfg, clock=clock)
    w = Writer(log)
    w.data(1)
    w.data(2)
    w.marker(1, commit=False)
    for _ in range(6):
        w.data(3)
    w.marker(3, commit=False)
    w.marker(2, commit=False)
    before = w.entries()
    assert len(before) == 3
    log.close_without_flush()  # a crash: no clean-shutdown marker, recovery point 0
    for path in tmp_path.glob("orders-0/*.txnindex"):
        path.write_bytes(path.read_bytes() + b"garbage")  # damage: torn tail
    reopened = Log.open(tmp_path / "orders-0", cfg, clock=clock)
    try:
        assert reopened.txn_index_rebuild_from == 0
        state = ProducerStateManager(reopened.dir)
        state.load(reopened)
        assert reopened.txn_index_rebuild_from is None
        assert Writer(reopened, state).entries() == before
    finally:
        reopened.close_without_flush()


def test_clean_open_rebuilds_a_corrupt_index(tmp_path: Path, clock: FakeClock) -> None:
    cfg = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "orders-0", cfg, clock=clock)
    w = Writer(log)
    for _ in range(7):
        w.data(1)
    w.marker(1, commit=False)
    w.data(2)
    before = w.entries()
    w.state.take_snapshot()
    log.close()
    (path,) = tmp_path.glob("orders-0/*.txnindex")
    path.write_bytes(struct.pack(">h", 7) + path.read_bytes()[2:])  # version 7
    reopened = Log.open(tmp_path / "orders-0", cfg, clock=clock)
    try:
        assert reopened.txn_index_rebuild_from is not None
        state = ProducerStateManager(reopened.dir)
        state.load(reopened)  # the snapshot is past the rebuild point: replayed from older
        assert Writer(reopened, state).entries() == before
    finally:
        reopened.close_without_flush()


def _compacted_with_aborts(tmp_path: Path, clock: FakeClock) -> tuple[Log, Writer]:
    from tests.log.compaction import compact_config

    log = Log.open(tmp_path / "orders-0", compact_config(segment_bytes=600), clock=clock)
    w = Writer(log)
    for round_ in range(12):
        pid = 10 + round_ % 3
        w.data(pid, key=b"k%d" % (round_ % 4), tag=str(round_))
        w.data(pid, key=b"k%d" % (round_ % 4), tag=f"{round_}b")
        w.marker(pid, commit=round_ % 2 == 1)
    log.roll()
    return log, w


@pytest.mark.parametrize("crash", [None, "swap", "deleted"])
def test_the_cleaner_keeps_markers_and_aborted_transactions(
    tmp_path: Path, clock: FakeClock, crash: str | None
) -> None:
    from tests.log.compaction import cleaner_for, compact_config
    from tests.log.test_cleaner_crash import TP, SimulatedCrash, crash_at

    log, w = _compacted_with_aborts(tmp_path, clock)
    before = w.entries()
    aborted = log.collect_aborted_transactions(0, log.log_end_offset)
    assert len(before) == 6 and len(log.segments) > 3
    markers = [h.base_offset for s in log.segments for h in s.batches() if h.is_control]
    if crash is None:
        assert cleaner_for(tmp_path, {TP: log}, clock).clean_once() is not None
    else:
        with pytest.raises(SimulatedCrash):
            cleaner_for(tmp_path, {TP: log}, clock, step=crash_at(crash)).clean_once()
        end = log.log_end_offset
        log.flush()
        log.close_without_flush()
        # the broker's recovery-point checkpoint says everything was flushed, so the .txnindex
        # files are what the cleaner and the swap left
        log = Log.open(
            tmp_path / "orders-0",
            compact_config(segment_bytes=600),
            clock=clock,
            recovery_point=end,
        )
        # only the (empty) active segment is rescanned: nothing below it is rebuilt
        assert log.txn_index_rebuild_from == log.log_end_offset
        ProducerStateManager(log.dir).load(log)
    try:
        assert [h.base_offset for s in log.segments for h in s.batches() if h.is_control] == markers
        assert Writer(log).entries() == before
        assert log.collect_aborted_transactions(0, log.log_end_offset) == aborted
        assert not list(log.dir.glob("*.txnindex.*"))
    finally:
        log.close_without_flush()


def test_the_cleaner_never_lets_an_aborted_record_supersede_a_committed_one(
    tmp_path: Path, clock: FakeClock
) -> None:
    from tests.log.compaction import cleaner_for, compact_config, read_all
    from tests.log.test_cleaner_crash import TP

    log = Log.open(tmp_path / "orders-0", compact_config(segment_bytes=600), clock=clock)
    w = Writer(log)
    committed = w.data(20, key=b"k", tag="committed")
    w.marker(20, commit=True)
    aborted = w.data(21, key=b"k", tag="aborted")
    w.marker(21, commit=False)
    for round_ in range(20):  # other keys, committed, enough for several segments
        w.data(22, key=b"other%d" % (round_ % 3), tag=str(round_))
        w.marker(22, commit=True)
    log.roll()
    try:
        assert cleaner_for(tmp_path, {TP: log}, clock).clean_once() is not None
        records = read_all(log)
        kept = {offset for offset, *_ in records}
        # the committed value of k stays (a read_committed consumer drops the aborted one)
        assert committed in kept and aborted in kept
        assert log.collect_aborted_transactions(0, log.log_end_offset) == [(21, aborted)]
        others = [key for _, key, *_ in records if key is not None and key.startswith(b"other")]
        assert len(others) == 3  # the other keys were compacted to their latest values
    finally:
        log.close_without_flush()
