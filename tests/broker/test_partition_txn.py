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


def test_a_produced_batch_is_validated_once(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader append validates the batch (CRC included) once, in the log adapter; the log
    takes its headers. Corrupt and malformed batches still get their errors."""
    import isrlab.broker.log.log as log_module
    import isrlab.broker.partition as partition_module

    calls: list[int] = []

    def counting(buf: Any, **kw: Any) -> Any:
        calls.append(len(buf))
        return validate(buf, **kw)

    monkeypatch.setattr(partition_module, "validate", counting)
    monkeypatch.setattr(log_module, "validate", counting)
    good = txn_batch(7, 0, 0, [b"a", b"b"], transactional=False)
    assert leader.append(good).error == ErrorCode.NONE
    assert len(calls) == 1
    bad_crc = bytearray(txn_batch(7, 0, 2, [b"c"], transactional=False))
    bad_crc[-1] ^= 0xFF
    assert leader.append(bytes(bad_crc)).error == ErrorCode.CORRUPT_MESSAGE
    bad_count = bytearray(txn_batch(7, 0, 2, [b"c"], transactional=False))
    bad_count[57:61] = (2).to_bytes(4, "big")  # recordsCount 2 for lastOffsetDelta 0, CRC fixed
    from crc32c import crc32c

    bad_count[17:21] = crc32c(bytes(bad_count[21:])).to_bytes(4, "big")
    res = leader.append(bytes(bad_count))
    assert res.error == ErrorCode.INVALID_RECORD and "recordsCount" in (res.message or "")
    assert leader.log.log_end_offset == 2
    # the producer state saw the stored offsets: the next sequence goes on, a retry is a dup
    assert leader.append(txn_batch(7, 0, 2, [b"c"], transactional=False)).base_offset == 2
    assert leader.append(good).base_offset == 0 and leader.log.log_end_offset == 3


def test_unknown_origin_is_a_caller_bug(leader: Leader) -> None:
    with pytest.raises(ValueError):
        leader.append(txn_batch(7, 0, 0, [b"a"]), origin="replication")


# --------------------------------------------------------------------------- live, in-process
# A standalone KafkaServer without its socket: requests go through the broker's codec and
# handlers (Fetch, ListOffsets), the ReplicaManager, HostedPartition and an on-disk Log.


class InProcessBroker:
    def __init__(self, directory: Path, overrides: dict[str, str] | None = None) -> None:
        from isrlab.broker.config import BrokerConfig
        from isrlab.broker.server import KafkaServer

        self.loop = asyncio.new_event_loop()
        props = {
            "broker.id": "0",
            "log.dirs": str(directory / "logs"),
            "listeners": "PLAINTEXT://127.0.0.1:19093",  # never bound
            "zero.copy.threshold.bytes": "0",
            **(overrides or {}),
        }
        self.server = KafkaServer(BrokerConfig(props))
        self.correlation_id = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def call(self, request: Any) -> Any:
        from kafka.protocol.api_header import ResponseClassRegistry

        from isrlab.broker.network.codec import decode_request

        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="txn-test")
        decoded = decode_request(bytes(request.encode(header=True)))
        parts = self.run(self.server.handle(decoded, None))  # type: ignore[arg-type]
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
        return cls[request.API_VERSION].decode(b"".join(parts)[4:], header=True)

    def append(self, tp: tuple[str, int], records: bytes, origin: str = "client") -> AppendResult:
        async def go() -> AppendResult:
            r = self.server.replica_manager.append(tp, memoryview(records), -1, 5000, origin=origin)
            return await r if isinstance(r, asyncio.Future) else r

        return self.run(go())

    def close(self) -> None:
        self.run(self.server.replica_manager.stop())
        self.server.log_manager.close()
        self.loop.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    b = InProcessBroker(tmp_path)
    b.run(b.server.create_topic("t", 1, 1, None, {}))
    yield b
    b.close()


def _fetch(b: InProcessBroker, offset: int, isolation: int) -> Any:
    from tests.broker.rawclient import fetch_request

    return b.call(fetch_request("t", offset=offset, isolation_level=isolation)).responses[0]


def _fetched_offsets(part: Any) -> list[int]:
    return [
        o
        for h in iter_batches(bytes(part.records or b""))
        for o in range(h.base_offset, h.next_offset)
    ]


def _latest(b: InProcessBroker, isolation: int) -> int:
    from tests.broker.rawclient import list_offsets_request

    resp = b.call(list_offsets_request("t", {0: -1}, isolation_level=isolation))
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


def test_read_committed_fetch_and_list_offsets(broker: InProcessBroker) -> None:
    tp = ("t", 0)
    ok = ErrorCode.NONE
    assert broker.append(tp, txn_batch(7, 0, 0, [b"a0", b"a1"])).error == ok  # 0-1, aborted
    assert broker.append(tp, txn_batch(8, 0, 0, [b"c0"])).error == ok  # 2, committed
    assert broker.append(tp, txn_batch(5, 0, 0, [b"p"], transactional=False)).error == ok  # 3
    abort = build_control_batch(7, 0, False, 0, 1)
    assert broker.append(tp, abort, origin="coordinator").base_offset == 4
    commit = build_control_batch(8, 0, True, 0, 1)
    assert broker.append(tp, commit, origin="coordinator").base_offset == 5
    assert broker.append(tp, txn_batch(9, 0, 0, [b"o0", b"o1"])).error == ok  # 6-7, open

    committed = _fetch(broker, 0, 1).partitions[0]
    assert committed.error_code == 0
    assert (committed.high_watermark, committed.last_stable_offset) == (8, 6)
    assert _fetched_offsets(committed) == [0, 1, 2, 3, 4, 5]  # stops at the LSO
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(7, 0)]

    uncommitted = _fetch(broker, 0, 0).partitions[0]
    assert _fetched_offsets(uncommitted) == list(range(8))
    assert uncommitted.last_stable_offset == 6
    assert not uncommitted.aborted_transactions  # only read_committed gets them

    # past the aborted transaction's marker: nothing to drop
    later = _fetch(broker, 5, 1).partitions[0]
    assert _fetched_offsets(later) == [5] and later.aborted_transactions == []
    assert _latest(broker, 1) == 6 and _latest(broker, 0) == 8
    # the log cleaner stops at the LSO too: producer 9's records may still be aborted
    assert broker.server.log_manager._cleanable_bound(("t", 0)) == 6

    # producer 9 aborts: the LSO reaches the HW, and its records are reported aborted
    assert (
        broker.append(tp, build_control_batch(9, 0, False, 0, 1), origin="coordinator").error == 0
    )
    after = _fetch(broker, 5, 1).partitions[0]
    assert (after.high_watermark, after.last_stable_offset) == (9, 9)
    assert _fetched_offsets(after) == [5, 6, 7, 8]
    assert [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(9, 6)]
    assert _latest(broker, 1) == 9 == _latest(broker, 0)
    hp = broker.server.replica_manager.get(tp)
    entries = [
        (e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
        for s in hp.log.segments
        for e in s.txn_index.entries
    ]
    # the LSO right after each abort: producer 8's transaction was still open at offset 4
    assert entries == [(7, 0, 4, 2), (9, 6, 8, 9)]


def test_transactional_state_errors_on_append(broker: InProcessBroker) -> None:
    tp = ("t", 0)
    assert broker.append(tp, txn_batch(7, 2, 0, [b"a"])).error == ErrorCode.NONE
    # a non-transactional write while the producer's transaction is open
    res = broker.append(tp, txn_batch(7, 2, 1, [b"x"], transactional=False))
    assert res.error == ErrorCode.INVALID_TXN_STATE
    # markers: an older producer epoch, then a coordinator epoch older than the last marker's
    old = build_control_batch(7, 1, True, 3, 1)
    assert broker.append(tp, old, origin="coordinator").error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert broker.append(tp, build_control_batch(7, 2, True, 3, 1), origin="coordinator").error == 0
    zombie = build_control_batch(7, 2, False, 2, 1)
    res = broker.append(tp, zombie, origin="coordinator")
    assert res.error == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    hp = broker.server.replica_manager.get(tp)
    assert hp.log.log_end_offset == 2 and hp.last_stable_offset == 2


def test_epoch_fencing_switch_accepts_zombies(tmp_path: Path) -> None:
    """transaction.producer.epoch.fencing.enable=false (historic, unsafe): a fenced producer's
    batch with an older epoch is appended instead of refused."""
    for fencing, expected in (
        ("true", ErrorCode.INVALID_PRODUCER_EPOCH),
        ("false", ErrorCode.NONE),
    ):
        b = InProcessBroker(tmp_path / fencing)
        try:
            b.run(
                b.server.create_topic(
                    "t", 1, 1, None, {"transaction.producer.epoch.fencing.enable": fencing}
                )
            )
            assert b.append(("t", 0), txn_batch(7, 1, 0, [b"new"])).error == ErrorCode.NONE
            assert b.append(("t", 0), txn_batch(7, 0, 5, [b"zombie"])).error == expected
        finally:
            b.close()


class RecordingIO(NoIO):
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_fetch(self, partition: Any, action: Any) -> None:
        self.sent.append(action)

    def send_offsets_for_leader_epoch(self, partition: Any, action: Any) -> None:
        self.sent.append(action)


def _stamped(batch: bytes, offset: int) -> bytes:
    from isrlab.broker.log.record_batch import stamp

    buf = bytearray(batch)
    stamp(buf, 0, offset, 0)
    return bytes(buf)


def test_follower_tracks_transactions_from_replicated_batches(tmp_path: Path) -> None:
    from isrlab.broker.replication import ErrorCode as CoreError

    loop = asyncio.new_event_loop()
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=4_000, file_delete_delay_ms=0))
    io = RecordingIO()
    hp = HostedPartition(("t", 0), log, 1, {}, ReplicationConfig(), io)
    try:
        hp.become(LeaderAndIsr(0, 0, (0, 1), 1), [0, 1])  # follow broker 0
        fetch = io.sent[-1]
        assert fetch.fetch_offset == 0
        data = (
            _stamped(txn_batch(7, 0, 0, [b"a", b"b"]), 0)
            + _stamped(txn_batch(8, 0, 0, [b"c"]), 2)
            + _stamped(build_control_batch(7, 0, False, 1, 5), 3)
        )
        hp.on_fetch_response(fetch.request_id, int(CoreError.NONE), data, 1, 0, 4)
        assert log.log_end_offset == 4
        # HW 1: producer 7's transaction (from 0) is aborted but its marker not yet below the HW
        assert (hp.high_watermark, hp.last_stable_offset) == (1, 0)
        entries = [
            (e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
            for s in log.segments
            for e in s.txn_index.entries
        ]
        assert entries == [(7, 0, 3, 2)]
        nxt = io.sent[-1]
        hp.on_fetch_response(nxt.request_id, int(CoreError.NONE), b"", 4, 0, 4)
        # HW 4: producer 7's abort is replicated, producer 8's transaction is still open
        assert (hp.high_watermark, hp.last_stable_offset) == (4, 2)
        assert hp.producer_state.has_ongoing_txn(8, 0)
        assert log.collect_aborted_transactions(0, 4) == [(7, 0)]
        # a truncation below the marker (a new leader without it) reopens producer 7's
        # transaction and drops its .txnindex entry
        hp.adapter.truncate_to(3)
        assert hp.producer_state.has_ongoing_txn(7, 0)
        assert log.collect_aborted_transactions(0, 3) == []
        assert hp.last_stable_offset == 0
    finally:
        log.close_without_flush()
        loop.close()


def test_producer_state_is_snapshotted_at_every_roll(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    ld = Leader.__new__(Leader)
    ld.loop = loop
    ld.log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=300, file_delete_delay_ms=0))
    ld.hp = HostedPartition(("t", 0), ld.log, 0, {}, ReplicationConfig(), NoIO())
    ld.hp.become(LeaderAndIsr(0, 1, (0,), 1), [0])
    try:
        for seq in range(8):
            assert ld.append(txn_batch(7, 0, seq, [b"v" * 40])).error == ErrorCode.NONE
        bases = [s.base_offset for s in ld.log.segments][1:]
        assert bases
        snapshots = [off for off, _ in ld.hp.producer_state.snapshot_files()]
        assert snapshots == bases[-2:]  # the two newest are kept
    finally:
        ld.log.close_without_flush()
        loop.close()
