"""The transaction coordinator's decisions, sans-IO (Kafka's TransactionCoordinator,
TransactionStateManager and the completion half of its TransactionMarkerChannelManager).

Every request is a method call ``(now, ref, request) -> [Effect]``; the coordinator answers
``ref`` with a ``Reply(ref, result)`` effect, at once or once the state record is written.
Writing to ``__transaction_state`` is an ``AppendTxnLog`` effect, answered by
``on_append_done(now, token, error)``; writing the transaction markers to the partitions of a
transaction is a ``SendMarkers`` effect, answered by ``on_markers_done(now, token, error)``.
Time only moves through ``tick(now)``.

A transaction ends as in Kafka: EndTxn appends PrepareCommit/PrepareAbort and is answered once
that record is acknowledged; the markers go out; once every partition has its marker,
CompleteCommit/CompleteAbort is appended. Every state change is appended before it takes effect
(``TransactionMetadata.prepare_*``/``complete_transition``); a failed append reverts the pending
transition and the client gets Kafka's error for it. The one exception, as in Kafka, is an epoch
fence (InitProducerId during a transaction, or a transaction past its timeout): the bumped epoch
is set at once, so the old producer is fenced while its abort is being written.

Ownership as the group coordinator: the transactional ids whose ``partition_for`` partition of
``__transaction_state`` this broker leads; the leader epoch is the coordinator epoch the markers
carry. ``begin_load``/``complete_load``/``unload`` follow leadership; a transaction loaded in
PrepareCommit/PrepareAbort gets its markers from the new coordinator.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from isrlab.broker.coordinator.effects import Reply
from isrlab.broker.coordinator.group.coordinator import _append_error
from isrlab.broker.coordinator.ownership import PartitionOwnership
from isrlab.broker.coordinator.transaction.metadata import (
    EXPIRATION_ALLOWED,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionMetadata,
    TxnTransit,
    is_epoch_exhausted,
)
from isrlab.broker.coordinator.transaction.records import TxnLogValue, TxnState
from isrlab.broker.errors import ErrorCode

TopicPartition = tuple[str, int]

# ----- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class TxnConfig:
    num_partitions: int = 50  # transaction.state.log.num.partitions
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    #: transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_timed_out_interval_ms: int = 10_000
    #: transaction.remove.expired.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3_600_000
    #: how soon a Complete* record whose append failed retriably is appended again (Kafka's
    #: marker sender retries it on its next round)
    complete_retry_backoff_ms: int = 100
    #: transaction.add.partitions.wait.ms (isrlab's own): how long an AddPartitionsToTxn that
    #: finds the producer's previous transaction still in Prepare* waits for its Complete*
    #: before CONCURRENT_TRANSACTIONS is answered; 0 answers at once, as Kafka 3.x does
    add_partitions_wait_ms: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_partitions",
            "max_timeout_ms",
            "id_expiration_ms",
            "abort_timed_out_interval_ms",
            "remove_expired_interval_ms",
            "complete_retry_backoff_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TxnConfig.{name} must be a positive int, not {value!r}")
        wait = self.add_partitions_wait_ms
        if not isinstance(wait, int) or wait < 0:
            raise ValueError(f"TxnConfig.add_partitions_wait_ms must be an int >= 0, not {wait!r}")


# ----- requests and results ------------------------------------------------------------------


@dataclass(frozen=True)
class InitPidRequest:
    transactional_id: str
    transaction_timeout_ms: int
    #: KIP-360: the producer's current id and epoch (both -1 for a new producer)
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    #: a producer id never used before, allocated by the shell; used only when a new id is
    #: needed (a new transactional id, or the epochs of the current one are spent)
    fresh_producer_id: int = NO_PRODUCER_ID


@dataclass(frozen=True)
class InitPidResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class AddPartitionsRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class AddPartitionsResult:
    errors: dict[TopicPartition, ErrorCode]


@dataclass(frozen=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True)
class TxnDescription:
    transactional_id: str
    error: ErrorCode
    state: str = ""  # Kafka's name: "Ongoing", "PrepareCommit", ...
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int = 0
    start_ms: int = -1
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


# ----- effects -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendTxnLog:
    """Write ``transactional_id``'s record (``value`` None: a tombstone) to partition
    ``partition`` of ``__transaction_state`` with acks=all, then call
    ``on_append_done(now, token, error)``."""

    partition: int
    transactional_id: str
    value: TxnLogValue | None
    token: int


@dataclass(frozen=True)
class SendMarkers:
    """Write the COMMIT (``commit``) or ABORT marker of the producer's transaction to every
    partition in ``partitions`` (WriteTxnMarkers to their leaders, retrying retriable errors,
    a partition that no longer exists counting as done), then call
    ``on_markers_done(now, token, error)``: NONE once all are written, NOT_COORDINATOR (or
    TRANSACTION_COORDINATOR_FENCED) if it gave up because this broker no longer coordinates."""

    token: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]


Effect = Reply | AppendTxnLog | SendMarkers


# ----- bookkeeping ---------------------------------------------------------------------------

#: who waits for the end of a transaction's Prepare* append
_END = "end"  # a client's EndTxn: Reply(ref, ErrorCode)
_FENCE = "fence"  # InitProducerId during a transaction: Reply(ref, InitPidResult)
_TIMEOUT = "timeout"  # the coordinator's own abort of a timed-out transaction: nobody


@dataclass
class _PendingAppend:
    kind: str  # "init", "add", "prepare", "complete", "expire"
    transactional_id: str
    partition: int
    coordinator_epoch: int
    transit: TxnTransit
    ref: Any = None
    requester: str = _END  # for "prepare"
    epoch_fence: bool = False  # for "prepare": the abort of an epoch fence
    partitions: tuple[TopicPartition, ...] = ()  # for "add": what the client asked for


@dataclass
class _PendingMarkers:
    transactional_id: str
    partition: int
    coordinator_epoch: int
    transit: TxnTransit  # the Complete* transition to append once the markers are written
    commit: bool


@dataclass
class _Waiting:
    """An AddPartitionsToTxn held until the producer's previous transaction is complete."""

    due: int
    ref: Any
    request: AddPartitionsRequest


@dataclass(order=True)
class _Retry:
    due: int
    token: int
    append: _PendingAppend = field(compare=False)


class TransactionCoordinator(PartitionOwnership):
    def __init__(self, config: TxnConfig | None = None):
        self.config = config or TxnConfig()
        self.num_partitions = self.config.num_partitions
        #: every transactional id of the owned partitions
        self.txns: dict[str, TransactionMetadata] = {}
        #: __transaction_state partitions this broker leads and has loaded -> leader epoch
        #: (the coordinator epoch)
        self.owned: dict[int, int] = {}
        #: partitions being loaded -> leader epoch (requests get COORDINATOR_LOAD_IN_PROGRESS)
        self.loading: dict[int, int] = {}
        self._tokens = itertools.count(1)
        self._appends: dict[int, _PendingAppend] = {}
        self._markers: dict[int, _PendingMarkers] = {}
        self._retries: list[_Retry] = []
        #: transactional id -> AddPartitionsToTxn requests waiting for its Complete* record
        self._waiting: dict[str, list[_Waiting]] = {}
        self._next_abort_check = 0
        self._next_expire_check = 0

    # ----- ownership -----------------------------------------------------------------------

    def begin_load(self, partition: int, epoch: int) -> list[Effect]:
        effects = self._drop_partition(partition)
        self.owned.pop(partition, None)
        self.loading[partition] = epoch
        return effects

    def complete_load(
        self,
        partition: int,
        epoch: int,
        entries: Iterable[tuple[str, TxnLogValue | None]],
        now: int,
    ) -> list[Effect]:
        """Replay the partition's records, oldest first (the latest per id wins, a tombstone
        deletes). Ignored if a newer leadership change overtook the load. Transactions found in
        PrepareCommit/PrepareAbort are completed: their markers go out again."""
        if self.loading.get(partition) != epoch:
            return []
        latest: dict[str, TxnLogValue | None] = {}
        for transactional_id, value in entries:
            latest[transactional_id] = value
        loaded: list[TransactionMetadata] = []
        for transactional_id, value in latest.items():
            if value is None or value.state == TxnState.DEAD:
                continue  # Kafka never writes Dead: the id expired
            if self.partition_for(transactional_id) != partition:
                continue  # not this partition's id: Kafka's cache would never look it up
            meta = TransactionMetadata.from_log(transactional_id, value)
            if meta.state == TxnState.PREPARE_EPOCH_FENCE:
                # never written by Kafka (the fence goes straight to PrepareAbort); an
                # interrupted fence is an ongoing transaction the timeout will abort
                meta.state = TxnState.ONGOING
            loaded.append(meta)
        del self.loading[partition]
        self.owned[partition] = epoch
        effects: list[Effect] = []
        for meta in loaded:
            self.txns[meta.transactional_id] = meta
        for meta in loaded:
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                effects += self._send_markers(now, meta, partition, epoch)
        return effects

    def unload(self, partition: int) -> list[Effect]:
        """Leadership of the partition moved away: forget its transactional ids, answer their
        waiting requests with NOT_COORDINATOR (the clients find the new coordinator), and stop
        caring about their markers."""
        self.loading.pop(partition, None)
        effects = self._drop_partition(partition)
        self.owned.pop(partition, None)
        return effects

    def _drop_partition(self, partition: int) -> list[Effect]:
        effects: list[Effect] = []
        for token, pa in list(self._appends.items()):
            if pa.partition == partition:
                del self._appends[token]
                effects += self._answer_failure(pa, ErrorCode.NOT_COORDINATOR)
        for token, pm in list(self._markers.items()):
            if pm.partition == partition:
                del self._markers[token]
        self._retries = [r for r in self._retries if r.append.partition != partition]
        for transactional_id in [t for t in self._waiting if self.partition_for(t) == partition]:
            for w in self._waiting.pop(transactional_id):
                effects += self._answer_waiting(w, ErrorCode.NOT_COORDINATOR)
        for transactional_id in [t for t in self.txns if self.partition_for(t) == partition]:
            del self.txns[transactional_id]
        return effects

    @staticmethod
    def _answer_waiting(w: _Waiting, code: ErrorCode) -> list[Effect]:
        return [Reply(w.ref, AddPartitionsResult(dict.fromkeys(w.request.partitions, code)))]

    def _epoch_of(self, transactional_id: str) -> int:
        return self.owned[self.partition_for(transactional_id)]

    # ----- InitProducerId ------------------------------------------------------------------

    def init_producer_id(self, now: int, ref: Any, req: InitPidRequest) -> list[Effect]:
        def fail(code: ErrorCode) -> list[Effect]:
            return [Reply(ref, InitPidResult(code))]

        transactional_id = req.transactional_id
        if not transactional_id:
            return fail(ErrorCode.INVALID_REQUEST)
        if (req.producer_id == NO_PRODUCER_ID) != (req.producer_epoch == NO_PRODUCER_EPOCH):
            return fail(ErrorCode.INVALID_REQUEST)
        timeout = req.transaction_timeout_ms
        if not 0 < timeout <= self.config.max_timeout_ms:
            return fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        err = self.coordinator_error(transactional_id)
        if err:
            return fail(err)
        expected = None if req.producer_id == NO_PRODUCER_ID else req.producer_epoch
        meta = self.txns.get(transactional_id)
        if meta is None:
            if req.fresh_producer_id < 0:
                return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            meta = TransactionMetadata.new(transactional_id, req.fresh_producer_id, timeout, now)
            self.txns[transactional_id] = meta
        if meta.pending_transition_in_progress:
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if expected is not None and not (
            meta.producer_epoch == NO_PRODUCER_EPOCH
            or req.producer_id == meta.producer_id
            or (req.producer_id == meta.last_producer_id and is_epoch_exhausted(expected))
        ):
            return fail(ErrorCode.PRODUCER_FENCED)
        state = meta.state
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if state == TxnState.ONGOING:
            # fence the producer: abort its transaction with a bumped epoch the client never
            # sees, answer CONCURRENT_TRANSACTIONS; its retry bumps the epoch again
            fence = meta.prepare_fence_producer_epoch()
            return self._end_transaction(
                now,
                transactional_id,
                fence.producer_id,
                fence.producer_epoch,
                commit=False,
                requester=_FENCE,
                ref=ref,
            )
        # Empty, CompleteCommit, CompleteAbort
        transit: TxnTransit | None
        if meta.is_producer_epoch_exhausted() and (
            expected is None or expected == meta.producer_epoch
        ):
            if req.fresh_producer_id < 0 or req.fresh_producer_id == meta.producer_id:
                return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            transit = meta.prepare_producer_id_rotation(
                req.fresh_producer_id, timeout, now, record_last_epoch=expected is not None
            )
        else:
            transit = meta.prepare_increment_producer_epoch(timeout, expected, now)
            if transit is None:
                return fail(ErrorCode.PRODUCER_FENCED)
        return self._append("init", meta, transit, ref=ref)

    # ----- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------

    def add_partitions(self, now: int, ref: Any, req: AddPartitionsRequest) -> list[Effect]:
        """Answers ``AddPartitionsResult`` with one error for every partition asked for, as
        Kafka does (PRODUCER_FENCED for a stale epoch: the API layer maps it to
        INVALID_PRODUCER_EPOCH for old request versions)."""
        partitions = tuple(req.partitions)

        def answer(code: ErrorCode) -> list[Effect]:
            return [Reply(ref, AddPartitionsResult({tp: code for tp in partitions}))]

        if not req.transactional_id:
            return answer(ErrorCode.INVALID_REQUEST)
        err = self.coordinator_error(req.transactional_id)
        if err:
            return answer(err)
        meta = self.txns.get(req.transactional_id)
        if meta is None or meta.producer_id != req.producer_id:
            return answer(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.producer_epoch != req.producer_epoch:
            return answer(ErrorCode.PRODUCER_FENCED)
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            # the previous transaction's markers and Complete* are being written. Kafka answers
            # CONCURRENT_TRANSACTIONS and the client retries after a back-off (librdkafka and
            # the Java client: 20 ms); waiting for Complete* instead (add_partitions_wait_ms)
            # starts the next transaction as soon as it may start, in the same order
            if self.config.add_partitions_wait_ms and partitions:
                due = now + self.config.add_partitions_wait_ms
                self._waiting.setdefault(req.transactional_id, []).append(_Waiting(due, ref, req))
                return []
            return answer(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.pending_transition_in_progress:
            return answer(ErrorCode.CONCURRENT_TRANSACTIONS)
        if not partitions:
            return answer(ErrorCode.NONE)  # nothing to add: no transaction is started
        added = frozenset(partitions)
        if meta.state == TxnState.ONGOING and added <= meta.partitions:
            return answer(ErrorCode.NONE)  # already in the transaction: no write needed
        transit = meta.prepare_add_partitions(added, now)
        return self._append("add", meta, transit, ref=ref, partitions=partitions)

    def verify_partitions(
        self,
        now: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """KIP-890 part 1 (AddPartitionsToTxn v4 verify-only, and the produce-side check):
        NONE for a partition of the producer's ongoing transaction (added and written),
        INVALID_TXN_STATE for one that is not; for the whole request INVALID_REQUEST,
        NOT_COORDINATOR/COORDINATOR_LOAD_IN_PROGRESS, INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED or CONCURRENT_TRANSACTIONS (while it commits or aborts), as Kafka's
        handleVerifyPartitionsInTransaction. No state changes."""
        tps = tuple(partitions)
        if not transactional_id:
            return dict.fromkeys(tps, ErrorCode.INVALID_REQUEST)
        err = self.coordinator_error(transactional_id)
        meta = self.txns.get(transactional_id)
        if not err:
            if meta is None or meta.producer_id != producer_id:
                err = ErrorCode.INVALID_PRODUCER_ID_MAPPING
            elif meta.producer_epoch != producer_epoch:
                err = ErrorCode.PRODUCER_FENCED
            elif meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                err = ErrorCode.CONCURRENT_TRANSACTIONS
        if err or meta is None:
            return dict.fromkeys(tps, err)
        return {
            tp: ErrorCode.NONE if tp in meta.partitions else ErrorCode.INVALID_TXN_STATE
            for tp in tps
        }

    # ----- EndTxn --------------------------------------------------------------------------

    def end_txn(self, now: int, ref: Any, req: EndTxnRequest) -> list[Effect]:
        if not req.transactional_id:
            return [Reply(ref, ErrorCode.INVALID_REQUEST)]
        return self._end_transaction(
            now,
            req.transactional_id,
            req.producer_id,
            req.producer_epoch,
            commit=req.commit,
            requester=_END,
            ref=ref,
        )

    def _end_transaction(
        self,
        now: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        requester: str,
        ref: Any,
    ) -> list[Effect]:
        """Kafka's endTransaction: validate, append Prepare*, and once written answer the
        requester and send the markers (``on_append_done``). ``requester`` is a client's
        EndTxn (exact epoch), or the coordinator's own abort for an epoch fence (a higher epoch
        is fine)."""
        from_client = requester == _END
        err = self.coordinator_error(transactional_id)
        meta = self.txns.get(transactional_id)
        if not err and meta is None:
            err = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if err or meta is None:
            return self._answer(requester, ref, err)
        state = meta.state
        if meta.producer_id != producer_id:
            err = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        elif (from_client and producer_epoch != meta.producer_epoch) or (
            producer_epoch < meta.producer_epoch
        ):
            err = ErrorCode.PRODUCER_FENCED
        elif meta.pending is not None and meta.pending != TxnState.PREPARE_EPOCH_FENCE:
            err = ErrorCode.CONCURRENT_TRANSACTIONS
        elif state == TxnState.ONGOING:
            epoch_fence = False
            if not commit and meta.pending == TxnState.PREPARE_EPOCH_FENCE:
                # the fence's bumped epoch takes effect now, before its PrepareAbort is written
                epoch_fence = True
                meta.pending = None
                meta.producer_epoch = producer_epoch
                meta.last_producer_epoch = NO_PRODUCER_EPOCH
            next_state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            transit = meta.prepare_abort_or_commit(next_state, now)
            return self._append(
                "prepare", meta, transit, ref=ref, requester=requester, epoch_fence=epoch_fence
            )
        elif state == TxnState.COMPLETE_COMMIT:
            err = ErrorCode.NONE if commit else ErrorCode.INVALID_TXN_STATE
        elif state == TxnState.COMPLETE_ABORT:
            err = ErrorCode.INVALID_TXN_STATE if commit else ErrorCode.NONE
        elif state == TxnState.PREPARE_COMMIT:
            err = ErrorCode.CONCURRENT_TRANSACTIONS if commit else ErrorCode.INVALID_TXN_STATE
        elif state == TxnState.PREPARE_ABORT:
            err = ErrorCode.INVALID_TXN_STATE if commit else ErrorCode.CONCURRENT_TRANSACTIONS
        else:  # Empty (Dead and PrepareEpochFence are never current states)
            err = ErrorCode.INVALID_TXN_STATE
        if meta.pending == TxnState.PREPARE_EPOCH_FENCE:
            meta.pending = None  # the fence could not go on (never with Kafka's callers)
        return self._answer(requester, ref, err)

    def _answer(self, requester: str, ref: Any, error: ErrorCode) -> list[Effect]:
        """The outcome of an end of transaction, to whoever asked for it."""
        if requester == _END:
            return [Reply(ref, error)]
        if requester == _FENCE:
            # InitProducerId: the abort is under way, the client retries (and gets a new epoch)
            return [Reply(ref, InitPidResult(error or ErrorCode.CONCURRENT_TRANSACTIONS))]
        return []  # a timed-out transaction's abort: nobody waits

    # ----- appends -------------------------------------------------------------------------

    def _append(
        self,
        kind: str,
        meta: TransactionMetadata,
        transit: TxnTransit,
        *,
        ref: Any = None,
        requester: str = _END,
        epoch_fence: bool = False,
        partitions: tuple[TopicPartition, ...] = (),
    ) -> list[Effect]:
        partition = self.partition_for(meta.transactional_id)
        pa = _PendingAppend(
            kind,
            meta.transactional_id,
            partition,
            self.owned[partition],
            transit,
            ref=ref,
            requester=requester,
            epoch_fence=epoch_fence,
            partitions=partitions,
        )
        return [self._issue(pa)]

    def _issue(self, pa: _PendingAppend) -> AppendTxnLog:
        token = next(self._tokens)
        self._appends[token] = pa
        value = None if pa.transit.state == TxnState.DEAD else pa.transit.to_log_value()
        return AppendTxnLog(pa.partition, pa.transactional_id, value, token)

    def on_append_done(self, now: int, token: int, error: ErrorCode) -> list[Effect]:
        pa = self._appends.pop(token, None)
        if pa is None:
            return []  # its partition was unloaded meanwhile; already answered
        meta = self.txns.get(pa.transactional_id)
        if (
            meta is None
            or self.owned.get(pa.partition) != pa.coordinator_epoch
            or meta.pending != pa.transit.state
        ):
            # not expected (unload drops the tokens), but never apply a stale transition
            return self._answer_failure(pa, ErrorCode.NOT_COORDINATOR)
        if error:
            code = _txn_append_error(error)
            if pa.kind == "complete" and code == ErrorCode.COORDINATOR_NOT_AVAILABLE:
                # the markers are written: keep the pending Complete* and write it again
                self._retries.append(_Retry(now + self.config.complete_retry_backoff_ms, token, pa))
                return []
            meta.pending = None
            if pa.kind == "prepare" and pa.epoch_fence:
                # the bumped epoch stays (it fences the old producer here) but was never given
                # out: the next fence does not bump again
                meta.has_failed_epoch_fence = True
            return self._answer_failure(pa, code)
        if pa.kind == "expire":
            del self.txns[pa.transactional_id]
            return []
        meta.complete_transition(pa.transit)
        if pa.kind == "init":
            t = pa.transit
            return [Reply(pa.ref, InitPidResult(ErrorCode.NONE, t.producer_id, t.producer_epoch))]
        if pa.kind == "add":
            return [
                Reply(pa.ref, AddPartitionsResult(dict.fromkeys(pa.partitions, ErrorCode.NONE)))
            ]
        if pa.kind == "prepare":
            # written: the outcome is decided. Answer, then write the markers.
            effects = self._answer(pa.requester, pa.ref, ErrorCode.NONE)
            effects += self._send_markers(now, meta, pa.partition, pa.coordinator_epoch)
            return effects
        # "complete": the transaction is over; a held AddPartitionsToTxn may start the next
        effects = []
        for w in self._waiting.pop(pa.transactional_id, []):
            effects += self.add_partitions(now, w.ref, w.request)
        return effects

    def _answer_failure(self, pa: _PendingAppend, code: ErrorCode) -> list[Effect]:
        if pa.kind == "init":
            return [Reply(pa.ref, InitPidResult(code))]
        if pa.kind == "add":
            return [Reply(pa.ref, AddPartitionsResult(dict.fromkeys(pa.partitions, code)))]
        if pa.kind == "prepare":
            return self._answer(pa.requester, pa.ref, code)
        return []  # "complete", "expire": nobody waits

    # ----- markers -------------------------------------------------------------------------

    def _send_markers(
        self, now: int, meta: TransactionMetadata, partition: int, coordinator_epoch: int
    ) -> list[Effect]:
        """The transaction is in Prepare*: prepare Complete* and write the markers."""
        commit = meta.state == TxnState.PREPARE_COMMIT
        partitions = tuple(sorted(meta.partitions))
        transit = meta.prepare_complete(now)
        if not partitions:
            # nothing to mark (Kafka's maybeWriteTxnCompletion with no partition left)
            pa = _PendingAppend(
                "complete", meta.transactional_id, partition, coordinator_epoch, transit
            )
            return [self._issue(pa)]
        token = next(self._tokens)
        self._markers[token] = _PendingMarkers(
            meta.transactional_id, partition, coordinator_epoch, transit, commit
        )
        return [
            SendMarkers(
                token,
                meta.transactional_id,
                meta.producer_id,
                meta.producer_epoch,
                commit,
                coordinator_epoch,
                partitions,
            )
        ]

    def on_markers_done(self, now: int, token: int, error: ErrorCode) -> list[Effect]:
        """Every marker is written (NONE): append Complete*. An error means the shell gave up
        because this broker no longer coordinates: as Kafka, the transaction stays in Prepare*
        with Complete* pending here, for the next coordinator's load to finish it."""
        pm = self._markers.pop(token, None)
        if pm is None:
            return []
        meta = self.txns.get(pm.transactional_id)
        if (
            error
            or meta is None
            or self.owned.get(pm.partition) != pm.coordinator_epoch
            or meta.pending != pm.transit.state
        ):
            return []
        pa = _PendingAppend(
            "complete", pm.transactional_id, pm.partition, pm.coordinator_epoch, pm.transit
        )
        return [self._issue(pa)]

    # ----- describe / list -----------------------------------------------------------------

    def describe_transactions(self, ids: list[str]) -> list[TxnDescription]:
        out: list[TxnDescription] = []
        for transactional_id in ids:
            if not transactional_id:
                out.append(TxnDescription(transactional_id, ErrorCode.INVALID_REQUEST))
                continue
            err = self.coordinator_error(transactional_id)
            meta = self.txns.get(transactional_id)
            if err:
                out.append(TxnDescription(transactional_id, err))
            elif meta is None or meta.state == TxnState.DEAD:
                out.append(TxnDescription(transactional_id, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND))
            else:
                out.append(
                    TxnDescription(
                        transactional_id,
                        ErrorCode.NONE,
                        meta.state.kafka_name,
                        meta.producer_id,
                        meta.producer_epoch,
                        meta.timeout_ms,
                        meta.start_ms,
                        tuple(sorted(meta.partitions)),
                    )
                )
        return out

    def list_error(self) -> ErrorCode:
        """ListTransactions' top-level error: COORDINATOR_LOAD_IN_PROGRESS while a partition
        loads (Kafka then lists nothing), else NONE."""
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.loading else ErrorCode.NONE

    def list_transactions(
        self, states: set[str] | None = None, producer_ids: set[int] | None = None
    ) -> list[TxnListing]:
        """The owned transactional ids matching both filters (empty or None: no filter), as
        Kafka's listTransactionStates; a state name Kafka does not know matches nothing (see
        ``unknown_state_filters``). Empty while a partition loads (``list_error``)."""
        if self.loading:
            return []
        wanted = {TxnState.from_kafka_name(s) for s in states or ()}
        return [
            TxnListing(meta.transactional_id, meta.producer_id, meta.state.kafka_name)
            for meta in self.txns.values()
            if meta.state != TxnState.DEAD
            and (not producer_ids or meta.producer_id in producer_ids)
            and (not states or meta.state in wanted)
        ]

    @staticmethod
    def unknown_state_filters(states: set[str] | None) -> list[str]:
        """ListTransactions' ``unknown_state_filters``: the names that are not states."""
        return sorted(s for s in states or () if TxnState.from_kafka_name(s) is None)

    # ----- time ----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        deadlines = [r.due for r in self._retries]
        deadlines += [w.due for ws in self._waiting.values() for w in ws]
        if any(m.state == TxnState.ONGOING and m.pending is None for m in self.txns.values()):
            deadlines.append(self._next_abort_check)
        if self.txns:
            deadlines.append(self._next_expire_check)
        return min(deadlines) if deadlines else None

    def tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        if now >= self._next_abort_check:
            self._next_abort_check = now + self.config.abort_timed_out_interval_ms
            effects += self._abort_timed_out(now)
        if now >= self._next_expire_check:
            self._next_expire_check = now + self.config.remove_expired_interval_ms
            effects += self._expire_ids(now)
        for transactional_id, waiting in list(self._waiting.items()):
            # still not complete (its markers cannot be written yet): let the client retry
            for w in [w for w in waiting if w.due <= now]:
                waiting.remove(w)
                effects += self._answer_waiting(w, ErrorCode.CONCURRENT_TRANSACTIONS)
            if not waiting:
                del self._waiting[transactional_id]
        due = [r for r in self._retries if r.due <= now]
        self._retries = [r for r in self._retries if r.due > now]
        for r in sorted(due):
            meta = self.txns.get(r.append.transactional_id)
            if (
                meta is not None
                and self.owned.get(r.append.partition) == r.append.coordinator_epoch
                and meta.pending == r.append.transit.state
            ):
                effects.append(self._issue(r.append))
        return effects

    def _abort_timed_out(self, now: int) -> list[Effect]:
        """Kafka's abortTimedOutTransactions: an Ongoing transaction older than its timeout
        is aborted with a bumped epoch (KIP-360), fencing its producer."""
        effects: list[Effect] = []
        for meta in list(self.txns.values()):
            if (
                meta.state == TxnState.ONGOING
                and meta.pending is None
                and meta.start_ms + meta.timeout_ms < now
            ):
                fence = meta.prepare_fence_producer_epoch()
                effects += self._end_transaction(
                    now,
                    meta.transactional_id,
                    fence.producer_id,
                    fence.producer_epoch,
                    commit=False,
                    requester=_TIMEOUT,
                    ref=None,
                )
        return effects

    def _expire_ids(self, now: int) -> list[Effect]:
        """transactional.id.expiration.ms: an id idle that long (Empty or Complete*, nothing
        pending) gets a tombstone, and is forgotten once it is written."""
        effects: list[Effect] = []
        horizon = now - self.config.id_expiration_ms
        for meta in list(self.txns.values()):
            if (
                meta.pending is None
                and meta.state in EXPIRATION_ALLOWED
                and meta.last_update_ms <= horizon
            ):
                effects += self._append("expire", meta, meta.prepare_dead())
        return effects


def _txn_append_error(error: ErrorCode) -> ErrorCode:
    """Kafka's TransactionStateManager.appendTransactionToLog mapping: a timeout is
    COORDINATOR_NOT_AVAILABLE too (the client retries), a record too large an unknown error."""
    return _append_error(
        error,
        timed_out=ErrorCode.COORDINATOR_NOT_AVAILABLE,
        too_large=ErrorCode.UNKNOWN_SERVER_ERROR,
    )
