"""The ``__transaction_state`` records: Kafka's bytes, round trips, and garbage refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isrlab.broker.coordinator.group.records import build_batch, iter_batch_records
from isrlab.broker.coordinator.transaction.records import (
    RecordFormatError,
    TxnLogValue,
    TxnState,
    UnknownRecordVersionError,
    decode_key,
    decode_value,
    describe_record,
    encode_key,
    encode_value,
)


def _kafka_value_v0() -> bytes:
    """TransactionLogValue v0 built field by field from Kafka's TransactionLogValue.json:
    an Ongoing transaction of producer 1234 epoch 7 over out-1, out-0 and in-3."""
    return (
        struct.pack(">h", 0)  # version
        + struct.pack(">q", 1234)  # ProducerId
        + struct.pack(">h", 7)  # ProducerEpoch
        + struct.pack(">i", 60_000)  # TransactionTimeoutMs
        + struct.pack(">b", 1)  # TransactionStatus: Ongoing
        + struct.pack(">i", 2)  # TransactionPartitions: 2 topics
        + struct.pack(">h", 2) + b"in" + struct.pack(">i", 1) + struct.pack(">i", 3)
        + struct.pack(">h", 3) + b"out" + struct.pack(">i", 2) + struct.pack(">ii", 0, 1)
        + struct.pack(">q", 1_700_000_000_500)  # TransactionLastUpdateTimestampMs
        + struct.pack(">q", 1_700_000_000_000)  # TransactionStartTimestampMs
    )  # fmt: skip


ONGOING = TxnLogValue(
    producer_id=1234,
    producer_epoch=7,
    timeout_ms=60_000,
    state=TxnState.ONGOING,
    partitions=(("in", 3), ("out", 0), ("out", 1)),
    last_update_ms=1_700_000_000_500,
    start_ms=1_700_000_000_000,
)


def test_key_is_kafkas_bytes():
    assert encode_key("tx-1") == b"\x00\x00\x00\x04tx-1"
    assert decode_key(b"\x00\x00\x00\x04tx-1") == "tx-1"
    assert decode_key(encode_key("ü")) == "ü"


def test_value_v0_matches_a_hand_built_kafka_record():
    assert decode_value(_kafka_value_v0()) == ONGOING
    assert encode_value(ONGOING) == _kafka_value_v0()


def test_empty_state_writes_null_partitions_and_complete_an_empty_array():
    empty = TxnLogValue(9, 0, 1000, TxnState.EMPTY, (), 5, -1)
    raw = encode_value(empty)
    # version, pid, epoch, timeout, status, then the null array (-1), then the two timestamps
    assert raw[2 + 8 + 2 + 4 + 1 : 2 + 8 + 2 + 4 + 1 + 4] == struct.pack(">i", -1)
    assert decode_value(raw) == empty
    done = TxnLogValue(9, 0, 1000, TxnState.COMPLETE_COMMIT, (), 5, 3)
    raw = encode_value(done)
    assert raw[17:21] == struct.pack(">i", 0)
    assert decode_value(raw) == done
    # Kafka ignores whatever partitions an Empty record carries, and refuses to write them
    with pytest.raises(RecordFormatError):
        encode_value(TxnLogValue(9, 0, 1000, TxnState.EMPTY, (("t", 0),), 5, -1))
    hacked = bytearray(encode_value(ONGOING))
    hacked[16] = 0  # status byte -> Empty
    assert decode_value(bytes(hacked)).partitions == ()


def test_flexible_v1_is_read():
    v1 = encode_value(ONGOING, version=1)
    assert v1[:2] == b"\x00\x01" and v1 != _kafka_value_v0()
    assert decode_value(v1) == ONGOING
    # a tagged field Kafka might add later is skipped: replace the closing 0 with one tag
    tagged = v1[:-1] + b"\x01\x05\x02ab"
    assert decode_value(tagged) == ONGOING


def test_tombstone_and_garbage():
    assert decode_value(None) is None
    for bad in (b"", b"\x00", _kafka_value_v0()[:-1], _kafka_value_v0() + b"x"):
        with pytest.raises(RecordFormatError):
            decode_value(bad)
    with pytest.raises(UnknownRecordVersionError):
        decode_value(b"\x00\x02" + _kafka_value_v0()[2:])
    bad_status = bytearray(_kafka_value_v0())
    bad_status[16] = 9
    with pytest.raises(RecordFormatError, match="status 9"):
        decode_value(bytes(bad_status))
    huge = bytearray(_kafka_value_v0())
    huge[17:21] = struct.pack(">i", 10**9)
    with pytest.raises(RecordFormatError, match="claims"):
        decode_value(bytes(huge))
    with pytest.raises(UnknownRecordVersionError):
        decode_key(b"\x00\x01\x00\x01x")
    with pytest.raises(RecordFormatError):
        decode_key(None)
    with pytest.raises(RecordFormatError):
        decode_key(b"\x00\x00\x00\x05ab")
    with pytest.raises(RecordFormatError):
        encode_value(TxnLogValue(1, 2**15, 1, TxnState.ONGOING, (), 0, 0))


def test_describe_record_prints_like_kafka_dump_log():
    line = describe_record(encode_key("tx"), _kafka_value_v0())
    assert line == (
        "key: transaction_metadata::transactionalId=tx payload: producerId:1234,"
        "producerEpoch:7,state=Ongoing,partitions=[in-3,out-0,out-1],"
        "txnLastUpdateTimestamp=1700000000500,txnTimeoutMs=60000"
    )
    assert describe_record(encode_key("tx"), None) == (
        "key: transaction_metadata::transactionalId=tx payload: <DELETE>"
    )
    assert describe_record(b"\x00\x03\x00\x00", b"") == "key: unknown::version=3"
    assert "<undecodable" in describe_record(encode_key("tx"), b"\x00\x00\x01")
    assert "<undecodable" in describe_record(b"\x00", None)
    assert "<undecodable" in describe_record(None, b"")


def test_state_names_are_kafkas():
    assert [s.kafka_name for s in TxnState] == [
        "Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
        "Dead", "PrepareEpochFence",
    ]  # fmt: skip
    assert TxnState.from_kafka_name("PrepareCommit") is TxnState.PREPARE_COMMIT
    assert TxnState.from_kafka_name("ongoing") is None


def test_records_survive_a_record_batch():
    entries = [(encode_key("a"), encode_value(ONGOING)), (encode_key("b"), None)]
    got = list(iter_batch_records(build_batch(entries, 1000)))
    assert [(decode_key(k), decode_value(v)) for _, k, v in got] == [("a", ONGOING), ("b", None)]


_values = st.builds(
    TxnLogValue,
    producer_id=st.integers(-1, 2**63 - 1),
    producer_epoch=st.integers(-1, 2**15 - 1),
    timeout_ms=st.integers(1, 2**31 - 1),
    state=st.sampled_from([s for s in TxnState if s != TxnState.EMPTY]),
    partitions=st.lists(
        st.tuples(st.text(min_size=1, max_size=5), st.integers(0, 2**31 - 1)), max_size=6
    ).map(lambda ps: tuple(sorted(set(ps)))),
    last_update_ms=st.integers(-1, 2**62),
    start_ms=st.integers(-1, 2**62),
)


@given(_values, st.sampled_from([0, 1]), st.text(max_size=20))
def test_round_trip(value: TxnLogValue, version: int, txn_id: str) -> None:
    assert decode_value(encode_value(value, version=version)) == value
    assert decode_key(encode_key(txn_id)) == txn_id


@given(st.binary(max_size=80))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        decode_value(data)
    except RecordFormatError:
        pass
    assert describe_record(data, data).startswith("key: ")
