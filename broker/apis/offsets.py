"""ListOffsets and OffsetForLeaderEpoch.

ListOffsets: timestamp -2 = earliest (log start offset), -1 = latest (high watermark, or the last
stable offset under read_committed; a follower's replica id: the log end offset), otherwise the
first offset whose timestamp is >= the given one, found through the time index. Consumers never see
an offset at or past what they may read. The leader epoch check and both bounds are the
replication core's answer (`Partition.on_list_offsets`); this handler looks up timestamps.
Any other negative timestamp is one of Kafka's newer special values (-3 max timestamp from v7,
-4 earliest local from v8, -5 latest tiered from v9) or none at all; this broker speaks up to v6,
so that partition gets UNSUPPORTED_VERSION, as Kafka answers a timestamp its version does not
allow (ReplicaManager.isListOffsetsTimestampUnsupported). A storage error reading the time index
is that partition's KAFKA_STORAGE_ERROR.

OffsetForLeaderEpoch: the end offset of a leader epoch from the leader-epoch-checkpoint cache, used
by followers to truncate (KIP-101/279) and by clients to detect log truncation (KIP-320).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import ListOffsetsResponse, OffsetForLeaderEpochResponse

from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.errors import LogError
from isrlab.broker.network.codec import FileRegion, Request, encode_response

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer

EARLIEST = -2
LATEST = -1
SPECIAL_TIMESTAMPS = (EARLIEST, LATEST)


async def handle_list_offsets(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    v = request.api_version
    req = request.body
    cls = ListOffsetsResponse[v]
    T = cls.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    read_committed = getattr(req, "isolation_level", 0) == 1
    topics = []
    for topic in req.topics:
        parts = []
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            try:
                if p.timestamp < 0 and p.timestamp not in SPECIAL_TIMESTAMPS:
                    raise KafkaError(ErrorCode.UNSUPPORTED_VERSION)
                hp = server.replica_manager.get(tp)
                epoch = getattr(p, "current_leader_epoch", None)
                bounds = hp.core.on_list_offsets(
                    -1 if epoch is None else epoch, req.replica_id, read_committed
                )
                if bounds.error:
                    raise KafkaError(ErrorCode(int(bounds.error)))
                ts, off = -1, -1
                if p.timestamp == EARLIEST:
                    off = bounds.earliest
                elif p.timestamp == LATEST:
                    off = bounds.latest
                else:
                    found = hp.log.offset_for_timestamp(p.timestamp)
                    if found is not None and found[0] < bounds.latest:
                        off, ts = found
                parts.append(
                    P(
                        partition_index=p.partition_index,
                        error_code=0,
                        timestamp=ts,
                        offset=off,
                        leader_epoch=bounds.leader_epoch,
                    )
                )
            except (KafkaError, LogError) as e:
                parts.append(
                    P(
                        partition_index=p.partition_index,
                        error_code=int(e.code),
                        timestamp=-1,
                        offset=-1,
                    )
                )
        topics.append(T(name=topic.name, partitions=parts))
    return encode_response(cls(throttle_time_ms=0, topics=topics), v, request.correlation_id)


async def handle_offset_for_leader_epoch(
    server: KafkaServer, request: Request
) -> list[bytes | FileRegion]:
    v = request.api_version
    req = request.body
    cls = OffsetForLeaderEpochResponse[v]
    T = cls.OffsetForLeaderTopicResult
    P = T.EpochEndOffset
    topics = []
    for topic in req.topics:
        parts = []
        for p in topic.partitions:
            tp = (topic.topic, p.partition)
            try:
                hp = server.replica_manager.get(tp)
                r = hp.core.on_offsets_for_leader_epoch(p.current_leader_epoch, p.leader_epoch)
                parts.append(
                    P(
                        error_code=int(r.error),
                        partition=p.partition,
                        leader_epoch=r.leader_epoch,
                        end_offset=r.end_offset,
                    )
                )
            except KafkaError as e:
                parts.append(
                    P(error_code=int(e.code), partition=p.partition, leader_epoch=-1, end_offset=-1)
                )
        topics.append(T(topic=topic.topic, partitions=parts))
    return encode_response(cls(throttle_time_ms=0, topics=topics), v, request.correlation_id)


__all__ = ["ErrorCode", "handle_list_offsets", "handle_offset_for_leader_epoch"]
