"""CreateTopics and DeleteTopics.

CreateTopics validates the name, the partition count, the replication factor against the live
brokers, explicit assignments and topic configs, each failure answered per topic with Kafka's error
code and a message; `validate_only` checks without creating. DeleteTopics removes the topic and its
partition logs. (InitProducerId is in broker/apis/txn.py.)
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from isrlab.broker.config import ConfigError, parse_topic_configs
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.network.codec import FileRegion, Request, encode_response
from isrlab.broker.topics import topic_name_problem

if TYPE_CHECKING:
    from isrlab.broker.server import KafkaServer


async def handle_create_topics(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    """Topics of one request are created concurrently: in a cluster each waits for its leader
    elections, and a client creating many topics must not wait for them one after another."""
    v = request.api_version
    req = request.body
    cls = CreateTopicsResponse[v]
    R = cls.CreatableTopicResult
    validate_only = bool(getattr(req, "validate_only", False))
    names = [t.name for t in req.topics]

    async def create_one(t: Any) -> Any:
        code, message = ErrorCode.NONE, None
        num_partitions = t.num_partitions
        rf = t.replication_factor
        try:
            problem = topic_name_problem(t.name)
            if problem:
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
            if names.count(t.name) > 1:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "topic listed twice in one request")
            try:
                parse_topic_configs(
                    {c.name: c.value for c in t.configs}, server.config.topic_defaults()
                )
            except ConfigError as e:
                raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments} or None
            overrides = {c.name: c.value for c in t.configs if c.value is not None}
            info = await server.create_topic(
                t.name, num_partitions, rf, assignment, overrides, validate_only=validate_only
            )
            num_partitions = info.num_partitions
            rf = info.replication_factor
        except KafkaError as e:
            code, message = e.code, e.message or e.code.name
        return R(
            name=t.name,
            error_code=int(code),
            error_message=message,
            num_partitions=num_partitions if code == ErrorCode.NONE else -1,
            replication_factor=rf if code == ErrorCode.NONE else -1,
            configs=None,
        )

    results = await asyncio.gather(*(create_one(t) for t in req.topics))
    return encode_response(cls(throttle_time_ms=0, topics=list(results)), v, request.correlation_id)


async def handle_delete_topics(server: KafkaServer, request: Request) -> list[bytes | FileRegion]:
    v = request.api_version
    req = request.body
    cls = DeleteTopicsResponse[v]
    R = cls.DeletableTopicResult
    results = []
    for name in req.topic_names:
        code, message = ErrorCode.NONE, None
        try:
            if not server.config["delete.topic.enable"]:
                raise KafkaError(ErrorCode.TOPIC_DELETION_DISABLED, "delete.topic.enable is false")
            await server.delete_topic(name)
        except KafkaError as e:
            code, message = e.code, e.message or e.code.name
        results.append(R(name=name, error_code=int(code), error_message=message))
    return encode_response(cls(throttle_time_ms=0, responses=results), v, request.correlation_id)
