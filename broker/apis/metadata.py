"""ApiVersions and Metadata: what this broker speaks and where each partition's leader is.

Metadata reports every live broker, the controller, and for each topic its partitions' leader,
leader epoch, replicas, ISR and offline replicas, so clients route produce and fetch requests and
fail over by themselves. An unknown topic is created when `auto.create.topics.enable` is on and the
client allows it (as Kafka does, on Metadata only); otherwise UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.codec import FileRegion, Request, api_versions_table, encode_response
from isrlab.broker.topics import topic_name_problem

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer


async def handle_api_versions(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    v = request.api_version
    cls = ApiVersionsResponse[v]
    resp = cls(
        error_code=0,
        api_keys=[
            cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in api_versions_table()
        ],
        throttle_time_ms=0,
    )
    return encode_response(resp, v, request.correlation_id)


async def handle_metadata(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    v = request.api_version
    req = request.body
    cls = MetadataResponse[v]
    T = cls.MetadataResponseTopic
    P = T.MetadataResponsePartition
    known = server.topics_snapshot()
    if req.topics is None:
        names = sorted(known)
    else:
        names = [t.name for t in req.topics]
    allow_auto = getattr(req, "allow_auto_topic_creation", True)
    if allow_auto is None:
        allow_auto = True
    # The brokers with an endpoint on the listener this client came in on.
    reachable = server.live_brokers(request.listener)
    topics = []
    for name in names:
        problem = topic_name_problem(name)
        if problem:
            topics.append(
                T(error_code=int(ErrorCode.INVALID_TOPIC_EXCEPTION), name=name, partitions=[])
            )
            continue
        info = known.get(name)
        if info is None and allow_auto and server.config["auto.create.topics.enable"]:
            err = await server.auto_create_topic(name)
            if err == ErrorCode.NONE:
                info = server.topics_snapshot().get(name)
            else:
                topics.append(T(error_code=int(err), name=name, partitions=[]))
                continue
        if info is None:
            topics.append(
                T(error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), name=name, partitions=[])
            )
            continue
        partitions = []
        for p in sorted(info.assignment):
            st = server.partition_metadata((name, p))
            leader, error = st.leader, ErrorCode.NONE
            if leader < 0:
                error = ErrorCode.LEADER_NOT_AVAILABLE
            elif leader not in reachable:
                # Kafka's MetadataCache: a live leader without this client's listener is no
                # leader to it; Metadata v6+ says why (LISTENER_NOT_FOUND).
                leader = -1
                error = ErrorCode.LISTENER_NOT_FOUND if v >= 6 else ErrorCode.LEADER_NOT_AVAILABLE
            partitions.append(
                P(
                    error_code=int(error),
                    partition_index=p,
                    leader_id=leader,
                    leader_epoch=st.leader_epoch,
                    replica_nodes=st.replicas,
                    isr_nodes=st.isr,
                    offline_replicas=st.offline,
                )
            )
        topics.append(
            T(
                error_code=0,
                name=name,
                topic_id=info.topic_id,
                is_internal=name.startswith("__"),
                partitions=partitions,
            )
        )
    brokers = [
        cls.MetadataResponseBroker(node_id=b, host=h, port=p, rack=None)
        for b, (h, p) in sorted(reachable.items())
    ]
    resp = cls(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=server.cluster_id,
        controller_id=server.controller_id(),
        topics=topics,
    )
    return encode_response(resp, v, request.correlation_id)
