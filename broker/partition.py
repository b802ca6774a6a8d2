"""One hosted partition: the on-disk `Log`, idempotent-producer state and the sans-IO replication
core (`broker.replication.Partition`), with the IO those need (Kafka's `Partition` + `UnifiedLog`
glue).

Every replication decision is the core's, taken in the very methods the hypothesis state machines
drive: produce admission and completion (leader?, |ISR| against min.insync.replicas, acks) in
`on_produce`, leader epoch checks (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH), fetch bounds
(follower: LEO, consumer: HW or LSO) and offset range in `on_fetch`, HW, ISR shrink/expand, leader
or follower in `become_leader_or_follower`, follower truncation. This shell compares no offsets,
epochs or ISR sizes itself; it
- adapts `broker.log.log.Log` to the core's `ReplicaLog` protocol (`LogAdapter`), whose leader
  append validates the batch and checks producer sequences (a refusal is raised through the core
  and mapped to the produce's error here; a duplicate answers with its original offsets) and keeps
  producer state in step with the log (rebuilt after truncation),
- turns the core's actions into IO through a `PartitionIO` (the ReplicaManager): resolving produce
  futures, sending follower requests, writing the state znode, reading the range a FetchResponse
  names from the log,
- wakes long-polling fetches whenever the high watermark or the log end moves.

A standalone broker uses the very same path: it becomes leader of every partition with ISR = {self}.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from isrlab.broker import clock
from isrlab.broker.errors import ErrorCode
from isrlab.broker.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
)
from isrlab.broker.log.inventory import record_truncation
from isrlab.broker.log.log import AppendOrigin, FetchDataInfo, Log
from isrlab.broker.log.producer_state import (
    CompletedTxn,
    DuplicateBatch,
    ProducerStateError,
    ProducerStateManager,
    batch_marker,
)
from isrlab.broker.log.record_batch import validate
from isrlab.broker.rate_limited_log import RateLimitedLog
from isrlab.broker.replication import (
    Action,
    FetchResponse,
    LeaderAndIsr,
    Partition,
    ProduceResponse,
    ReplicationConfig,
    SendFetch,
    SendOffsetsForLeaderEpoch,
    TopicPartition,
    WriteStateZnode,
    follower_error,
)

log = logging.getLogger(__name__)

#: a tick time after any other
_NEVER = 1 << 62
#: topic (and broker default) config key of the historic switch: false accepts batches and
#: markers of zombie producers (an older epoch) instead of INVALID_PRODUCER_EPOCH
EPOCH_FENCING_KEY = "transaction.producer.epoch.fencing.enable"
# a full disk fails every append: one line per partition and 10 s, with the count dropped
_storage_errors = RateLimitedLog(log)


def now_ms() -> int:
    return clock.monotonic_ms()


class LogAdapter:
    """`broker.log.log.Log` seen through the replication core's `ReplicaLog` protocol."""

    def __init__(self, log_: Log, owner: HostedPartition, hw_checkpoint: int):
        self.log = log_
        self.owner = owner
        self._hw_checkpoint = hw_checkpoint
        #: who the leader append in progress is from: the core's on_produce is synchronous, so
        #: HostedPartition.append sets this for the duration of the call
        self.origin = AppendOrigin.CLIENT

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def hw_checkpoint(self) -> int:
        return self._hw_checkpoint

    @hw_checkpoint.setter
    def hw_checkpoint(self, value: int) -> None:
        # the core sets this whenever the HW moves: completed transactions whose marker is
        # now below it stop holding the LSO back
        self._hw_checkpoint = value
        self.owner.producer_state.on_high_watermark_updated(value)

    def first_unstable_offset(self) -> int | None:
        return self.owner.producer_state.first_unstable_offset()

    def latest_epoch(self) -> int:
        latest = self.log.leader_epoch_cache.latest_epoch
        return -1 if latest is None else int(latest)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.log.leader_epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        self.log.leader_epoch_cache.assign(epoch, start_offset)

    def truncate_to(self, offset: int) -> None:
        if offset < self.log.log_end_offset:
            log.warning(
                "%s: truncating log from %d to %d", self.owner.name, self.log.log_end_offset, offset
            )
            self._journal(offset, "truncate")
            self.log.truncate_to(offset)
            self.owner.reload_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        log.warning("%s: truncating fully, restarting at %d", self.owner.name, offset)
        self._journal(self.log.log_start_offset, "truncate-fully")
        self.log.truncate_fully_and_start_at(offset)
        self.owner.reload_producer_state()

    def _journal(self, offset: int, kind: str) -> None:
        """The records about to be cut, in the log directory's truncation journal
        (broker.log.inventory: what explains a write no client could find)."""
        if offset < self.log.log_end_offset:
            record_truncation(
                self.log.dir,
                self.log.topic,
                self.log.partition,
                self.log.log_end_offset,
                offset,
                getattr(getattr(self.owner, "core", None), "leader_epoch", -1),
                kind,
            )

    def append_as_leader(self, records: Any, leader_epoch: int) -> tuple[int, int]:
        """Validate one produced batch, check its producer sequence and append it; raises
        InvalidRecordError / ProducerStateError / a storage error when refused, returns the
        original offsets of a duplicate without appending.

        ``self.origin`` says who appends: a client (control batches refused, sequences
        checked) or the broker's own coordinators (transaction markers and transactional
        offset commits: producer epochs checked, no sequences)."""
        origin = self.origin
        headers = validate(records)
        if len(headers) != 1:
            raise InvalidRecordError(
                "a produce request must carry exactly one record batch per partition, "
                f"not {len(headers)}"
            )
        header = headers[0]
        if origin is AppendOrigin.CLIENT and header.is_control:
            raise InvalidRecordError(
                "the batch is a control batch (a transaction marker); clients may not write those"
            )
        marker = batch_marker(records, header)  # InvalidRecordError if malformed
        if header.is_control and (marker is None or header.producer_id < 0):
            raise InvalidRecordError(
                "a control batch must be a transaction marker (ABORT or COMMIT) of a producer"
            )
        producer_state = self.owner.producer_state
        try:
            producer_state.check(header, origin=origin, marker=marker)
        except DuplicateBatch as dup:
            return dup.first_offset, dup.last_offset
        # the batch is validated once, here: the log is handed the headers
        info = self.log.append_as_leader(records, leader_epoch, origin=origin, validated=headers)
        producer_state.apply(records, info.batches, self._index_aborted)
        return info.first_offset, info.last_offset

    def append_as_follower(self, records: Any) -> None:
        info = self.log.append_as_follower(records)
        self.owner.producer_state.apply(records, info.batches, self._index_aborted)

    def _index_aborted(self, txn: CompletedTxn, last_stable_offset: int) -> None:
        self.log.append_aborted_txn(
            txn.producer_id, txn.first_offset, txn.last_offset, last_stable_offset
        )


class PartitionIO(Protocol):
    """What a partition asks of its broker (implemented by the ReplicaManager)."""

    def send_fetch(self, partition: HostedPartition, action: SendFetch) -> None: ...

    def send_offsets_for_leader_epoch(
        self, partition: HostedPartition, action: SendOffsetsForLeaderEpoch
    ) -> None: ...

    def write_state(self, partition: HostedPartition, action: WriteStateZnode) -> None: ...

    def data_changed(self, partition: HostedPartition) -> None: ...

    def role_changed(self, partition: HostedPartition) -> None: ...


@dataclass
class AppendResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    last_offset: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class ReadResult:
    error: ErrorCode = ErrorCode.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    data: FetchDataInfo | None = None
    #: read_committed: (producer id, first offset) of the aborted transactions overlapping
    #: the data (FetchResponse v4+ aborted_transactions); None for read_uncommitted
    aborted_transactions: list[tuple[int, int]] | None = None

    @property
    def size(self) -> int:
        return self.data.size if self.data is not None else 0


_BROKER_ERRORS: dict[int, ErrorCode] = {int(e): e for e in ErrorCode}


def _broker_error(error: int) -> ErrorCode:
    """The broker's ErrorCode of the replication core's (another enum of the same codes)."""
    code = _BROKER_ERRORS.get(error)
    return code if code is not None else ErrorCode(int(error))


class HostedPartition:
    def __init__(
        self,
        tp: tuple[str, int],
        log_: Log,
        broker_id: int,
        config: dict[str, Any],
        replication: ReplicationConfig,
        io: PartitionIO,
        hw_checkpoint: int = 0,
    ):
        self.tp = tp
        self.name = f"{tp[0]}-{tp[1]}"
        self.log = log_
        self.broker_id = broker_id
        self.config = config
        self.io = io
        self.producer_state = ProducerStateManager(
            log_.dir, epoch_fencing=bool(config.get(EPOCH_FENCING_KEY, True))
        )
        log_.on_roll = self._on_roll
        #: KIP-890 verification in flight per producer id (broker/apis/txn.py): a marker for the
        #: producer removes its entry, so a produce verified before the marker is not appended
        self.verification_guards: dict[int, object] = {}
        self.reload_producer_state()
        self.adapter = LogAdapter(log_, self, hw_checkpoint)
        self.core = Partition(TopicPartition(*tp), broker_id, self.adapter, replication)
        self.producer_state.on_high_watermark_updated(self.core.high_watermark)
        self.replicas: list[int] = [broker_id]
        self._ids = itertools.count(1)
        self._produce_futures: dict[int, asyncio.Future[AppendResult]] = {}
        #: the request id of the append in progress (`append`) and its answer, if the core
        #: gave it in that call's actions
        self._appending: int | None = None
        self._answered: AppendResult | None = None
        self._last_hw = -1
        #: when `tick` next runs the core's tick (0: at the next call)
        self._tick_at = 0

    # ----- state ----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.core.is_leader

    @property
    def leader_id(self) -> int:
        return self.core.leader_id

    @property
    def leader_epoch(self) -> int:
        return self.core.leader_epoch

    @property
    def isr(self) -> list[int]:
        return list(self.core.isr)

    @property
    def high_watermark(self) -> int:
        return self.core.high_watermark

    @property
    def last_stable_offset(self) -> int:
        return self.core.last_stable_offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.adapter.end_offset_for_epoch(epoch)

    def fetch_has_answer(self, interest: Any) -> bool:
        """Whether a fetch waiting for data (``interest``: replica id, fetch offset, current
        leader epoch, read_committed) would now get records or an error: the core decides."""
        return self.core.fetch_has_answer(*interest)

    def become(self, state: LeaderAndIsr, replicas: list[int]) -> None:
        """Apply a partition state from the controller (via ZooKeeper) or standalone start-up."""
        self.replicas = list(replicas)
        core = self.core
        before = (core.role, core.leader_id, core.leader_epoch)
        leo = self.log.log_end_offset
        self._tick_at = 0
        actions = core.become_leader_or_follower(state, replicas, now_ms())
        if (core.role, core.leader_id, core.leader_epoch) != before:  # not a stale state
            if core.is_leader:
                log.info(
                    "%s: becoming leader at epoch %d, ISR %s, LEO %d, HW %d",
                    self.name,
                    core.leader_epoch,
                    list(core.isr),
                    leo,
                    core.high_watermark,
                )
            else:
                log.info(
                    "%s: following %d at epoch %d (LEO %d)",
                    self.name,
                    core.leader_id,
                    core.leader_epoch,
                    leo,
                )
        self.dispatch(actions)
        if (core.role, core.leader_id, core.leader_epoch) != before:
            self.io.role_changed(self)

    def reload_producer_state(self) -> None:
        """Newest snapshot, then replay the log past it (after open or truncation); the
        .txnindex files recovery rescanned are rebuilt on the way."""
        self.producer_state.load(self.log)
        core = getattr(self, "core", None)
        if core is not None:
            self.producer_state.on_high_watermark_updated(core.high_watermark)

    def _on_roll(self, new_base: int) -> None:
        """Snapshot the producer state at every new segment (Kafka does too), so a reload
        replays at most the active segment."""
        try:
            self.producer_state.take_snapshot()
        except OSError as e:
            log.warning(
                "%s: could not write the producer snapshot at %d: %s", self.name, new_base, e
            )

    # ----- actions --------------------------------------------------------------------------

    def dispatch(self, actions: list[Action]) -> None:
        self._tick_at = 0  # the core had an input: its next tick is due at once
        hw_before = self._last_hw
        for a in actions:
            if isinstance(a, ProduceResponse):
                if a.request_id == self._appending:  # the append on the stack: `append`
                    self._answered = self._append_result(a)
                    continue
                fut = self._produce_futures.pop(a.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(self._append_result(a))
            elif isinstance(a, SendFetch):
                self.io.send_fetch(self, a)
            elif isinstance(a, SendOffsetsForLeaderEpoch):
                self.io.send_offsets_for_leader_epoch(self, a)
            elif isinstance(a, WriteStateZnode):
                self.io.write_state(self, a)
            elif isinstance(a, FetchResponse):
                pass  # fetches are answered by the fetch handler, which polls instead of parking
        hw = self.core.high_watermark
        if hw != hw_before:
            self._last_hw = hw
            self.adapter.hw_checkpoint = hw
            self.io.data_changed(self)

    def _append_result(self, a: ProduceResponse) -> AppendResult:
        return AppendResult(
            _broker_error(a.error),
            a.base_offset,
            a.last_offset,
            self.log.log_start_offset,
            message=a.message,
        )

    def tick(self) -> None:
        """Time passed: the core's tick, skipped before the earliest time it could act
        (`Partition.next_tick_ms`; any input to the core, through `dispatch` or `become`,
        makes the next call tick again)."""
        now = now_ms()
        if now < self._tick_at:
            return
        self.dispatch(self.core.tick(now))
        at = self.core.next_tick_ms(now)
        self._tick_at = _NEVER if at is None else at

    # ----- produce --------------------------------------------------------------------------

    def append(
        self,
        records: memoryview,
        acks: int,
        timeout_ms: int,
        *,
        origin: str | AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendResult | asyncio.Future[AppendResult]:
        """Produce to this partition: the core admits, appends (through `LogAdapter`) and
        answers; the result is ready now or, for acks=all, when the core completes it.

        ``origin``: "client" (a Produce request) or "coordinator" (the broker's transaction
        or group coordinator: transaction markers, transactional offset commits)."""
        if origin is not AppendOrigin.CLIENT:
            origin = AppendOrigin(origin)  # ValueError for anything else: a caller's bug
        request_id = next(self._ids)
        # An answer among the core's actions of this very call is taken by `dispatch` into
        # `_answered`; a future is made only for one that comes later (acks=all). (The
        # previous pair is put back afterwards, should an append ever run inside another.)
        outer = self._appending, self._answered
        self._appending, self._answered = request_id, None
        log_ = self.log
        try:
            leo = log_.log_end_offset
            self.adapter.origin = origin
            try:
                actions = self.core.on_produce(request_id, records, acks, timeout_ms, now_ms())
            except (ProducerStateError, LogError, OSError) as e:
                return self._refused(e)
            finally:
                self.adapter.origin = AppendOrigin.CLIENT
            if log_.log_end_offset != leo:
                self.io.data_changed(self)
            self.dispatch(actions)
            answered = self._answered
        finally:
            self._appending, self._answered = outer
        if answered is not None:
            return answered
        if acks == 0:  # the core never answers a successful acks=0 produce
            return AppendResult(log_start_offset=log_.log_start_offset)
        fut: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._produce_futures[request_id] = fut
        return fut

    def _refused(self, e: ProducerStateError | LogError | OSError) -> AppendResult:
        """The produce's error for an exception the log raised while appending."""
        if isinstance(e, ProducerStateError):
            return AppendResult(ErrorCode(e.code), message=str(e))
        if isinstance(e, InvalidRecordError):
            return AppendResult(
                ErrorCode.INVALID_RECORD, message=str(e), record_errors=[(0, str(e))]
            )
        if isinstance(e, (KafkaStorageError, OSError)):
            _storage_errors.error(self.name, "append to %s failed: %s", self.name, e)
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
        return AppendResult(ErrorCode(e.code), message=str(e))  # a LogError carries its code

    # ----- fetch ----------------------------------------------------------------------------

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        replica_id: int,
        current_leader_epoch: int,
        read_committed: bool,
        min_one_message: bool,
    ) -> ReadResult:
        core = self.core
        if replica_id < 0:
            # A consumer's fetch changes nothing in the core (`on_fetch` has no other action
            # for it): its answer is `consumer_fetch` and the core's state as it stands, what
            # on_consumer_fetch's FetchResponse holds.
            error, records_end = core.consumer_fetch(
                fetch_offset, current_leader_epoch, read_committed
            )
            res = ReadResult(
                _broker_error(error),
                core.high_watermark,
                core.last_stable_offset,
                self.log.log_start_offset,
            )
        else:
            actions = core.on_fetch(
                replica_id,
                fetch_offset,
                current_leader_epoch,
                now_ms(),
                read_committed=read_committed,
            )
            resp = None
            others: list[Action] = []
            for a in actions:
                if resp is None and isinstance(a, FetchResponse):
                    resp = a
                elif not isinstance(a, FetchResponse):
                    others.append(a)
            self.dispatch(others)
            if resp is None:  # pragma: no cover - the core always answers a non-parked fetch
                return ReadResult(error=ErrorCode.UNKNOWN_SERVER_ERROR)
            records_end = resp.records_end
            res = ReadResult(
                _broker_error(resp.error),
                resp.high_watermark,
                resp.last_stable_offset,
                resp.log_start_offset,
            )
        if res.error != ErrorCode.NONE:
            return res
        try:
            res.data = self.log.read(
                fetch_offset,
                max_bytes,
                max_offset=records_end,
                min_one_message=min_one_message,
            )
            if read_committed and replica_id < 0:
                upper = res.data.upper_bound_offset
                res.aborted_transactions = (
                    self.log.collect_aborted_transactions(fetch_offset, upper)
                    if upper > fetch_offset
                    else []
                )
        except OffsetOutOfRangeError:  # retention moved the log start since the core answered
            res.error = ErrorCode.OFFSET_OUT_OF_RANGE
        except (KafkaStorageError, OSError) as e:  # an unreadable .txnindex
            _storage_errors.error(self.name, "read of %s failed: %s", self.name, e)
            res.error, res.data = ErrorCode.KAFKA_STORAGE_ERROR, None
        return res

    # ----- follower responses ---------------------------------------------------------------

    def on_fetch_response(
        self, request_id: int, error: int, records: bytes, hw: int, log_start: int, leo: int
    ) -> None:
        fetch_offset = self.log.log_end_offset
        try:
            actions = self.core.on_fetch_response(
                request_id, follower_error(error), records, hw, log_start, leo, now_ms()
            )
        except (CorruptRecordError, InvalidRecordError) as e:
            # Kafka's fetcher: log it and fetch again (the partition is not failed); the
            # follower stays behind and leaves the ISR while the leader serves such data
            log.error(
                "%s: Found invalid messages during fetch at offset %d: %s",
                self.name,
                fetch_offset,
                e,
            )
            actions = []
        except (LogError, OSError) as e:  # the core fetches again after the back-off
            log.error("%s: follower append failed: %s", self.name, e)
            actions = []
        self.io.data_changed(self)
        self.dispatch(actions)

    def on_offsets_for_leader_epoch_response(
        self, request_id: int, error: int, leader_epoch: int, end_offset: int
    ) -> None:
        self.dispatch(
            self.core.on_offsets_for_leader_epoch_response(
                request_id, follower_error(error), leader_epoch, end_offset, now_ms()
            )
        )

    def on_state_write_result(
        self, ok: bool, new_version: int, proposal: LeaderAndIsr | None = None
    ) -> None:
        self.dispatch(self.core.on_isr_update_result(ok, new_version, now_ms(), proposal))

    def fail_pending(self, error: ErrorCode) -> None:
        if self._appending is not None and self._answered is None:
            self._answered = AppendResult(error)
        for fut in self._produce_futures.values():
            if not fut.done():
                fut.set_result(AppendResult(error))
        self._produce_futures.clear()
