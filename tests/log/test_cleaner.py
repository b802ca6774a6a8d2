"""Log compaction (broker/log/cleaner.py) on the in-process log: what is kept, where, and when."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c

from isrlab.broker.log.cleaner import (
    CLEANER_OFFSET_CHECKPOINT,
    DELETE_HORIZON_MASK,
    LogCleaner,
    cleanable,
)
from isrlab.broker.log.errors import UnexpectedAppendOffsetError
from isrlab.broker.log.log import EARLIEST_TIMESTAMP, AppendOrigin, Log, LogConfig
from isrlab.broker.log.record_batch import CONTROL_MASK, TRANSACTIONAL_MASK, iter_batches
from tests.log.compaction import Record, cleaner_for, compact_config, keyed_batch, read_all
from tests.log.conftest import FakeClock

TP = ("orders", 0)
Opener = Callable[..., Log]


def k(i: int) -> bytes:
    return f"key-{i}".encode()


def fill(
    log: Log, rounds: int, keys: int, *, per_batch: int = 5, tag: str = "v", epoch: int = 0
) -> dict[bytes, tuple[int, bytes | None]]:
    """Append ``rounds`` x ``keys`` records, key i's value ``<tag><round>-<i>``; returns the
    latest (offset, value) per key."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    pending: list[Record] = []
    for r in range(rounds):
        for i in range(keys):
            pending.append((k(i), f"{tag}{r}-{i}".encode()))
            if len(pending) == per_batch:
                _append(log, pending, latest, epoch)
                pending = []
    if pending:
        _append(log, pending, latest, epoch)
    return latest


def _append(
    log: Log, records: list[Record], latest: dict[bytes, tuple[int, bytes | None]], epoch: int = 0
) -> int:
    first = log.append_as_leader(keyed_batch(records), epoch).first_offset
    for i, (key, value) in enumerate(records):
        assert key is not None
        latest[key] = (first + i, value)
    return first


def check_latest(
    log: Log, latest: dict[bytes, tuple[int, bytes | None]]
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """Every key's latest record is readable at its offset; offsets strictly increase."""
    records = read_all(log)
    offsets = [offset for offset, *_ in records]
    assert offsets == sorted(set(offsets))
    seen = {(offset, key): value for offset, key, value, _ in records}
    for key, (offset, value) in latest.items():
        if value is not None:
            assert seen.get((offset, key)) == value, (key, offset, value)
    return records


def test_cleaning_keeps_the_latest_record_of_every_key_at_its_offset(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    latest = fill(log, rounds=20, keys=10)
    end, start = log.log_end_offset, log.log_start_offset
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    result = cleaner.clean_once()
    assert result is not None and result.end_offset == log.active_segment.base_offset
    assert (log.log_start_offset, log.log_end_offset) == (start, end)
    records = check_latest(log, latest)
    # Below the active segment only one record per key is left.
    cleaned = [r for r in records if r[0] < log.active_segment.base_offset]
    assert len(cleaned) == len({key for _, key, _, _ in cleaned})
    assert result.stats.records_kept < result.stats.records_read
    # The checkpoint is Kafka's offset checkpoint file.
    text = (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text()
    assert text == f"0\n1\norders 0 {result.end_offset}\n"
    assert cleaner.clean_once() is None  # nothing dirty left


def test_without_a_newer_record_nothing_is_dropped(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    latest = fill(log, rounds=1, keys=200)
    log.roll()
    before = read_all(log)
    assert cleaner_for(tmp_path, {TP: log}, clock).clean_once() is not None
    assert read_all(log) == before
    check_latest(log, latest)


def test_the_active_segment_is_never_cleaned(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(segment_bytes=1 << 20))
    fill(log, rounds=10, keys=3)
    assert len(log.segments) == 1
    assert cleaner_for(tmp_path, {TP: log}, clock).clean_once() is None
    assert len(read_all(log)) == 30


def test_nothing_at_or_past_the_high_watermark_is_cleaned(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=20, keys=10)
    bases = [s.base_offset for s in log.segments]
    hw = bases[2]
    cleaner = cleaner_for(tmp_path, {TP: log}, clock, high_watermark=lambda tp: hw)
    result = cleaner.clean_once()
    assert result is not None and result.end_offset == hw
    above = [r for r in read_all(log) if r[0] >= hw]
    assert len(above) == log.log_end_offset - hw  # untouched: every offset still there


def test_min_compaction_lag_keeps_recent_segments_dirty(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(min_compaction_lag_ms=60_000))
    now = int(clock() * 1000)
    for r in range(20):
        log.append_as_leader(keyed_batch([(k(i), b"x%d" % r) for i in range(5)], timestamp=now), 0)
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    assert cleaner.clean_once() is None  # every record is younger than the lag
    clock.advance_ms(60_000)
    assert cleaner.clean_once() is None  # the newest is 4 ms younger still
    clock.advance_ms(5)
    assert cleaner.clean_once() is not None


def test_the_dirty_ratio_decides_when_a_log_is_cleaned(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(min_cleanable_dirty_ratio=0.5))
    fill(log, rounds=1, keys=300)  # distinct keys: cleaning keeps everything
    log.roll()
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    assert cleaner.clean_once() is not None  # all dirty: ratio 1
    clean_bytes = log.size_in_bytes
    fill(log, rounds=1, keys=30, tag="w")
    log.roll()
    info = cleanable(log, cleaner.checkpoints[TP], None, 0)
    assert info.clean_bytes == clean_bytes and 0 < info.cleanable_ratio < 0.5
    assert cleaner.clean_once() is None
    fill(log, rounds=1, keys=300, tag="z")
    log.roll()
    assert cleanable(log, cleaner.checkpoints[TP], None, 0).cleanable_ratio > 0.5
    assert cleaner.clean_once() is not None


def test_tombstones_stay_delete_retention_ms_after_the_first_cleaning(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(delete_retention_ms=10_000))
    latest = fill(log, rounds=3, keys=10)
    tomb = _append(log, [(k(3), None), (k(4), b"after")], latest)
    fill(log, rounds=5, keys=2, tag="other")  # keys 0 and 1 only
    log.roll()
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    assert cleaner.clean_once() is not None
    records = {(o, key): (v, ts) for o, key, v, ts in read_all(log)}
    assert records[(tomb, k(3))] == (None, 1000)  # kept, timestamp unchanged
    assert records[(tomb + 1, k(4))] == (b"after", 1001)
    horizon_batch = next(
        h for s in log.segments for h in s.batches() if h.base_offset <= tomb <= h.last_offset
    )
    assert horizon_batch.attributes & DELETE_HORIZON_MASK
    assert horizon_batch.base_timestamp == int(clock() * 1000) + 10_000
    assert not any(key == k(3) and o < tomb for o, key in records)  # no older value shows

    def clean_again() -> None:
        fill(log, rounds=2, keys=1, tag="more")
        log.roll()
        assert cleaner.clean_once() is not None

    clock.advance_ms(9_999)
    clean_again()
    assert (tomb, k(3)) in {(o, key) for o, key, _, _ in read_all(log)}
    clock.advance_ms(2)
    clean_again()
    after = read_all(log)
    assert not any(key == k(3) for _, key, _, _ in after)  # the tombstone and the key are gone
    assert (tomb + 1, k(4), b"after", 1001) in after


def test_a_fetch_in_a_gap_returns_the_next_batch(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=20, keys=10)
    cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    records = read_all(log)
    offsets = [r[0] for r in records]
    gap = next(o for o in range(offsets[-1]) if o not in offsets)
    data = log.read(gap, 1 << 20).read_bytes()
    first = next(iter_batches(data))
    assert first.last_offset >= gap
    following = next(o for o in offsets if o > gap)
    assert first.base_offset <= following <= first.last_offset
    # The log start offset does not move and ListOffsets(earliest) answers it; by time, the
    # first record kept with that timestamp or later.
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(0) == (records[0][0], records[0][3])
    late = max(r[3] for r in records)
    assert log.offset_for_timestamp(late) == next((r[0], r[3]) for r in records if r[3] >= late)
    assert read_all(log, 0) == records
    # Reading from every offset, gap or not, gives the records from there on.
    for start in range(0, log.log_end_offset, 7):
        assert read_all(log, start) == [r for r in records if r[0] >= start]


def test_a_follower_fetching_from_a_gap_continues_after_it(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    leader = open_log(compact_config(), name="leader-0")
    latest = fill(leader, rounds=20, keys=10)
    cleaner_for(tmp_path, {TP: leader}, clock).clean_once()
    assert read_all(leader)[0][0] > 0  # offset 0 was cleaned away
    follower = open_log(compact_config(), name="follower-0")
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_as_follower(leader.read(follower.log_end_offset, 1_000).read_bytes())
    assert read_all(follower) == read_all(leader)
    check_latest(follower, latest)
    plain = open_log(name="plain-0")  # not compacted: a gap is a replication error
    with pytest.raises(UnexpectedAppendOffsetError):
        plain.append_as_follower(leader.read(0, 1_000).read_bytes())


def test_the_last_batch_of_an_idempotent_producer_is_kept(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    first = log.append_as_leader(keyed_batch([(k(1), b"a"), (k(2), b"b")], producer_id=7), 0)
    second = log.append_as_leader(
        keyed_batch([(k(1), b"c"), (k(2), b"d")], producer_id=7, base_sequence=2), 0
    )
    fill(log, rounds=30, keys=3, tag="n")  # newer values of keys 1 and 2 from another producer
    log.roll()
    cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    kept = [h for s in log.segments for h in s.batches() if h.producer_id == 7]
    assert [(h.base_offset, h.base_sequence, h.records_count) for h in kept] == [
        (second.first_offset, 2, 2)
    ]
    assert first.first_offset not in {h.base_offset for s in log.segments for h in s.batches()}


def test_a_kept_producer_batch_never_outlives_the_tombstone_of_its_key(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(delete_retention_ms=100))
    log.append_as_leader(keyed_batch([(k(1), b"old")], producer_id=7), 0)
    fill(log, rounds=10, keys=3, tag="n")  # a newer value of key 1: the batch is obsolete
    log.roll()
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    cleaner.clean_once()
    assert [h.producer_id for s in log.segments for h in s.batches()].count(7) == 1  # kept whole
    tomb = log.append_as_leader(keyed_batch([(k(1), None)]), 0).first_offset
    fill(log, rounds=10, keys=1, tag="pad")  # key 0 only
    log.roll()
    cleaner.clean_once()  # the tombstone is mapped: the old value goes now
    assert [h.producer_id for s in log.segments for h in s.batches()].count(7) == 0
    clock.advance_ms(101)
    fill(log, rounds=10, keys=1, tag="pad2")
    log.roll()
    cleaner.clean_once()  # past the horizon: the tombstone goes too
    assert not [r for r in read_all(log) if r[1] == k(1)], tomb


def _control_batch(log: Log) -> bytes:
    batch = bytearray(
        keyed_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")], producer_id=9)
    )
    attributes = struct.unpack_from(">h", batch, 21)[0] | CONTROL_MASK | TRANSACTIONAL_MASK
    struct.pack_into(">h", batch, 21, attributes)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def test_control_batches_are_kept(open_log: Opener, tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(compact_config())
    fill(log, rounds=2, keys=5)
    marker = log.append_as_leader(_control_batch(log), 0, origin=AppendOrigin.COORDINATOR)
    fill(log, rounds=30, keys=5, tag="later")
    log.roll()
    cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    controls = [h.base_offset for s in log.segments for h in s.batches() if h.is_control]
    assert controls == [marker.first_offset]


def test_compressed_batches_are_cleaned_and_stay_compressed(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    codecs = {}
    for r in range(30):
        records: list[Record] = [(k(i), f"g{r}-{i}".encode()) for i in range(4)]
        first = log.append_as_leader(keyed_batch(records, compression=1), 0).first_offset
        latest.update({key: (first + i, v) for i, (key, v) in enumerate(records)})
        records = [(k(0), f"h{r}".encode()), (k(9), f"h{r}".encode())]
        first = log.append_as_leader(keyed_batch(records, compression=1), 0).first_offset
        latest.update({key: (first + i, v) for i, (key, v) in enumerate(records)})
    log.roll()
    codecs = {h.base_offset: h.compression_type for s in log.segments for h in s.batches()}
    assert 1 in codecs.values()
    result = cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    assert result is not None and result.stats.batches_rewritten > 0
    records_after = check_latest(log, latest)
    assert len(records_after) == len(latest)
    for h in (h for s in log.segments for h in s.batches()):
        assert h.compression_type == codecs[h.base_offset]


def test_retention_by_time_and_size_only_with_the_delete_policy(
    open_log: Opener, clock: FakeClock
) -> None:
    for policy, expect_deleted in ((("compact",), False), (("compact", "delete"), True)):
        log = open_log(
            compact_config(cleanup_policy=policy, retention_bytes=100), name=f"p{len(policy)}-0"
        )
        fill(log, rounds=5, keys=20)
        assert len(log.segments) >= 2
        assert (log.delete_old_segments() > 0) is expect_deleted


def test_the_cleaned_log_reopens_with_its_indexes_and_epochs(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    latest = fill(log, rounds=10, keys=10)
    # Epoch 3 starts with a batch the cleaning removes: the cache keeps its start offset.
    epoch3 = log.append_as_leader(keyed_batch([(k(0), b"epoch3")]), 3)
    latest.update(fill(log, rounds=10, keys=10, tag="x", epoch=3))
    log.roll()
    cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    before = read_all(log)
    epochs = log.leader_epoch_cache.epoch_entries()
    log.close()
    again = open_log(compact_config())
    assert read_all(again) == before
    assert epochs == [(0, 0), (3, epoch3.first_offset)]
    assert epoch3.first_offset not in {r[0] for r in before}
    assert again.leader_epoch_cache.epoch_entries() == epochs
    for segment in again.segments:
        segment.sanity_check()
    check_latest(again, latest)


def test_cleaning_is_dropped_when_retention_got_there_first(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=40, keys=10)
    before = read_all(log)
    assert len(log.segments) > 3

    def owner(fn: Callable[[], object]) -> object:
        if getattr(fn, "__name__", "") == "<lambda>":  # the swap: the first segment goes first
            log.maybe_increment_log_start_offset(log.segments[1].base_offset)
            assert log.delete_old_segments() == 1
        return fn()

    cleaner = LogCleaner(
        tmp_path,
        cleaner_for(tmp_path, {TP: log}, clock).config,
        logs=lambda: {TP: log},
        clock=clock,
        run_on_owner=owner,
    )
    assert cleaner.clean_once() is None
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))
    assert [r for r in before if r[0] >= log.log_start_offset] == read_all(log)
    assert TP not in cleaner.checkpoints


def test_dump_log_shows_the_gaps(open_log: Opener, tmp_path: Path, clock: FakeClock) -> None:
    import io

    from isrlab.broker.log.dump import dump_files

    log = open_log(compact_config())
    log.append_as_leader(keyed_batch([(k(1), b"a"), (k(2), b"b"), (k(1), b"c")]), 0)  # 0..2
    log.append_as_leader(keyed_batch([(k(3), b"x")]), 0)  # 3
    log.append_as_leader(keyed_batch([(k(3), b"y"), (k(4), b"z")]), 0)  # 4..5
    log.roll()
    cleaner_for(tmp_path, {TP: log}, clock).clean_once()
    out = io.StringIO()
    dump_files([log.segments[0].log_file], print_records=True, out=out)
    lines = [
        " ".join(line.split()[:6]) if line.startswith("baseOffset") else " ".join(line.split()[:3])
        for line in out.getvalue().splitlines()[1:]
    ]
    assert lines == [
        "Log starting offset:",
        "baseOffset: 0 lastOffset: 2 count: 2",  # offset 0 went: the batch keeps its range
        "| offset: 1",
        "| offset: 2",
        "baseOffset: 4 lastOffset: 5 count: 2",  # the batch of offset 3 went
        "| offset: 4",
        "| offset: 5",
    ]


def test_a_topic_config_of_the_cleaner_is_validated() -> None:
    from isrlab.broker.config import BrokerConfig, ConfigError, parse_topic_configs

    defaults = BrokerConfig().topic_defaults()
    assert defaults["cleanup.policy"] == ["delete"]
    assert defaults["min.cleanable.dirty.ratio"] == 0.5
    assert defaults["delete.retention.ms"] == 86_400_000
    assert defaults["min.compaction.lag.ms"] == 0
    cfg = parse_topic_configs({"cleanup.policy": "compact,delete"}, defaults)
    assert cfg["cleanup.policy"] == ["compact", "delete"]
    with pytest.raises(ConfigError, match=r"cleanup\.policy.*compact, delete"):
        parse_topic_configs({"cleanup.policy": "compacted"}, defaults)
    with pytest.raises(ConfigError, match=r"min\.cleanable\.dirty\.ratio.*between 0 and 1"):
        parse_topic_configs({"min.cleanable.dirty.ratio": "1.5"}, defaults)
    with pytest.raises(ConfigError, match=r"delete\.retention\.ms"):
        parse_topic_configs({"delete.retention.ms": "-2"}, defaults)
    broker = BrokerConfig({"log.cleanup.policy": "compact", "log.cleaner.delete.retention.ms": "5"})
    assert broker.topic_defaults()["cleanup.policy"] == ["compact"]
    assert broker.topic_defaults()["delete.retention.ms"] == 5


def test_log_config_policies() -> None:
    assert not LogConfig().compact and LogConfig().delete
    both = LogConfig(cleanup_policy=("compact", "delete"))
    assert both.compact and both.delete


def test_a_compacted_log_refuses_records_without_a_key(open_log: Opener) -> None:
    from isrlab.broker.log.errors import InvalidRecordError

    log = open_log(compact_config())
    with pytest.raises(InvalidRecordError, match="without key") as info:
        log.append_as_leader(keyed_batch([(k(1), b"a"), (None, b"b")]), 0)
    assert info.value.code == 87  # INVALID_RECORD
    with pytest.raises(InvalidRecordError, match="without key"):
        log.append_as_leader(keyed_batch([(None, b"b")], compression=1), 0)
    assert log.log_end_offset == 0
    log.append_as_leader(keyed_batch([(k(1), b"a")], compression=1), 0)
    plain = open_log(name="plain-0")
    plain.append_as_leader(keyed_batch([(None, b"b")]), 0)  # a delete-policy topic takes it


def test_segment_ms_closes_the_active_segment_so_it_can_be_cleaned(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config(segment_bytes=1 << 20, segment_ms=60_000))
    fill(log, rounds=10, keys=3)
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)
    assert cleaner.clean_once() is None  # one (active) segment
    clock.advance_ms(60_001)
    latest = fill(log, rounds=1, keys=3, tag="late")  # this append rolls first (segment.ms)
    assert len(log.segments) == 2
    assert cleaner.clean_once() is not None
    assert len(read_all(log)) == 3 + 3  # one per key cleaned, plus the new active segment
    check_latest(log, latest)


def test_the_log_manager_maps_cleanup_policy_to_the_log_config() -> None:
    from isrlab.broker.config import BrokerConfig, parse_topic_configs
    from isrlab.broker.log_manager import log_config_from

    defaults = BrokerConfig().topic_defaults()
    parsed = parse_topic_configs(
        {"cleanup.policy": "compact", "delete.retention.ms": "7"}, defaults
    )
    config = log_config_from(parsed)
    assert config.compact and not config.delete and config.delete_retention_ms == 7
    assert log_config_from({**parsed, "cleanup.policy": "compact, delete"}).cleanup_policy == (
        "compact",
        "delete",
    )
    assert log_config_from(defaults).cleanup_policy == ("delete",)


def test_a_stop_abandons_a_cleaning_and_leaves_no_cleaned_files(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=20, keys=10)
    before = read_all(log)
    cleaner = cleaner_for(tmp_path, {TP: log}, clock)

    def stop_midway(name: str) -> None:
        if name == "mapped":
            cleaner._stop.set()  # what LogCleaner.stop does, between the map and the rewrite

    cleaner.cleaner.step = stop_midway
    assert cleaner.clean_once() is None
    assert not list(log.dir.glob("*.cleaned")) and read_all(log) == before
    assert TP not in cleaner.checkpoints
