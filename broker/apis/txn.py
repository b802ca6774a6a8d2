"""Transaction APIs: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn (client to
coordinator), WriteTxnMarkers (coordinator to partition leader), DescribeTransactions,
ListTransactions and DescribeProducers (operators), and the produce-side verification of KIP-890.

The decisions are the transaction coordinator core's (broker/coordinator/transaction/); these
handlers translate the request schema for it and answer in the request's version. One rule is
Kafka's KIP-588: versions older than InitProducerId v4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn
v2 do not know PRODUCER_FENCED, and get INVALID_PRODUCER_EPOCH instead.

Transaction markers: `write_markers` appends one control batch per partition through the
ReplicaManager (origin "coordinator": the producer state checks the marker's producer epoch and
coordinator epoch) with acks=all, or acks=1 under the historic switch
`transaction.marker.required.acks=1`; a marker in `__consumer_offsets` then completes the
transaction's offset commits in the group coordinator.

Verification (`transaction.partition.verification.enable`, on by default as in Kafka 3.6+): a
transactional batch for a producer with no transaction open in the partition is appended only if
the coordinator confirms the partition was added to the producer's ongoing transaction
(AddPartitionsToTxn v4 verify-only when the coordinator is another broker). A marker written
while the check was in flight invalidates it (Kafka's verification guard), so a produce delayed
past its transaction's end cannot open a hanging transaction.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin.transactions import (
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
)
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    WriteTxnMarkersResponse,
)

from isrlab.broker.apis.grouping import by_topic
from isrlab.broker.coordinator.group.service import OFFSETS_TOPIC
from isrlab.broker.coordinator.shell import coordinator_address, now_ms
from isrlab.broker.coordinator.transaction.coordinator import (
    AddPartitionsRequest,
    EndTxnRequest,
    InitPidRequest,
)
from isrlab.broker.coordinator.transaction.service import TRANSACTION_TOPIC
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.control import build_control_batch
from isrlab.broker.network.client import ConnectionFailed
from isrlab.broker.network.codec import FileRegion, Request, encode_response
from isrlab.broker.partition import AppendResult

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)

Response = list[bytes | FileRegion]
TopicPartition = tuple[str, int]

#: how long a marker append may wait for the ISR (Kafka: request.timeout.ms)
MARKER_APPEND_TIMEOUT_MS = 30_000
#: how long a verification request to another broker's coordinator may take
VERIFY_TIMEOUT_S = 10.0


def _fenced(code: ErrorCode, version: int, since: int) -> int:
    """KIP-588: PRODUCER_FENCED only for versions >= `since`, else INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.PRODUCER_FENCED and version < since:
        return int(ErrorCode.INVALID_PRODUCER_EPOCH)
    return int(code)


# ----- InitProducerId --------------------------------------------------------------------------


async def handle_init_producer_id(server: KafkaServer, request: Request) -> Response:
    """An idempotent producer gets a fresh producer id (epoch 0); a transactional one asks its
    coordinator, which bumps the epoch of its transactional id (fencing zombies)."""
    v = request.api_version
    req = request.body
    cls = InitProducerIdResponse[v]

    def answer(error: ErrorCode, pid: int = -1, epoch: int = -1) -> Response:
        resp = cls(
            throttle_time_ms=0,
            error_code=_fenced(error, v, 4),
            producer_id=pid,
            producer_epoch=epoch,
        )
        return encode_response(resp, v, request.correlation_id)

    if not req.transactional_id:
        return answer(ErrorCode.NONE, await server.allocate_producer_id(), 0)
    txn = server.txn_coordinator
    err = txn.core.coordinator_error(req.transactional_id)
    if err:
        return answer(err)
    try:
        fresh = await server.allocate_producer_id()
    except KafkaError as e:
        return answer(e.code)
    result = await txn.call(
        txn.core.init_producer_id,
        InitPidRequest(
            transactional_id=req.transactional_id,
            transaction_timeout_ms=req.transaction_timeout_ms,
            producer_id=getattr(req, "producer_id", -1),
            producer_epoch=getattr(req, "producer_epoch", -1),
            fresh_producer_id=fresh,
        ),
    )
    return answer(result.error, result.producer_id, result.producer_epoch)


# ----- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------------


async def _add_partitions(
    server: KafkaServer,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: list[TopicPartition],
) -> dict[TopicPartition, ErrorCode]:
    txn = server.txn_coordinator
    err = txn.core.coordinator_error(transactional_id)
    if err:
        return dict.fromkeys(partitions, err)
    topics = server.topics_snapshot()
    unknown = {
        tp
        for tp in partitions
        if tp[0] not in topics or tp[1] not in topics[tp[0]].assignment or tp[1] < 0
    }
    if unknown:
        # Kafka answers the unknown ones and OPERATION_NOT_ATTEMPTED for the rest
        return {
            tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if tp in unknown
            else ErrorCode.OPERATION_NOT_ATTEMPTED
            for tp in partitions
        }
    result = await txn.call(
        txn.core.add_partitions,
        AddPartitionsRequest(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            partitions=tuple(sorted(set(partitions))),
        ),
    )
    return {tp: result.errors.get(tp, ErrorCode.NONE) for tp in partitions}


async def handle_add_partitions_to_txn(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = AddPartitionsToTxnResponse[v]
    if v >= 4:
        return await _verify_request(server, request)
    partitions = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    errors = await _add_partitions(
        server,
        req.v3_and_below_transactional_id,
        req.v3_and_below_producer_id,
        req.v3_and_below_producer_epoch,
        partitions,
    )
    T = cls.AddPartitionsToTxnTopicResult
    P = T.AddPartitionsToTxnPartitionResult
    topics = by_topic(
        errors.items(), lambda p, e: P(partition_index=p, partition_error_code=_fenced(e, v, 2))
    )
    resp = cls(
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            T(name=t, results_by_partition=ps) for t, ps in topics.items()
        ],
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_add_offsets_to_txn(server: KafkaServer, request: Request) -> Response:
    """The group's `__consumer_offsets` partition joins the transaction, so the markers reach
    it and TxnOffsetCommit's offsets become visible (or not) with the transaction."""
    v = request.api_version
    req = request.body
    if not req.group_id:
        code = ErrorCode.INVALID_GROUP_ID
    else:
        err = await server.group_coordinator.ensure_offsets_topic()
        if err:
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            tp = (OFFSETS_TOPIC, server.group_coordinator.core.partition_for(req.group_id))
            errors = await _add_partitions(
                server, req.transactional_id, req.producer_id, req.producer_epoch, [tp]
            )
            code = errors[tp]
    resp = AddOffsetsToTxnResponse[v](throttle_time_ms=0, error_code=_fenced(code, v, 2))
    return encode_response(resp, v, request.correlation_id)


# ----- EndTxn ----------------------------------------------------------------------------------


async def handle_end_txn(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    txn = server.txn_coordinator
    code = txn.core.coordinator_error(req.transactional_id)
    if not code:
        code = await txn.call(
            txn.core.end_txn,
            EndTxnRequest(
                transactional_id=req.transactional_id,
                producer_id=req.producer_id,
                producer_epoch=req.producer_epoch,
                commit=bool(req.committed),
            ),
        )
    if code not in (ErrorCode.NONE, ErrorCode.CONCURRENT_TRANSACTIONS):
        meta = txn.core.txns.get(req.transactional_id)
        log.info(
            "EndTxn(%s) of %s (producer %d epoch %d): %s; the coordinator has %s",
            "commit" if req.committed else "abort",
            req.transactional_id,
            req.producer_id,
            req.producer_epoch,
            ErrorCode(code).name,
            "nothing"
            if meta is None
            else f"{meta.state.kafka_name} producer {meta.producer_id} epoch {meta.producer_epoch}",
        )
    resp = EndTxnResponse[v](throttle_time_ms=0, error_code=_fenced(ErrorCode(code), v, 2))
    return encode_response(resp, v, request.correlation_id)


# ----- WriteTxnMarkers -------------------------------------------------------------------------


async def write_markers(
    server: KafkaServer,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[TopicPartition],
) -> dict[TopicPartition, ErrorCode]:
    """Append a transaction marker to each partition led here; the error per partition."""
    acks = int(server.config["transaction.marker.required.acks"])
    batch = build_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, now_ms())
    pending: list[tuple[TopicPartition, AppendResult | asyncio.Future[AppendResult]]] = []
    for tp in partitions:
        hp = server.replica_manager.partitions.get(tp)
        if hp is not None:
            hp.verification_guards.pop(producer_id, None)
        pending.append(
            (
                tp,
                server.replica_manager.append(
                    tp, memoryview(batch), acks, MARKER_APPEND_TIMEOUT_MS, origin="coordinator"
                ),
            )
        )
    out: dict[TopicPartition, ErrorCode] = {}
    offsets_done: list[int] = []
    for tp, res in pending:
        if isinstance(res, asyncio.Future):
            res = await res
        out[tp] = res.error
        if res.error == ErrorCode.NONE and tp[0] == OFFSETS_TOPIC:
            offsets_done.append(tp[1])
        elif res.error != ErrorCode.NONE:
            log.info(
                "%s marker for producer %d epoch %d on %s-%d: %s %s",
                "commit" if commit else "abort",
                producer_id,
                producer_epoch,
                *tp,
                res.error.name,
                res.message or "",
            )
    if offsets_done:
        server.group_coordinator.complete_txn(producer_id, offsets_done, commit)
    return out


async def handle_write_txn_markers(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = WriteTxnMarkersResponse[v]
    M = cls.WritableTxnMarkerResult
    T = M.WritableTxnMarkerTopicResult
    P = T.WritableTxnMarkerPartitionResult
    markers = []
    for m in req.markers:
        tps = [(t.name, p) for t in m.topics for p in t.partition_indexes]
        errors = await write_markers(
            server,
            m.producer_id,
            m.producer_epoch,
            bool(m.transaction_result),
            m.coordinator_epoch,
            tps,
        )
        topics = by_topic(errors.items(), lambda p, e: P(partition_index=p, error_code=int(e)))
        markers.append(
            M(
                producer_id=m.producer_id,
                topics=[T(name=t, partitions=ps) for t, ps in topics.items()],
            )
        )
    return encode_response(cls(markers=markers), v, request.correlation_id)


# ----- produce-side verification (KIP-890 part 1) ----------------------------------------------

#: offsets in a RecordBatch v2 header
_ATTRIBUTES = struct.Struct(">h")
_PRODUCER = struct.Struct(">qh")
_TRANSACTIONAL = 0x10
_CONTROL = 0x20


def transactional_producer(records: memoryview) -> tuple[int, int] | None:
    """(producer id, epoch) of a transactional data batch, None for anything else (the batch
    is validated later by the log)."""
    if len(records) < 61 or records[16] != 2:
        return None
    (attributes,) = _ATTRIBUTES.unpack_from(records, 21)
    if not attributes & _TRANSACTIONAL or attributes & _CONTROL:
        return None
    pid, epoch = _PRODUCER.unpack_from(records, 43)
    return pid, epoch


async def verify_transactional_produce(
    server: KafkaServer,
    tp: TopicPartition,
    transactional_id: str | None,
    producer: tuple[int, int],
) -> tuple[ErrorCode, object | None]:
    """Before appending a transactional batch of ``producer`` (id, epoch, from
    `transactional_producer`; other batches need no verification): NONE with a verification
    guard to check right before the append, or the produce's error. Verification off, a
    partition not led here, and a producer whose transaction is already open in this partition
    pass without asking the coordinator."""
    if not server.config["transaction.partition.verification.enable"]:
        return ErrorCode.NONE, None
    hp = server.replica_manager.partitions.get(tp)
    if hp is None or not hp.is_leader:
        return ErrorCode.NONE, None
    pid, epoch = producer
    state = hp.producer_state
    if state.has_ongoing_txn(pid, epoch):
        return ErrorCode.NONE, None
    if not state.epoch_fencing and _open_at_any_epoch(state, pid):
        # historic switch transaction.producer.epoch.fencing.enable=false: a zombie's batch
        # joins the transaction its producer id has open here, whatever its epoch
        return ErrorCode.NONE, None
    if not transactional_id:
        return ErrorCode.INVALID_TXN_STATE, None
    # One guard per producer at a time, shared by its produces verified concurrently (as
    # Kafka's VerificationGuard): a second request must not invalidate the first's
    guard = hp.verification_guards.setdefault(pid, object())
    error = await _verify_with_coordinator(server, transactional_id, pid, epoch, tp)
    if error != ErrorCode.NONE:
        if hp.verification_guards.get(pid) is guard:
            del hp.verification_guards[pid]
        return error, None
    return ErrorCode.NONE, guard


def _open_at_any_epoch(state: Any, pid: int) -> bool:
    entry = state.producers.get(pid)
    return entry is not None and entry.current_txn_first_offset >= 0


def guard_holds(server: KafkaServer, tp: TopicPartition, pid: int, guard: object | None) -> bool:
    """True if no marker for `pid` was written to `tp` since its verification started."""
    if guard is None:
        return True
    hp = server.replica_manager.partitions.get(tp)
    return hp is not None and hp.verification_guards.get(pid) is guard


async def _verify_with_coordinator(
    server: KafkaServer, transactional_id: str, pid: int, epoch: int, tp: TopicPartition
) -> ErrorCode:
    txn = server.txn_coordinator
    p = txn.core.partition_for(transactional_id)
    address = coordinator_address(server, TRANSACTION_TOPIC, p)
    if address is None:
        return ErrorCode.NOT_ENOUGH_REPLICAS  # retriable for the producer
    if address[0] == server.broker_id:
        err = txn.core.coordinator_error(transactional_id)
        if err:
            return ErrorCode.NOT_ENOUGH_REPLICAS
        errors = txn.core.verify_partitions(now_ms(), transactional_id, pid, epoch, (tp,))
        return _produce_error(errors.get(tp, ErrorCode.INVALID_TXN_STATE))
    cls = AddPartitionsToTxnRequest[4]
    Txn = cls.AddPartitionsToTxnTransaction
    Topic = cls.AddPartitionsToTxnTopic
    req = cls(
        transactions=[
            Txn(
                transactional_id=transactional_id,
                producer_id=pid,
                producer_epoch=epoch,
                verify_only=True,
                topics=[Topic(name=tp[0], partitions=[tp[1]])],
            )
        ]
    )
    conn = txn.verify_connection(*address)
    try:
        resp = await conn.request(req, VERIFY_TIMEOUT_S)
    except ConnectionFailed as e:
        log.info("verifying %s for %s: %s", tp, transactional_id, e)
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if resp.error_code:
        return _produce_error(ErrorCode(resp.error_code))
    for result in resp.results_by_transaction:
        for topic in result.topic_results:
            for part in topic.results_by_partition:
                if (topic.name, part.partition_index) == tp:
                    return _produce_error(ErrorCode(part.partition_error_code))
    return ErrorCode.INVALID_TXN_STATE


def _produce_error(code: ErrorCode) -> ErrorCode:
    """What the producer gets for a verification answer: coordinator trouble is retriable
    (NOT_ENOUGH_REPLICAS, as Kafka 3.6 answers), a partition not in the transaction or a fenced
    epoch is not."""
    if code in (
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    ):
        return ErrorCode.NOT_ENOUGH_REPLICAS
    return code


async def _verify_request(server: KafkaServer, request: Request) -> Response:
    """AddPartitionsToTxn v4 (broker to coordinator): verify-only checks; adding through v4 is
    refused (isrlab's brokers only send verify-only batches)."""
    v = request.api_version
    req = request.body
    cls = AddPartitionsToTxnResponse[v]
    R = cls.AddPartitionsToTxnResult
    T = cls.AddPartitionsToTxnTopicResult
    P = T.AddPartitionsToTxnPartitionResult
    results = []
    txn = server.txn_coordinator
    for t in req.transactions:
        tps = tuple((topic.name, p) for topic in t.topics for p in topic.partitions)
        err = txn.core.coordinator_error(t.transactional_id)
        if err:
            errors = dict.fromkeys(tps, err)
        elif not t.verify_only:
            errors = dict.fromkeys(tps, ErrorCode.INVALID_REQUEST)
        else:
            errors = txn.core.verify_partitions(
                now_ms(), t.transactional_id, t.producer_id, t.producer_epoch, tps
            )
        topics = by_topic(
            errors.items(), lambda p, e: P(partition_index=p, partition_error_code=int(e))
        )
        results.append(
            R(
                transactional_id=t.transactional_id,
                topic_results=[T(name=n, results_by_partition=ps) for n, ps in topics.items()],
            )
        )
    resp = cls(throttle_time_ms=0, error_code=0, results_by_transaction=results)
    return encode_response(resp, v, request.correlation_id)


# ----- operators -------------------------------------------------------------------------------


async def handle_describe_transactions(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = DescribeTransactionsResponse[v]
    S = cls.TransactionState
    TD = S.TopicData
    txn = server.txn_coordinator
    states = []
    for d in txn.core.describe_transactions(list(req.transactional_ids)):
        topics = by_topic(((tp, None) for tp in d.partitions), lambda p, _: p)
        states.append(
            S(
                error_code=int(d.error),
                transactional_id=d.transactional_id,
                transaction_state=d.state,
                transaction_timeout_ms=d.timeout_ms,
                transaction_start_time_ms=d.start_ms,
                producer_id=d.producer_id,
                producer_epoch=d.producer_epoch,
                topics=[TD(topic=t, partitions=ps) for t, ps in topics.items()],
            )
        )
    resp = cls(throttle_time_ms=0, transaction_states=states)
    return encode_response(resp, v, request.correlation_id)


async def handle_list_transactions(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = ListTransactionsResponse[v]
    S = cls.TransactionState
    core = server.txn_coordinator.core
    states = set(req.state_filters or []) or None
    listings = core.list_transactions(states, set(req.producer_id_filters or []) or None)
    resp = cls(
        throttle_time_ms=0,
        error_code=int(core.list_error()),
        unknown_state_filters=core.unknown_state_filters(states),
        transaction_states=[
            S(
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in listings
        ],
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_describe_producers(server: KafkaServer, request: Request) -> Response:
    v = request.api_version
    req = request.body
    cls = DescribeProducersResponse[v]
    T = cls.TopicResponse
    P = T.PartitionResponse
    S = P.ProducerState
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partition_indexes:
            hp = server.replica_manager.partitions.get((t.name, p))
            error = ErrorCode.NONE
            producers: list[Any] = []
            if hp is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not hp.is_leader:
                error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                producers = [
                    S(
                        producer_id=e.producer_id,
                        producer_epoch=e.producer_epoch,
                        last_sequence=e.last_sequence,
                        last_timestamp=e.last_timestamp,
                        coordinator_epoch=e.coordinator_epoch,
                        current_txn_start_offset=e.current_txn_start_offset,
                    )
                    for e in hp.producer_state.active_producers()
                ]
            parts.append(
                P(
                    partition_index=p,
                    error_code=int(error),
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(T(name=t.name, partitions=parts))
    resp = cls(throttle_time_ms=0, topics=topics)
    return encode_response(resp, v, request.correlation_id)
