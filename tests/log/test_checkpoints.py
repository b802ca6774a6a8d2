from pathlib import Path

import pytest

from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.leader_epoch_checkpoint import LeaderEpochFileCache


def test_offset_checkpoint_round_trip_in_kafka_format(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    checkpoint = OffsetCheckpointFile(path)
    assert checkpoint.read() == {}
    offsets = {("orders-eu", 3): 77, ("orders", 0): 1234, ("__consumer_offsets", 12): 0}
    checkpoint.write(offsets)
    assert path.read_text() == "0\n3\n__consumer_offsets 12 0\norders 0 1234\norders-eu 3 77\n"
    assert OffsetCheckpointFile(path).read() == offsets
    assert not list(tmp_path.glob("*.tmp"))
    checkpoint.write({})
    assert checkpoint.read() == {}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "version line"),
        ("1\n0\n", "unsupported version"),
        ("zero\n0\n", "version is not an integer"),
        ("0\n2\norders 0 5\n", "says 2 entries"),
        ("0\n1\norders 0\n", "does not parse"),
        ("0\n1\norders x 5\n", "does not parse"),
        ("0\nmany\n", "count is not an integer"),
    ],
)
def test_garbage_checkpoint_is_a_clear_error(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(KafkaStorageError, match=problem) as info:
        OffsetCheckpointFile(path).read()
    assert "delete the file" in str(info.value)
    assert info.value.code == 56


def test_epoch_cache_assign_takes_new_epochs_and_not_a_later_start_of_the_latest(
    tmp_path: Path,
) -> None:
    cache = LeaderEpochFileCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.latest_epoch == -1
    assert cache.assign(2, 0)
    assert not cache.assign(2, 10)
    assert not cache.assign(-1, 10)  # a batch without an epoch (magic < 2)
    assert cache.assign(5, 30)
    assert cache.epoch_entries() == [(2, 0), (5, 30)]
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n2\n2 0\n5 30\n"
    assert LeaderEpochFileCache(tmp_path / "leader-epoch-checkpoint").epoch_entries() == [
        (2, 0),
        (5, 30),
    ]
    assert cache.assign(6, 20)  # a start offset below a later entry's replaces it
    assert cache.epoch_entries() == [(2, 0), (6, 20)]
    assert cache.epoch_for_offset(25) == 6 and cache.epoch_for_offset(3) == 2


def test_an_older_epoch_replaces_the_entries_it_contradicts(tmp_path: Path) -> None:
    """Kafka's assign: a batch of an older epoch than the latest entry, at that entry's start,
    drops what it contradicts (an epoch at or above its own, a start at or past its offset).
    The case: records 0-3 of epoch 0; this broker led epoch 1 from offset 4 and appended
    nothing; it then fetched offsets 4-5, stamped epoch 0, from the leader of epoch 2 (their
    old leader's uncommitted tail, committed since); it leads epoch 3. A follower still at
    epoch 0 asks where epoch 0 ends: at 6, not at 4, or it cuts committed records (the
    simulator's invariants found a follower in the ISR below the high watermark so)."""
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochFileCache(path)
    assert cache.assign(0, 0) and cache.assign(1, 4)
    assert cache.end_offset_for(0, 4) == (0, 4)
    assert cache.assign(0, 4)
    assert cache.epoch_entries() == [(0, 4)]  # Kafka drops (0, 0) too: its epoch is not below
    assert cache.assign(3, 6)
    assert cache.end_offset_for(0, 6) == (0, 6)
    assert LeaderEpochFileCache(path).epoch_entries() == [(0, 4), (3, 6)]
    # an older epoch further on cuts the later entries only
    cache = LeaderEpochFileCache(tmp_path / "other")
    assert cache.assign(1, 0) and cache.assign(4, 10) and cache.assign(6, 20)
    assert cache.assign(5, 20)
    assert cache.epoch_entries() == [(1, 0), (4, 10), (5, 20)]


def test_end_offset_for_follows_offsets_for_leader_epoch(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.end_offset_for(0, 100) == (-1, -1)  # empty cache
    for epoch, start in [(1, 0), (3, 10), (6, 25)]:
        cache.assign(epoch, start)
    leo = 40
    assert cache.end_offset_for(-1, leo) == (-1, -1)  # undefined epoch
    assert cache.end_offset_for(6, leo) == (6, 40)  # the latest: the log end offset
    assert cache.end_offset_for(7, leo) == (-1, -1)  # newer than anything known
    assert cache.end_offset_for(3, leo) == (3, 25)  # ends where epoch 6 starts
    assert cache.end_offset_for(4, leo) == (3, 25)  # unknown: the largest epoch below it
    assert cache.end_offset_for(2, leo) == (1, 10)
    assert cache.end_offset_for(0, leo) == (0, 0)  # below every epoch: first start offset


def test_epoch_cache_truncation(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochFileCache(path)
    for epoch, start in [(1, 0), (3, 10), (6, 25)]:
        cache.assign(epoch, start)
    cache.truncate_from_end(25)
    assert cache.epoch_entries() == [(1, 0), (3, 10)]
    cache.truncate_from_start(12)
    assert cache.epoch_entries() == [(3, 12)]
    cache.truncate_from_start(5)
    assert cache.epoch_entries() == [(3, 12)]
    assert LeaderEpochFileCache(path).epoch_entries() == [(3, 12)]
    cache.clear_and_flush()
    assert LeaderEpochFileCache(path).epoch_entries() == []


def test_garbage_epoch_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n1\nthree 0\n")
    with pytest.raises(KafkaStorageError, match="leader-epoch-checkpoint"):
        LeaderEpochFileCache(path)


def test_an_older_snapshot_never_overwrites_a_newer_checkpoint(tmp_path: Path) -> None:
    cp = OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint")
    older = cp.snapshot({("t", 0): 5})
    newer = cp.snapshot({("t", 0): 9})
    newer()
    older()  # e.g. a periodic write that was still running in a thread at shutdown
    assert cp.read() == {("t", 0): 9}
    cp.snapshot({("t", 0): 12})()
    assert cp.read() == {("t", 0): 12}


def test_periodic_writer_logs_a_failing_write_once_a_minute_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio
    import logging

    missing = tmp_path / "gone"  # writes fail until the directory exists
    checkpoint = OffsetCheckpointFile(missing / "recovery-point-offset-checkpoint")

    async def run() -> None:
        task = asyncio.create_task(checkpoint.write_every(0.005, lambda: {("t", 0): 7}))
        await asyncio.sleep(0.3)  # dozens of failed writes
        missing.mkdir()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if checkpoint.path.exists():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="isrlab.broker.log.checkpoint"):
        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cannot write checkpoint" in lines[0], lines
    assert checkpoint.read() == {("t", 0): 7}
    assert not list(missing.glob("*.tmp"))
