"""The records of ``__transaction_state``, byte for byte as Kafka 3.x writes them.

Every key and value starts with a big-endian int16 version; the fields follow in the order of
Kafka's message definitions (core's ``TransactionLogKey.json`` and ``TransactionLogValue.json``)::

    key   v0     TransactionLogKey    transactionalId string
    value v0/v1  TransactionLogValue  producerId int64, producerEpoch int16,
                                      transactionTimeoutMs int32, transactionStatus int8,
                                      transactionPartitions [topic string, partitionIds [int32]]?,
                                      transactionLastUpdateTimestampMs int64,
                                      transactionStartTimestampMs int64

Version 0 is classic (string = int16 length + UTF-8, array = int32 count, -1 = null), version 1
flexible (KIP-482: compact strings and arrays, a tagged-field section closing the value and each
partitions entry). Kafka 3.x writes key v0 and value v0 and reads both value versions; so does
this module. A record whose value is null is a tombstone: the transactional id expired.

The partitions field is null for a transaction in state Empty (Kafka writes it so and ignores
whatever an Empty record carries) and an array otherwise, empty for the Complete* states.
This module writes topics and partition ids sorted (Kafka groups them by topic in hash order).

The module is pure (bytes in, dataclasses out); ``build_batch``/``iter_batch_records`` of the
group records wrap these records in RecordBatch v2. The byte codec (``_Reader``/``_Writer``) and
``RecordFormatError`` are the group records' own.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

# The primitive codec is shared with __consumer_offsets; only the field layout differs.
from isrlab.broker.coordinator.group.records import (
    RecordFormatError,
    UnknownRecordVersionError,
    _Reader,
    _Writer,
)

__all__ = [
    "TXN_KEY_VERSION",
    "TXN_VALUE_VERSION",
    "TXN_VALUE_VERSIONS",
    "RecordFormatError",
    "TxnLogValue",
    "TxnState",
    "UnknownRecordVersionError",
    "decode_key",
    "decode_value",
    "describe_record",
    "encode_key",
    "encode_value",
]

#: The only key version (TransactionLogKey v0).
TXN_KEY_VERSION = 0
#: The value version Kafka 3.x writes (its highest non-flexible one).
TXN_VALUE_VERSION = 0
#: The value versions this module reads (and can write, for tests).
TXN_VALUE_VERSIONS = (0, 1)
_FLEXIBLE_VERSION = 1

TopicPartition = tuple[str, int]


class TxnState(IntEnum):
    """A transactional id's state, with Kafka's on-disk status byte as the value."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka prints and DescribeTransactions/ListTransactions carry
        (``Ongoing``, ``PrepareCommit``, ...)."""
        return _NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        """The state called ``name`` by Kafka, or None (ListTransactions' unknown filters)."""
        return _BY_NAME.get(name)


_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}


@dataclass(frozen=True)
class TxnLogValue:
    """One TransactionLogValue: what the coordinator knows of a transactional id.

    ``partitions`` is sorted; ``start_ms`` is -1 when no transaction was started since the last
    InitProducerId (state Empty)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: tuple[TopicPartition, ...]
    last_update_ms: int
    start_ms: int


# --------------------------------------------------------------------------- writing


def encode_key(transactional_id: str) -> bytes:
    """TransactionLogKey v0."""
    if not isinstance(transactional_id, str):
        raise RecordFormatError(
            f"transactionalId must be a str, not {type(transactional_id).__name__}"
        )
    w = _Writer(flexible=False)
    w.int16(TXN_KEY_VERSION, "version")
    w.string(transactional_id, "transactionalId")
    return bytes(w.buf)


def encode_value(v: TxnLogValue, *, version: int = TXN_VALUE_VERSION) -> bytes:
    """TransactionLogValue v0 (``version`` 1 writes the flexible layout, for tests)."""
    if version not in TXN_VALUE_VERSIONS:
        raise UnknownRecordVersionError("transaction log value", version)
    try:
        state = TxnState(v.state)
    except ValueError:
        raise RecordFormatError(f"transactionStatus {v.state!r} is not a state") from None
    if state == TxnState.EMPTY and v.partitions:
        # Kafka refuses to write it (TransactionLog.valueToBytes): an Empty id has no partitions
        raise RecordFormatError(f"a transaction in state Empty has no partitions: {v.partitions}")
    w = _Writer(flexible=version >= _FLEXIBLE_VERSION)
    w.int16(version, "version")
    w.int64(v.producer_id, "producerId")
    w.int16(v.producer_epoch, "producerEpoch")
    w.int32(v.timeout_ms, "transactionTimeoutMs")
    w.buf.append(int(state))
    if state == TxnState.EMPTY:
        if w.flexible:
            w.uvarint(0)
        else:
            w.int32(-1, "transactionPartitions count")
    else:
        by_topic: dict[str, list[int]] = {}
        for tp in v.partitions:
            if not (isinstance(tp, tuple) and len(tp) == 2):
                raise RecordFormatError(f"a partition is a (topic, partition) pair, not {tp!r}")
            by_topic.setdefault(tp[0], []).append(tp[1])
        w.array_length(len(by_topic), "transactionPartitions")
        for topic in sorted(by_topic):
            w.string(topic, "topic")
            ids = sorted(set(by_topic[topic]))
            w.array_length(len(ids), "partitionIds")
            for p in ids:
                w.int32(p, "partitionId")
            w.end_struct()
    w.int64(v.last_update_ms, "transactionLastUpdateTimestampMs")
    w.int64(v.start_ms, "transactionStartTimestampMs")
    w.end_struct()
    return bytes(w.buf)


# --------------------------------------------------------------------------- reading


def decode_key(data: bytes | bytearray | memoryview | None) -> str:
    """The transactional id of a record key; RecordFormatError (UnknownRecordVersionError for a
    version other than 0) if ``data`` is not one."""
    if data is None:
        raise RecordFormatError("__transaction_state record has no key")
    r = _Reader(data, "transaction log key")
    version = r.int16("version")
    if version != TXN_KEY_VERSION:
        raise UnknownRecordVersionError("transaction log key", version)
    transactional_id = r.required_string("transactionalId")
    r.finish()
    return transactional_id


def decode_value(data: bytes | bytearray | memoryview | None) -> TxnLogValue | None:
    """A record value: None for a tombstone, else the TxnLogValue (versions 0 and 1).
    RecordFormatError on anything else."""
    if data is None:
        return None
    r = _Reader(data, "transaction log value")
    version = r.int16("version")
    if version not in TXN_VALUE_VERSIONS:
        raise UnknownRecordVersionError("transaction log value", version)
    r.what = f"transaction log value v{version}"
    r.flexible = version >= _FLEXIBLE_VERSION
    producer_id = r.int64("producerId")
    producer_epoch = r.int16("producerEpoch")
    timeout_ms = r.int32("transactionTimeoutMs")
    status = struct.unpack(">b", r._take(1, "transactionStatus"))[0]
    try:
        state = TxnState(status)
    except ValueError:
        raise RecordFormatError(f"{r.what}: unknown transaction status {status}") from None
    partitions: list[TopicPartition] = []
    count = (
        r.uvarint("transactionPartitions length") - 1
        if r.flexible
        else r.int32("transactionPartitions count")
    )
    if count < -1:
        raise RecordFormatError(f"{r.what}: transactionPartitions has negative length {count}")
    min_entry = 1 + 1 + 1 if r.flexible else 2 + 4
    if count * min_entry > len(r.data) - r.pos:
        raise RecordFormatError(
            f"{r.what}: transactionPartitions claims {count} entries, more than the "
            f"{len(r.data) - r.pos} bytes left can hold"
        )
    for _ in range(max(count, 0)):
        topic = r.required_string("topic")
        for _ in range(r.array_length("partitionIds", 4)):
            partitions.append((topic, r.int32("partitionId")))
        r.end_struct()
    last_update_ms = r.int64("transactionLastUpdateTimestampMs")
    start_ms = r.int64("transactionStartTimestampMs")
    r.end_struct()
    r.finish()
    if state == TxnState.EMPTY:
        partitions = []  # as Kafka's readTxnRecordValue: an Empty id's partitions are ignored
    return TxnLogValue(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timeout_ms=timeout_ms,
        state=state,
        partitions=tuple(sorted(set(partitions))),
        last_update_ms=last_update_ms,
        start_ms=start_ms,
    )


# --------------------------------------------------------------------------- dump-log


def describe_record(key: bytes | None, value: bytes | None) -> str:
    """``key: ... payload: ...`` of one ``__transaction_state`` record, as Kafka 3.x's
    ``kafka-dump-log --transaction-log-decoder`` prints it (TransactionLog.formatRecordKeyAndValue):
    ``key: transaction_metadata::transactionalId=T payload: producerId:5,producerEpoch:0,
    state=Ongoing,partitions=[t-0,t-1],txnLastUpdateTimestamp=...,txnTimeoutMs=60000``, ``payload:
    <DELETE>`` for a tombstone, ``key: unknown::version=N`` (no payload) for a key version it
    does not know. Never raises: an undecodable field reads ``<undecodable: why>``."""
    if key is None:
        return "key: <undecodable: record has no key> payload: " + _show(value)
    try:
        transactional_id = decode_key(key)
    except UnknownRecordVersionError as exc:
        return f"key: unknown::version={exc.version}"
    except RecordFormatError as exc:
        return f"key: <undecodable: {exc}; key bytes {bytes(key).hex()}> payload: {_show(value)}"
    shown_key = f"transaction_metadata::transactionalId={transactional_id}"
    try:
        decoded = decode_value(value)
    except RecordFormatError as exc:
        return f"key: {shown_key} payload: <undecodable: {exc}; value bytes {_show(value)}>"
    if decoded is None:
        return f"key: {shown_key} payload: <DELETE>"
    partitions = ",".join(f"{t}-{p}" for t, p in decoded.partitions)
    payload = (
        f"producerId:{decoded.producer_id},producerEpoch:{decoded.producer_epoch},"
        f"state={decoded.state.kafka_name},partitions=[{partitions}],"
        f"txnLastUpdateTimestamp={decoded.last_update_ms},txnTimeoutMs={decoded.timeout_ms}"
    )
    return f"key: {shown_key} payload: {payload}"


def _show(data: bytes | None) -> str:
    return "null" if data is None else bytes(data).hex()
