"""The transaction coordinator's asyncio shell: carries out what the sans-IO core decides.

- A request becomes a `ref` with a future; the core's `Reply(ref, ...)` resolves it (`call`,
  from `broker.coordinator.shell`).
- `AppendTxnLog`: one record written to `__transaction_state` through the ReplicaManager with
  acks=all (the topic's min.insync.replicas is `transaction.state.log.min.isr`); the core hears
  `on_append_done`.
- `SendMarkers`: the transaction markers are written to every partition of the transaction by its
  leader — this broker's own partitions directly, the others with WriteTxnMarkers — retrying
  retriable errors (a leader moving, too few replicas, a timeout) until each partition has its
  marker, as Kafka's TransactionMarkerChannelManager does. Partitions of deleted topics are
  dropped. It gives up only when this broker no longer coordinates the transaction (the new
  coordinator loads the Prepare record and sends the markers again) or a leader answers that the
  coordinator or the producer epoch is fenced. The core then hears `on_markers_done`.
- Time: the shared timer loop wakes the core at its next deadline (transaction timeouts,
  transactional id expiration).
- Leadership: becoming leader of a `__transaction_state` partition loads it (every record, the
  latest per transactional id wins); losing it unloads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from isrlab.broker import clock
from isrlab.broker.coordinator.group.records import RecordFormatError, build_batch
from isrlab.broker.coordinator.group.records import iter_batch_records as iter_records
from isrlab.broker.coordinator.shell import CoordinatorShell, now_ms
from isrlab.broker.coordinator.transaction.coordinator import (
    AppendTxnLog,
    Reply,
    SendMarkers,
    TransactionCoordinator,
    TxnConfig,
)
from isrlab.broker.coordinator.transaction.records import (
    TxnLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.client import ConnectionFailed, KafkaConnection

if TYPE_CHECKING:
    from isrlab.broker.partition import HostedPartition
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)

TRANSACTION_TOPIC = "__transaction_state"
#: how long one append to __transaction_state may wait for the ISR (Kafka: request.timeout.ms)
APPEND_TIMEOUT_MS = 30_000
#: back-off between rounds of marker retries
MARKER_RETRY_BACKOFF_S = 0.1
#: a marker request to another broker that has not been answered after this long is retried
MARKER_REQUEST_TIMEOUT_S = 30.0

#: leader answers after which the markers are sent again (Kafka's
#: TransactionMarkerRequestCompletionHandler)
RETRIABLE_MARKER_ERRORS = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    }
)
#: leader answers that end the attempt: this coordinator (or the producer epoch it wrote) is
#: fenced; the transaction stays prepared until a coordinator that owns it sends the markers
FENCED_MARKER_ERRORS = frozenset(
    {
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
    }
)


def txn_config(server: KafkaServer) -> TxnConfig:
    c = server.config
    return TxnConfig(
        num_partitions=int(c["transaction.state.log.num.partitions"]),
        max_timeout_ms=int(c["transaction.max.timeout.ms"]),
        id_expiration_ms=int(c["transactional.id.expiration.ms"]),
        abort_timed_out_interval_ms=int(
            c["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
        ),
        remove_expired_interval_ms=int(
            c["transaction.remove.expired.transaction.cleanup.interval.ms"]
        ),
        add_partitions_wait_ms=int(c["transaction.add.partitions.wait.ms"]),
    )


class TransactionCoordinatorService(CoordinatorShell):
    topic = TRANSACTION_TOPIC

    def __init__(self, server: KafkaServer):
        self.core = TransactionCoordinator(txn_config(server))
        super().__init__(server, self.core, "transaction coordinator")
        self._marker_connections: dict[int, KafkaConnection] = {}
        self._verify_connections: dict[int, KafkaConnection] = {}

    async def stop(self) -> None:
        await super().stop()
        for conns in (self._marker_connections, self._verify_connections):
            for conn in conns.values():
                conn.close()
            conns.clear()

    def _connection(
        self, pool: dict[int, KafkaConnection], broker: int, host: str, port: int, what: str
    ) -> KafkaConnection:
        """The connection of `pool` to `broker` (one request at a time), replaced if the
        broker's address changed; a failed request closes it and the next one reconnects."""
        conn = pool.get(broker)
        if conn is None or (conn.host, conn.port) != (host, port):
            if conn is not None:
                conn.close()
            conn = KafkaConnection(
                host, port, f"broker-{self.server.broker_id}-{what}", self.server.transport
            )
            pool[broker] = conn
        return conn

    def verify_connection(self, broker: int, host: str, port: int) -> KafkaConnection:
        """The connection this broker's produce-side verification (AddPartitionsToTxn v4) uses
        to reach the transaction coordinator on `broker`: kept, as Kafka's
        AddPartitionsToTxnManager keeps one per coordinator node, rather than a new TCP
        connection for the first batch of every partition of every transaction. Separate from
        the marker connections, whose requests wait for the ISR."""
        return self._connection(self._verify_connections, broker, host, port, "verify")

    # ----- carrying out effects --------------------------------------------------------------

    def _run(self, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                self._resolve(e.ref, e.result)
            elif isinstance(e, AppendTxnLog):
                self._spawn(self._append(e))
            elif isinstance(e, SendMarkers):
                self._spawn(self._send_markers(e))
            else:  # pragma: no cover - a new effect the shell does not know
                log.error("transaction coordinator: unknown effect %r", e)

    async def _append(self, a: AppendTxnLog) -> None:
        tp = (TRANSACTION_TOPIC, a.partition)
        error = ErrorCode.NONE
        try:
            value = None if a.value is None else encode_value(a.value)
            batch = build_batch([(encode_key(a.transactional_id), value)], now_ms())
            result = self.server.replica_manager.append(
                tp, memoryview(batch), -1, APPEND_TIMEOUT_MS
            )
            if isinstance(result, asyncio.Future):
                result = await result
            error = result.error
            self.append_refused(a.partition, len(batch), error)
        except (RecordFormatError, ValueError) as e:
            log.error("transaction coordinator: cannot encode a record for %s: %s", tp, e)
            error = ErrorCode.UNKNOWN_SERVER_ERROR
        self._run(self.core.on_append_done(now_ms(), a.token, error))

    def _still_coordinating(self, m: SendMarkers) -> bool:
        p = self.core.partition_for(m.transactional_id)
        return self.core.owned.get(p) == m.coordinator_epoch

    async def _send_markers(self, m: SendMarkers) -> None:
        """Write the markers of `m` to every partition, retrying until each is done."""
        from isrlab.broker.apis.txn import write_markers

        remaining = set(m.partitions)
        outcome = ErrorCode.NONE
        while remaining:
            if not self._still_coordinating(m):
                outcome = ErrorCode.NOT_COORDINATOR
                break
            topics = self.server.topics_snapshot()
            for tp in [tp for tp in remaining if tp[0] not in topics]:
                log.info("transaction %s: %s-%d was deleted, no marker", m.transactional_id, *tp)
                remaining.discard(tp)
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp in sorted(remaining):
                by_leader.setdefault(self.server.partition_metadata(tp).leader, []).append(tp)
            # every leader at once (Kafka's marker channel has a queue per broker): the
            # transaction stays PrepareCommit/PrepareAbort, answering its producer's next
            # AddPartitionsToTxn with CONCURRENT_TRANSACTIONS, until the slowest is done
            requests = []
            for leader, tps in by_leader.items():
                if leader < 0:
                    continue  # no leader right now: next round
                if leader == self.server.broker_id:
                    requests.append(
                        write_markers(
                            self.server,
                            m.producer_id,
                            m.producer_epoch,
                            m.commit,
                            m.coordinator_epoch,
                            tps,
                        )
                    )
                else:
                    requests.append(self._remote_markers(leader, m, tps))
            answers: dict[tuple[str, int], ErrorCode] = {}
            for answer in await asyncio.gather(*requests):
                answers.update(answer)
            for tp, err in answers.items():
                if err == ErrorCode.NONE:
                    remaining.discard(tp)
                elif err in FENCED_MARKER_ERRORS:
                    log.warning(
                        "transaction %s: %s-%d refused the %s marker: %s; giving up",
                        m.transactional_id,
                        *tp,
                        "commit" if m.commit else "abort",
                        err.name,
                    )
                    outcome = err
                elif err not in RETRIABLE_MARKER_ERRORS:
                    # Kafka treats these as a bug (corrupt message, bad acks): say so, drop
                    log.error(
                        "transaction %s: %s-%d refused the marker with %s; not retried",
                        m.transactional_id,
                        *tp,
                        err.name,
                    )
                    remaining.discard(tp)
            if outcome != ErrorCode.NONE:
                break
            if remaining:
                await asyncio.sleep(MARKER_RETRY_BACKOFF_S)
        self._run(self.core.on_markers_done(now_ms(), m.token, outcome))

    async def _remote_markers(
        self, leader: int, m: SendMarkers, tps: list[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        address = self.server.live_brokers().get(leader)
        if address is None:
            return {}
        conn = self._connection(
            self._marker_connections, leader, address[0], address[1], "txn-markers"
        )
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        cls = WriteTxnMarkersRequest[1]
        M = cls.WritableTxnMarker
        T = M.WritableTxnMarkerTopic
        req = cls(
            markers=[
                M(
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    transaction_result=m.commit,
                    topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
                    coordinator_epoch=m.coordinator_epoch,
                )
            ]
        )
        try:
            resp = await conn.request(req, MARKER_REQUEST_TIMEOUT_S)
        except ConnectionFailed as e:
            log.info("transaction %s: markers to broker %d: %s", m.transactional_id, leader, e)
            return {}
        out: dict[tuple[str, int], ErrorCode] = {}
        for marker in resp.markers:
            for topic in marker.topics:
                for part in topic.partitions:
                    out[(topic.name, part.partition_index)] = _error(part.error_code)
        return out

    # ----- loading __transaction_state partitions (leadership: CoordinatorShell) ------------

    async def _load(self, hp: HostedPartition, p: int, epoch: int) -> None:
        start = clock.monotonic()
        entries: list[tuple[str, TxnLogValue | None]] = []
        bad = 0
        try:
            async for header, batch in self.read_batches(hp):
                if header.is_control:
                    continue
                try:
                    records = list(iter_records(batch))
                except RecordFormatError as e:  # a damaged batch: skipped, the rest loads
                    log.error("%s-%d: skipping a batch: %s", TRANSACTION_TOPIC, p, e)
                    bad += max(header.records_count, 1)
                    continue
                for _, key, value in records:
                    try:
                        if key is None:
                            raise RecordFormatError("no key")
                        entries.append((decode_key(key), decode_value(value)))
                    except RecordFormatError:
                        bad += 1
        except Exception as e:
            log.error(
                "transaction coordinator: loading %s-%d failed: %s; serving what was loaded",
                TRANSACTION_TOPIC,
                p,
                e,
            )
        if bad:
            log.warning("%s-%d: %d bad record(s) skipped", TRANSACTION_TOPIC, p, bad)
        self._run(self.core.complete_load(p, epoch, entries, now_ms()))
        if self.core.owned.get(p) == epoch:
            log.info(
                "transaction coordinator: loaded %s-%d (epoch %d, %d records) in %.0f ms",
                TRANSACTION_TOPIC,
                p,
                epoch,
                len(entries),
                (clock.monotonic() - start) * 1000,
            )

    # ----- the topic -------------------------------------------------------------------------

    async def ensure_transaction_topic(self) -> ErrorCode:
        cfg = self.server.config
        rf = int(cfg["transaction.state.log.replication.factor"])
        live_rf = max(min(rf, len(self.server.live_brokers())), 1)
        return await self.ensure_topic(
            int(cfg["transaction.state.log.num.partitions"]),
            rf,
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(cfg["transaction.state.log.segment.bytes"]),
                "min.insync.replicas": str(min(int(cfg["transaction.state.log.min.isr"]), live_rf)),
                "unclean.leader.election.enable": "false",
            },
        )


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
