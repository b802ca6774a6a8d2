"""Bad transactional requests, sent raw: each gets Kafka's error code (never a traceback, never a
hang), and nothing committed is lost or exposed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer.transaction import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)

from isrlab.broker.errors import ErrorCode as E
from tests.broker.rawclient import RawClient, build_batch, produce_req
from tests.broker.test_txn_clients import (
    create_topic,
    produce_txn,
    read_all,
    txn_broker,
    txn_producer,
)

pytestmark = pytest.mark.integration


def find_txn_coordinator(client: RawClient, txn_id: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        resp = client.call(FindCoordinatorRequest[3](key=txn_id, key_type=1))
        if resp.error_code == 0 or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def init_pid(client: RawClient, txn_id: str, timeout_ms: int = 60_000) -> tuple[int, int]:
    deadline = time.monotonic() + 20
    while True:
        resp = client.call(
            InitProducerIdRequest[3](
                transactional_id=txn_id,
                transaction_timeout_ms=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        if resp.error_code == 0:
            return resp.producer_id, resp.producer_epoch
        assert resp.error_code in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_LOAD_IN_PROGRESS)
        assert time.monotonic() < deadline
        time.sleep(0.1)


def add_partitions(
    client: RawClient, txn_id: str, pid: int, epoch: int, topic: str, parts: list[int], v: int = 3
) -> dict[int, int]:
    cls = AddPartitionsToTxnRequest[v]
    resp = client.call(
        cls(
            v3_and_below_transactional_id=txn_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[cls.AddPartitionsToTxnTopic(name=topic, partitions=parts)],
        )
    )
    return {
        p.partition_index: p.partition_error_code
        for t in resp.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def end_txn(client: RawClient, txn_id: str, pid: int, epoch: int, commit: bool, v: int = 3) -> int:
    resp = client.call(
        EndTxnRequest[v](
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit
        )
    )
    return int(resp.error_code)


def txn_produce(
    client: RawClient, topic: str, txn_id: str, pid: int, epoch: int, seq: int, values: list[bytes]
) -> int:
    req = produce_req(
        topic,
        build_batch(
            values, transactional=True, producer_id=pid, producer_epoch=epoch, base_sequence=seq
        ),
        acks=-1,
    )
    req.transactional_id = txn_id
    resp = client.call(req)
    return int(resp.responses[0].partition_responses[0].error_code)


@pytest.fixture
def raw(broker_factory: Any) -> Any:
    b = txn_broker(broker_factory)
    create_topic(b.bootstrap, "t", 2)
    c = RawClient(b.port)
    assert find_txn_coordinator(c, "raw").error_code == 0
    yield b, c
    c.close()


def test_end_txn_for_an_unknown_transactional_id(raw: Any) -> None:
    _b, c = raw
    assert end_txn(c, "never-initialised", 12345, 0, commit=True) == E.INVALID_PRODUCER_ID_MAPPING


def test_end_txn_without_a_transaction(raw: Any) -> None:
    _b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert end_txn(c, "raw", pid, epoch, commit=True) == E.INVALID_TXN_STATE


def test_stale_epoch_is_fenced(raw: Any) -> None:
    """After a second InitProducerId, the first epoch gets PRODUCER_FENCED (v2+) or
    INVALID_PRODUCER_EPOCH (older versions, KIP-588) from AddPartitionsToTxn and EndTxn."""
    _b, c = raw
    pid, epoch = init_pid(c, "raw")
    pid2, epoch2 = init_pid(c, "raw")
    assert (pid2, epoch2) == (pid, epoch + 1)
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.PRODUCER_FENCED}
    assert add_partitions(c, "raw", pid, epoch, "t", [0], v=1) == {0: E.INVALID_PRODUCER_EPOCH}
    assert end_txn(c, "raw", pid, epoch, commit=True) == E.PRODUCER_FENCED
    assert end_txn(c, "raw", pid, epoch, commit=True, v=1) == E.INVALID_PRODUCER_EPOCH
    assert add_partitions(c, "raw", pid, 77, "t", [0]) == {0: E.PRODUCER_FENCED}
    assert add_partitions(c, "raw", pid + 1, epoch2, "t", [0]) == {0: E.INVALID_PRODUCER_ID_MAPPING}


def test_add_unknown_partition(raw: Any) -> None:
    _b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert add_partitions(c, "raw", pid, epoch, "t", [0, 9]) == {
        0: E.OPERATION_NOT_ATTEMPTED,
        9: E.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert add_partitions(c, "raw", pid, epoch, "no-such-topic", [0]) == {
        0: E.UNKNOWN_TOPIC_OR_PARTITION
    }


def test_transaction_timeout_above_the_maximum(raw: Any) -> None:
    _b, c = raw
    resp = c.call(
        InitProducerIdRequest[3](
            transactional_id="raw",
            transaction_timeout_ms=900_001,
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert resp.error_code == E.INVALID_TRANSACTION_TIMEOUT


def test_produce_to_a_partition_not_in_the_transaction_is_refused(raw: Any) -> None:
    """KIP-890 verification: a transactional batch for a partition the producer never added is
    refused with INVALID_TXN_STATE and never appended; the added partition takes its batch."""
    b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
    assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"added"]) == E.NONE
    req = produce_req(
        "t",
        build_batch(
            [b"not-added"],
            transactional=True,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
        ),
        acks=-1,
        partition=1,
    )
    req.transactional_id = "raw"
    resp = c.call(req)
    assert resp.responses[0].partition_responses[0].error_code == E.INVALID_TXN_STATE
    assert end_txn(c, "raw", pid, epoch, commit=True) == E.NONE
    deadline = time.monotonic() + 10
    while read_all(b.bootstrap, "t", "read_committed", partitions=2) != [b"added"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert read_all(b.bootstrap, "t", "read_uncommitted", partitions=2) == [b"added"]


def test_late_produce_after_abort_does_not_hang_the_partition(raw: Any) -> None:
    """The Bufstream/KIP-890 hazard: a produce of an aborted transaction that arrives after the
    abort marker. With verification it is refused, so the LSO is not held back and later
    transactions stay readable."""
    b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
    assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"aborted"]) == E.NONE
    assert end_txn(c, "raw", pid, epoch, commit=False) == E.NONE
    time.sleep(0.5)  # markers written
    # the delayed retry of another batch of the aborted transaction
    assert txn_produce(c, "t", "raw", pid, epoch, 1, [b"late"]) == E.INVALID_TXN_STATE
    p = txn_producer(b.bootstrap, "later")
    p.init_transactions(20)
    produce_txn(p, "t", [b"later"], commit=True)
    assert read_all(b.bootstrap, "t", "read_committed", partitions=2) == [b"later"]


def test_describe_and_list_transactions_and_producers(raw: Any) -> None:
    _b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
    assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"open"]) == E.NONE
    d = c.call(DescribeTransactionsRequest[0](transactional_ids=["raw", "unknown-id"]))
    by_id = {s.transactional_id: s for s in d.transaction_states}
    assert by_id["raw"].error_code == 0
    assert by_id["raw"].transaction_state == "Ongoing"
    assert by_id["raw"].producer_id == pid
    assert [(t.topic, list(t.partitions)) for t in by_id["raw"].topics] == [("t", [0])]
    assert by_id["unknown-id"].error_code == E.TRANSACTIONAL_ID_NOT_FOUND
    lst = c.call(
        ListTransactionsRequest[0](state_filters=["Ongoing", "Bogus"], producer_id_filters=[])
    )
    assert [s.transactional_id for s in lst.transaction_states] == ["raw"]
    assert list(lst.unknown_state_filters) == ["Bogus"]
    cls = DescribeProducersRequest[0]
    dp = c.call(cls(topics=[cls.TopicRequest(name="t", partition_indexes=[0, 1])]))
    parts = {p.partition_index: p for p in dp.topics[0].partitions}
    [active] = parts[0].active_producers
    assert (active.producer_id, active.producer_epoch, active.current_txn_start_offset) == (
        pid,
        epoch,
        0,
    )
    assert list(parts[1].active_producers) == []


def test_clients_cannot_produce_to_the_transaction_log(raw: Any) -> None:
    b, _c = raw
    p = Producer({"bootstrap.servers": b.bootstrap})
    errors: list[Any] = []
    p.produce("__transaction_state", value=b"forged", on_delivery=lambda e, _m: errors.append(e))
    p.flush(10)
    assert errors and errors[0] is not None


def test_without_verification_a_late_produce_hangs_the_partition(broker_factory: Any) -> None:
    """The historic switch transaction.partition.verification.enable=false (Kafka before 3.6):
    the late produce of an aborted transaction is appended after the abort marker and opens a
    transaction no coordinator knows about; the LSO stays below it, so a later committed
    transaction is never readable with read_committed (a hanging transaction)."""
    b = txn_broker(broker_factory, **{"transaction.partition.verification.enable": "false"})
    create_topic(b.bootstrap, "t", 2)
    c = RawClient(b.port)
    try:
        assert find_txn_coordinator(c, "raw").error_code == 0
        pid, epoch = init_pid(c, "raw")
        assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
        assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"aborted"]) == E.NONE
        assert end_txn(c, "raw", pid, epoch, commit=False) == E.NONE
        time.sleep(0.5)
        assert txn_produce(c, "t", "raw", pid, epoch, 1, [b"late"]) == E.NONE
    finally:
        c.close()
    p = txn_producer(b.bootstrap, "later")
    p.init_transactions(20)
    produce_txn(p, "t", [b"later"], commit=True)
    assert read_all(b.bootstrap, "t", "read_committed", partitions=2) == []
    assert b"later" in read_all(b.bootstrap, "t", "read_uncommitted", partitions=2)


@pytest.mark.parametrize(
    ("fencing", "verification"), [("true", "true"), ("true", "false"), ("false", "true")]
)
def test_zombie_write_after_a_new_producer_took_over(
    broker_factory: Any, fencing: str, verification: str
) -> None:
    """A zombie (the old epoch of a transactional id) writes while the new producer's
    transaction is open in the same partition. With epoch fencing (the default) the write is
    refused and the new transaction commits only its own record. With the historic switch
    transaction.producer.epoch.fencing.enable=false the zombie's record is accepted and
    committed by the new producer's commit marker: a write the zombie never committed becomes
    visible (in a consume-transform-produce copier: a duplicate). Without KIP-890 verification
    the partition's own epoch check is what refuses the zombie."""
    b = txn_broker(
        broker_factory,
        **{
            "transaction.producer.epoch.fencing.enable": fencing,
            "transaction.partition.verification.enable": verification,
        },
    )
    create_topic(b.bootstrap, "t", 1)
    c = RawClient(b.port)
    try:
        assert find_txn_coordinator(c, "z").error_code == 0
        pid, old = init_pid(c, "z")
        assert add_partitions(c, "z", pid, old, "t", [0]) == {0: E.NONE}
        assert txn_produce(c, "t", "z", pid, old, 0, [b"zombie-1"]) == E.NONE
        pid2, new = init_pid(c, "z")  # fences the zombie and aborts its transaction
        assert pid2 == pid and new > old
        assert add_partitions(c, "z", pid, new, "t", [0]) == {0: E.NONE}
        assert txn_produce(c, "t", "z", pid, new, 0, [b"new"]) == E.NONE
        zombie = txn_produce(c, "t", "z", pid, old, 1, [b"zombie-2"])
        assert end_txn(c, "z", pid, new, commit=True) == E.NONE
    finally:
        c.close()
    deadline = time.monotonic() + 10
    expected = [b"new"] if fencing == "true" else [b"new", b"zombie-2"]
    while (got := read_all(b.bootstrap, "t", "read_committed")) != expected:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    if fencing == "true":
        assert zombie in (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED)
    else:
        assert zombie == E.NONE


def test_a_sequence_reused_after_an_abort_is_not_answered_with_the_aborted_batch(
    raw: Any,
) -> None:
    """Found by a harness run (lost-write): librdkafka aborted a transaction whose produce had
    timed out, then sent the next transaction's first batch with the same producer epoch and
    sequence. The partition still remembered that sequence at the aborted batch's offset, and
    answered the new batch as its duplicate: the client was told its record was committed at an
    offset that holds the aborted one. A sequence used by a transaction that has ended is
    refused (OUT_OF_ORDER_SEQUENCE_NUMBER, which makes the client abort and bump its epoch)."""
    b, c = raw
    pid, epoch = init_pid(c, "raw")
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
    assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"aborted"]) == E.NONE
    assert end_txn(c, "raw", pid, epoch, commit=False) == E.NONE
    time.sleep(0.5)  # the abort marker is written
    assert add_partitions(c, "raw", pid, epoch, "t", [0]) == {0: E.NONE}
    assert txn_produce(c, "t", "raw", pid, epoch, 0, [b"reused"]) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert txn_produce(c, "t", "raw", pid, epoch, 1, [b"next"]) == E.NONE
    assert end_txn(c, "raw", pid, epoch, commit=True) == E.NONE
    deadline = time.monotonic() + 10
    while (got := read_all(b.bootstrap, "t", "read_committed", partitions=2)) != [b"next"]:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def test_a_transaction_whose_state_record_outgrows_its_segment_is_refused_and_logged(
    broker_factory: Any,
) -> None:
    """transaction.state.log.segment.bytes at its minimum (1 KiB) and a transaction over 400
    partitions: its state record (every partition listed) no longer fits a segment. As in
    Kafka the client gets UNKNOWN_SERVER_ERROR and the transaction stays as it was; the
    broker says why at ERROR, since the client cannot."""
    b = txn_broker(broker_factory, **{"transaction.state.log.segment.bytes": "1024"})
    create_topic(b.bootstrap, "wide", 400)
    c = RawClient(b.port)
    try:
        assert find_txn_coordinator(c, "wide").error_code == 0
        pid, epoch = init_pid(c, "wide")
        got = add_partitions(c, "wide", pid, epoch, "wide", list(range(400)))
        assert set(got.values()) == {E.UNKNOWN_SERVER_ERROR}, got
        assert add_partitions(c, "wide", pid, epoch, "wide", [0]) == {0: 0}  # a small one fits
    finally:
        c.close()
    said = b.stderr_path.read_text()
    assert "transaction coordinator: appending" in said, said[-2000:]
    assert "__transaction_state" in said and "larger than the topic's segment.bytes" in said
