"""Produce: validate and append RecordBatch v2 data, answer per partition.

Each partition's records must be exactly one v2 batch (as Kafka requires from v3 on); the batch is
stored as received except baseOffset and partitionLeaderEpoch. Every failure is per partition and
leaves that partition's log untouched. acks=0 gets no response at all (the client does not read one);
acks=1 is answered after the leader's append; acks=all (-1) after the high watermark passes the batch,
bounded by the request's timeout (see the replication core). A rejected batch is logged at most once
per partition, error and 10 s (a full disk rejects every one), with the count of those not logged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from isrlab.broker.apis.txn import (
    guard_holds,
    transactional_producer,
    verify_transactional_produce,
)
from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.codec import FileRegion, Request
from isrlab.broker.network.hot_responses import encode_produce_response
from isrlab.broker.partition import AppendResult
from isrlab.broker.rate_limited_log import RateLimitedLog
from isrlab.broker.replication import valid_acks

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)
_rejections = RateLimitedLog(log)


#: topics only the broker's coordinators append to
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


async def handle_produce(server: KafkaServer, request: Request) -> list[bytes | FileRegion] | None:
    req = request.body
    acks = req.acks
    results: list[tuple[str, list[tuple[int, AppendResult]]]] = []
    pending: list[tuple[list[tuple[int, AppendResult]], int, asyncio.Future[AppendResult]]] = []
    if not valid_acks(acks):
        for t_i, topic in enumerate(req.topic_data):
            results.append((topic.name, []))
            for p in topic.partition_data:
                results[t_i][1].append((p.index, AppendResult(ErrorCode.INVALID_REQUIRED_ACKS)))
        return _encode(request, results)
    max_bytes = server.config["message.max.bytes"] + 61
    for topic in req.topic_data:
        name = topic.name
        parts: list[tuple[int, AppendResult]] = []
        results.append((name, parts))
        for p in topic.partition_data:
            records = p.records
            if name in INTERNAL_TOPICS:
                # Kafka: only the coordinators write their internal topics
                res: Any = AppendResult(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    message=f"cannot append to internal topic {name}",
                )
            elif records is None or len(records) == 0:
                res = AppendResult(ErrorCode.INVALID_RECORD, message="no records")
            elif len(records) > max_bytes:
                res = AppendResult(
                    ErrorCode.MESSAGE_TOO_LARGE, message="batch over message.max.bytes"
                )
            elif (producer := transactional_producer(records)) is None:
                # not a transactional data batch: nothing to verify with a coordinator
                res = server.produce_to_partition(
                    (name, p.index), memoryview(records), acks, req.timeout_ms
                )
            else:
                res = await _produce_transactional(
                    server,
                    (name, p.index),
                    getattr(req, "transactional_id", None),
                    producer,
                    records,
                    acks,
                    req,
                )
            if isinstance(res, asyncio.Future):
                pending.append((parts, len(parts), res))
            parts.append((p.index, res))
    # (each awaited in request order; the others were answered at once)
    for parts, i, fut in pending:
        parts[i] = (parts[i][0], await fut)
    for name, parts in results:
        for index, res in parts:
            if res.error != ErrorCode.NONE:
                _rejections.info(
                    (name, index, res.error),
                    "produce to %s-%d rejected: %s %s",
                    name,
                    index,
                    res.error.name,
                    res.message or "",
                )
    if acks == 0:
        return None
    return _encode(request, results)


async def _produce_transactional(
    server: KafkaServer,
    tp: tuple[str, int],
    transactional_id: str | None,
    producer: tuple[int, int],
    records: Any,
    acks: int,
    req: Any,
) -> AppendResult | asyncio.Future[AppendResult]:
    """Append a transactional batch of ``producer`` (id, epoch): verified with its
    coordinator first (KIP-890, see broker/apis/txn.py) and appended only if no marker for
    its producer landed in the partition meanwhile."""
    error, guard = await verify_transactional_produce(server, tp, transactional_id, producer)
    if error != ErrorCode.NONE:
        return AppendResult(error, message=f"transaction verification: {error.name}")
    if guard is not None and not guard_holds(server, tp, producer[0], guard):
        return AppendResult(
            ErrorCode.INVALID_TXN_STATE,
            message="the transaction ended while this produce was being verified",
        )
    # The guard stays until the producer's marker removes it: other produces of the same
    # transaction verified concurrently share it.
    return server.produce_to_partition(tp, memoryview(records), acks, req.timeout_ms)


def _encode(
    request: Request, results: list[tuple[str, list[tuple[int, AppendResult]]]]
) -> list[bytes | FileRegion]:
    return encode_produce_response(
        request.api_version,
        request.correlation_id,
        [
            (
                name,
                [
                    (
                        index,
                        int(r.error),
                        r.base_offset,
                        r.log_start_offset,
                        r.record_errors,
                        r.message if r.error != ErrorCode.NONE else None,
                    )
                    for index, r in parts
                ],
            )
            for name, parts in results
        ],
    )
