"""The partition side of transactions in the broker's shell (`HostedPartition` over an on-disk
`Log`): who may append what (`origin`), transaction markers as control batches."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from isrlab.broker.errors import ErrorCode
from isrlab.broker.log.control import build_control_batch, parse_end_txn_marker
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.record_batch import iter_batches, validate
from isrlab.broker.partition import AppendResult, HostedPartition
from isrlab.broker.replication import LeaderAndIsr, ReplicationConfig


class NoIO:
    """A standalone leader needs no IO but the data-changed notifications."""

    def send_fetch(self, partition: Any, action: Any) -> None:  # pragma: no cover
        raise AssertionError("a sole replica sends no fetches")

    def send_offsets_for_leader_epoch(self, partition: Any, action: Any) -> None:
        raise AssertionError("a sole replica sends no OffsetsForLeaderEpoch")  # pragma: no cover

    def write_state(self, partition: Any, action: Any) -> None:  # pragma: no cover
        raise AssertionError("a sole replica writes no state")

    def data_changed(self, partition: Any) -> None:
        pass

    def role_changed(self, partition: Any) -> None:
        pass


def txn_batch(
    pid: int, epoch: int, seq: int, values: list[bytes], *, transactional: bool = True
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        assert builder.append(i, 1_000 + i, None, v, []) is not None
    return bytes(builder.build())


class Leader:
    def __init__(self, directory: Path, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.log = Log.open(
            directory / "t-0", LogConfig(segment_bytes=4_000, file_delete_delay_ms=0)
        )
        self.hp = HostedPartition(("t", 0), self.log, 0, {}, ReplicationConfig(), NoIO())
        self.hp.become(LeaderAndIsr(0, 1, (0,), 1), [0])

    def append(self, records: bytes, origin: str = "client") -> AppendResult:
        async def go() -> AppendResult:
            r = self.hp.append(memoryview(records), 1, 1000, origin=origin)
            return await r if isinstance(r, asyncio.Future) else r

        return self.loop.run_until_complete(go())


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    loop = asyncio.new_event_loop()
    ld = Leader(tmp_path, loop)
    yield ld
    ld.log.close_without_flush()
    loop.close()


def test_control_batch_format() -> None:
    raw = build_control_batch(7, 3, True, 5, 1_234)
    (h,) = validate(raw)  # CRC and structure check
    assert h.is_control and h.is_transactional
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count) == (7, 3, -1, 1)
    assert h.base_timestamp == h.max_timestamp == 1_234
    marker = parse_end_txn_marker(raw, h)
    assert marker is not None and marker.commit and marker.coordinator_epoch == 5
    # the record's key and value, byte for byte: version 0 + type 1; version 0 + epoch 5
    assert raw.endswith(b"\x08\x00\x00\x00\x01\x0c\x00\x00\x00\x00\x00\x05\x00")
    abort = build_control_batch(7, 3, False, 9, 1_234)
    m2 = parse_end_txn_marker(abort, next(iter_batches(abort)))
    assert m2 is not None and not m2.commit and m2.coordinator_epoch == 9


def test_kafka_python_reads_our_marker() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    raw = build_control_batch(7, 3, False, 2, 99)
    batch = DefaultRecordBatch(raw)
    assert batch.is_control_batch and batch.is_transactional
    (rec,) = list(batch)
    assert rec.key == b"\x00\x00\x00\x00" and rec.value == b"\x00\x00\x00\x00\x00\x02"


def test_client_may_not_write_control_batches(leader: Leader) -> None:
    res = leader.append(build_control_batch(7, 0, True, 0, 1))
    assert res.error == ErrorCode.INVALID_RECORD
    assert leader.log.log_end_offset == 0


def test_coordinator_writes_markers(leader: Leader) -> None:
    assert leader.append(txn_batch(7, 0, 0, [b"a", b"b"])).error == ErrorCode.NONE
    res = leader.append(build_control_batch(7, 0, True, 0, 1), origin="coordinator")
    assert res.error == ErrorCode.NONE and res.base_offset == 2
    assert leader.log.log_end_offset == 3


def test_coordinator_batches_skip_sequence_checks_but_not_epochs(leader: Leader) -> None:
    assert leader.append(txn_batch(7, 1, 0, [b"a"])).error == ErrorCode.NONE
    # a transactional offset commit from the group coordinator: sequence -1, same epoch
    assert leader.append(txn_batch(7, 1, -1, [b"o"]), origin="coordinator").error == 0
    stale = leader.append(txn_batch(7, 0, -1, [b"o"]), origin="coordinator")
    assert stale.error == ErrorCode.INVALID_PRODUCER_EPOCH
    # the same sequence -1 batch from a client is out of order
    res = leader.append(txn_batch(7, 1, 5, [b"x"]))
    assert res.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_unknown_origin_is_a_caller_bug(leader: Leader) -> None:
    with pytest.raises(ValueError):
        leader.append(txn_batch(7, 0, 0, [b"a"]), origin="replication")
