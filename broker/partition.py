"""One hosted partition: the on-disk `Log`, idempotent-producer state and the sans-IO replication
core (`broker.replication.Partition`), with the IO those need (Kafka's `Partition` + `UnifiedLog`
glue).

Every decision (HW, ISR, acks=all completion, follower truncation) is the core's. This shell
- adapts `broker.log.log.Log` to the core's `ReplicaLog` protocol (`LogAdapter`),
- checks producer sequences before a leader append and keeps producer state in step with the log
  (rebuilt after truncation),
- turns the core's actions into IO through a `PartitionIO` (the ReplicaManager): resolving produce
  futures, sending follower requests, writing the state znode,
- wakes long-polling fetches whenever the high watermark or the log end moves.

A standalone broker uses the very same path: it becomes leader of every partition with ISR = {self}.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from isrlab.broker.errors import ErrorCode
from isrlab.broker.log.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
)
from isrlab.broker.log.log import FetchDataInfo, Log
from isrlab.broker.log.producer_state import (
    DuplicateBatch,
    ProducerStateError,
    ProducerStateManager,
)
from isrlab.broker.log.record_batch import iter_batches, validate
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
)

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class LogAdapter:
    """`broker.log.log.Log` seen through the replication core's `ReplicaLog` protocol."""

    def __init__(self, log_: Log, owner: HostedPartition, hw_checkpoint: int):
        self.log = log_
        self.owner = owner
        self._hw_checkpoint = hw_checkpoint

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
        self._hw_checkpoint = value

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
            self.log.truncate_to(offset)
            self.owner.reload_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        log.warning("%s: truncating fully, restarting at %d", self.owner.name, offset)
        self.log.truncate_fully_and_start_at(offset)
        self.owner.reload_producer_state()

    def append_as_leader(self, records: Any, leader_epoch: int) -> tuple[int, int]:
        info = self.log.append_as_leader(records, leader_epoch)
        return info.first_offset, info.last_offset

    def append_as_follower(self, records: Any) -> None:
        self.log.append_as_follower(records)
        self.owner.producer_state.update_all(iter_batches(records))


class PartitionIO(Protocol):
    """What a partition asks of its broker (implemented by the ReplicaManager)."""

    def send_fetch(self, partition: HostedPartition, action: SendFetch) -> None: ...

    def send_offsets_for_leader_epoch(
        self, partition: HostedPartition, action: SendOffsetsForLeaderEpoch
    ) -> None: ...

    def write_state(self, partition: HostedPartition, action: WriteStateZnode) -> None: ...

    def data_changed(self, partition: HostedPartition) -> None: ...


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

    @property
    def size(self) -> int:
        return self.data.size if self.data is not None else 0


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
        self.producer_state = ProducerStateManager(log_.dir)
        self.reload_producer_state()
        self.adapter = LogAdapter(log_, self, hw_checkpoint)
        self.core = Partition(TopicPartition(*tp), broker_id, self.adapter, replication)
        self.replicas: list[int] = [broker_id]
        self._ids = itertools.count(1)
        self._produce_futures: dict[int, asyncio.Future[AppendResult]] = {}
        self._last_hw = -1

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
        return self.core.high_watermark  # no transactions yet: nothing open below HW

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.adapter.end_offset_for_epoch(epoch)

    def become(self, state: LeaderAndIsr, replicas: list[int]) -> None:
        """Apply a partition state from the controller (via ZooKeeper) or standalone start-up."""
        self.replicas = list(replicas)
        now = now_ms()
        if state.leader == self.broker_id:
            if not self.core.is_leader or state.leader_epoch != self.core.leader_epoch:
                log.info(
                    "%s: becoming leader at epoch %d, ISR %s, LEO %d, HW %d",
                    self.name,
                    state.leader_epoch,
                    list(state.isr),
                    self.log.log_end_offset,
                    self.core.high_watermark,
                )
            self.dispatch(self.core.become_leader(state, replicas, now))
        else:
            if self.core.leader_id != state.leader or self.core.leader_epoch != state.leader_epoch:
                log.info(
                    "%s: following %d at epoch %d (LEO %d)",
                    self.name,
                    state.leader,
                    state.leader_epoch,
                    self.log.log_end_offset,
                )
            self.dispatch(self.core.become_follower(state, replicas, now))

    def reload_producer_state(self) -> None:
        """Newest snapshot, then replay the log past it (after open or truncation)."""
        lg = self.log
        offset = self.producer_state.load_latest_snapshot(lg.log_start_offset, lg.log_end_offset)
        while offset < lg.log_end_offset:
            data = lg.read(offset, 8 << 20, min_one_message=True)
            if data.size == 0:
                break
            headers = list(iter_batches(data.read_bytes()))
            self.producer_state.update_all(headers)
            offset = headers[-1].next_offset

    # ----- actions --------------------------------------------------------------------------

    def dispatch(self, actions: list[Action]) -> None:
        hw_before = self._last_hw
        for a in actions:
            if isinstance(a, ProduceResponse):
                fut = self._produce_futures.pop(a.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(
                        AppendResult(
                            ErrorCode(int(a.error)),
                            a.base_offset,
                            a.last_offset,
                            self.log.log_start_offset,
                        )
                    )
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

    def tick(self) -> None:
        self.dispatch(self.core.tick(now_ms()))

    # ----- produce --------------------------------------------------------------------------

    def append(
        self, records: memoryview, acks: int, timeout_ms: int
    ) -> AppendResult | asyncio.Future[AppendResult]:
        core = self.core
        if not core.is_leader:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if acks == -1 and len(core.isr) < core.config.min_insync_replicas:
            return AppendResult(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                message=f"ISR {list(core.isr)} is smaller than min.insync.replicas="
                f"{core.config.min_insync_replicas}",
            )
        try:
            headers = validate(records)
            if len(headers) != 1:
                raise InvalidRecordError(
                    "a produce request must carry exactly one record batch per partition, "
                    f"not {len(headers)}"
                )
            self.producer_state.check(headers[0])
            first, last = self.adapter.append_as_leader(records, core.leader_epoch)
            self.producer_state.update(replace(headers[0], base_offset=first))
        except DuplicateBatch as dup:
            first, last = dup.first_offset, dup.last_offset
        except ProducerStateError as e:
            return AppendResult(ErrorCode(e.code), message=str(e))
        except InvalidRecordError as e:
            return AppendResult(
                ErrorCode.INVALID_RECORD, message=str(e), record_errors=[(0, str(e))]
            )
        except (KafkaStorageError, OSError) as e:
            log.error("append to %s failed: %s", self.name, e)
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
        except LogError as e:  # each storage error carries its Kafka error code
            return AppendResult(ErrorCode(e.code), message=str(e))
        request_id = next(self._ids)
        fut: asyncio.Future[AppendResult] | None = None
        if acks == -1:
            fut = asyncio.get_running_loop().create_future()
            self._produce_futures[request_id] = fut
        actions = core.produce_appended(request_id, last, acks, timeout_ms, now_ms(), first)
        self.io.data_changed(self)
        self.dispatch(actions)
        if fut is not None:
            return fut
        return AppendResult(
            base_offset=first, last_offset=last, log_start_offset=self.log.log_start_offset
        )

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
        if replica_id >= 0:
            actions = self.core.on_follower_fetch(
                replica_id, fetch_offset, current_leader_epoch, now_ms(), 0, 0
            )
        else:
            actions = [self.core.on_consumer_fetch(fetch_offset, current_leader_epoch)]
        resp = next((a for a in actions if isinstance(a, FetchResponse)), None)
        self.dispatch([a for a in actions if not isinstance(a, FetchResponse)])
        if resp is None:  # pragma: no cover - the core always answers a non-parked fetch
            return ReadResult(error=ErrorCode.UNKNOWN_SERVER_ERROR)
        res = ReadResult(
            error=ErrorCode(int(resp.error)),
            high_watermark=resp.high_watermark,
            last_stable_offset=resp.high_watermark,
            log_start_offset=resp.log_start_offset,
        )
        if res.error != ErrorCode.NONE:
            return res
        if replica_id < 0 and read_committed:
            max_offset = self.last_stable_offset
        else:
            max_offset = resp.records_end
        try:
            res.data = self.log.read(
                fetch_offset, max_bytes, max_offset=max_offset, min_one_message=min_one_message
            )
        except OffsetOutOfRangeError:
            res.error = ErrorCode.OFFSET_OUT_OF_RANGE
        return res

    # ----- follower responses ---------------------------------------------------------------

    def on_fetch_response(
        self, request_id: int, error: int, records: bytes, hw: int, log_start: int, leo: int
    ) -> None:
        from isrlab.broker.replication import ErrorCode as ReplError

        try:
            err = ReplError(error)
        except ValueError:
            err = ReplError.REPLICA_NOT_AVAILABLE  # treat any other error as retriable
        try:
            actions = self.core.on_fetch_response(
                request_id, err, records, hw, log_start, leo, now_ms()
            )
        except LogError as e:
            log.error("%s: follower append failed: %s", self.name, e)
            actions = self.core.on_fetch_response(
                request_id, ReplError.REPLICA_NOT_AVAILABLE, b"", hw, log_start, leo, now_ms()
            )
        self.io.data_changed(self)
        self.dispatch(actions)

    def on_offsets_for_leader_epoch_response(
        self, request_id: int, error: int, leader_epoch: int, end_offset: int
    ) -> None:
        from isrlab.broker.replication import ErrorCode as ReplError

        try:
            err = ReplError(error)
        except ValueError:
            err = ReplError.REPLICA_NOT_AVAILABLE
        self.dispatch(
            self.core.on_offsets_for_leader_epoch_response(
                request_id, err, leader_epoch, end_offset, now_ms()
            )
        )

    def on_state_write_result(self, ok: bool, new_version: int) -> None:
        self.dispatch(self.core.on_isr_update_result(ok, new_version, now_ms()))

    def fail_pending(self, error: ErrorCode) -> None:
        for fut in self._produce_futures.values():
            if not fut.done():
                fut.set_result(AppendResult(error))
        self._produce_futures.clear()
