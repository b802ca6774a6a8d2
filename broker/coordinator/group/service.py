"""The group coordinator's asyncio shell: carries out what the sans-IO core decides.

- A request becomes a `ref` with a future; the core's `Reply(ref, ...)` resolves it.
- An `Append` is written to `__consumer_offsets` through the ReplicaManager like any produce,
  with acks=all (or acks=1 under the historic switch `offsets.commit.required.acks=1`), and
  the core hears `on_append_done` (with the batch's offset) when the write is acknowledged or
  failed. A transactional offset commit (`Append.producer`) is a transactional batch of the
  producer, appended with the coordinator's origin: the partition checks its producer epoch.
- Transactions: `complete_txn` is called by the transaction marker path once a marker is
  written to partitions of `__consumer_offsets`; the core commits or drops the producer's
  pending offsets there.
- Time: one task wakes at the core's next deadline (heartbeat expiry, rebalance timeout,
  initial delay, offset retention) and calls `tick`.
- Leadership: the ReplicaManager tells this shell when a replica of `__consumer_offsets`
  becomes leader (load the partition's groups: read the log, replay it into the core) or stops
  being leader (unload).
- The topic itself is created on the first FindCoordinator, as Kafka does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from isrlab.broker.coordinator.group.coordinator import (
    Append,
    Effect,
    GroupConfig,
    GroupCoordinator,
    Key,
    LoadedRecord,
    LoadItem,
    Reply,
    TxnMarker,
    Value,
)
from isrlab.broker.coordinator.group.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    OffsetValue,
    RecordFormatError,
    build_batch,
    control_record_type,
    decode_key,
    decode_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
    iter_batch_records,
)
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.record_batch import iter_batches

if TYPE_CHECKING:
    from isrlab.broker.partition import HostedPartition
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
#: bytes read per step while loading a partition
LOAD_READ_BYTES = 1 << 20
#: the timer's resolution: heartbeat expiry, rebalance timeouts and the initial delay are
#: noticed within this long (Kafka's purgatories tick at a similar grain)
TICK_MS = 100


def now_ms() -> int:
    return int(time.time() * 1000)


def group_config(server: KafkaServer) -> GroupConfig:
    c = server.config
    return GroupConfig(
        num_partitions=int(c["offsets.topic.num.partitions"]),
        min_session_timeout_ms=int(c["group.min.session.timeout.ms"]),
        max_session_timeout_ms=int(c["group.max.session.timeout.ms"]),
        initial_rebalance_delay_ms=int(c["group.initial.rebalance.delay.ms"]),
        max_size=int(c["group.max.size"]),
        offsets_retention_ms=int(c["offsets.retention.minutes"]) * 60_000,
        offsets_retention_check_interval_ms=int(c["offsets.retention.check.interval.ms"]),
        offset_metadata_max_bytes=int(c["offset.metadata.max.bytes"]),
    )


def encode_entry(key: Key, value: Value | None) -> tuple[bytes, bytes | None]:
    if value is None:
        return encode_key(key), None
    if isinstance(value, OffsetValue):
        return encode_key(key), encode_offset_value(value)
    return encode_key(key), encode_group_value(value)


class GroupCoordinatorService:
    def __init__(self, server: KafkaServer):
        self.server = server
        self.core = GroupCoordinator(group_config(server))
        self.required_acks = int(server.config["offsets.commit.required.acks"])
        self.commit_timeout_ms = int(server.config["offsets.commit.timeout.ms"])
        self._refs = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._create_lock = asyncio.Lock()

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._timer_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in list(self._tasks):
            t.cancel()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "stopping"))
        self._waiting.clear()

    async def _timer_loop(self) -> None:
        """Deadlines are kept to TICK_MS: requests do not wake this loop (a scan of every group
        per request would cost the event loop dearly with thousands of members); it sleeps until
        the next deadline, at most TICK_MS."""
        while True:
            deadline = self.core.next_deadline()
            wait = TICK_MS / 1000 if deadline is None else (deadline - now_ms()) / 1000
            await asyncio.sleep(min(max(wait, 0.0), TICK_MS / 1000))
            try:
                self._run(self.core.tick(now_ms()))
            except Exception:  # pragma: no cover - a bug; the coordinator keeps serving
                log.exception("group coordinator tick failed")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- carrying out effects --------------------------------------------------------------

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                fut = self._waiting.pop(e.ref, None)
                if fut is not None and not fut.done():
                    fut.set_result(e.result)
            else:
                self._spawn(self._append(e))

    async def call(self, method: Callable[..., list[Effect]], *args: Any) -> Any:
        """Ask the core; wait for its answer to this request (now or later)."""
        ref = next(self._refs)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ref] = fut
        try:
            self._run(method(now_ms(), ref, *args))
            return await fut
        finally:
            self._waiting.pop(ref, None)

    async def _append(self, a: Append) -> None:
        tp = (OFFSETS_TOPIC, a.partition)
        error = ErrorCode.NONE
        offset = -1
        try:
            batch = build_batch(
                [encode_entry(k, v) for k, v in a.entries], now_ms(), producer=a.producer
            )
            rm = self.server.replica_manager
            if a.producer is not None:
                # the partition checks the producer's epoch (and, with verification, that the
                # producer added this partition to its transaction)
                result = rm.append(
                    tp,
                    memoryview(batch),
                    self.required_acks,
                    self.commit_timeout_ms,
                    origin="coordinator",
                )
            else:
                result = rm.append(
                    tp, memoryview(batch), self.required_acks, self.commit_timeout_ms
                )
            if isinstance(result, asyncio.Future):
                result = await result
            error = result.error
            offset = result.base_offset
        except RecordFormatError as e:
            log.error("group coordinator: cannot encode records for %s: %s", tp, e)
            error = ErrorCode.UNKNOWN_SERVER_ERROR
        self._run(self.core.on_append_done(now_ms(), a.token, error, offset))

    # ----- transactions ----------------------------------------------------------------------

    def complete_txn(self, producer_id: int, partitions: list[int], commit: bool) -> None:
        """A transaction marker of `producer_id` (COMMIT if `commit`, else ABORT) is written to
        these partitions of __consumer_offsets: the producer's offsets pending in their groups
        become the committed offsets, or are dropped. Call it once the marker is written,
        before answering WriteTxnMarkers."""
        self._run(self.core.complete_txn(now_ms(), producer_id, partitions, commit))

    # ----- leadership of __consumer_offsets partitions ---------------------------------------

    def on_role_change(self, hp: HostedPartition) -> None:
        if hp.tp[0] != OFFSETS_TOPIC:
            return
        p = hp.tp[1]
        if hp.is_leader:
            epoch = hp.leader_epoch
            if self.core.owned.get(p) == epoch or self.core.loading.get(p) == epoch:
                return
            self._run(self.core.begin_load(p, epoch))
            self._spawn(self._load(hp, p, epoch))
        elif p in self.core.owned or p in self.core.loading:
            log.info("group coordinator: unloading %s-%d (no longer leader)", OFFSETS_TOPIC, p)
            self._run(self.core.unload(p))

    def on_partition_removed(self, tp: tuple[str, int]) -> None:
        if tp[0] == OFFSETS_TOPIC:
            self._run(self.core.unload(tp[1]))

    async def _load(self, hp: HostedPartition, p: int, epoch: int) -> None:
        """Read the partition from its log start to its log end and replay it. A leader's whole
        log is loaded (as Kafka does): what it holds past the high watermark is replicated before
        anything written after it can be acknowledged."""
        start = time.monotonic()
        entries: list[LoadItem] = []
        lg = hp.log
        offset = lg.log_start_offset
        end = lg.log_end_offset
        bad = 0
        try:
            while offset < end:
                data = lg.read(offset, LOAD_READ_BYTES, max_offset=end).read_bytes()
                if not data:
                    break
                nxt = offset
                for header in iter_batches(data):
                    nxt = header.next_offset
                    batch = data[header.position : header.end_position]
                    if header.is_control:
                        try:
                            kind = control_record_type(batch)
                        except RecordFormatError as e:
                            log.error("%s-%d: skipping a control batch: %s", OFFSETS_TOPIC, p, e)
                            bad += 1
                            continue
                        if kind in (CONTROL_ABORT, CONTROL_COMMIT):
                            entries.append(TxnMarker(header.producer_id, kind == CONTROL_COMMIT))
                        continue
                    try:
                        records = list(iter_batch_records(batch))
                    except RecordFormatError as e:  # a damaged batch: skipped, the rest loads
                        log.error("%s-%d: skipping a batch: %s", OFFSETS_TOPIC, p, e)
                        bad += max(header.records_count, 1)
                        continue
                    producer_id = header.producer_id if header.is_transactional else -1
                    first = records[0][0] if records else header.base_offset
                    for _, key, value in records:
                        try:
                            if key is None:
                                raise RecordFormatError("no key")
                            k = decode_key(key)
                            entries.append(
                                LoadedRecord(k, decode_value(k, value), first, producer_id)
                            )
                        except RecordFormatError:
                            bad += 1
                if nxt <= offset:
                    break
                offset = nxt
                await asyncio.sleep(0)  # a big partition must not stall the broker
        except Exception as e:
            # As Kafka does: the partition is served with what could be loaded (the groups are
            # not left without a coordinator until the next leader change).
            log.error(
                "group coordinator: loading %s-%d stopped at offset %d: %s; serving what was "
                "loaded",
                OFFSETS_TOPIC,
                p,
                offset,
                e,
            )
        if bad:
            log.warning(
                "%s-%d: %d record(s) that are not group records skipped", OFFSETS_TOPIC, p, bad
            )
        self.core.complete_load(p, epoch, entries, now_ms())
        if self.core.owned.get(p) == epoch:
            log.info(
                "group coordinator: loaded %s-%d (epoch %d, %d records) in %.0f ms",
                OFFSETS_TOPIC,
                p,
                epoch,
                len(entries),
                (time.monotonic() - start) * 1000,
            )

    # ----- the offsets topic -----------------------------------------------------------------

    async def ensure_offsets_topic(self) -> ErrorCode:
        """Create __consumer_offsets if it does not exist yet (Kafka does on the first
        FindCoordinator). NONE once it exists; COORDINATOR_NOT_AVAILABLE meanwhile."""
        if OFFSETS_TOPIC in self.server.topics_snapshot():
            return ErrorCode.NONE
        async with self._create_lock:
            if OFFSETS_TOPIC in self.server.topics_snapshot():
                return ErrorCode.NONE
            cfg = self.server.config
            rf = min(int(cfg["offsets.topic.replication.factor"]), len(self.server.live_brokers()))
            try:
                await self.server.create_topic(
                    OFFSETS_TOPIC,
                    int(cfg["offsets.topic.num.partitions"]),
                    max(rf, 1),
                    None,
                    {
                        "cleanup.policy": "compact",
                        "segment.bytes": str(cfg["offsets.topic.segment.bytes"]),
                    },
                )
            except KafkaError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("could not create %s: %s", OFFSETS_TOPIC, e)
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE
