"""One transactional id's state and its legal transitions (Kafka's TransactionMetadata).

A transition is two steps, as in Kafka: ``prepare_*`` checks it is legal from the current
state, records the target state as ``pending`` and returns a ``TxnTransit`` (the whole next
state, which the coordinator appends to ``__transaction_state``); once the append is
acknowledged ``complete_transition`` makes it the current state. While a transition is pending
no other may be prepared. A failed append just clears ``pending``.

The one thing changed before its append is the producer epoch of an epoch fence (an
InitProducerId that finds a transaction ongoing, or a transaction past its timeout): as Kafka
does, the bumped epoch is set at once so the old producer is fenced at this coordinator while
its PrepareAbort is being written; if that write fails, ``has_failed_epoch_fence`` keeps the next
fence from bumping again (that epoch was never given to a client).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from isrlab.broker.coordinator.transaction.records import TxnLogValue, TxnState

TopicPartition = tuple[str, int]

#: RecordBatch.NO_PRODUCER_ID / NO_PRODUCER_EPOCH
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Short.MaxValue: a producer id's epochs are spent at MAX_EPOCH - 1 (the last one is kept so
#: the coordinator can always fence), and a new producer id is given out (KIP-360).
MAX_EPOCH = 2**15 - 1

#: Kafka's name for the type; the states are records.TxnState (their on-disk status bytes).
TransactionState = TxnState

_S = TxnState
#: Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_ABORT, _S.COMPLETE_COMMIT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}
#: States whose transactional id may expire (transactional.id.expiration.ms).
EXPIRATION_ALLOWED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})


class IllegalTransition(Exception):
    """A transition Kafka's TransactionMetadata refuses with IllegalStateException: a bug in
    the caller, never a client's doing (clients get error codes before any prepare)."""


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka's TransactionMetadata.isEpochExhausted."""
    return epoch >= MAX_EPOCH - 1


def _log_value(m: TxnTransit | TransactionMetadata) -> TxnLogValue:
    """A transition's target, or a transaction's current state, as its record."""
    return TxnLogValue(
        producer_id=m.producer_id,
        producer_epoch=m.producer_epoch,
        timeout_ms=m.timeout_ms,
        state=m.state,
        partitions=tuple(sorted(m.partitions)),
        last_update_ms=m.last_update_ms,
        start_ms=m.start_ms,
    )


@dataclass(frozen=True)
class TxnTransit:
    """The target of a transition (Kafka's TxnTransitMetadata)."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int

    def to_log_value(self) -> TxnLogValue:
        return _log_value(self)


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    #: the state a prepared transition leads to, until its append is done or failed
    pending: TxnState | None = None
    has_failed_epoch_fence: bool = False

    @classmethod
    def new(
        cls, transactional_id: str, producer_id: int, timeout_ms: int, now: int
    ) -> TransactionMetadata:
        """A transactional id seen for the first time: Empty, no epoch yet."""
        return cls(
            transactional_id,
            producer_id,
            NO_PRODUCER_ID,
            NO_PRODUCER_EPOCH,
            NO_PRODUCER_EPOCH,
            timeout_ms,
            TxnState.EMPTY,
            set(),
            -1,
            now,
        )

    @classmethod
    def from_log(cls, transactional_id: str, v: TxnLogValue) -> TransactionMetadata:
        """As Kafka's TransactionLog.readTxnRecordValue: the last producer id and epoch are not
        in the record (v0) and load as -1."""
        return cls(
            transactional_id,
            v.producer_id,
            NO_PRODUCER_ID,
            v.producer_epoch,
            NO_PRODUCER_EPOCH,
            v.timeout_ms,
            v.state,
            set() if v.state == TxnState.EMPTY else set(v.partitions),
            v.start_ms,
            v.last_update_ms,
        )

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending is not None

    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    def has_pending_transaction(self) -> bool:
        return self.state in (TxnState.ONGOING, TxnState.PREPARE_ABORT, TxnState.PREPARE_COMMIT)

    # ----- prepare -------------------------------------------------------------------------

    def prepare_fence_producer_epoch(self) -> TxnTransit:
        """PrepareEpochFence: the epoch goes up by one (not again after a failed fence)."""
        if self.producer_epoch == MAX_EPOCH:
            raise IllegalTransition(
                f"{self.transactional_id}: cannot fence epoch {MAX_EPOCH}, it would overflow"
            )
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(
            TxnState.PREPARE_EPOCH_FENCE,
            self.producer_id,
            bumped,
            NO_PRODUCER_EPOCH,
            self.timeout_ms,
            frozenset(self.partitions),
            self.start_ms,
            self.last_update_ms,
        )

    def prepare_increment_producer_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now: int
    ) -> TxnTransit | None:
        """InitProducerId on an Empty/Complete* id (KIP-360 when ``expected_epoch`` is given):
        the next epoch, or the current one for a retry of the last bump; None when the expected
        epoch is fenced (PRODUCER_FENCED)."""
        if self.is_producer_epoch_exhausted():
            raise IllegalTransition(
                f"{self.transactional_id}: no more epochs for producer id {self.producer_id}"
            )
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            nxt, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            nxt, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            nxt, last = self.producer_epoch, self.last_producer_epoch  # a retried bump
        else:
            return None
        return self._prepare(
            TxnState.EMPTY, self.producer_id, nxt, last, timeout_ms, frozenset(), -1, now
        )

    def prepare_producer_id_rotation(
        self, new_producer_id: int, timeout_ms: int, now: int, record_last_epoch: bool
    ) -> TxnTransit:
        """The epochs of the producer id are spent: a new producer id at epoch 0."""
        if self.has_pending_transaction():
            raise IllegalTransition(
                f"{self.transactional_id}: cannot rotate producer ids in state {self.state.kafka_name}"
            )
        last = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._prepare(
            TxnState.EMPTY, new_producer_id, 0, last, timeout_ms, frozenset(), -1, now
        )

    def prepare_add_partitions(self, added: frozenset[TopicPartition], now: int) -> TxnTransit:
        start = (
            now
            if self.state in (TxnState.EMPTY, TxnState.COMPLETE_ABORT, TxnState.COMPLETE_COMMIT)
            else self.start_ms
        )
        return self._prepare(
            TxnState.ONGOING,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(self.partitions) | added,
            start,
            now,
        )

    def prepare_abort_or_commit(self, new_state: TxnState, now: int) -> TxnTransit:
        return self._prepare(
            new_state,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(self.partitions),
            self.start_ms,
            now,
        )

    def prepare_complete(self, now: int) -> TxnTransit:
        """CompleteCommit/CompleteAbort once the markers are written."""
        new_state = (
            TxnState.COMPLETE_COMMIT
            if self.state == TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        self.has_failed_epoch_fence = False  # the fence made it to the log
        return self._prepare(
            new_state,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(),
            self.start_ms,
            now,
        )

    def prepare_dead(self) -> TxnTransit:
        """The id expires: a tombstone is written, then the id is forgotten."""
        return self._prepare(
            TxnState.DEAD,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(),
            self.start_ms,
            self.last_update_ms,
        )

    def _prepare(
        self,
        state: TxnState,
        producer_id: int,
        epoch: int,
        last_epoch: int,
        timeout_ms: int,
        partitions: frozenset[TopicPartition],
        start_ms: int,
        now: int,
    ) -> TxnTransit:
        if self.pending is not None:
            raise IllegalTransition(
                f"{self.transactional_id}: preparing {state.kafka_name} while "
                f"{self.pending.kafka_name} is pending"
            )
        if producer_id < 0:
            raise IllegalTransition(f"{self.transactional_id}: illegal producer id {producer_id}")
        if state != TxnState.DEAD and epoch < 0:
            raise IllegalTransition(f"{self.transactional_id}: illegal producer epoch {epoch}")
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTransition(
                f"{self.transactional_id}: {state.kafka_name} cannot follow {self.state.kafka_name}"
            )
        self.pending = state
        return TxnTransit(
            producer_id=producer_id,
            last_producer_id=self.producer_id,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            timeout_ms=timeout_ms,
            state=state,
            partitions=partitions,
            start_ms=start_ms,
            last_update_ms=now,
        )

    # ----- complete ------------------------------------------------------------------------

    def complete_transition(self, t: TxnTransit) -> None:
        """The transition's record is acknowledged: make it the current state (Kafka's
        completeTransitionTo, with its checks)."""
        if self.pending is None:
            raise IllegalTransition(
                f"{self.transactional_id}: completing {t.state.kafka_name} with nothing pending"
            )
        if self.pending != t.state:
            self._fail(t)
        same_producer = (
            t.producer_epoch == self.producer_epoch and t.producer_id == self.producer_id
        )
        if t.state == TxnState.EMPTY:  # InitProducerId
            bump = t.producer_epoch == self.producer_epoch + 1 or (
                t.producer_epoch == 0 and t.producer_id != self.producer_id
            )
            if (
                (t.producer_epoch != self.producer_epoch and not bump)
                or t.partitions
                or t.start_ms != -1
            ):
                self._fail(t)
            self.timeout_ms = t.timeout_ms
            self.producer_epoch = t.producer_epoch
            self.last_producer_epoch = t.last_producer_epoch
            self.producer_id = t.producer_id
            self.last_producer_id = t.last_producer_id
            # Kafka keeps the previous transaction's start in memory until a reload reads the
            # record's -1; here the state is what the record says from the start
            self.start_ms = t.start_ms
        elif t.state == TxnState.ONGOING:  # AddPartitionsToTxn
            if (
                not same_producer
                or not self.partitions <= t.partitions
                or self.timeout_ms != t.timeout_ms
            ):
                self._fail(t)
            self.start_ms = t.start_ms
            self.partitions |= t.partitions
        elif t.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):  # EndTxn
            if (
                not same_producer
                or self.partitions != t.partitions
                or self.timeout_ms != t.timeout_ms
                or self.start_ms != t.start_ms
            ):
                self._fail(t)
        elif t.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):  # markers written
            if not same_producer or self.timeout_ms != t.timeout_ms or t.start_ms == -1:
                self._fail(t)
            self.start_ms = t.start_ms
            self.partitions.clear()
        else:  # PrepareEpochFence and Dead are never completed
            self._fail(t)
        self.last_update_ms = t.last_update_ms
        self.pending = None
        self.state = t.state

    def _fail(self, t: TxnTransit) -> None:
        raise IllegalTransition(
            f"{self.transactional_id}: transition from {self.state.kafka_name} to {t} refused"
        )

    def to_log_value(self) -> TxnLogValue:
        """The current state as a record (what a reload would rebuild)."""
        return _log_value(self)
