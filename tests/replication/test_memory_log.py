"""MemoryLog: epoch cache semantics (Kafka's LeaderEpochFileCache), truncation, crashes;
LeaderAndIsr JSON; ReplicationConfig properties."""

from __future__ import annotations

import pytest

from isrlab.broker.replication import LeaderAndIsr, MemoryLog, ReplicationConfig, TruncationMode
from isrlab.broker.replication.replica_log import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET


def log_with_epochs() -> MemoryLog:
    log = MemoryLog()
    log.append_as_follower([("a", 1), ("b", 1), ("c", 3), ("d", 5), ("e", 5)])
    return log


def test_epoch_entries_follow_appends() -> None:
    assert log_with_epochs().epoch_entries == [(1, 0), (3, 2), (5, 3)]


@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        (5, (5, 5)),  # latest epoch: ends at the LEO
        (3, (3, 3)),
        (4, (3, 3)),  # unknown epoch: largest smaller epoch, start of the next one
        (1, (1, 2)),
        (0, (0, 0)),  # smaller than every epoch: the first epoch's start
        (6, (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)),
        (UNDEFINED_EPOCH, (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)),
    ],
)
def test_end_offset_for_epoch(asked: int, answer: tuple[int, int]) -> None:
    assert log_with_epochs().end_offset_for_epoch(asked) == answer


def test_truncation_drops_records_and_epochs() -> None:
    log = log_with_epochs()
    log.truncate_to(3)
    assert log.log_end_offset == 3 and log.epoch_entries == [(1, 0), (3, 2)]
    assert log.latest_epoch() == 3 and log.end_offset_for_epoch(3) == (3, 3)


def test_leader_append_stamps_epoch_and_assign_is_monotonic() -> None:
    log = MemoryLog()
    assert log.append_as_leader(["x", "y"], 2) == (0, 1)
    log.assign_epoch_start_offset(4, 2)
    log.assign_epoch_start_offset(4, 3)  # the latest epoch again, later: nothing changes
    assert log.epoch_entries == [(2, 0), (4, 2)]
    assert log.append_as_leader(["z"], 4) == (2, 2)
    assert log.read(0, 10) == [("x", 2), ("y", 2), ("z", 4)]


def test_a_fetched_batch_of_an_older_epoch_replaces_a_stale_entry() -> None:
    """A broker that led epoch 4 from offset 2 without appending, then fetched offset 2
    stamped epoch 2 (an older leader's tail) from the next leader: epoch 4's entry goes, as
    in Kafka's cache (broker/log/leader_epoch_checkpoint.py), so epoch 2 ends at the log end."""
    log = MemoryLog()
    log.append_as_leader(["x", "y"], 2)
    log.assign_epoch_start_offset(4, 2)
    log.append_as_follower([("z", 2)])
    assert log.epoch_entries == [(2, 2)]  # Kafka's rule drops (2, 0) too
    log.assign_epoch_start_offset(6, 3)
    assert log.end_offset_for_epoch(2) == (2, 3)
    with pytest.raises(ValueError, match="at least one record"):
        log.append_as_leader([], 4)


def test_crash_loses_only_unflushed_records() -> None:
    log = log_with_epochs()
    log.flush()
    log.append_as_follower([("f", 6), ("g", 6)])
    log.hw_checkpoint = 6
    log.crash()
    assert log.log_end_offset == 5 and log.latest_epoch() == 5
    assert log.hw_checkpoint == 6  # the checkpoint file survives; Partition clamps it


def test_truncate_fully_and_start_at() -> None:
    log = log_with_epochs()
    log.truncate_fully_and_start_at(10)
    assert (log.log_start_offset, log.log_end_offset, log.epoch_entries) == (10, 10, [])
    log.append_as_follower([("k", 7)])
    assert log.record_at(10) == ("k", 7) and log.record_at(9) is None


def test_leader_and_isr_json_round_trip() -> None:
    state = LeaderAndIsr(2, 7, (2, 0), 4, zk_version=11)
    assert LeaderAndIsr.from_json(state.to_json(), 11) == state
    with pytest.raises(ValueError, match="malformed partition state"):
        LeaderAndIsr.from_json(b'{"leader": 1}', 0)


def test_config_from_kafka_properties() -> None:
    cfg = ReplicationConfig.from_properties(
        {
            "min.insync.replicas": "2",
            "replica.lag.time.max.ms": "3000",
            "replica.truncation.mode": "high-watermark",
            "log.dirs": "/ignored",
        }
    )
    assert cfg.min_insync_replicas == 2 and cfg.replica_lag_time_max_ms == 3000
    assert cfg.truncation_mode is TruncationMode.HIGH_WATERMARK
    with pytest.raises(ValueError, match=r"replica\.truncation\.mode must be one of"):
        ReplicationConfig.from_properties({"replica.truncation.mode": "yolo"})
    with pytest.raises(ValueError, match=r"min\.insync\.replicas must be an integer"):
        ReplicationConfig.from_properties({"min.insync.replicas": "two"})
    with pytest.raises(ValueError, match="at least 1"):
        ReplicationConfig(min_insync_replicas=0)
