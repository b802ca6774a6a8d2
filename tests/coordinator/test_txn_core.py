"""The transaction coordinator core, driven without sockets or clocks.

Unit tests pin Kafka 3.x's answers (InitProducerId with KIP-360, AddPartitionsToTxn, EndTxn,
the timeout abort, loading a partition mid-commit, append failures); a hypothesis state machine
drives several transactional ids through random requests, write and marker completions (or
failures), time and coordinator failover, and checks the safety rules after every step.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from isrlab.broker.coordinator.transaction.coordinator import (
    AddPartitionsRequest,
    AddPartitionsResult,
    AppendTxnLog,
    EndTxnRequest,
    InitPidRequest,
    InitPidResult,
    Reply,
    SendMarkers,
    TransactionCoordinator,
    TxnConfig,
    TxnDescription,
    TxnListing,
)
from isrlab.broker.coordinator.transaction.metadata import (
    IllegalTransition,
    TransactionMetadata,
)
from isrlab.broker.coordinator.transaction.records import TxnLogValue, TxnState
from isrlab.broker.errors import ErrorCode as E

T = "tx"
TP0, TP1, TP2 = ("out", 0), ("out", 1), ("in", 0)
CONFIG = TxnConfig(num_partitions=1)


class Harness:
    """The core plus the acknowledged __transaction_state log, answering its writes and marker
    requests on demand."""

    def __init__(self, config: TxnConfig = CONFIG, load: bool = True):
        self.core = TransactionCoordinator(config)
        self.now = 1_000_000
        self.refs = itertools.count(1)
        self.pids = itertools.count(1000)
        self.replies: dict[int, Any] = {}
        self.appends: list[AppendTxnLog] = []
        self.markers: list[SendMarkers] = []
        self.log: list[tuple[str, TxnLogValue | None]] = []
        self.epoch = 0
        if load:
            self.core.begin_load(0, 0)
            self.run(self.core.complete_load(0, 0, [], self.now))
            self.run(self.core.tick(self.now))  # the periodic checks start

    def run(self, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                assert e.ref not in self.replies, f"request {e.ref} answered twice"
                self.replies[e.ref] = e.result
            elif isinstance(e, AppendTxnLog):
                self.appends.append(e)
            else:
                assert isinstance(e, SendMarkers)
                self.markers.append(e)

    def call(self, method: Any, req: Any) -> int:
        ref = next(self.refs)
        self.run(method(self.now, ref, req))
        return ref

    def ack(self, error: E = E.NONE) -> None:
        """Answer the appends issued so far (not the ones they lead to)."""
        pending, self.appends = self.appends, []
        for a in pending:
            if not error:
                self.log.append((a.transactional_id, a.value))
            self.run(self.core.on_append_done(self.now, a.token, error))

    def markers_done(self, error: E = E.NONE) -> None:
        pending, self.markers = self.markers, []
        for m in pending:
            self.run(self.core.on_markers_done(self.now, m.token, error))

    def settle(self) -> None:
        for _ in range(20):
            if not self.appends and not self.markers:
                return
            self.ack()
            self.markers_done()
        raise AssertionError("writes never settle")

    def advance(self, ms: int) -> None:
        self.now += ms
        self.acting = "tick"
        self.run(self.core.tick(self.now))
        self.acting = "other"

    def init(self, txn: str = T, timeout: int = 60_000, pid: int = -1, epoch: int = -1) -> int:
        return self.call(
            self.core.init_producer_id, InitPidRequest(txn, timeout, pid, epoch, next(self.pids))
        )

    def add(self, pid: int, epoch: int, *tps: tuple[str, int], txn: str = T) -> int:
        return self.call(self.core.add_partitions, AddPartitionsRequest(txn, pid, epoch, tps))

    def end(self, pid: int, epoch: int, commit: bool, txn: str = T) -> int:
        return self.call(self.core.end_txn, EndTxnRequest(txn, pid, epoch, commit))

    def ready(self, txn: str = T, timeout: int = 60_000) -> tuple[int, int]:
        ref = self.init(txn, timeout)
        self.settle()
        res = self.replies[ref]
        assert res.error == E.NONE, res
        return res.producer_id, res.producer_epoch

    def ongoing(
        self, *tps: tuple[str, int], txn: str = T, timeout: int = 60_000
    ) -> tuple[int, int]:
        """A producer of `txn` whose transaction holds `tps`, written (Ongoing)."""
        pid, epoch = self.ready(txn, timeout)
        self.add(pid, epoch, *tps, txn=txn)
        self.ack()
        return pid, epoch

    def prepared(self, commit: bool, *tps: tuple[str, int]) -> tuple[int, int]:
        """An ongoing transaction of T holding `tps`, ended with PrepareCommit (or
        PrepareAbort) written: its markers are sent and not yet answered."""
        pid, epoch = self.ongoing(*tps)
        self.end(pid, epoch, commit)
        self.ack()
        return pid, epoch

    def state(self, txn: str = T) -> TxnState:
        return self.core.txns[txn].state

    def failover(self, keep_unacked: bool = False) -> None:
        """Leadership of partition 0 moves and comes back at a higher epoch; the new leader
        loads what was written (the unacknowledged writes too when ``keep_unacked``)."""
        self.run(self.core.unload(0))
        if keep_unacked:
            self.log.extend((a.transactional_id, a.value) for a in self.appends)
        self.appends.clear()
        self.markers_done(E.NOT_COORDINATOR)
        self.epoch += 1
        self.run(self.core.begin_load(0, self.epoch))
        self.run(self.core.complete_load(0, self.epoch, list(self.log), self.now))


# ----- InitProducerId --------------------------------------------------------------------------


def test_init_gives_a_new_id_epoch_0_only_once_written():
    h = Harness()
    ref = h.init()
    assert ref not in h.replies
    [a] = h.appends
    assert a.partition == 0 and a.transactional_id == T
    assert a.value == TxnLogValue(1000, 0, 60_000, TxnState.EMPTY, (), h.now, -1)
    h.ack()
    assert h.replies[ref] == InitPidResult(E.NONE, 1000, 0)


def test_init_again_bumps_the_epoch_and_fences_the_old_producer():
    h = Harness()
    pid, epoch = h.ready()
    pid2, epoch2 = h.ready()
    assert (pid2, epoch2) == (pid, epoch + 1)  # same producer id: the fresh one is not used
    assert h.replies[h.add(pid, epoch, TP0)] == AddPartitionsResult({TP0: E.PRODUCER_FENCED})
    assert h.replies[h.end(pid, epoch, True)] == E.PRODUCER_FENCED
    assert not h.appends


def test_init_argument_errors():
    h = Harness()
    assert h.replies[h.init(timeout=900_001)].error == E.INVALID_TRANSACTION_TIMEOUT
    assert h.replies[h.init(timeout=0)].error == E.INVALID_TRANSACTION_TIMEOUT
    assert h.replies[h.init(txn="")].error == E.INVALID_REQUEST
    assert h.replies[h.init(pid=5)].error == E.INVALID_REQUEST  # producer id without epoch
    assert not h.appends and T not in h.core.txns
    req = InitPidRequest(T, 1000)  # no fresh producer id from the shell
    assert h.replies[h.call(h.core.init_producer_id, req)].error == E.COORDINATOR_NOT_AVAILABLE


def test_kip360_init_with_the_current_or_last_epoch():
    h = Harness()
    pid, e0 = h.ready()
    r = h.init(pid=pid, epoch=e0)  # the producer recovers: bump, remember the last epoch
    h.settle()
    assert h.replies[r] == InitPidResult(E.NONE, pid, e0 + 1)
    r = h.init(pid=pid, epoch=e0)  # a retry of that call: the same epoch again, no bump
    h.settle()
    assert h.replies[r] == InitPidResult(E.NONE, pid, e0 + 1)
    assert h.replies[h.init(pid=pid, epoch=e0 + 7)].error == E.PRODUCER_FENCED
    assert h.replies[h.init(pid=pid + 99, epoch=0)].error == E.PRODUCER_FENCED
    h.ready()  # a new producer (no id given) takes over: the last epoch is forgotten
    assert h.replies[h.init(pid=pid, epoch=e0)].error == E.PRODUCER_FENCED


def test_epoch_exhaustion_rotates_the_producer_id():
    h = Harness(load=False)
    h.core.begin_load(0, 1)
    spent = TxnLogValue(77, 32766, 60_000, TxnState.COMPLETE_COMMIT, (), 5, 4)
    h.run(h.core.complete_load(0, 1, [(T, spent)], h.now))
    r = h.init(pid=77, epoch=32766)
    h.settle()
    res = h.replies[r]
    assert res.error == E.NONE and res.producer_id != 77 and res.producer_epoch == 0
    # KIP-360: the old id with its spent epoch is a retry of that rotation
    assert h.core.txns[T].last_producer_id == 77 and h.core.txns[T].last_producer_epoch == 32766
    r = h.init(pid=77, epoch=32766)
    h.settle()
    assert h.replies[r] == InitPidResult(E.NONE, res.producer_id, 0)  # the same answer again


def test_init_during_a_transaction_aborts_it_with_a_bumped_epoch():
    h = Harness()
    pid, epoch = h.ongoing(TP0)
    r = h.init()
    assert r not in h.replies  # waits for the PrepareAbort
    [a] = h.appends
    assert a.value is not None and a.value.state == TxnState.PREPARE_ABORT
    assert a.value.producer_epoch == epoch + 1
    # the old producer is fenced at once, while the abort is being written
    assert h.replies[h.end(pid, epoch, True)] == E.PRODUCER_FENCED
    h.ack()
    assert h.replies[r] == InitPidResult(E.CONCURRENT_TRANSACTIONS)
    [m] = h.markers
    assert (m.commit, m.producer_epoch, m.partitions) == (False, epoch + 1, (TP0,))
    assert h.replies[h.init()].error == E.CONCURRENT_TRANSACTIONS  # still completing
    h.settle()
    assert h.state() == TxnState.COMPLETE_ABORT
    assert h.ready() == (pid, epoch + 2)


# ----- AddPartitionsToTxn ----------------------------------------------------------------------


def test_add_partitions_starts_the_transaction_once_written():
    h = Harness()
    pid, epoch = h.ready()
    h.advance(5)
    r = h.add(pid, epoch, TP0, TP1)
    assert r not in h.replies and h.state() == TxnState.EMPTY
    assert h.core.verify_partitions(h.now, T, pid, epoch, [TP0]) == {TP0: E.INVALID_TXN_STATE}
    h.ack()
    assert h.replies[r] == AddPartitionsResult({TP0: E.NONE, TP1: E.NONE})
    meta = h.core.txns[T]
    assert meta.state == TxnState.ONGOING and meta.start_ms == h.now
    assert h.log[-1][1] == TxnLogValue(
        pid, epoch, 60_000, TxnState.ONGOING, (TP0, TP1), h.now, h.now
    )
    # already in the transaction: answered at once, nothing written
    assert h.replies[h.add(pid, epoch, TP1)] == AddPartitionsResult({TP1: E.NONE})
    assert not h.appends
    h.advance(5)
    h.add(pid, epoch, TP2)
    h.ack()
    assert h.core.txns[T].partitions == {TP0, TP1, TP2}
    assert h.core.txns[T].start_ms == h.now - 5  # the transaction's start stays


def test_add_partitions_bad_inputs():
    h = Harness()
    assert h.replies[h.add(1, 0, TP0)] == AddPartitionsResult({TP0: E.INVALID_PRODUCER_ID_MAPPING})
    pid, epoch = h.ready()
    assert h.replies[h.add(pid + 1, epoch, TP0)].errors[TP0] == E.INVALID_PRODUCER_ID_MAPPING
    assert h.replies[h.add(pid, epoch - 1, TP0)].errors[TP0] == E.PRODUCER_FENCED
    assert h.replies[h.add(pid, epoch + 1, TP0)].errors[TP0] == E.PRODUCER_FENCED
    h.add(pid, epoch, TP0)  # its write is pending
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.CONCURRENT_TRANSACTIONS
    h.ack()
    h.end(pid, epoch, True)
    h.ack()  # PrepareCommit written, markers not yet
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.CONCURRENT_TRANSACTIONS
    assert h.replies[h.add(pid, epoch)] == AddPartitionsResult({})
    req = AddPartitionsRequest("", pid, epoch, (TP0,))
    assert h.replies[h.call(h.core.add_partitions, req)].errors[TP0] == E.INVALID_REQUEST


# ----- EndTxn ----------------------------------------------------------------------------------


def test_commit_prepare_markers_complete():
    h = Harness()
    pid, epoch = h.ongoing(TP1, TP0)
    r = h.end(pid, epoch, True)
    assert r not in h.replies and not h.markers  # no markers before PrepareCommit is written
    [a] = h.appends
    assert a.value is not None and a.value.state == TxnState.PREPARE_COMMIT
    h.ack()
    assert h.replies[r] == E.NONE
    [m] = h.markers
    assert m == SendMarkers(m.token, T, pid, epoch, True, 0, (TP0, TP1))
    assert not h.appends  # no CompleteCommit before the markers are written
    assert h.replies[h.end(pid, epoch, True)] == E.CONCURRENT_TRANSACTIONS
    # as Kafka: while Complete* is pending, the opposite outcome is told to wait too
    assert h.replies[h.end(pid, epoch, False)] == E.CONCURRENT_TRANSACTIONS
    assert h.replies[h.init()].error == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    [a] = h.appends
    assert a.value is not None and a.value.state == TxnState.COMPLETE_COMMIT
    assert a.value.partitions == ()
    h.ack()
    assert h.state() == TxnState.COMPLETE_COMMIT and not h.core.txns[T].partitions
    assert h.replies[h.end(pid, epoch, True)] == E.NONE  # a retry of the commit
    assert h.replies[h.end(pid, epoch, False)] == E.INVALID_TXN_STATE
    assert not h.appends and not h.markers


def test_abort_and_a_second_transaction():
    h = Harness()
    pid, epoch = h.ongoing(TP0)
    r = h.end(pid, epoch, False)
    h.ack()
    assert h.replies[r] == E.NONE and h.markers[0].commit is False
    h.settle()
    assert h.state() == TxnState.COMPLETE_ABORT
    assert h.replies[h.end(pid, epoch, False)] == E.NONE
    assert h.replies[h.end(pid, epoch, True)] == E.INVALID_TXN_STATE
    h.add(pid, epoch, TP1)
    h.settle()
    assert h.state() == TxnState.ONGOING and h.core.txns[T].partitions == {TP1}


def test_end_txn_bad_inputs():
    h = Harness()
    assert h.replies[h.end(1, 0, True)] == E.INVALID_PRODUCER_ID_MAPPING  # unknown id
    pid, epoch = h.ready()
    assert h.replies[h.end(pid, epoch, True)] == E.INVALID_TXN_STATE  # nothing started
    assert h.replies[h.end(pid, epoch, False)] == E.INVALID_TXN_STATE
    h.add(pid, epoch, TP0)
    h.ack()
    assert h.replies[h.end(pid + 1, epoch, True)] == E.INVALID_PRODUCER_ID_MAPPING
    assert h.replies[h.end(pid, epoch - 1, True)] == E.PRODUCER_FENCED
    assert h.replies[h.end(pid, epoch + 1, True)] == E.PRODUCER_FENCED
    assert h.replies[h.end(pid, epoch, True, txn="")] == E.INVALID_REQUEST
    assert not h.appends and h.state() == TxnState.ONGOING


# ----- append failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("append_error", "client_error"),
    [
        (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
        (E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.COORDINATOR_NOT_AVAILABLE),
        (E.REQUEST_TIMED_OUT, E.COORDINATOR_NOT_AVAILABLE),
        (E.UNKNOWN_TOPIC_OR_PARTITION, E.COORDINATOR_NOT_AVAILABLE),
        (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
        (E.KAFKA_STORAGE_ERROR, E.NOT_COORDINATOR),
        (E.MESSAGE_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    ],
)
def test_a_failed_write_reverts_the_transition(append_error: E, client_error: E):
    h = Harness()
    r = h.init()
    h.ack(append_error)
    assert h.replies[r] == InitPidResult(client_error)
    assert h.core.txns[T].producer_epoch == -1 and h.core.txns[T].pending is None
    pid, epoch = h.ready()
    r = h.add(pid, epoch, TP0)
    h.ack(append_error)
    assert h.replies[r] == AddPartitionsResult({TP0: client_error})
    assert h.state() == TxnState.EMPTY and not h.core.txns[T].partitions
    h.add(pid, epoch, TP0)
    h.ack()
    r = h.end(pid, epoch, True)
    h.ack(append_error)
    assert h.replies[r] == client_error and not h.markers
    assert h.state() == TxnState.ONGOING and h.core.txns[T].pending is None
    r = h.end(pid, epoch, False)  # not committed: the client may still abort
    h.settle()
    assert h.replies[r] == E.NONE and h.state() == TxnState.COMPLETE_ABORT


def test_a_failed_fence_does_not_bump_the_epoch_twice():
    h = Harness()
    pid, epoch = h.ongoing(TP0)
    r = h.init()
    h.ack(E.NOT_ENOUGH_REPLICAS)
    assert h.replies[r].error == E.COORDINATOR_NOT_AVAILABLE
    meta = h.core.txns[T]
    assert meta.state == TxnState.ONGOING and meta.producer_epoch == epoch + 1
    assert meta.has_failed_epoch_fence
    assert h.replies[h.end(pid, epoch, True)] == E.PRODUCER_FENCED  # still fenced here
    r = h.init()
    assert h.appends[0].value is not None and h.appends[0].value.producer_epoch == epoch + 1
    h.settle()
    assert h.replies[r].error == E.CONCURRENT_TRANSACTIONS
    assert not h.core.txns[T].has_failed_epoch_fence
    assert h.ready() == (pid, epoch + 2)


def test_complete_write_is_retried_until_it_succeeds():
    h = Harness(TxnConfig(num_partitions=1, complete_retry_backoff_ms=50))
    h.prepared(True, TP0)
    h.markers_done()
    h.ack(E.NOT_ENOUGH_REPLICAS)
    assert not h.appends and h.state() == TxnState.PREPARE_COMMIT
    assert h.core.next_deadline() == h.now + 50
    h.advance(49)
    assert not h.appends
    h.advance(1)
    [a] = h.appends
    assert a.value is not None and a.value.state == TxnState.COMPLETE_COMMIT
    h.ack()
    assert h.state() == TxnState.COMPLETE_COMMIT


def test_complete_write_lost_with_leadership_leaves_prepare_for_the_next_load():
    h = Harness()
    pid, epoch = h.prepared(True, TP0)
    h.markers_done()
    h.ack(E.NOT_LEADER_OR_FOLLOWER)
    assert h.state() == TxnState.PREPARE_COMMIT and h.core.txns[T].pending is None
    assert h.replies[h.end(pid, epoch, True)] == E.CONCURRENT_TRANSACTIONS
    assert h.replies[h.end(pid, epoch, False)] == E.INVALID_TXN_STATE  # nothing pending now
    h.failover()
    [m] = h.markers
    assert m.commit and m.coordinator_epoch == 1
    h.settle()
    assert h.state() == TxnState.COMPLETE_COMMIT


# ----- timeouts and expiration -----------------------------------------------------------------


def test_a_transaction_past_its_timeout_is_aborted_and_its_epoch_fenced():
    h = Harness(TxnConfig(num_partitions=1, abort_timed_out_interval_ms=1_000))
    pid, epoch = h.ongoing(TP0, timeout=5_000)
    h.advance(5_000)  # start + timeout == now: not yet past it
    assert not h.appends and h.state() == TxnState.ONGOING
    assert h.core.next_deadline() == h.now + 1_000
    h.advance(1_000)
    [a] = h.appends
    assert a.value is not None and a.value.state == TxnState.PREPARE_ABORT
    assert a.value.producer_epoch == epoch + 1
    assert h.replies[h.end(pid, epoch, True)] == E.PRODUCER_FENCED
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.PRODUCER_FENCED
    h.ack()
    [m] = h.markers
    assert (m.commit, m.producer_id, m.producer_epoch) == (False, pid, epoch + 1)
    h.settle()
    assert h.state() == TxnState.COMPLETE_ABORT
    assert h.replies[h.end(pid, epoch, True)] == E.PRODUCER_FENCED
    assert h.replies[h.init(pid=pid, epoch=epoch)].error == E.PRODUCER_FENCED
    h.settle()
    assert h.ready() == (pid, epoch + 2)


def test_an_idle_transactional_id_expires():
    cfg = TxnConfig(num_partitions=1, id_expiration_ms=10_000, remove_expired_interval_ms=1_000)
    h = Harness(cfg)
    h.advance(0)
    pid, epoch = h.ready()
    h.ongoing(TP0, txn="busy")
    h.advance(9_999)
    assert not h.appends
    h.advance(1_000)
    [a] = h.appends  # only the idle one; the ongoing transaction does not expire
    assert (a.transactional_id, a.value) == (T, None)
    assert h.replies[h.init()].error == E.CONCURRENT_TRANSACTIONS
    h.ack(E.NOT_ENOUGH_REPLICAS)  # not written: kept, tried again on the next round
    assert h.core.txns[T].pending is None
    h.advance(1_000)
    h.ack()
    assert T not in h.core.txns and h.log[-1] == (T, None)
    assert h.replies[h.end(pid, epoch, True)] == E.INVALID_PRODUCER_ID_MAPPING
    pid2, epoch2 = h.ready()
    assert pid2 != pid and epoch2 == 0
    assert "busy" in h.core.txns


# ----- loading and unloading -------------------------------------------------------------------


def test_load_in_prepare_commit_sends_markers_and_completes():
    h = Harness(load=False)
    assert h.replies[h.init()].error == E.NOT_COORDINATOR
    h.core.begin_load(0, 4)
    assert h.replies[h.init()].error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.core.verify_partitions(h.now, T, 1, 0, [TP0]) == {TP0: E.COORDINATOR_LOAD_IN_PROGRESS}
    prepared = TxnLogValue(7, 3, 60_000, TxnState.PREPARE_COMMIT, (TP0, TP2), 10, 9)
    entries = [
        (T, TxnLogValue(7, 3, 60_000, TxnState.ONGOING, (TP0,), 9, 9)),
        ("gone", TxnLogValue(8, 0, 60_000, TxnState.EMPTY, (), 1, -1)),
        (T, prepared),
        ("gone", None),
    ]
    h.run(h.core.complete_load(0, 4, entries, h.now))
    assert "gone" not in h.core.txns
    [m] = h.markers
    assert m == SendMarkers(m.token, T, 7, 3, True, 4, (TP2, TP0))
    assert h.replies[h.end(7, 3, True)] == E.CONCURRENT_TRANSACTIONS
    assert h.replies[h.end(7, 3, False)] == E.CONCURRENT_TRANSACTIONS
    h.markers_done()
    [a] = h.appends
    assert a.value == TxnLogValue(7, 3, 60_000, TxnState.COMPLETE_COMMIT, (), h.now, 9)
    h.ack()
    assert h.replies[h.end(7, 3, True)] == E.NONE


def test_load_in_prepare_abort_and_ongoing():
    h = Harness(TxnConfig(num_partitions=1, abort_timed_out_interval_ms=1_000), load=False)
    h.core.begin_load(0, 2)
    entries = [
        ("a", TxnLogValue(7, 3, 60_000, TxnState.PREPARE_ABORT, (TP0,), 10, 9)),
        ("o", TxnLogValue(8, 1, 5_000, TxnState.ONGOING, (TP1,), h.now, h.now)),
    ]
    h.run(h.core.complete_load(0, 2, entries, h.now))
    [m] = h.markers
    assert (m.transactional_id, m.commit) == ("a", False)
    h.settle()
    assert h.state("a") == TxnState.COMPLETE_ABORT and h.state("o") == TxnState.ONGOING
    h.advance(6_000)
    [a] = h.appends
    assert a.transactional_id == "o" and a.value is not None
    assert (a.value.state, a.value.producer_epoch) == (TxnState.PREPARE_ABORT, 2)


def test_a_load_overtaken_by_a_newer_one_is_ignored():
    h = Harness(load=False)
    h.core.begin_load(0, 1)
    h.core.begin_load(0, 2)
    value = TxnLogValue(7, 3, 60_000, TxnState.PREPARE_COMMIT, (TP0,), 10, 9)
    assert h.core.complete_load(0, 1, [(T, value)], h.now) == []
    assert h.core.coordinator_error(T) == E.COORDINATOR_LOAD_IN_PROGRESS
    h.run(h.core.complete_load(0, 2, [(T, value)], h.now))
    assert h.core.owned == {0: 2} and h.markers[0].coordinator_epoch == 2


def test_unload_answers_waiting_requests_and_forgets_in_flight_work():
    h = Harness()
    pid, epoch = h.ongoing(TP0)
    r_end = h.end(pid, epoch, True)
    r_init = h.init("other")
    stale = list(h.appends)
    h.run(h.core.unload(0))
    assert h.replies[r_end] == E.NOT_COORDINATOR
    assert h.replies[r_init] == InitPidResult(E.NOT_COORDINATOR)
    assert h.core.txns == {} and h.core.coordinator_error(T) == E.NOT_COORDINATOR
    for a in stale:  # late acknowledgements change nothing and answer nobody twice
        h.run(h.core.on_append_done(h.now, a.token, E.NONE))
    h.appends.clear()
    assert h.core.txns == {} and h.core.next_deadline() is None


def test_markers_given_up_after_unload_write_no_completion():
    h = Harness()
    h.prepared(False, TP0)
    [m] = h.markers
    h.run(h.core.unload(0))
    assert h.core.on_markers_done(h.now, m.token, E.NONE) == []
    # reloaded from the log (PrepareAbort written): the new coordinator finishes the abort
    h.markers.clear()
    h.failover()
    assert h.markers[0].commit is False and h.markers[0].coordinator_epoch == 1
    h.settle()
    assert h.state() == TxnState.COMPLETE_ABORT


def test_markers_given_up_while_still_owned_wait_for_the_next_load():
    """As Kafka: markers refused as fenced leave the transaction prepared, its Complete*
    pending, until a coordinator loads the partition again and sends them."""
    h = Harness()
    pid, epoch = h.prepared(True, TP0)
    h.markers_done(E.TRANSACTION_COORDINATOR_FENCED)
    assert not h.appends and h.state() == TxnState.PREPARE_COMMIT
    assert h.replies[h.end(pid, epoch, True)] == E.CONCURRENT_TRANSACTIONS
    assert h.replies[h.add(pid, epoch, TP1)].errors[TP1] == E.CONCURRENT_TRANSACTIONS
    h.failover()
    assert [m.commit for m in h.markers] == [True]
    h.settle()
    assert h.state() == TxnState.COMPLETE_COMMIT


# ----- verification, describe, list ------------------------------------------------------------


def test_verify_partitions_kip890():
    h = Harness()
    assert h.core.verify_partitions(h.now, T, 1, 0, [TP0]) == {TP0: E.INVALID_PRODUCER_ID_MAPPING}
    pid, epoch = h.ongoing(TP0)
    v = h.core.verify_partitions
    assert v(h.now, T, pid, epoch, [TP0, TP1]) == {TP0: E.NONE, TP1: E.INVALID_TXN_STATE}
    assert v(h.now, T, pid, epoch - 1, [TP0]) == {TP0: E.PRODUCER_FENCED}
    assert v(h.now, T, pid + 1, epoch, [TP0]) == {TP0: E.INVALID_PRODUCER_ID_MAPPING}
    assert v(h.now, "", pid, epoch, [TP0]) == {TP0: E.INVALID_REQUEST}
    h.end(pid, epoch, False)
    h.ack()
    assert v(h.now, T, pid, epoch, [TP0]) == {TP0: E.CONCURRENT_TRANSACTIONS}
    h.settle()
    # aborted: a late produce to TP0 must not start a hanging transaction
    assert v(h.now, T, pid, epoch, [TP0]) == {TP0: E.INVALID_TXN_STATE}
    assert not h.appends


def test_describe_and_list_transactions():
    h = Harness()
    pid, epoch = h.ongoing(TP1, TP0)
    pid2, _ = h.ready("b")
    assert h.core.describe_transactions([T, "b", "nope", ""]) == [
        TxnDescription(T, E.NONE, "Ongoing", pid, epoch, 60_000, h.now, (TP0, TP1)),
        TxnDescription("b", E.NONE, "Empty", pid2, 0, 60_000, -1, ()),
        TxnDescription("nope", E.TRANSACTIONAL_ID_NOT_FOUND),
        TxnDescription("", E.INVALID_REQUEST),
    ]
    everything = sorted(h.core.list_transactions(None, None), key=lambda x: x.transactional_id)
    assert everything == [TxnListing("b", pid2, "Empty"), TxnListing(T, pid, "Ongoing")]
    assert h.core.list_transactions({"Ongoing"}, None) == [TxnListing(T, pid, "Ongoing")]
    assert h.core.list_transactions(set(), {pid2}) == [TxnListing("b", pid2, "Empty")]
    assert h.core.list_transactions({"Bogus"}, None) == []
    assert h.core.unknown_state_filters({"Bogus", "Empty"}) == ["Bogus"]
    assert h.core.list_error() == E.NONE
    h.core.begin_load(1, 0)
    assert h.core.list_error() == E.COORDINATOR_LOAD_IN_PROGRESS
    other = TransactionCoordinator(TxnConfig(num_partitions=3))
    assert other.describe_transactions([T])[0].error == E.NOT_COORDINATOR


def test_config_is_checked():
    with pytest.raises(ValueError, match="num_partitions"):
        TxnConfig(num_partitions=0)
    with pytest.raises(ValueError, match="max_timeout_ms"):
        TxnConfig(max_timeout_ms=-5)


def test_metadata_refuses_illegal_transitions():
    meta = TransactionMetadata.new(T, 5, 1000, 0)
    with pytest.raises(IllegalTransition):
        meta.prepare_abort_or_commit(TxnState.PREPARE_COMMIT, 1)  # Empty -> PrepareCommit
    t = meta.prepare_increment_producer_epoch(1000, None, 1)
    assert t is not None
    with pytest.raises(IllegalTransition):  # one pending transition at a time
        meta.prepare_add_partitions(frozenset({TP0}), 1)
    meta.complete_transition(t)
    with pytest.raises(IllegalTransition):  # nothing pending
        meta.complete_transition(t)


# ----- the state machine -----------------------------------------------------------------------

IDS = ("a", "b", "c")
TPS = (TP0, TP1, TP2)
APPEND_OUTCOMES = (
    E.NONE,
    E.NONE,
    E.NONE,
    E.NOT_ENOUGH_REPLICAS,
    E.NOT_LEADER_OR_FOLLOWER,
    "timed-out-but-written",
)


class TxnMachine(RuleBasedStateMachine):
    """Producers with three transactional ids (and their zombies) against one coordinator of a
    two-partition __transaction_state; every rule something that may happen at any moment."""

    #: 0: AddPartitionsToTxn during Prepare* answers CONCURRENT_TRANSACTIONS at once (Kafka)
    add_partitions_wait_ms = 0

    def __init__(self) -> None:
        super().__init__()
        self.core = TransactionCoordinator(
            TxnConfig(
                num_partitions=2,
                abort_timed_out_interval_ms=1_000,
                id_expiration_ms=120_000,
                remove_expired_interval_ms=30_000,
                complete_retry_backoff_ms=100,
                add_partitions_wait_ms=self.add_partitions_wait_ms,
            )
        )
        self.now = 0
        self.refs = itertools.count(1)
        self.pids = itertools.count(100)
        self.requests: dict[int, tuple[str, Any]] = {}
        self.answered: set[int] = set()
        self.appends: list[AppendTxnLog] = []
        self.markers: list[SendMarkers] = []
        #: the written records, per __transaction_state partition (what a load reads)
        self.log: dict[int, list[tuple[str, TxnLogValue | None]]] = {0: [], 1: []}
        #: the acknowledged ones (a write that timed out or was cut off by a failover may be
        #: in the log, yet the coordinator went on without it, as Kafka's does)
        self.acked: dict[int, list[tuple[str, TxnLogValue | None]]] = {0: [], 1: []}
        self.epochs = {0: 0, 1: 0}
        #: what each id's newest producer holds, and what its zombies held
        self.producer: dict[str, tuple[int, int]] = {}
        self.zombies: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        #: the newest (producer id, epoch) an InitProducerId gave each id
        self.issued: dict[str, tuple[int, int]] = {}
        #: markers written for each id since its last Prepare* record: (pid, epoch, commit)
        self.markers_written: dict[str, tuple[int, int, bool] | None] = {}
        #: an EndTxn acknowledged for a transaction not yet complete: the outcome promised
        self.promised: dict[str, bool] = {}
        #: ids whose coordinator view may differ from the log (a write that timed out but
        #: was written): the view-equals-log check skips them until a reload
        self.diverged: set[str] = set()
        #: what the machine is doing: "init", "tick" or "other"
        self.acting = "other"
        for p in (0, 1):
            self.core.begin_load(p, 0)
            self.run(self.core.complete_load(p, 0, [], self.now))

    # ----- plumbing ------------------------------------------------------------------------

    def run(self, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                assert e.ref in self.requests, e
                assert e.ref not in self.answered, f"request {e.ref} answered twice"
                self.answered.add(e.ref)
                self.on_reply(e.ref, e.result)
            elif isinstance(e, AppendTxnLog):
                v = e.value
                if (
                    v is not None
                    and v.state == TxnState.PREPARE_ABORT
                    and self.acting in ("init", "tick")
                    and self.issued.get(e.transactional_id, (-1, -1))[0] == v.producer_id
                ):
                    # the coordinator's own abort (an InitProducerId fence, a timeout) fences
                    # the producer: its epoch is above any given out
                    assert v.producer_epoch > self.issued[e.transactional_id][1], (
                        f"{e.transactional_id}: abort at epoch {v.producer_epoch} does not fence "
                        f"{self.issued[e.transactional_id]}"
                    )
                if v is not None and v.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    self.markers_written[e.transactional_id] = None
                if v is not None and v.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                    commit = v.state == TxnState.COMPLETE_COMMIT
                    assert self.markers_written.get(e.transactional_id) == (
                        v.producer_id,
                        v.producer_epoch,
                        commit,
                    ), f"{v.state.kafka_name} for {e.transactional_id} before its markers"
                assert e.partition == self.core.partition_for(e.transactional_id)
                self.appends.append(e)
            else:
                assert isinstance(e, SendMarkers)
                promised = self.promised.get(e.transactional_id)
                assert promised is None or promised == e.commit, (
                    f"{e.transactional_id}: EndTxn(commit={promised}) was acknowledged, "
                    f"then markers with commit={e.commit}"
                )
                assert (
                    e.coordinator_epoch == self.epochs[self.core.partition_for(e.transactional_id)]
                )
                self.markers.append(e)

    def on_reply(self, ref: int, result: Any) -> None:
        kind, req = self.requests[ref]
        txn = req.transactional_id
        if kind == "init" and result.error == E.NONE:
            got = (result.producer_id, result.producer_epoch)
            assert got >= self.issued.get(txn, (-1, -1)), f"{txn}: epoch went back to {got}"
            self.issued[txn] = got
            old = self.producer.get(txn)
            if old is not None and old != got:
                self.zombies[txn].append(old)
            self.producer[txn] = got
        if kind in ("add", "end") and (result if kind == "end" else
                                       next(iter(result.errors.values()), None)) == E.NONE:  # fmt: skip
            # fencing: only the newest producer of an id gets anything done
            assert (req.producer_id, req.producer_epoch) == self.issued.get(txn), (
                f"{txn}: a request of {req.producer_id}/{req.producer_epoch} succeeded after "
                f"{self.issued.get(txn)} was given out"
            )
        if kind == "end" and result == E.NONE:
            meta = self.core.txns.get(txn)
            done = TxnState.COMPLETE_COMMIT if req.commit else TxnState.COMPLETE_ABORT
            if meta is None or meta.state != done or meta.pending is not None:
                # the outcome is promised to the client until the transaction is complete
                assert self.promised.get(txn, req.commit) == req.commit, (
                    f"{txn}: EndTxn(commit={req.commit}) acknowledged after the opposite was"
                )
                self.promised[txn] = req.commit

    def request(self, kind: str, method: Any, req: Any) -> None:
        ref = next(self.refs)
        self.requests[ref] = (kind, req)
        self.acting = "init" if kind == "init" else "other"
        self.run(method(self.now, ref, req))
        self.acting = "other"

    def forget_completed_promises(self) -> None:
        for txn in list(self.promised):
            meta = self.core.txns.get(txn)
            if meta is not None and meta.state in (
                TxnState.COMPLETE_COMMIT,
                TxnState.COMPLETE_ABORT,
            ):
                del self.promised[txn]

    def credentials(self, txn: str, zombie: bool, data: st.DataObject) -> tuple[int, int]:
        if zombie and self.zombies[txn]:
            return data.draw(st.sampled_from(self.zombies[txn]))
        return self.producer.get(txn, (999, 0))

    # ----- clients -------------------------------------------------------------------------

    @rule(txn=st.sampled_from(IDS), kip360=st.booleans(), data=st.data())
    def init_producer_id(self, txn: str, kip360: bool, data: st.DataObject) -> None:
        timeout = data.draw(st.sampled_from([5_000, 60_000]))
        if kip360 and txn in self.producer:
            pid, epoch = self.credentials(txn, data.draw(st.booleans()), data)
            req = InitPidRequest(txn, timeout, pid, epoch, next(self.pids))
        else:
            req = InitPidRequest(txn, timeout, fresh_producer_id=next(self.pids))
        self.request("init", self.core.init_producer_id, req)

    @rule(
        txn=st.sampled_from(IDS),
        tps=st.lists(st.sampled_from(TPS), min_size=1, max_size=2, unique=True),
        zombie=st.booleans(),
        data=st.data(),
    )
    def add_partitions(
        self, txn: str, tps: list[tuple[str, int]], zombie: bool, data: st.DataObject
    ) -> None:
        pid, epoch = self.credentials(txn, zombie, data)
        req = AddPartitionsRequest(txn, pid, epoch, tuple(tps))
        self.request("add", self.core.add_partitions, req)

    @rule(txn=st.sampled_from(IDS), commit=st.booleans(), zombie=st.booleans(), data=st.data())
    def end_txn(self, txn: str, commit: bool, zombie: bool, data: st.DataObject) -> None:
        pid, epoch = self.credentials(txn, zombie, data)
        self.request("end", self.core.end_txn, EndTxnRequest(txn, pid, epoch, commit))

    @rule(
        txn=st.sampled_from(IDS),
        commit=st.booleans(),
        tp=st.sampled_from(TPS),
        outcome=st.sampled_from([E.NONE, E.NONE, E.NONE, E.NOT_ENOUGH_REPLICAS, None]),
    )
    def producer_makes_progress(
        self, txn: str, commit: bool, tp: tuple[str, int], outcome: E | None
    ) -> None:
        """The newest producer of the id takes its next step, whose write (only that one)
        is done at once with ``outcome`` (None: left in flight), and if it succeeds so are the
        markers and the Complete* record: keeps the machine moving through whole
        transactions, and through failures where they matter."""
        meta = self.core.txns.get(txn)
        before = {a.token for a in self.appends}
        if txn not in self.producer or meta is None:
            self.request(
                "init",
                self.core.init_producer_id,
                InitPidRequest(txn, 60_000, fresh_producer_id=next(self.pids)),
            )
        else:
            pid, epoch = self.producer[txn]
            if meta.state == TxnState.ONGOING and (commit or len(meta.partitions) > 1):
                self.request("end", self.core.end_txn, EndTxnRequest(txn, pid, epoch, commit))
            else:
                req = AddPartitionsRequest(txn, pid, epoch, (tp,))
                self.request("add", self.core.add_partitions, req)
        if outcome is None:
            return
        mine = [a for a in self.appends if a.token not in before]
        self.appends = [a for a in self.appends if a.token in before]
        self.complete(mine, outcome)
        while self.markers and self.markers[-1].transactional_id == txn:
            self.markers_done(len(self.markers) - 1)
            mine = [a for a in self.appends if a.token not in before]
            self.appends = [a for a in self.appends if a.token in before]
            self.complete(mine, E.NONE)

    # ----- the shell -----------------------------------------------------------------------

    @rule(outcome=st.sampled_from(APPEND_OUTCOMES), all_of_them=st.booleans())
    def appends_done(self, outcome: Any, all_of_them: bool) -> None:
        pending = self.appends if all_of_them else self.appends[:1]
        self.appends = [] if all_of_them else self.appends[1:]
        self.complete(pending, outcome)

    def complete(self, pending: list[AppendTxnLog], outcome: Any) -> None:
        for a in pending:
            error = E.NONE
            if outcome == "timed-out-but-written":
                error = E.REQUEST_TIMED_OUT
                self.diverged.add(a.transactional_id)
            elif outcome != E.NONE:
                error = outcome
            if error == E.NONE or outcome == "timed-out-but-written":
                self.log[a.partition].append((a.transactional_id, a.value))
            if error == E.NONE:
                self.acked[a.partition].append((a.transactional_id, a.value))
            self.run(self.core.on_append_done(self.now, a.token, error))
            self.forget_completed_promises()

    @rule()
    def markers_done(self, index: int = 0) -> None:
        if self.markers:
            m = self.markers.pop(index)
            self.markers_written[m.transactional_id] = (m.producer_id, m.producer_epoch, m.commit)
            self.run(self.core.on_markers_done(self.now, m.token, E.NONE))

    @rule(ms=st.sampled_from([100, 1_000, 6_000, 61_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.acting = "tick"
        self.run(self.core.tick(self.now))
        self.acting = "other"

    @rule(partition=st.sampled_from([0, 1]), keep_unacked=st.booleans())
    def failover(self, partition: int, keep_unacked: bool) -> None:
        """Leadership of a partition moves and comes back; its unacknowledged writes are
        either lost or made it to the log. Markers in flight are given up."""
        self.run(self.core.unload(partition))
        lost = [a for a in self.appends if a.partition == partition]
        self.appends = [a for a in self.appends if a.partition != partition]
        if keep_unacked:
            self.log[partition].extend((a.transactional_id, a.value) for a in lost)
        given_up = [
            m for m in self.markers if self.core.partition_for(m.transactional_id) == partition
        ]
        self.markers = [m for m in self.markers if m not in given_up]
        for m in given_up:
            self.run(self.core.on_markers_done(self.now, m.token, E.NOT_COORDINATOR))
        self.epochs[partition] += 1
        self.run(self.core.begin_load(partition, self.epochs[partition]))
        self.run(
            self.core.complete_load(
                partition, self.epochs[partition], list(self.log[partition]), self.now
            )
        )
        self.diverged = {t for t in self.diverged if self.core.partition_for(t) != partition}
        self.forget_completed_promises()

    @rule()
    def settle(self) -> None:
        """Every write and marker succeeds, and time passes: every request gets its answer and
        nothing is left half done."""
        for _ in range(50):
            if (
                not self.appends
                and not self.markers
                and not self.core._retries
                and not self.core._waiting
            ):
                break
            self.appends_done(E.NONE, True)
            while self.markers:
                self.markers_done()
            self.time_passes(100)
        assert not self.appends and not self.markers
        assert self.answered == set(self.requests), set(self.requests) - self.answered
        for meta in self.core.txns.values():
            assert meta.pending is None, meta

    # ----- invariants ----------------------------------------------------------------------

    @invariant()
    def at_most_one_transition_in_flight_per_id(self) -> None:
        in_flight = [pa.transactional_id for pa in self.core._appends.values()]
        in_flight += [pm.transactional_id for pm in self.core._markers.values()]
        in_flight += [r.append.transactional_id for r in self.core._retries]
        assert len(in_flight) == len(set(in_flight)), in_flight
        for txn in in_flight:
            assert self.core.txns[txn].pending is not None

    @invariant()
    def acknowledged_epochs_never_go_back(self) -> None:
        for records in self.acked.values():
            last: dict[str, tuple[int, int]] = {}
            for txn, v in records:
                if v is None:
                    continue
                got = (v.producer_id, v.producer_epoch)
                assert got >= last.get(txn, (-1, -1)), (txn, got, last.get(txn))
                last[txn] = got

    @invariant()
    def the_coordinator_sees_what_the_log_says(self) -> None:
        for p, records in self.log.items():
            if p not in self.core.owned:
                continue
            latest = dict(records)
            for txn, meta in self.core.txns.items():
                if self.core.partition_for(txn) != p or txn in self.diverged:
                    continue
                if (
                    meta.pending is None
                    and not meta.has_failed_epoch_fence
                    and meta.producer_epoch >= 0
                ):
                    assert latest.get(txn) == meta.to_log_value(), (txn, latest.get(txn), meta)
            for txn, v in latest.items():
                if v is not None and txn not in self.diverged:
                    assert txn in self.core.txns, f"{txn} is in the log but not known"

    @invariant()
    def ongoing_transactions_have_partitions(self) -> None:
        for meta in self.core.txns.values():
            if meta.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                assert meta.partitions and meta.start_ms >= 0
            if meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                assert not meta.partitions


TxnMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestTxnMachine = TxnMachine.TestCase
