"""The partitions this broker hosts and the produce/fetch paths through them (Kafka's ReplicaManager).

Each hosted partition pairs an on-disk `Log` with its replication state. The replication decisions
(high watermark, ISR, acks=all waiting, follower truncation) are made by the sans-IO core in
`broker.replication`; this module is the IO shell around it: it appends to and reads from logs,
wakes long-polling fetches when data or the high watermark moves, and times out waiting produces.

Without ZooKeeper (a standalone broker) every partition is led by this broker with ISR = {self}, so
the high watermark follows the log end offset.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from broker.errors import ErrorCode, KafkaError
from broker.log.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
)
from broker.log.log import FetchDataInfo, Log
from broker.log.producer_state import DuplicateBatch, ProducerStateError, ProducerStateManager
from broker.log.record_batch import iter_batches, validate

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class DataNotifier:
    """Wakes every waiter when any partition's fetchable data changes."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass


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
    """A partition hosted here. Standalone: leader with ISR = {self}."""

    def __init__(self, tp: TopicPartition, log_: Log, broker_id: int, config: dict[str, Any]):
        self.tp = tp
        self.log = log_
        self.broker_id = broker_id
        self.config = config
        self.leader_id = broker_id
        self.leader_epoch = max(0, log_.leader_epoch_cache.latest_epoch or 0)
        self.replicas = [broker_id]
        self.isr = [broker_id]
        self.high_watermark = log_.log_end_offset
        self.producer_state = ProducerStateManager(log_.dir)
        self.reload_producer_state()

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

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def last_stable_offset(self) -> int:
        return self.high_watermark  # no transactions yet: nothing open below HW

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.log.leader_epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    def append_as_leader(self, records: memoryview, acks: int) -> AppendResult:
        if not self.is_leader:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        try:
            headers = validate(records)
            if len(headers) != 1:
                raise InvalidRecordError(
                    f"a produce request must carry exactly one record batch per partition, "
                    f"not {len(headers)}"
                )
            self.producer_state.check(headers[0])
            info = self.log.append_as_leader(records, self.leader_epoch)
            self.producer_state.update(replace(headers[0], base_offset=info.first_offset))
        except DuplicateBatch as dup:
            return AppendResult(
                base_offset=dup.first_offset,
                last_offset=dup.last_offset,
                log_start_offset=self.log.log_start_offset,
            )
        except ProducerStateError as e:
            return AppendResult(ErrorCode(e.code), message=str(e))
        except InvalidRecordError as e:
            return AppendResult(
                ErrorCode.INVALID_RECORD, message=str(e), record_errors=[(0, str(e))]
            )
        except (KafkaStorageError, OSError) as e:
            log.error("append to %s-%d failed: %s", *self.tp, e)
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
        except LogError as e:  # each storage error carries its Kafka error code
            return AppendResult(ErrorCode(e.code), message=str(e))
        self.high_watermark = self.log.log_end_offset
        return AppendResult(
            base_offset=info.first_offset,
            last_offset=info.last_offset,
            log_start_offset=self.log.log_start_offset,
        )

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        replica_id: int,
        read_committed: bool,
        min_one_message: bool,
    ) -> ReadResult:
        hw = self.high_watermark
        lso = hw  # no open transactions yet: LSO = HW
        if replica_id >= 0:
            max_offset = None
        else:
            max_offset = lso if read_committed else hw
        res = ReadResult(
            high_watermark=hw, last_stable_offset=lso, log_start_offset=self.log.log_start_offset
        )
        try:
            res.data = self.log.read(
                fetch_offset, max_bytes, max_offset=max_offset, min_one_message=min_one_message
            )
        except OffsetOutOfRangeError:
            res.error = ErrorCode.OFFSET_OUT_OF_RANGE
        return res


class ReplicaManager:
    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.notifier = DataNotifier()

    def add(self, tp: TopicPartition, log_: Log, config: dict[str, Any]) -> HostedPartition:
        hp = HostedPartition(tp, log_, self.broker_id, config)
        self.partitions[tp] = hp
        return hp

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self.notifier.notify()

    def get(self, tp: TopicPartition) -> HostedPartition:
        hp = self.partitions.get(tp)
        if hp is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return hp

    async def append(
        self, tp: TopicPartition, records: memoryview, acks: int, timeout_ms: int
    ) -> AppendResult:
        hp = self.partitions.get(tp)
        if hp is None:
            return AppendResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        result = hp.append_as_leader(records, acks)
        if result.error == ErrorCode.NONE:
            self.notifier.notify()
        return result
