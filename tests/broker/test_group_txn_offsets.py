"""TxnOffsetCommit against one broker process, sent raw (kafka-python's protocol classes): the
broker is its own transaction coordinator, group coordinator and leader of both internal topics,
so EndTxn writes real markers to __consumer_offsets and the group coordinator completes the
pending offsets from them.

Covers every TxnOffsetCommit version (0-3), OffsetFetch require_stable (UNSTABLE_OFFSET_COMMIT
while a transaction holds offsets), commit and abort, Kafka's errors for bad requests (unknown
partitions, a stale producer epoch, offsets never added to the transaction, v3 member checks),
and loading after a restart: a committed transaction's offsets come back, an open one's stay
pending until the coordinator aborts it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.producer.transaction import AddOffsetsToTxnRequest, TxnOffsetCommitRequest

from isrlab.broker.errors import ErrorCode as E
from tests.broker.rawclient import RawClient
from tests.broker.rawgroup import Member, find_coordinator
from tests.broker.test_txn_bad_input import end_txn, find_txn_coordinator, init_pid
from tests.broker.test_txn_clients import create_topic, txn_broker

pytestmark = pytest.mark.integration

G = "copier"
IN0 = ("in", 0)
IN1 = ("in", 1)


def add_offsets(c: RawClient, txn_id: str, pid: int, epoch: int, group: str = G) -> int:
    resp = c.call(
        AddOffsetsToTxnRequest[3](
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group
        )
    )
    return int(resp.error_code)


def txn_commit(
    c: RawClient,
    txn_id: str,
    pid: int,
    epoch: int,
    offsets: dict[tuple[str, int], int],
    *,
    v: int = 3,
    group: str = G,
    generation: int = -1,
    member_id: str = "",
    metadata: str | None = "m",
) -> dict[tuple[str, int], int]:
    """{(topic, partition): error code} of a TxnOffsetCommit at version `v`."""
    cls = TxnOffsetCommitRequest[v]
    T = cls.TxnOffsetCommitRequestTopic
    P = T.TxnOffsetCommitRequestPartition
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), off in offsets.items():
        by_topic.setdefault(topic, []).append(
            P(
                partition_index=p,
                committed_offset=off,
                committed_leader_epoch=-1,
                committed_metadata=metadata,
            )
        )
    fields: dict[str, Any] = {
        "transactional_id": txn_id,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "topics": [T(name=n, partitions=ps) for n, ps in by_topic.items()],
    }
    if v >= 3:
        fields.update(generation_id=generation, member_id=member_id, group_instance_id=None)
    resp = c.call(cls(**fields))
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch(
    c: RawClient, partitions: list[tuple[str, int]], require_stable: bool, group: str = G
) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (offset, error)} of an OffsetFetch v7."""
    F = OffsetFetchRequest[7]
    names: dict[str, list[int]] = {}
    for t, p in partitions:
        names.setdefault(t, []).append(p)
    topics = [F.OffsetFetchRequestTopic(name=n, partition_indexes=ps) for n, ps in names.items()]
    resp = c.call(F(group_id=group, topics=topics, require_stable=require_stable))
    assert resp.error_code == 0, resp
    return {
        (t.name, p.partition_index): (p.committed_offset, p.error_code)
        for t in resp.topics
        for p in t.partitions
    }


def wait_stable(
    c: RawClient, expected: dict[tuple[str, int], int], timeout: float = 20
) -> dict[tuple[str, int], tuple[int, int]]:
    """OffsetFetch with require_stable until it answers `expected` without errors (the markers
    are written after EndTxn is answered)."""
    want = {tp: (off, 0) for tp, off in expected.items()}
    deadline = time.monotonic() + timeout
    while True:
        got = fetch(c, list(expected), require_stable=True)
        if got == want:
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.1)


@pytest.fixture
def raw(broker_factory: Any) -> Iterator[tuple[Any, RawClient]]:
    b = txn_broker(broker_factory, **{"transaction.max.timeout.ms": "900000"})
    create_topic(b.bootstrap, "in", 2)
    c = RawClient(b.port)
    assert find_txn_coordinator(c, "tx").error_code == 0
    assert find_coordinator(c, G).error_code == 0
    yield b, c
    c.close()


def begin(c: RawClient, txn_id: str = "tx", timeout_ms: int = 60_000) -> tuple[int, int]:
    pid, epoch = init_pid(c, txn_id, timeout_ms)
    assert add_offsets(c, txn_id, pid, epoch) == E.NONE
    return pid, epoch


def test_offsets_of_a_transaction_are_committed_with_it_and_dropped_on_abort(raw: Any) -> None:
    _b, c = raw
    pid, epoch = begin(c)
    assert txn_commit(c, "tx", pid, epoch, {IN0: 5, IN1: 7}) == {IN0: 0, IN1: 0}
    # open transaction: require_stable refuses, a plain fetch shows nothing committed yet
    assert fetch(c, [IN0, IN1], True) == {IN0: (-1, E.UNSTABLE_OFFSET_COMMIT),
                                          IN1: (-1, E.UNSTABLE_OFFSET_COMMIT)}  # fmt: skip
    assert fetch(c, [IN0, IN1], False) == {IN0: (-1, 0), IN1: (-1, 0)}
    assert end_txn(c, "tx", pid, epoch, commit=True) == E.NONE
    wait_stable(c, {IN0: 5, IN1: 7})

    assert add_offsets(c, "tx", pid, epoch) == E.NONE
    assert txn_commit(c, "tx", pid, epoch, {IN0: 99}, v=0) == {IN0: 0}
    assert fetch(c, [IN0], True) == {IN0: (-1, E.UNSTABLE_OFFSET_COMMIT)}
    assert fetch(c, [IN0], False) == {IN0: (5, 0)}
    assert end_txn(c, "tx", pid, epoch, commit=False) == E.NONE
    wait_stable(c, {IN0: 5, IN1: 7})  # the aborted 99 never shows


def test_every_version_commits(raw: Any) -> None:
    _b, c = raw
    for v in range(4):
        pid, epoch = begin(c)
        assert txn_commit(c, "tx", pid, epoch, {IN0: 10 + v}, v=v, metadata=None) == {IN0: 0}
        assert end_txn(c, "tx", pid, epoch, commit=True) == E.NONE
        wait_stable(c, {IN0: 10 + v})


def test_bad_requests_get_kafkas_errors(raw: Any) -> None:
    _b, c = raw
    pid, epoch = begin(c)
    assert txn_commit(c, "tx", pid, epoch, {IN0: 1, ("in", 9): 1, ("nope", 0): 1}) == {
        IN0: 0,
        ("in", 9): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
    }
    big = "x" * 5000  # over offset.metadata.max.bytes (4096)
    assert txn_commit(c, "tx", pid, epoch, {IN1: 1}, metadata=big) == {
        IN1: E.OFFSET_METADATA_TOO_LARGE
    }
    assert txn_commit(c, "tx", pid, epoch, {IN0: 1}, group="") == {IN0: E.INVALID_GROUP_ID}
    # a second InitProducerId bumps the epoch (aborting the open transaction): the old epoch
    # is refused by the offsets partition's producer state, nothing is committed
    pid2, epoch2 = init_pid(c, "tx")
    assert pid2 == pid and epoch2 > epoch
    stale = txn_commit(c, "tx", pid, epoch, {IN0: 2})
    assert stale == {IN0: E.INVALID_PRODUCER_EPOCH}  # the append's epoch check, as Kafka 3.x
    wait_stable(c, {IN0: -1})


def test_offsets_not_added_to_the_transaction_are_never_exposed(raw: Any) -> None:
    """AddOffsetsToTxn was never sent. As in Kafka before 3.6 (no KIP-890 verification of
    TxnOffsetCommit yet), only the offsets partition's producer-state check runs: the batch is
    written, but no marker of this transaction ever reaches the group's partition, so the offset
    stays pending and is never returned as committed (require_stable keeps refusing)."""
    _b, c = raw
    pid, epoch = init_pid(c, "tx")
    assert txn_commit(c, "tx", pid, epoch, {IN0: 3}) == {IN0: 0}
    assert end_txn(c, "tx", pid, epoch, commit=True) == E.INVALID_TXN_STATE  # nothing added
    time.sleep(1)
    assert fetch(c, [IN0], False) == {IN0: (-1, 0)}
    assert fetch(c, [IN0], True) == {IN0: (-1, E.UNSTABLE_OFFSET_COMMIT)}


def test_v3_member_and_generation_are_checked(raw: Any) -> None:
    _b, c = raw
    m = Member(c, G)
    assert m.sync({m.member_id: b""}).error_code == 0
    pid, epoch = begin(c)
    wrong_gen = txn_commit(c, "tx", pid, epoch, {IN0: 4}, generation=m.generation + 1,
                           member_id=m.member_id)  # fmt: skip
    assert wrong_gen == {IN0: E.ILLEGAL_GENERATION}
    unknown = txn_commit(c, "tx", pid, epoch, {IN0: 4}, generation=m.generation,
                         member_id="not-a-member")  # fmt: skip
    assert unknown == {IN0: E.UNKNOWN_MEMBER_ID}
    good = txn_commit(c, "tx", pid, epoch, {IN0: 4}, generation=m.generation,
                      member_id=m.member_id)  # fmt: skip
    assert good == {IN0: 0}
    assert end_txn(c, "tx", pid, epoch, commit=True) == E.NONE
    wait_stable(c, {IN0: 4})


def test_pending_and_committed_transactional_offsets_are_loaded_after_a_restart(
    raw: Any,
) -> None:
    """The log holds a committed transaction (records + COMMIT marker) and an open one (records,
    no marker). After a restart the group coordinator loads the first as committed and holds the
    second pending (UNSTABLE_OFFSET_COMMIT) until the transaction coordinator aborts it when it
    times out; its offset never becomes visible."""
    b, c = raw
    pid, epoch = begin(c, "tx")
    assert txn_commit(c, "tx", pid, epoch, {IN0: 5}) == {IN0: 0}
    assert end_txn(c, "tx", pid, epoch, commit=True) == E.NONE
    wait_stable(c, {IN0: 5})
    open_pid, open_epoch = begin(c, "open", timeout_ms=10_000)
    assert txn_commit(c, "open", open_pid, open_epoch, {IN0: 50, IN1: 51}) == {IN0: 0, IN1: 0}
    c.close()
    b.stop()
    b.start()
    c = RawClient(b.port)
    try:
        assert find_coordinator(c, G).error_code == 0
        first = fetch(c, [IN0, IN1], True)
        assert first in (
            {IN0: (-1, E.UNSTABLE_OFFSET_COMMIT), IN1: (-1, E.UNSTABLE_OFFSET_COMMIT)},
            {IN0: (5, 0), IN1: (-1, 0)},  # the timeout abort already happened
        ), first
        assert fetch(c, [IN0, IN1], False) == {IN0: (5, 0), IN1: (-1, 0)}
        wait_stable(c, {IN0: 5, IN1: -1}, timeout=40)
    finally:
        c.close()
