"""Every error code the broker sends must mean on the wire what Kafka means by it."""

from __future__ import annotations

import kafka.errors as ke
import pytest

from isrlab.broker.errors import ErrorCode

# kafka-python names a few errors differently from org.apache.kafka.common.protocol.Errors.
ALIASES = {
    "CORRUPT_MESSAGE": "CorruptRecordException",
    "INVALID_FETCH_SIZE": "InvalidFetchRequestError",
    "NOT_LEADER_OR_FOLLOWER": "NotLeaderForPartitionError",
    "MESSAGE_TOO_LARGE": "MessageSizeTooLargeError",
    "INVALID_TOPIC_EXCEPTION": "InvalidTopicError",
    "INVALID_REPLICA_ASSIGNMENT": "InvalidReplicationAssignmentError",
    "INVALID_CONFIG": "InvalidConfigurationError",
    "NONE": "NoError",
    "UNKNOWN_SERVER_ERROR": "UnknownError",
}


def _kafka_python_name(code: ErrorCode) -> str:
    if code.name in ALIASES:
        return ALIASES[code.name]
    return "".join(w.capitalize() for w in code.name.split("_")) + (
        "" if code.name.endswith(("_ERROR", "_EXCEPTION")) else "Error"
    )


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_code_number_matches_kafka(code: ErrorCode) -> None:
    cls = getattr(ke, _kafka_python_name(code))
    assert cls.errno == code.value, f"{code.name} is {code.value}, Kafka says {cls.errno}"
