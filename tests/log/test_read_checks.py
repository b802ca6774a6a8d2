"""Reads check what no recovery checked (recovery.mark_unchecked / verify_read): after a clean
stop a rolled segment's batches before its checked tail are CRC-checked by the first read that
serves them, once; a corrupt one raises CorruptLogData (and tells the log's storage-failure
hook) instead of being served; what recovery rescanned is not checked again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from isrlab.broker.log import recovery
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.record_batch import iter_batches
from tests.log.batches import decode_values, make_batch

Opener = Callable[..., Log]
BATCH = len(make_batch(3))
# 4 batches per segment, an index entry per batch: the checked tail is the last batch only
CONFIG = LogConfig(segment_bytes=4 * BATCH, index_interval_bytes=BATCH, file_delete_delay_ms=0)


def filled(open_log: Opener, clean: bool = True) -> Path:
    log = open_log(CONFIG)
    for i in range(10):  # segments 0 (0..11), 12 (12..23), 24 (24..29)
        log.append_as_leader(make_batch(3, tag=i), 0)
    if clean:
        log.close()
    else:
        log.close_without_flush()
    return log.dir / f"{0:020d}.log"


def flip_batch(path: Path, n: int) -> int:
    header = list(iter_batches(path.read_bytes()))[n]
    data = bytearray(path.read_bytes())
    data[header.position + header.size - 2] ^= 0x10  # a byte of the last record
    path.write_bytes(bytes(data))
    return header.position


def test_a_corrupt_batch_no_recovery_checked_is_not_served(open_log: Opener) -> None:
    segment = filled(open_log)
    position = flip_batch(segment, 1)  # offsets 3..5, below the segment's checked tail
    log = open_log(CONFIG)
    told: list[KafkaStorageError] = []
    log.on_storage_failure = told.append
    assert decode_values(log.read(0, 1 << 20, max_offset=3).read_bytes())[-1][0] == 2
    with pytest.raises(recovery.CorruptLogData) as caught:
        log.read(0, 1 << 20)
    assert caught.value.path == segment and caught.value.position == position
    assert caught.value.segment_base == 0 and told == [caught.value]
    assert f"corrupt record batch in {segment} at byte offset {position}" in str(caught.value)
    # the later segments are whole: a read from there is served
    assert [o for o, _ in decode_values(log.read(12, 1 << 20).read_bytes())] == list(range(12, 30))


def test_each_batch_is_checked_once(open_log: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    filled(open_log)
    log = open_log(CONFIG)
    checked: list[int] = []
    original = recovery._check_batch

    def spy(buf: object, position: int, end: int, base: int) -> object:
        checked.append(position)
        return original(buf, position, end, base)  # type: ignore[arg-type]

    monkeypatch.setattr(recovery, "_check_batch", spy)
    assert len(decode_values(log.read(0, 1 << 20).read_bytes())) == 30
    # the batches before the last index entry of segments 0 and 12 (the active segment and
    # the tails were checked at the start)
    assert checked == [0, BATCH, 0, BATCH]
    assert len(decode_values(log.read(0, 1 << 20).read_bytes())) == 30
    assert len(decode_values(log.read(3, 1 << 20).read_bytes())) == 27
    assert checked == [0, BATCH, 0, BATCH]  # not again


def test_what_recovery_rescanned_is_not_checked_again(
    open_log: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled(open_log, clean=False)  # an unclean stop: every segment is rescanned at the start
    log = open_log(CONFIG)
    calls: list[int] = []
    monkeypatch.setattr(recovery, "_check_batch", lambda *a: calls.append(1))
    assert len(decode_values(log.read(0, 1 << 20).read_bytes())) == 30
    assert calls == []


def test_a_follower_never_appends_a_corrupt_batch_and_fetches_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fetcher side (Kafka's AbstractFetcherThread): a batch whose CRC fails is logged as
    invalid messages at the fetch offset, nothing is appended, and the follower fetches the
    same offset again after the back-off."""
    import asyncio

    from isrlab.broker.partition import HostedPartition
    from isrlab.broker.replication import ErrorCode as CoreError
    from isrlab.broker.replication import LeaderAndIsr, ReplicationConfig
    from tests.broker.test_partition_txn import RecordingIO

    loop = asyncio.new_event_loop()
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=4_000, file_delete_delay_ms=0))
    io = RecordingIO()
    hp = HostedPartition(("t", 0), log, 1, {}, ReplicationConfig(replica_fetch_backoff_ms=0), io)
    try:
        hp.become(LeaderAndIsr(0, 0, (0, 1), 1), [0, 1])  # follow broker 0
        fetch = io.sent[-1]
        data = bytearray(make_batch(3))
        data[-2] ^= 0x10  # a byte of the last record: the CRC fails
        hp.on_fetch_response(fetch.request_id, int(CoreError.NONE), bytes(data), 3, 0, 3)
        assert log.log_end_offset == 0
        assert "t-0: Found invalid messages during fetch at offset 0" in caplog.text
        sent = len(io.sent)
        hp.tick()
        assert len(io.sent) == sent + 1 and io.sent[-1].fetch_offset == 0
    finally:
        log.close_without_flush()
        loop.close()
