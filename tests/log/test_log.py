from collections.abc import Callable
from pathlib import Path

import pytest

from isrlab.broker.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
)
from isrlab.broker.log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, AppendOrigin, Log, LogConfig
from isrlab.broker.log.record_batch import CONTROL_MASK, iter_batches, stamp
from tests.log.batches import decode_values, make_batch
from tests.log.conftest import FakeClock

Opener = Callable[..., Log]
BATCH = len(make_batch(3))


def fill(log: Log, batches: int, *, epoch: int = 0, timestamp: int = 1_000) -> None:
    for i in range(batches):
        log.append_as_leader(make_batch(3, timestamp=timestamp + 10 * i, tag=i), epoch)


def test_topic_and_partition_come_from_the_directory(open_log: Opener) -> None:
    log = open_log(name="orders-eu-west-12")
    assert (log.topic, log.partition) == ("orders-eu-west", 12)
    assert log.dir.name == "orders-eu-west-12"


def test_bad_directory_name_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KafkaStorageError, match="<topic>-<partition>"):
        Log.open(tmp_path / "orders", LogConfig())


def test_append_as_leader_assigns_offsets_and_epoch(open_log: Opener) -> None:
    log = open_log()
    records = make_batch(3, tag=1) + make_batch(2, tag=2)
    original = bytes(records)
    info = log.append_as_leader(records, 5)
    assert (info.first_offset, info.last_offset, info.num_records, info.num_batches) == (0, 4, 5, 2)
    assert info.valid_bytes == len(records) and info.log_append_time == -1
    assert info.max_timestamp == 1_002 and info.offset_of_max_timestamp == 2
    info2 = log.append_as_leader(make_batch(4, tag=3), 5)
    assert (info2.first_offset, info2.last_offset) == (5, 8)
    assert records == original  # the caller's buffer is not modified
    stored = log.read(0, 10**6).read_bytes()
    headers = list(iter_batches(stored))
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 5), (3, 5), (5, 5)]
    assert [o for o, _ in decode_values(stored)] == list(range(9))
    assert log.log_end_offset == 9
    assert log.leader_epoch_cache.epoch_entries() == [(5, 0)]
    log.append_as_leader(make_batch(1), 7)
    assert log.leader_epoch_cache.epoch_entries() == [(5, 0), (7, 9)]


def test_a_bad_batch_rejects_the_whole_append(open_log: Opener) -> None:
    log = open_log()
    fill(log, 2)
    bad = bytearray(make_batch(3))
    bad[-2] ^= 0x01
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(make_batch(3) + bytes(bad), 0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(make_batch(3) + make_batch(3)[:40], 0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(b"", 0)
    assert log.log_end_offset == 6 and log.size_in_bytes == 2 * BATCH


def test_size_limits(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=1_000, max_message_bytes=500, file_delete_delay_ms=0))
    with pytest.raises(RecordTooLargeError) as info:
        log.append_as_leader(make_batch(1, value_size=600), 0)
    assert info.value.code == 10
    with pytest.raises(RecordBatchTooLargeError) as info2:
        log.append_as_leader(b"".join(make_batch(2, value_size=100, tag=i) for i in range(6)), 0)
    assert info2.value.code == 18
    assert log.log_end_offset == 0


def test_clients_cannot_write_control_batches(open_log: Opener) -> None:
    log = open_log()
    data = bytearray(make_batch(1, producer_id=3, transactional=True))
    attributes = int.from_bytes(data[21:23], "big") | CONTROL_MASK
    data[21:23] = attributes.to_bytes(2, "big")
    from crc32c import crc32c

    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    with pytest.raises(InvalidRecordError, match="control"):
        log.append_as_leader(bytes(data), 0)
    assert log.append_as_leader(bytes(data), 0, origin=AppendOrigin.COORDINATOR).num_batches == 1


def test_validated_headers_skip_only_the_batch_validation(open_log: Opener) -> None:
    """A caller that validated the batch hands the headers over: the log does not validate it
    again (a CRC it would reject goes in), and still makes its own checks."""
    from isrlab.broker.log.record_batch import validate

    log = open_log(LogConfig(segment_bytes=4_000, max_message_bytes=500, file_delete_delay_ms=0))
    good = make_batch(3)
    headers = validate(good)
    bad_crc = bytearray(good)
    bad_crc[-2] ^= 0x01
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(bad_crc), 0)
    info = log.append_as_leader(bytes(bad_crc), 4, validated=headers)
    assert (info.first_offset, info.last_offset) == (0, 2)
    # the stored headers, stamped: offsets and leader epoch
    (stored,) = info.batches
    assert (stored.base_offset, stored.partition_leader_epoch, stored.position) == (0, 4, 0)
    assert stored == next(iter_batches(log.read(0, 10_000).read_bytes()))
    big = make_batch(1, value_size=600)
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(big, 0, validated=validate(big))
    control = bytearray(make_batch(1, producer_id=3, transactional=True))
    control[21:23] = (int.from_bytes(control[21:23], "big") | CONTROL_MASK).to_bytes(2, "big")
    from crc32c import crc32c

    control[17:21] = crc32c(bytes(control[21:])).to_bytes(4, "big")
    with pytest.raises(InvalidRecordError, match="control"):
        log.append_as_leader(bytes(control), 0, validated=validate(bytes(control)))
    assert log.log_end_offset == 3


def test_append_as_follower_keeps_offsets_and_epochs(open_log: Opener, tmp_path: Path) -> None:
    leader = open_log(name="leader-0")
    leader.append_as_leader(make_batch(3, tag=1), 2)
    leader.append_as_leader(make_batch(3, tag=2), 4)
    fetched = leader.read(0, 10**6).read_bytes()
    follower = open_log(name="follower-0")
    assert follower.append_as_follower(b"").num_batches == 0
    info = follower.append_as_follower(fetched)
    assert (info.first_offset, info.last_offset) == (0, 5)
    assert follower.read(0, 10**6).read_bytes() == fetched
    assert follower.leader_epoch_cache.epoch_entries() == [(2, 0), (4, 3)]
    with pytest.raises(LogError, match="log end offset is 6"):
        follower.append_as_follower(fetched)
    gap = bytearray(make_batch(2))
    stamp(gap, 0, 10, 4)
    with pytest.raises(LogError):
        follower.append_as_follower(bytes(gap))


def test_a_fetched_batch_of_an_older_epoch_replaces_the_epoch_led_without_appends(
    open_log: Opener,
) -> None:
    """The append path gives the epoch cache a batch whose epoch is older than its latest
    entry (Kafka's assign, tests/log/test_checkpoints.py): a broker that led epoch 1 from
    offset 3 without appending, then fetched offsets 3-5 stamped epoch 0 from the next leader,
    says epoch 0 ends at its log end, not at 3. Also after a restart (the cache rebuilt from
    the batches when its file is gone)."""
    leader = open_log(name="leader-0")
    leader.append_as_leader(make_batch(3, tag=1), 0)
    leader.append_as_leader(make_batch(3, tag=2), 0)
    fetched = leader.read(0, 10**6).read_bytes()
    follower = open_log(name="follower-0")
    follower.append_as_follower(fetched[:BATCH])
    follower.leader_epoch_cache.assign(1, 3)  # it led epoch 1 (appending nothing)
    assert follower.leader_epoch_cache.end_offset_for(0, follower.log_end_offset) == (0, 3)
    follower.append_as_follower(fetched[BATCH:])
    assert follower.leader_epoch_cache.epoch_entries() == [(0, 3)]
    assert follower.leader_epoch_cache.end_offset_for(0, follower.log_end_offset) == (0, 6)
    cache_file = follower.leader_epoch_cache.path
    follower.close()
    cache_file.unlink()
    reopened = open_log(name="follower-0")
    assert reopened.leader_epoch_cache.epoch_entries() == [(0, 0)]
    assert reopened.leader_epoch_cache.end_offset_for(0, reopened.log_end_offset) == (0, 6)


def test_roll_on_segment_bytes(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=3 * BATCH, file_delete_delay_ms=0))
    fill(log, 7)
    assert [s.base_offset for s in log.segments] == [0, 9, 18]
    assert all(s.size <= 3 * BATCH for s in log.segments)
    assert log.recovery_point == 18  # rolled segments are flushed


def test_roll_on_segment_ms(open_log: Opener, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_ms=60_000, file_delete_delay_ms=0))
    fill(log, 2)
    clock.advance_ms(60_000)
    fill(log, 1)
    assert len(log.segments) == 1  # not yet past segment.ms
    clock.advance_ms(1)
    fill(log, 1)
    assert [s.base_offset for s in log.segments] == [0, 9]
    clock.advance_ms(10 * 60_000)
    assert len(log.segments) == 2  # time alone never rolls an idle (empty) segment


def test_full_index_forces_a_roll(open_log: Opener) -> None:
    log = open_log(
        LogConfig(segment_index_bytes=24, index_interval_bytes=1, file_delete_delay_ms=0)
    )
    fill(log, 12)
    assert len(log.segments) > 1
    for segment in log.segments[:-1]:
        assert segment.offset_index.entries <= 3
    assert [o for o, _ in decode_values(log.read(0, 10**6).read_bytes())] == list(range(36))


def test_explicit_roll_and_empty_roll_is_a_noop(open_log: Opener) -> None:
    log = open_log()
    assert log.roll() is log.active_segment and len(log.segments) == 1
    fill(log, 1)
    new = log.roll()
    assert new.base_offset == 3 and len(log.segments) == 2
    assert log.roll() is new


def test_read_errors_and_empty_read(open_log: Opener) -> None:
    log = open_log()
    fill(log, 2)
    assert log.read(6, 1000).size == 0
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(7, 1000)
    assert info.value.code == 1
    log.maybe_increment_log_start_offset(3)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 1000)
    assert log.read(3, 1000).size == BATCH


def test_read_across_segments_with_limits(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    fill(log, 6)  # segments 0, 6, 12 with two batches each
    assert len(log.segments) == 3
    everything = log.read(0, 10**6)
    assert len(everything.regions) == 3 and everything.size == 6 * BATCH
    assert [o for o, _ in decode_values(everything.read_bytes())] == list(range(18))
    middle = log.read(4, 3 * BATCH + 5)  # batch 3..5, then 6..8, 9..11
    assert decode_values(middle.read_bytes())[0][0] == 3
    assert middle.size == 3 * BATCH
    capped = log.read(0, 10**6, max_offset=10)  # stops before batch 9..11
    assert [o for o, _ in decode_values(capped.read_bytes())][-1] == 8
    assert log.read(9, 10**6, max_offset=9).size == 0
    assert log.read(0, 1).size == BATCH  # min_one_message
    assert log.read(0, 1, min_one_message=False).size == 0


def test_offset_for_timestamp(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    fill(log, 6, timestamp=5_000)  # batch i has timestamps 5000+10i .. +2
    assert log.offset_for_timestamp(0) == (0, 5_000)
    assert log.offset_for_timestamp(5_031) == (10, 5_031)
    assert log.offset_for_timestamp(5_033) == (12, 5_040)
    assert log.offset_for_timestamp(6_000) is None
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (18, -1)


def test_truncate_to_drops_data_segments_and_epochs(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    fill(log, 2, epoch=1)
    fill(log, 2, epoch=2)
    fill(log, 2, epoch=3)
    assert log.leader_epoch_cache.epoch_entries() == [(1, 0), (2, 6), (3, 12)]
    assert log.truncate_to(7)  # inside batch 6..8: the whole batch goes
    assert log.log_end_offset == 6
    assert [s.base_offset for s in log.segments] == [0, 6]
    assert log.leader_epoch_cache.epoch_entries() == [(1, 0)]
    assert not log.truncate_to(100)
    info = log.append_as_leader(make_batch(3), 4)
    assert info.first_offset == 6
    assert log.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 6)]
    assert [o for o, _ in decode_values(log.read(0, 10**6).read_bytes())] == list(range(9))


def test_truncate_fully_and_start_at(open_log: Opener) -> None:
    log = open_log()
    fill(log, 3, epoch=1)
    log.truncate_fully_and_start_at(50)
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (50, 50, 50)
    assert log.leader_epoch_cache.epoch_entries() == []
    assert log.append_as_leader(make_batch(2), 2).first_offset == 50
    assert sorted(p.name for p in log.dir.glob("*.log")) == ["00000000000000000050.log"]


def test_retention_by_time_never_deletes_the_active_segment(
    open_log: Opener, clock: FakeClock
) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, retention_ms=60_000, file_delete_delay_ms=0))
    now_ms = int(clock() * 1000)
    fill(log, 3, timestamp=now_ms - 120_000)  # old: segments 0 and 6
    fill(log, 3, timestamp=now_ms)
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 6, 12]
    assert log.delete_old_segments() == 1  # segment 6 holds a fresh batch
    assert log.log_start_offset == 6
    assert not (log.dir / "00000000000000000000.log").exists()
    clock.advance_ms(10 * 60_000)
    assert log.delete_old_segments() == 1
    assert [s.base_offset for s in log.segments] == [12]
    assert log.delete_old_segments() == 0  # only the active one is left
    assert log.log_start_offset == 12
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_retention_by_size(open_log: Opener) -> None:
    log = open_log(
        LogConfig(
            segment_bytes=2 * BATCH,
            retention_bytes=3 * BATCH,
            retention_ms=-1,
            file_delete_delay_ms=0,
        )
    )
    fill(log, 7)  # segments: [0,6) [6,12) [12,18) [18,21)
    assert log.delete_old_segments() == 2
    assert [s.base_offset for s in log.segments] == [12, 18]
    assert log.size_in_bytes <= 3 * BATCH
    assert log.log_start_offset == 12


def test_retention_respects_the_high_watermark(open_log: Opener) -> None:
    log = open_log(
        LogConfig(
            segment_bytes=2 * BATCH, retention_bytes=0, retention_ms=-1, file_delete_delay_ms=0
        )
    )
    fill(log, 6)
    assert log.delete_old_segments(high_watermark=7) == 1  # segment 6 ends at 12 > 7
    assert log.log_start_offset == 6


def test_log_start_offset_advancement_deletes_segments_below_it(open_log: Opener) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, retention_ms=-1, file_delete_delay_ms=0))
    fill(log, 6)
    assert log.maybe_increment_log_start_offset(13)
    assert not log.maybe_increment_log_start_offset(5)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(100)
    assert log.delete_old_segments() == 2
    assert log.log_start_offset == 13
    assert decode_values(log.read(13, 10**6).read_bytes())[0][0] == 12  # whole batch holding 13


def test_deleted_segments_wait_for_file_delete_delay(open_log: Opener, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, retention_ms=-1, file_delete_delay_ms=30_000))
    fill(log, 6)
    in_flight = log.read(0, 2 * BATCH)
    log.maybe_increment_log_start_offset(6)
    assert log.delete_old_segments() == 1
    assert (log.dir / "00000000000000000000.log.deleted").exists()
    assert len(in_flight.read_bytes()) == 2 * BATCH  # a region handed out before still reads
    clock.advance_ms(30_000)
    log.maybe_flush()
    assert not (log.dir / "00000000000000000000.log.deleted").exists()


def test_flush_policies_advance_the_recovery_point(open_log: Opener, clock: FakeClock) -> None:
    log = open_log(LogConfig(flush_interval_messages=6, file_delete_delay_ms=0))
    fill(log, 1)
    assert log.recovery_point == 0
    fill(log, 1)
    assert log.recovery_point == 6
    timed = open_log(LogConfig(flush_interval_ms=1_000, file_delete_delay_ms=0), name="timed-0")
    fill(timed, 2)
    assert not timed.maybe_flush() and timed.recovery_point == 0
    clock.advance_ms(1_000)
    assert timed.maybe_flush() and timed.recovery_point == 6
    fill(timed, 1)
    timed.flush(up_to=100)
    assert timed.recovery_point == 9


def test_close_reopen_and_delete(open_log: Opener, tmp_path: Path) -> None:
    log = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    fill(log, 5, epoch=3)
    before = log.read(0, 10**6).read_bytes()
    log.close()
    assert (log.dir / ".kafka_cleanshutdown").exists()
    with pytest.raises(KafkaStorageError):
        log.read(0, 10)
    again = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    assert not (again.dir / ".kafka_cleanshutdown").exists()
    assert again.read(0, 10**6).read_bytes() == before
    assert again.recovery_point == again.log_end_offset == 15
    assert again.leader_epoch_cache.epoch_entries() == [(3, 0)]
    assert again.append_as_leader(make_batch(1), 3).first_offset == 15
    again.delete()
    assert not (tmp_path / "orders-0").exists()


def test_read_never_skips_a_batch_that_did_not_fit(open_log: Opener) -> None:
    big = make_batch(3, value_size=200)
    log = open_log(LogConfig(segment_bytes=BATCH + len(big), file_delete_delay_ms=0))
    log.append_as_leader(make_batch(3), 0)
    log.append_as_leader(big, 0)  # a big batch ends segment 0
    log.append_as_leader(make_batch(3), 0)  # segment 6, small
    assert [s.base_offset for s in log.segments] == [0, 6]
    got = log.read(0, 2 * BATCH, min_one_message=False)
    assert (
        got.size == BATCH
    )  # the big batch does not fit; the small one after it must not jump ahead


def test_segment_age_restarts_at_reopen(open_log: Opener, clock: FakeClock) -> None:
    config = LogConfig(segment_ms=60_000, file_delete_delay_ms=0)
    log = open_log(config)
    fill(log, 1, timestamp=1)  # record timestamps from 1970 must not make the segment "old"
    log.close()
    clock.advance_ms(30_000)
    again = open_log(config)
    fill(again, 1)
    assert len(again.segments) == 1
    clock.advance_ms(60_001)
    fill(again, 1)
    assert [s.base_offset for s in again.segments] == [0, 6]


def test_regions_can_be_sent_with_sendfile(open_log: Opener) -> None:
    import socket

    log = open_log(LogConfig(segment_bytes=2 * BATCH, file_delete_delay_ms=0))
    fill(log, 5)
    fetched = log.read(4, 10**6)
    assert len(fetched.regions) == 3
    sender, receiver = socket.socketpair()
    with sender, receiver:
        for region in fetched.regions:
            sent = sender.sendfile(region.file, region.position, region.size)  # type: ignore[arg-type]
            assert sent == region.size
        sender.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := receiver.recv(65536):
            received += chunk
    assert received == fetched.read_bytes()
    assert decode_values(received)[0][0] == 3
    log.append_as_leader(make_batch(1), 0)  # sendfile moved the file position; appends use pwrite
    assert decode_values(log.read(15, 10**6).read_bytes())[0][0] == 15


def test_follower_offset_mismatch_carries_the_offsets(open_log: Opener) -> None:
    from isrlab.broker.log.errors import UnexpectedAppendOffsetError

    leader = open_log(name="leader-0")
    fill(leader, 3)
    leader.maybe_increment_log_start_offset(4)  # inside batch 3..5
    fetched = leader.read(4, 10**6).read_bytes()
    follower = open_log(name="follower-0")
    follower.truncate_fully_and_start_at(4)
    with pytest.raises(UnexpectedAppendOffsetError) as info:
        follower.append_as_follower(fetched)
    assert (info.value.first_offset, info.value.last_offset) == (3, 8)
    follower.truncate_fully_and_start_at(info.value.first_offset)  # what Kafka's Partition does
    follower.append_as_follower(fetched)
    assert follower.read(3, 10**6).read_bytes() == fetched
