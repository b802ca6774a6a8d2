"""The torn-file matrix (issue 12): every file a partition's state lives in, each damage a disk
or an operator can do to it, after a clean and after an unclean stop.

Each cell builds a real log dir (LogManager, three segments, two leader epochs, an idempotent
producer, the producer state snapshot and the three offset checkpoints as the broker writes
them), damages one file, and loads it again the way the broker starts: LogManager.load, then
ReplicaManager hosting the partition (high watermark from replication-offset-checkpoint,
producer state from the snapshot plus a replay of the log). Every cell must start, serve
exactly the records it had (minus a batch the damage destroyed), give the next record the next
offset, rebuild derived files to what they were, and log what it did. docs/durability.md holds
the same table.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from isrlab.broker.config import BrokerConfig, parse_topic_configs
from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.leader_epoch_checkpoint import LeaderEpochFileCache
from isrlab.broker.log.log import CLEAN_SHUTDOWN_FILE, Log
from isrlab.broker.log.producer_state import ProducerStateManager
from isrlab.broker.log.record_batch import iter_batches
from isrlab.broker.log.recovery import LogDirFailure
from isrlab.broker.log_manager import LogManager
from isrlab.broker.replica_manager import LocalStateStore, ReplicaManager
from isrlab.broker.replication.config import ReplicationConfig
from tests.log.batches import decode_values, make_batch

TP = ("orders", 0)
BATCH_RECORDS = 3
BATCH = len(make_batch(BATCH_RECORDS, producer_id=7))
BATCHES = 10  # offsets 0..29
# 4 batches per segment: segments 0 (offsets 0..11), 12 (12..23), 24 (24..29, active)
OVERRIDES = [
    f"log.segment.bytes={4 * BATCH}",
    f"log.index.interval.bytes={BATCH}",
    "log.flush.interval.messages=9223372036854775807",
]

KINDS = [
    "segment",
    "index",
    "timeindex",
    "leader-epoch-checkpoint",
    "recovery-point-offset-checkpoint",
    "replication-offset-checkpoint",
    "producer-snapshot",
]
DAMAGES = ["cut", "garbage", "zeros", "flip"]


@dataclass
class Built:
    records: list[tuple[int, bytes]]
    epochs: list[tuple[int, int]]
    index: list[tuple[int, int]]
    timeindex: list[tuple[int, int]]
    producer: list[tuple[int, int, int]]  # (pid, epoch, last seq)


def broker_config(root: Path) -> BrokerConfig:
    return BrokerConfig.load(None, [f"log.dirs={root}", *OVERRIDES])


def topic_configs(cfg: BrokerConfig) -> dict[str, dict[str, object]]:
    return {TP[0]: parse_topic_configs({}, cfg.topic_defaults())}


def producer_summary(state: ProducerStateManager) -> list[tuple[int, int, int]]:
    return sorted((pid, e.epoch, e.last_seq) for pid, e in state.producers.items())


def build(root: Path, *, clean: bool) -> Built:
    cfg = broker_config(root)
    manager = LogManager(cfg)
    log = manager.get_or_create(TP, topic_configs(cfg)[TP[0]])
    state = ProducerStateManager(log.dir)
    for i in range(BATCHES):
        data = idempotent_batch(i)
        info = log.append_as_leader(data, leader_epoch=1 if i < 5 else 4)
        header = next(iter_batches(data))
        state.update(header._replace(base_offset=info.first_offset))
    assert state.take_snapshot() is not None
    first = log.segments[0]
    built = Built(
        records=decode_values(log.read(0, 1 << 20).read_bytes()),
        epochs=log.leader_epoch_cache.epoch_entries(),
        index=first.offset_index.entries_list(),
        timeindex=first.time_index.entries_list(),
        producer=producer_summary(state),
    )
    OffsetCheckpointFile(root / ReplicaManager.HW_CHECKPOINT).write({TP: log.log_end_offset})
    if clean:
        manager.close()
    else:
        manager.checkpoint()  # what the periodic checkpoint task last wrote
        log.close_without_flush()
    assert len(log.segments) == 3 and log.log_end_offset == BATCHES * BATCH_RECORDS
    return built


def idempotent_batch(i: int) -> bytes:
    """The i-th batch of producer 7: sequences 0, 3, 6, ... as a real idempotent producer's."""
    data = bytearray(make_batch(BATCH_RECORDS, producer_id=7, tag=i, timestamp=1_000 + 10 * i))
    data[53:57] = (i * BATCH_RECORDS).to_bytes(4, "big")
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def target(root: Path, kind: str) -> Path:
    part = root / f"{TP[0]}-{TP[1]}"
    return {
        "segment": part / "00000000000000000024.log",  # the active segment
        "index": part / "00000000000000000000.index",  # a rolled segment's (trusted) index
        "timeindex": part / "00000000000000000000.timeindex",
        "leader-epoch-checkpoint": part / "leader-epoch-checkpoint",
        "recovery-point-offset-checkpoint": root / LogManager.RECOVERY_POINT,
        "replication-offset-checkpoint": root / ReplicaManager.HW_CHECKPOINT,
        "producer-snapshot": part / f"{BATCHES * BATCH_RECORDS:020d}.snapshot",
    }[kind]


def last_record(path: Path, kind: str) -> tuple[int, int]:
    """(start, length) of the file's last record: batch, index entry or text line."""
    data = path.read_bytes()
    if kind == "segment":
        last = list(iter_batches(data))[-1]
        return last.position, last.size
    if kind in ("index", "timeindex"):
        width = 8 if kind == "index" else 12
        return len(data) - width, width
    body = data.rstrip(b"\n")
    start = body.rfind(b"\n") + 1
    return start, len(body) - start


def damage(path: Path, kind: str, how: str) -> None:
    start, length = last_record(path, kind)
    data = bytearray(path.read_bytes())
    if how == "cut":
        del data[start + length // 2 :]
    elif how == "garbage":
        data += random.Random(12).randbytes(37)
    elif how == "zeros":
        data += bytes(4096)
    else:
        data[start + length // 2] ^= 0x01
    path.write_bytes(bytes(data))


def reload(root: Path) -> tuple[LogManager, Log, ReplicaManager]:
    cfg = broker_config(root)
    manager = LogManager(cfg)
    manager.load(topic_configs(cfg))
    log = manager.logs[TP]
    try:
        replicas = ReplicaManager(
            0,
            root,
            replication=lambda topic: ReplicationConfig(),
            broker_address=lambda broker: None,
            state_store=LocalStateStore(),
        )
    except LogDirFailure:
        manager.close()
        raise
    replicas.add(TP, log, topic_configs(cfg)[TP[0]])
    return manager, log, replicas


# What each cell logs (a regex on the broker's log) and how many records the damage destroys.
LOST_LAST_BATCH = {("segment", "cut"), ("segment", "flip")}


def goes_offline(kind: str, path: Path) -> str | None:
    """The refusal (a regex) of a cell where Kafka takes the log dir offline: a damaged
    leader-epoch-checkpoint or replication-offset-checkpoint that no longer parses (a flipped
    byte may still parse: then it is handled as any contradiction)."""
    if kind not in ("leader-epoch-checkpoint", "replication-offset-checkpoint"):
        return None
    try:
        if kind == "leader-epoch-checkpoint":
            LeaderEpochFileCache(path)
        else:
            OffsetCheckpointFile(path).read()
    except KafkaStorageError:
        return r"the log dir goes offline, as in Kafka: malformed checkpoint file .*" + kind
    return None


def expected_log(kind: str, how: str, clean: bool) -> str | None:
    if kind == "segment":
        return r"Found invalid messages in log segment .*00000000000000000024\.log at byte offset"
    if kind in ("index", "timeindex"):
        return r"Rebuilding index files for segment .*00000000000000000000\.log"
    if kind == "leader-epoch-checkpoint":
        return r"leader-epoch-checkpoint.*rebuilding"
    if kind == "producer-snapshot":
        return r"Deleting corrupt producer state snapshot"
    if how == "flip":
        return None  # a flipped digit still parses: see the checkpoint cells' asserts
    return r"unreadable .*" + kind


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Path, Built]]:
    """One log dir per kind of stop, built once; each cell damages a copy."""
    out = {}
    for clean in (True, False):
        root = tmp_path_factory.mktemp("template") / "logs"
        out[clean] = (root, build(root, clean=clean))
    return out


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_torn_file_matrix(
    tmp_path: Path,
    templates: dict[bool, tuple[Path, Built]],
    kind: str,
    how: str,
    clean: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    template, built = templates[clean]
    root = tmp_path / "logs"
    shutil.copytree(template, root)
    damage(target(root, kind), kind, how)
    caplog.set_level(logging.INFO)

    refusal = goes_offline(kind, target(root, kind))
    if refusal is not None:
        with pytest.raises(LogDirFailure, match=refusal):
            reload(root)
        return
    manager, log, replicas = reload(root)
    try:
        lost = BATCH_RECORDS if (kind, how) in LOST_LAST_BATCH else 0
        leo = BATCHES * BATCH_RECORDS - lost
        # every record below the HW is served unless the damage destroyed it, nothing else is
        assert decode_values(log.read(0, 1 << 20).read_bytes()) == built.records[:leo]
        assert log.log_end_offset == leo
        partition = replicas.partitions[TP]
        assert partition.high_watermark <= leo
        # derived files are what they were
        assert log.segments[0].offset_index.entries_list() == built.index
        assert log.segments[0].time_index.entries_list() == built.timeindex
        assert log.leader_epoch_cache.epoch_entries() == built.epochs
        summary = producer_summary(partition.producer_state)
        if lost:
            assert summary == [(7, 0, leo - 1)]
        else:
            assert summary == built.producer
        assert not (log.dir / CLEAN_SHUTDOWN_FILE).exists()
        if not clean:
            assert "Recovering unflushed segment 24 in " in caplog.text
        pattern = expected_log(kind, how, clean)
        if pattern is not None:
            assert re.search(pattern, caplog.text), caplog.text
        # the next record gets the next offset: no offset of a record on disk is reused
        assert log.append_as_leader(make_batch(1, tag=99), 5).first_offset == leo
    finally:
        manager.close()


def test_flipped_checkpoint_digit_is_harmless(tmp_path: Path) -> None:
    """A flipped byte that still parses cannot be detected (Kafka's checkpoints carry no
    checksum); what it can change is bounded: a recovery point only chooses which segments
    are rescanned in full, a high watermark is capped at the log end offset."""
    root = tmp_path / "logs"
    build(root, clean=False)
    for name in (LogManager.RECOVERY_POINT, ReplicaManager.HW_CHECKPOINT):
        path = root / name
        path.write_text(path.read_text().replace(" 30\n", " 90\n"))
    manager, log, replicas = reload(root)
    try:
        assert log.log_end_offset == 30
        assert replicas.partitions[TP].high_watermark == 30
    finally:
        manager.close()
