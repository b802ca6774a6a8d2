"""Kafka error codes the replication and controller cores answer with.

The numbers are Kafka's own (org.apache.kafka.common.protocol.Errors), so a response built from
them goes on the wire unchanged and a Kafka user recognises every name.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """The subset of Kafka's error codes that replication, acks and elections produce."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    REPLICA_NOT_AVAILABLE = 9
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_REPLICATION_FACTOR = 38
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78


# Errors after which a follower simply retries the same request after a back-off: the leader
# has not caught up with the controller yet, or is briefly unavailable.
RETRIABLE_FOLLOWER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)


def follower_error(code: int) -> ErrorCode:
    """A leader's error code as a follower's core acts on it: codes it has no rule for are
    treated like REPLICA_NOT_AVAILABLE (fetch again after replica.fetch.backoff.ms)."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.REPLICA_NOT_AVAILABLE
