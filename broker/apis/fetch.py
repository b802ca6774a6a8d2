"""Fetch: serve stored batches unchanged, zero-copy, with long polling.

Consumers (replica_id -1) read below the high watermark (read_uncommitted) or the last stable offset
(read_committed, with the aborted transactions overlapping the data from the segments' .txnindex
files, so the consumer can drop those records); followers (replica_id >= 0) read up to the log end offset, and their fetch offset
is their acknowledgement. Those bounds, the offset range and the leader epoch check are the
replication core's answer (`Partition.on_fetch`); this handler serves what it names.
`max_wait_ms`/`min_bytes` make the request wait until enough data is fetchable or the time is up
(it is woken only when one of its partitions has records or an error for it: the core's
`fetch_has_answer`, so an append does not wake consumers waiting at the high watermark; a
consumer's fetch that nothing can answer yet waits before its first read, a follower's reads
first, as its fetch offset acknowledges its log end);
`max_bytes` bounds the whole response and `partition_max_bytes` each partition, except that the
first batch of the first non-empty partition is returned even when it is larger (so a consumer can
always make progress), as in Kafka.

Large record data is sent with sendfile: see `broker.network.codec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from isrlab.broker import clock
from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.codec import FileRegion, Request
from isrlab.broker.network.hot_responses import FetchPartition, encode_fetch_response
from isrlab.broker.partition import ReadResult
from isrlab.broker.replica_manager import FetchInterest

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer


def _read_all(server: KafkaServer, req: Any, replica_id: int) -> tuple[list[Any], int, bool]:
    """One pass over the requested partitions -> (per-topic results, bytes, any error)."""
    read_committed = getattr(req, "isolation_level", 0) == 1
    remaining = req.max_bytes if req.max_bytes is not None else 0x7FFFFFFF
    total = 0
    errors = False
    out: list[Any] = []
    for topic in req.topics:
        parts = []
        for p in topic.partitions:
            tp = (topic.topic, p.partition)
            res = server.read_partition(
                tp,
                p.fetch_offset,
                min(p.partition_max_bytes, max(remaining, 0)),
                replica_id=replica_id,
                current_leader_epoch=p.current_leader_epoch,
                read_committed=read_committed,
                min_one_message=total == 0,
                fetcher_log_start=p.log_start_offset,
            )
            if res.error != ErrorCode.NONE:
                errors = True
            size = res.size
            total += size
            remaining -= size
            parts.append((p.partition, res))
        out.append((topic.topic, parts))
    return out, total, errors


def _interests(req: Any, replica_id: int) -> tuple[list[tuple[str, int]], list[FetchInterest]]:
    read_committed = getattr(req, "isolation_level", 0) == 1
    tps = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
    interests = [
        FetchInterest(replica_id, p.fetch_offset, p.current_leader_epoch, read_committed)
        for t in req.topics
        for p in t.partitions
    ]
    return tps, interests


async def handle_fetch(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    req = request.body
    replica_id = req.replica_id if req.replica_id is not None else -1
    deadline = clock.monotonic() + max(req.max_wait_ms, 0) / 1000
    waits: tuple[list[tuple[str, int]], list[FetchInterest]] | None = None
    rm = server.replica_manager
    if replica_id < 0 and req.max_wait_ms > 0 and not server.stopping:
        # A consumer's fetch changes nothing on the leader: when no partition has records or
        # an error for it (the cores' fetch_has_answer), it waits before reading anything.
        # A follower's fetch always reads first: its fetch offset acknowledges its log end.
        waits = _interests(req, replica_id)
        if not any(map(rm.fetch_has_answer, *waits)):
            await rm.notifier.wait(waits[0], deadline - clock.monotonic(), waits[1])
    while True:
        results, total, errors = _read_all(server, req, replica_id)
        now = clock.monotonic()
        if total >= max(req.min_bytes, 1) or errors or now >= deadline or server.stopping:
            break
        if waits is None:
            waits = _interests(req, replica_id)
        # Woken only when a partition can answer with records or an error (its core's
        # fetch_has_answer); the read after waking decides, as min_bytes may not be reached.
        await rm.notifier.wait(waits[0], deadline - now, waits[1])
    return _encode(server, request, results)


def _encode(
    server: KafkaServer, request: Request, results: list[tuple[str, list[tuple[int, ReadResult]]]]
) -> list[bytes | FileRegion]:
    threshold = server.config["zero.copy.threshold.bytes"]
    read_committed = getattr(request.body, "isolation_level", 0) == 1
    topics: list[tuple[str, list[FetchPartition]]] = []
    for topic, parts in results:
        partitions: list[FetchPartition] = []
        for index, res in parts:
            records: bytes | list[FileRegion] = b""
            data = res.data
            if data is not None and (size := data.size) > 0:
                if size >= threshold > 0:
                    records = [FileRegion(r.file, r.position, r.size) for r in data.regions]
                else:
                    records = data.read_bytes()
            partitions.append(
                (
                    index,
                    int(res.error),
                    res.high_watermark,
                    res.last_stable_offset,
                    res.log_start_offset,
                    (res.aborted_transactions or []) if read_committed else None,
                    records,
                )
            )
        topics.append((topic, partitions))
    return encode_fetch_response(request.api_version, request.correlation_id, topics)
