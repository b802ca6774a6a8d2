"""AddPartitionsToTxn held while the producer's previous transaction completes
(`transaction.add.partitions.wait.ms`, isrlab's own key).

Kafka answers CONCURRENT_TRANSACTIONS while the previous transaction is in Prepare* and the
client retries after a 20 ms back-off; this coordinator can hold the request until Complete*
is written instead. The next transaction must still start only after the previous one is
complete, a fenced producer must still be refused, and every held request must be answered.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from isrlab.broker.coordinator.transaction.coordinator import (
    AddPartitionsRequest,
    AddPartitionsResult,
    EndTxnRequest,
    TxnConfig,
)
from isrlab.broker.coordinator.transaction.records import TxnState
from isrlab.broker.errors import ErrorCode as E
from tests.coordinator.test_txn_core import IDS, TP0, TP1, TPS, Harness, TxnMachine

WAIT = TxnConfig(num_partitions=1, add_partitions_wait_ms=500)


def committing(h: Harness) -> tuple[int, int]:
    """A producer whose transaction on TP0 has its PrepareCommit written, markers pending."""
    pid, epoch = h.ready()
    h.add(pid, epoch, TP0)
    h.ack()
    h.end(pid, epoch, True)
    h.ack()
    assert h.state() == TxnState.PREPARE_COMMIT and h.markers
    return pid, epoch


def test_kafka_default_answers_concurrent_transactions_at_once():
    h = Harness()
    pid, epoch = committing(h)
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.CONCURRENT_TRANSACTIONS


def test_the_next_add_is_answered_once_the_previous_transaction_is_complete():
    h = Harness(WAIT)
    pid, epoch = committing(h)
    r = h.add(pid, epoch, TP1)
    assert r not in h.replies and not h.appends  # held, nothing written for it yet
    h.markers_done()
    [complete] = h.appends
    assert complete.value is not None and complete.value.state == TxnState.COMPLETE_COMMIT
    assert r not in h.replies  # not before CompleteCommit is written
    h.ack()
    # now the add is processed as if it had just arrived: its Ongoing record is written
    [add] = h.appends
    assert add.value is not None and add.value.state == TxnState.ONGOING
    assert add.value.partitions == (TP1,)
    h.ack()
    assert h.replies[r] == AddPartitionsResult({TP1: E.NONE})
    assert h.state() == TxnState.ONGOING and h.core.txns["tx"].partitions == {TP1}


def test_a_held_add_times_out_with_concurrent_transactions():
    h = Harness(WAIT)
    pid, epoch = committing(h)
    r = h.add(pid, epoch, TP1)
    assert h.core.next_deadline() is not None and h.core.next_deadline() <= h.now + 500
    h.advance(499)
    assert r not in h.replies
    h.advance(1)  # the markers are still not written
    assert h.replies[r] == AddPartitionsResult({TP1: E.CONCURRENT_TRANSACTIONS})
    h.settle()  # the transaction completes later: nothing more is answered for r
    assert h.state() == TxnState.COMPLETE_COMMIT and not h.core.txns["tx"].partitions


def test_a_fenced_producer_is_refused_not_held():
    h = Harness(WAIT)
    pid, epoch = h.ready()
    pid2, epoch2 = h.ready()  # a new producer takes over: the first is a zombie
    h.add(pid2, epoch2, TP0)
    h.ack()
    h.end(pid2, epoch2, False)
    h.ack()
    assert h.state() == TxnState.PREPARE_ABORT
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.PRODUCER_FENCED
    assert h.replies[h.add(pid + 1, epoch2, TP1)].errors[TP1] == E.INVALID_PRODUCER_ID_MAPPING
    assert not h.core._waiting


def test_failover_answers_held_adds_not_coordinator():
    h = Harness(WAIT)
    pid, epoch = committing(h)
    r = h.add(pid, epoch, TP1)
    h.failover()
    assert h.replies[r] == AddPartitionsResult({TP1: E.NOT_COORDINATOR})
    assert not h.core._waiting


def test_empty_add_and_pending_transitions_are_not_held():
    h = Harness(WAIT)
    pid, epoch = committing(h)
    assert h.replies[h.add(pid, epoch)] == AddPartitionsResult({})
    assert not h.core._waiting


class WaitingTxnMachine(TxnMachine):
    """The coordinator machine of test_txn_core with adds held during Prepare*: fencing,
    promised outcomes, markers before Complete*, and every request answered still hold."""

    add_partitions_wait_ms = 500

    def on_reply(self, ref: int, result: Any) -> None:
        super().on_reply(ref, result)
        kind, req = self.requests[ref]
        if kind == "add" and result.errors and set(result.errors.values()) == {E.NONE}:
            # a successful add means the partitions are in an ongoing transaction now
            meta = self.core.txns[req.transactional_id]
            assert meta.state == TxnState.ONGOING, meta
            assert set(req.partitions) <= meta.partitions, (req, meta)

    @rule(txn=st.sampled_from(IDS), commit=st.booleans(), tp=st.sampled_from(TPS))
    def end_then_add_at_once(self, txn: str, commit: bool, tp: tuple[str, int]) -> None:
        """The newest producer ends its ongoing transaction and, as soon as EndTxn is
        answered, adds a partition for the next one while the markers are still pending
        (what a producer running back-to-back transactions does)."""
        meta = self.core.txns.get(txn)
        if txn not in self.producer or meta is None or meta.pending is not None:
            return
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return
        pid, epoch = self.producer[txn]
        if meta.state != TxnState.ONGOING:  # start one: its add is written at once
            self.write_at_once("add", AddPartitionsRequest(txn, pid, epoch, (tp,)))
        self.write_at_once("end", EndTxnRequest(txn, pid, epoch, commit))
        self.request("add", self.core.add_partitions, AddPartitionsRequest(txn, pid, epoch, (tp,)))

    def write_at_once(self, kind: str, req: Any) -> None:
        before = {a.token for a in self.appends}
        method = self.core.add_partitions if kind == "add" else self.core.end_txn
        self.request(kind, method, req)
        mine = [a for a in self.appends if a.token not in before]
        self.appends = [a for a in self.appends if a.token in before]
        self.complete(mine, E.NONE)

    @invariant()
    def only_adds_of_completing_transactions_wait(self) -> None:
        for txn, waiting in self.core._waiting.items():
            assert waiting
            meta = self.core.txns[txn]
            assert meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT), meta
            for w in waiting:
                assert w.due <= self.now + 500


WaitingTxnMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestWaitingTxnMachine = WaitingTxnMachine.TestCase
