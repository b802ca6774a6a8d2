"""A failed fsync of a segment takes the log dir offline (the broker halts), as Kafka's
LogDirFailureChannel does: after a failed fsync the page cache cannot be trusted ("fsyncgate":
the kernel may have dropped the dirty pages or marked them clean), so the append whose flush
failed stays unacknowledged and nothing may retry the fsync and call it durable. Before this
rule a produce under log.flush.interval.messages=1 was answered KAFKA_STORAGE_ERROR while its
batch stayed in the log, replicated and served, and the broker went on taking writes."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from isrlab.broker.config import BrokerConfig, parse_topic_configs
from isrlab.broker.log import durable
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.log import Log
from isrlab.broker.log_manager import LogManager
from tests.log.batches import make_batch

TP = ("t", 0)


def manager(root: Path, *overrides: str) -> tuple[LogManager, Log, list[int]]:
    """A log manager whose halts are recorded, and its log of partition `TP`."""
    cfg = BrokerConfig.load(None, [f"log.dirs={root}", *overrides])
    m = LogManager(cfg)
    halts: list[int] = []
    m.halt = halts.append
    return m, m.get_or_create(TP, parse_topic_configs({}, cfg.topic_defaults())), halts


def failing_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable, "_fsync", eio)


def test_a_failed_fsync_on_append_takes_the_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    m, lg, halts = manager(tmp_path / "logs", "log.flush.interval.messages=1")
    lg.append_as_leader(make_batch(2, tag=0), 0)
    assert lg.recovery_point == 2 and not halts
    failing_fsync(monkeypatch)
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        lg.append_as_leader(make_batch(2, tag=1), 0)
    assert halts == [1], "the broker halts: its one log dir failed"
    assert m.offline_reason is not None and "cannot flush segment" in m.offline_reason
    assert lg.recovery_point == 2, "the failed flush declared nothing durable"
    assert "check the device" in caplog.text
    # the stop that follows reports what it cannot write and ends: no second halt
    assert m.close() >= 1
    assert halts == [1]


def test_a_failed_scheduled_flush_takes_the_log_dir_offline_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, lg, halts = manager(tmp_path / "logs", "log.flush.interval.ms=1")
    lg.append_as_leader(make_batch(3, tag=0), 0)
    failing_fsync(monkeypatch)
    lg._last_flush_ms -= 10  # the interval has passed
    with pytest.raises(KafkaStorageError):
        lg.maybe_flush()  # the flush scheduler's call
    assert halts == [1] and lg.recovery_point == 0


def test_a_failed_leader_epoch_checkpoint_on_append_takes_the_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, lg, halts = manager(tmp_path / "logs")  # no flush policy: only the epoch file is fsynced
    lg.append_as_leader(make_batch(2, tag=0), 0)
    failing_fsync(monkeypatch)
    for i in range(3):  # the same epoch: nothing is fsynced, the broker goes on
        lg.append_as_leader(make_batch(2, tag=1 + i), 0)
    assert lg.log_end_offset == 8 and not halts
    with pytest.raises(KafkaStorageError, match="leader-epoch-checkpoint"):
        lg.append_as_leader(make_batch(2, tag=9), 1)  # a new epoch: its checkpoint fails
    assert halts == [1]


def test_a_failed_leader_epoch_checkpoint_for_a_new_leader_takes_the_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Becoming leader writes the new epoch's start (`assign_epoch_start_offset`): its failed
    fsync left a broker named leader with a partition half become leader, its followers never
    back in the ISR (found by kill+partition+pause+fsync-fail, seed 11: the high watermark of
    t6/0 frozen for 40 s). Now the broker halts and the controller elects elsewhere."""
    _, lg, halts = manager(tmp_path / "logs")
    lg.append_as_leader(make_batch(2, tag=0), 0)
    failing_fsync(monkeypatch)
    with pytest.raises(KafkaStorageError, match="leader-epoch-checkpoint"):
        lg.leader_epoch_cache.assign(3, lg.log_end_offset)
    assert halts == [1]


def test_a_failed_write_is_undone_and_does_not_halt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import isrlab.broker.log.segment as segment

    _, lg, halts = manager(tmp_path / "logs", "log.flush.interval.messages=1")
    lg.append_as_leader(make_batch(2, tag=0), 0)

    def full(fd: int, data: memoryview, position: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment, "_pwrite_fully", full)
    with pytest.raises(KafkaStorageError, match="No space left"):
        lg.append_as_leader(make_batch(2, tag=1), 0)
    assert lg.log_end_offset == 2 and not halts, "a full disk refuses the write, no more"
