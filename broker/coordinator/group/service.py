"""The group coordinator's asyncio shell: carries out what the sans-IO core decides.

What every coordinator shell does (requests as futures, the timer, loading on leadership, creating
the topic) is in `broker.coordinator.shell.CoordinatorShell`; this module adds:
- An `Append` is written to `__consumer_offsets` through the ReplicaManager like any produce,
  with acks=all (or acks=1 under the historic switch `offsets.commit.required.acks=1`), and
  the core hears `on_append_done` (with the batch's offset) when the write is acknowledged or
  failed. A transactional offset commit (`Append.producer`) is a transactional batch of the
  producer, appended with the coordinator's origin: the partition checks its producer epoch.
- Transactions: `complete_txn` is called by the transaction marker path once a marker is
  written to partitions of `__consumer_offsets`; the core commits or drops the producer's
  pending offsets there.
- Loading: a partition's records replayed into the core, transactional batches held with their
  producer id until its marker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from isrlab.broker import clock
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
from isrlab.broker.coordinator.shell import CoordinatorShell, now_ms
from isrlab.broker.errors import ErrorCode

if TYPE_CHECKING:
    from isrlab.broker.partition import HostedPartition
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


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


class GroupCoordinatorService(CoordinatorShell):
    topic = OFFSETS_TOPIC

    def __init__(self, server: KafkaServer):
        self.core = GroupCoordinator(group_config(server))
        super().__init__(server, self.core, "group coordinator")
        self.required_acks = int(server.config["offsets.commit.required.acks"])
        self.commit_timeout_ms = int(server.config["offsets.commit.timeout.ms"])

    # ----- carrying out effects --------------------------------------------------------------

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                self._resolve(e.ref, e.result)
            else:
                self._spawn(self._append(e))

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
            self.append_refused(a.partition, len(batch), error)
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

    # ----- loading __consumer_offsets partitions (leadership: CoordinatorShell) -------------

    async def _load(self, hp: HostedPartition, p: int, epoch: int) -> None:
        """Read the partition from its log start to its log end and replay it. A leader's whole
        log is loaded (as Kafka does): what it holds past the high watermark is replicated before
        anything written after it can be acknowledged."""
        start = clock.monotonic()
        entries: list[LoadItem] = []
        bad = 0
        offset = hp.log.log_start_offset
        try:
            async for header, batch in self.read_batches(hp):
                offset = header.base_offset
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
                        entries.append(LoadedRecord(k, decode_value(k, value), first, producer_id))
                    except RecordFormatError:
                        bad += 1
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
                (clock.monotonic() - start) * 1000,
            )

    # ----- the offsets topic -----------------------------------------------------------------

    async def ensure_offsets_topic(self) -> ErrorCode:
        """Create __consumer_offsets if it does not exist yet (Kafka does on the first
        FindCoordinator). NONE once it exists; COORDINATOR_NOT_AVAILABLE meanwhile."""
        cfg = self.server.config
        return await self.ensure_topic(
            int(cfg["offsets.topic.num.partitions"]),
            int(cfg["offsets.topic.replication.factor"]),
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(cfg["offsets.topic.segment.bytes"]),
            },
        )
