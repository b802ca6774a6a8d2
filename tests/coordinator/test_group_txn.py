"""Transactional offset commits in the group coordinator core (TxnOffsetCommit, KIP-98/447).

The offsets of a TxnOffsetCommit are written as a transactional batch and stay pending per
(group, producer id) until the transaction's marker: `complete_txn(commit=True)` makes them the
committed offsets unless a plain commit whose record is later in the log replaced them, an abort
drops them. Loading replays the log the same way (markers are control batches). A hypothesis
state machine checks that an aborted (or never written) transactional commit is never visible,
and that a committed one is visible unless a commit later in the log superseded it.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from isrlab.broker.coordinator.group.coordinator import (
    Append,
    CommitResult,
    GroupConfig,
    GroupCoordinator,
    LoadedRecord,
    LoadItem,
    OffsetFetchResult,
    TxnCommitRequest,
    TxnMarker,
)
from isrlab.broker.coordinator.group.group import GroupState
from isrlab.broker.coordinator.group.records import GroupMetadataKey, OffsetKey, OffsetValue
from isrlab.broker.errors import ErrorCode
from tests.coordinator.test_group_core import CONFIG, G, Harness, join_two_step

T0 = ("t", 0)
T1 = ("t", 1)


class TxnHarness(Harness):
    """The core plus a log with offsets: plain and transactional records, and markers."""

    def __init__(self, config: GroupConfig = CONFIG):
        self.items: list[LoadItem] = []
        self.next_offset = 0
        super().__init__(config)

    def ack_all(self, error: ErrorCode = ErrorCode.NONE) -> None:
        while self.pending:
            self.ack_one(error)

    def ack_one(self, error: ErrorCode = ErrorCode.NONE) -> Append:
        a = self.pending.pop(0)
        offset = self.next_offset
        self.next_offset += len(a.entries)
        if not error:
            pid = a.producer[0] if a.producer is not None else -1
            self.items += [LoadedRecord(k, v, offset, pid) for k, v in a.entries]
            self.log.extend(a.entries)
        self.run(self.core.on_append_done(self.now, a.token, error, offset if not error else -1))
        return a

    def marker(self, producer_id: int, commit: bool) -> None:
        """The transaction coordinator wrote a marker to partition 0 of __consumer_offsets."""
        self.items.append(TxnMarker(producer_id, commit))
        self.next_offset += 1
        self.run(self.core.complete_txn(self.now, producer_id, [0], commit))

    def txn_commit(self, producer_id: int, offsets: dict[tuple[str, int], int], *,
                   member_id: str = "", generation: int = -1, instance: str | None = None,
                   metadata: str = "", group: str = G) -> int:  # fmt: skip
        req = TxnCommitRequest(
            f"txn-{producer_id}", producer_id, 0, group, generation, member_id, instance,
            {tp: (o, -1, metadata) for tp, o in offsets.items()},
        )  # fmt: skip
        return self.call(self.core.txn_offset_commit, req)

    def fetch_stable(self, require_stable: bool = True) -> OffsetFetchResult:
        res = self.replies[self.call(self.core.fetch_offsets, G, None, require_stable)]
        assert isinstance(res, OffsetFetchResult)
        return res

    def fetch_some(self, tps: list[tuple[str, int]], require_stable: bool) -> OffsetFetchResult:
        res = self.replies[self.call(self.core.fetch_offsets, G, tps, require_stable)]
        assert isinstance(res, OffsetFetchResult)
        return res

    def failover(self, epoch: int) -> None:
        self.run(self.core.unload(0))
        self.pending.clear()
        self.run(self.core.begin_load(0, epoch))
        self.core.complete_load(0, epoch, list(self.items), self.now)


def ok(h: TxnHarness, ref: int) -> bool:
    res = h.replies[ref]
    assert isinstance(res, CommitResult)
    return all(e == ErrorCode.NONE for e in res.errors.values())


# ----- commit and abort ----------------------------------------------------------------------


def test_a_transactional_commit_is_visible_only_after_its_commit_marker():
    h = TxnHarness()
    ref = h.txn_commit(7, {T0: 5, T1: 6})
    assert ref not in h.replies  # answered once written
    (a,) = h.pending
    assert a.producer == (7, 0)  # a transactional batch of the producer
    h.ack_all()
    assert ok(h, ref)
    assert h.fetch() == {}  # pending until the transaction ends
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 5, T1: 6}
    h.failover(1)
    assert h.fetch() == {T0: 5, T1: 6}


def test_an_aborted_transactional_commit_is_dropped():
    h = TxnHarness()
    h.commit({T0: 3})
    h.ack_all()
    h.txn_commit(7, {T0: 50, T1: 60})
    h.ack_all()
    h.marker(7, commit=False)
    assert h.fetch() == {T0: 3}
    assert not h.core.groups[G].pending_txn_offsets
    h.failover(1)
    assert h.fetch() == {T0: 3}
    h.marker(7, commit=True)  # a later marker of the producer finds nothing of the old one
    assert h.fetch() == {T0: 3}


def test_markers_of_one_producer_leave_another_producers_offsets_pending():
    h = TxnHarness()
    h.txn_commit(1, {T0: 10})
    h.txn_commit(2, {T1: 20})
    h.ack_all()
    h.marker(1, commit=True)
    assert h.fetch() == {T0: 10}
    assert list(h.core.groups[G].pending_txn_offsets) == [2]
    h.marker(2, commit=False)
    assert h.fetch() == {T0: 10}


def test_a_marker_on_another_partition_does_not_complete_this_groups_offsets():
    h = TxnHarness(GroupConfig(num_partitions=2, initial_rebalance_delay_ms=0))
    h.core.begin_load(1, 0)
    h.core.complete_load(1, 0, [], h.now)
    p = h.core.partition_for(G)
    h.txn_commit(7, {T0: 5})
    h.ack_all()
    h.run(h.core.complete_txn(h.now, 7, [1 - p], True))
    assert h.fetch() == {}
    h.run(h.core.complete_txn(h.now, 7, [p], True))
    assert h.fetch() == {T0: 5}


def test_a_later_commit_of_the_same_transaction_replaces_the_earlier():
    h = TxnHarness()
    h.txn_commit(7, {T0: 5})
    h.txn_commit(7, {T0: 9})
    h.ack_all()
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 9}
    h.failover(1)
    assert h.fetch() == {T0: 9}


# ----- ordering against plain commits --------------------------------------------------------


def test_a_plain_commit_later_in_the_log_wins_over_a_transaction_committed_after_it():
    """Kafka's CommitRecordMetadataAndOffset.olderThan: the marker comes after the plain
    commit, but the plain commit's record is later than the transactional one."""
    h = TxnHarness()
    h.txn_commit(7, {T0: 5})
    h.ack_all()
    h.commit({T0: 8})
    h.ack_all()
    assert h.fetch() == {T0: 8}
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 8}
    h.failover(1)
    assert h.fetch() == {T0: 8}


def test_a_transactional_commit_later_in_the_log_replaces_an_earlier_plain_commit():
    h = TxnHarness()
    h.commit({T0: 8})
    h.ack_all()
    h.txn_commit(7, {T0: 5})
    h.ack_all()
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 5}
    h.failover(1)
    assert h.fetch() == {T0: 5}


# ----- require_stable -------------------------------------------------------------------------


def test_require_stable_answers_unstable_offset_commit_while_a_transaction_is_open():
    h = TxnHarness()
    h.commit({T0: 1, T1: 2})
    h.ack_all()
    h.txn_commit(7, {T0: 5})
    h.ack_all()
    res = h.fetch_stable()
    assert res.error == ErrorCode.NONE
    assert res.errors == {T0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert res.offsets[T0] is None and res.offsets[T1].offset == 2
    # without require_stable: the last committed offsets
    assert h.fetch() == {T0: 1, T1: 2}
    # partitions asked for by name, one never committed but pending
    res = h.fetch_some([T0, ("u", 0)], require_stable=True)
    assert res.errors == {T0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    h.txn_commit(8, {("u", 0): 3})
    res = h.fetch_some([("u", 0)], require_stable=True)
    assert res.errors == {("u", 0): ErrorCode.UNSTABLE_OFFSET_COMMIT}  # its write in flight
    h.ack_all()
    h.marker(7, commit=True)
    h.marker(8, commit=False)
    res = h.fetch_stable()
    assert res.errors == {} and {tp: c.offset for tp, c in res.offsets.items()} == {T0: 5, T1: 2}


def test_require_stable_waits_for_a_plain_commit_in_flight_too():
    """As Kafka's hasPendingOffsetCommitsForTopicPartition: a plain commit whose record is not
    acknowledged yet is unstable as well."""
    h = TxnHarness()
    h.commit({T0: 1})
    h.ack_all()
    h.commit({T0: 2})
    res = h.fetch_some([T0], require_stable=True)
    assert res.errors == {T0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert h.fetch_some([T0], require_stable=False).offsets[T0].offset == 1
    h.ack_all()
    assert h.fetch_some([T0], require_stable=True).offsets[T0].offset == 2


# ----- membership (TxnOffsetCommit v3, KIP-447) ------------------------------------------------


def stable_member(h: TxnHarness, instance: str | None = None) -> str:
    if instance is None:
        mid, _ = join_two_step(h)
    else:
        mid = h.replies[h.join(instance=instance)].member_id
    h.sync(mid, 1, {mid: b"a"}, instance=instance)
    h.ack_all()
    assert h.core.groups[G].state is GroupState.STABLE
    return mid


def test_v3_member_and_generation_are_checked():
    h = TxnHarness()
    mid = stable_member(h)
    good = h.txn_commit(7, {T0: 5}, member_id=mid, generation=1)
    h.ack_all()
    assert ok(h, good)
    stale = h.txn_commit(7, {T0: 6}, member_id=mid, generation=0)
    assert h.replies[stale].errors == {T0: ErrorCode.ILLEGAL_GENERATION}
    unknown = h.txn_commit(7, {T0: 6}, member_id="someone-else", generation=1)
    assert h.replies[unknown].errors == {T0: ErrorCode.UNKNOWN_MEMBER_ID}
    gen_only = h.txn_commit(7, {T0: 6}, generation=1)
    assert h.replies[gen_only].errors == {T0: ErrorCode.UNKNOWN_MEMBER_ID}
    # v0-v2 send no member: accepted even though the group has members (unlike OffsetCommit)
    old = h.txn_commit(8, {T1: 4})
    h.ack_all()
    assert ok(h, old)
    plain = h.commit({T1: 4})
    assert h.replies[plain].errors == {T1: ErrorCode.UNKNOWN_MEMBER_ID}
    pending = h.core.groups[G].pending_txn_offsets
    assert {pid: {tp: c.offset for tp, c in o.items()} for pid, o in pending.items()} == {
        7: {T0: 5},
        8: {T1: 4},
    }


def test_v3_fenced_static_member():
    h = TxnHarness()
    mid = stable_member(h, instance="i1")
    fenced = h.txn_commit(7, {T0: 5}, member_id="old-id", generation=1, instance="i1")
    assert h.replies[fenced].errors == {T0: ErrorCode.FENCED_INSTANCE_ID}
    good = h.txn_commit(7, {T0: 5}, member_id=mid, generation=1, instance="i1")
    h.ack_all()
    assert ok(h, good)


def test_a_member_of_a_group_that_does_not_exist_is_unknown_and_leaves_no_group():
    h = TxnHarness()
    ref = h.txn_commit(7, {T0: 5}, member_id="m", generation=3, group="nowhere")
    assert h.replies[ref].errors == {T0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert "nowhere" not in h.core.groups


def test_coordinator_errors_and_bad_input():
    h = TxnHarness(GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0,
                               offset_metadata_max_bytes=4))  # fmt: skip
    ref = h.txn_commit(7, {T0: 5}, group="")
    assert h.replies[ref].errors == {T0: ErrorCode.INVALID_GROUP_ID}
    req = TxnCommitRequest("x", 7, 0, G, -1, "", None, {T0: (1, -1, "toolong"), T1: (2, -1, None)})
    ref = h.call(h.core.txn_offset_commit, req)
    h.ack_all()
    assert h.replies[ref].errors == {
        T0: ErrorCode.OFFSET_METADATA_TOO_LARGE,
        T1: ErrorCode.NONE,
    }
    assert list(h.core.groups[G].pending_txn_offsets[7]) == [T1]
    core = GroupCoordinator(CONFIG)
    (reply,) = core.txn_offset_commit(0, 1, req)
    assert reply.result.errors == {T0: ErrorCode.NOT_COORDINATOR, T1: ErrorCode.NOT_COORDINATOR}
    core.begin_load(0, 1)
    (reply,) = core.txn_offset_commit(0, 1, req)
    assert set(reply.result.errors.values()) == {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


# ----- failed writes and unusual orders -------------------------------------------------------


def test_a_failed_write_is_answered_with_the_partitions_error_and_stays_invisible():
    h = TxnHarness()
    for error, answer in [
        (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_EPOCH),
        (ErrorCode.PRODUCER_FENCED, ErrorCode.PRODUCER_FENCED),
        (ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_TXN_STATE),
        (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR),
    ]:
        ref = h.txn_commit(7, {T0: 5})
        h.ack_all(error)
        assert h.replies[ref].errors == {T0: answer}
        assert not h.core.groups[G].pending_txn_offsets
        h.marker(7, commit=True)
        assert h.fetch() == {}


def test_a_failed_write_does_not_drop_a_later_commit_of_the_transaction():
    h = TxnHarness()
    h.txn_commit(7, {T0: 5})
    h.txn_commit(7, {T0: 9})
    h.ack_one(ErrorCode.REQUEST_TIMED_OUT)
    h.ack_one()
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 9}


def test_a_transaction_ended_before_its_write_was_acknowledged():
    """Kafka refuses to complete a commit whose record has not been appended
    (IllegalStateException) and the offset is dropped; an abort drops it anyway."""
    h = TxnHarness()
    ref = h.txn_commit(7, {T0: 5})
    h.marker(7, commit=False)
    h.ack_all()
    assert ok(h, ref)
    assert h.fetch() == {} and not h.core.groups[G].pending_txn_offsets
    ref = h.txn_commit(8, {T0: 6})
    h.marker(8, commit=True)
    h.ack_all()
    assert h.fetch() == {}


def test_offsets_pending_in_a_transaction_keep_an_empty_group_alive():
    h = TxnHarness(GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0,
                               offsets_retention_ms=1_000,
                               offsets_retention_check_interval_ms=1_000))  # fmt: skip
    h.txn_commit(7, {T0: 5})
    h.ack_all()
    h.advance(5_000)
    h.ack_all()
    assert G in h.core.groups  # not removed while its transaction is open
    h.marker(7, commit=True)
    assert h.fetch() == {T0: 5}


def test_offset_delete_drops_a_pending_transactional_commit():
    h = TxnHarness()
    h.txn_commit(7, {T0: 5, T1: 6})
    h.ack_all()
    ref = h.call(h.core.delete_offsets, G, [T0])
    h.ack_all()
    assert h.replies[ref] == (ErrorCode.NONE, {T0: ErrorCode.NONE})
    h.marker(7, commit=True)
    assert h.fetch() == {T1: 6}


# ----- loading ------------------------------------------------------------------------------


def rec(tp: tuple[str, int], offset: int, at: int, pid: int = -1, group: str = G) -> LoadedRecord:
    return LoadedRecord(OffsetKey(group, tp[0], tp[1]), OffsetValue(offset), at, pid)


def test_load_holds_transactional_records_until_their_marker():
    h = TxnHarness()
    h.run(h.core.unload(0))
    h.run(h.core.begin_load(0, 5))
    items: list[LoadItem] = [
        rec(T0, 1, 0),  # plain
        rec(T0, 10, 1, pid=1),  # committed below
        rec(T1, 20, 2, pid=2),  # aborted below
        rec(("u", 0), 30, 3, pid=1),
        TxnMarker(1, True),
        TxnMarker(2, False),
        rec(T1, 2, 6),  # plain, after the abort
        rec(T1, 40, 7, pid=3),  # no marker: still pending at the log end
        rec(("v", 0), 50, 8, pid=4),
        rec(("v", 0), 0, 9),  # a plain commit later in the log than pid 4's
        LoadedRecord(OffsetKey(G, "u", 0), None, 10, 4),  # a transactional tombstone
        rec(T0, 60, 11, pid=5, group="other"),  # another group: created for its pending offset
        (GroupMetadataKey("gone"), None),  # a bare (key, value): a plain record
    ]
    h.core.complete_load(0, 5, items, h.now)
    assert h.fetch() == {T0: 10, T1: 2, ("u", 0): 30, ("v", 0): 0}
    group = h.core.groups[G]
    assert {pid: set(o) for pid, o in group.pending_txn_offsets.items()} == {
        3: {T1},
        4: {("v", 0)},
    }
    assert h.core.groups["other"].pending_txn_offsets[5][T0].offset == 60
    assert h.fetch_stable().errors == {
        T1: ErrorCode.UNSTABLE_OFFSET_COMMIT,
        ("v", 0): ErrorCode.UNSTABLE_OFFSET_COMMIT,
    }
    h.marker(3, commit=True)  # the unresolved tail is resolved by a later marker
    h.marker(4, commit=True)
    assert h.fetch() == {T0: 10, T1: 40, ("u", 0): 30, ("v", 0): 0}


def test_a_transaction_completed_while_its_partition_loads_is_applied_after_the_load():
    h = TxnHarness()
    h.txn_commit(7, {T0: 5})
    h.txn_commit(8, {T1: 6})
    h.ack_all()
    h.run(h.core.unload(0))
    h.run(h.core.begin_load(0, 1))
    snapshot = list(h.items)  # what the load read: no markers yet
    h.marker(7, commit=True)
    h.marker(8, commit=False)
    h.core.complete_load(0, 1, snapshot, h.now)
    assert h.fetch() == {T0: 5}
    assert not h.core.groups[G].pending_txn_offsets


# ----- the state machine ----------------------------------------------------------------------


class TxnOffsetsMachine(RuleBasedStateMachine):
    """Plain and transactional commits of three producers, their writes acknowledged or failed,
    markers, and coordinator failover (the state reloaded from the log)."""

    PRODUCERS = (1, 2, 3)

    def __init__(self) -> None:
        super().__init__()
        self.h = TxnHarness()
        self.values = itertools.count(1)
        #: value -> [tp, producer (-1 plain), status, position in the log]
        self.commits: dict[int, list[Any]] = {}
        self.refs: dict[int, int] = {}  # request ref -> value
        self.epoch = 0

    def _collect(self) -> None:
        positions = {
            item.value.offset: item.offset
            for item in self.h.items
            if isinstance(item, LoadedRecord) and isinstance(item.value, OffsetValue)
        }
        for ref, value in list(self.refs.items()):
            if ref in self.h.replies:
                del self.refs[ref]
                c = self.commits[value]
                if ok(self.h, ref):
                    c[2], c[3] = "acked", positions[value]
                else:
                    c[2] = "failed"

    def _in_flight(self, producer: int) -> bool:
        return any(c[1] == producer and c[2] == "inflight" for c in self.commits.values())

    @rule(producer=st.sampled_from((-1, *PRODUCERS)), p=st.integers(0, 1))
    def commit(self, producer: int, p: int) -> None:
        value = next(self.values)
        tp = ("t", p)
        if producer < 0:
            ref = self.h.commit({tp: value})
        else:
            ref = self.h.txn_commit(producer, {tp: value})
        self.commits[value] = [tp, producer, "inflight", -1]
        self.refs[ref] = value
        self._collect()

    @rule(ok=st.booleans(), one=st.booleans())
    def complete_writes(self, ok: bool, one: bool) -> None:
        error = ErrorCode.NONE if ok else ErrorCode.NOT_ENOUGH_REPLICAS
        if one and self.h.pending:
            self.h.ack_one(error)
        else:
            self.h.ack_all(error)
        self._collect()

    @rule(producer=st.sampled_from(PRODUCERS), commit=st.booleans())
    def end_transaction(self, producer: int, commit: bool) -> None:
        # a client ends its transaction once its TxnOffsetCommits are answered
        if self._in_flight(producer):
            return
        self.h.marker(producer, commit)
        for c in self.commits.values():
            if c[1] == producer and c[2] == "acked":
                c[2] = "committed" if commit else "aborted"

    @rule()
    def failover(self) -> None:
        self.epoch += 1
        self.h.failover(self.epoch)  # writes in flight are lost: answered NOT_COORDINATOR
        self._collect()

    def _visible(self) -> dict[tuple[str, int], int]:
        return self.h.fetch() if G in self.h.core.groups else {}

    @invariant()
    def aborted_or_unwritten_offsets_are_never_visible(self) -> None:
        for tp, value in self._visible().items():
            c = self.commits[value]
            assert c[0] == tp
            assert c[2] not in ("aborted", "failed"), (tp, value, c)
            if c[1] >= 0:
                assert c[2] == "committed", (tp, value, c)  # never before its marker
            else:
                assert c[2] == "acked", (tp, value, c)  # plain commits: once acknowledged

    @invariant()
    def a_committed_offset_is_visible_unless_a_later_record_superseded_it(self) -> None:
        visible = self._visible()
        for value, (tp, producer, status, position) in self.commits.items():
            if status == "committed" or (producer < 0 and status == "acked"):
                assert tp in visible, (value, tp)
                assert self.commits[visible[tp]][3] >= position, (tp, visible[tp], value)

    @invariant()
    def require_stable_reports_exactly_the_partitions_with_open_commits(self) -> None:
        if G not in self.h.core.groups:
            return
        open_tps = {
            c[0]
            for c in self.commits.values()
            if c[2] == "inflight" or (c[1] >= 0 and c[2] == "acked")
        }
        res = self.h.fetch_some([("t", 0), ("t", 1)], require_stable=True)
        assert set(res.errors) == open_tps
        assert set(res.errors.values()) <= {ErrorCode.UNSTABLE_OFFSET_COMMIT}


TxnOffsetsMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestTxnOffsetsMachine = TxnOffsetsMachine.TestCase
