"""Errors raised by the broker's log storage, mirroring Kafka's exception classes.

Every error carries ``code``, the Kafka protocol error code the server puts in its response
(``CorruptRecordError.code == 2`` is CORRUPT_MESSAGE, and so on), so a request handler can
``except LogError as e: respond(error_code=e.code)`` without a lookup table.
"""

from __future__ import annotations


class LogError(Exception):
    """Base class of every log storage error; ``code`` -1 is Kafka's UNKNOWN_SERVER_ERROR."""

    code: int = -1


class UnexpectedAppendOffsetError(LogError):
    """A follower append does not start at the log end offset (Kafka's UnexpectedAppendOffsetException).

    ``first_offset``/``last_offset`` span the rejected records. When an empty follower
    fetched from a leader whose log start is inside a batch, the replica handles this as
    Kafka's Partition does: ``truncate_fully_and_start_at(first_offset)`` and append again.
    """

    def __init__(self, message: str, first_offset: int, last_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.last_offset = last_offset


class SegmentsChangedError(LogError):
    """The segments a cleaning replaces are no longer the log's (retention, a truncation or a
    deletion got there first); the cleaning is dropped and tried again later."""


class OffsetOutOfRangeError(LogError):
    """OFFSET_OUT_OF_RANGE (1): a read below the log start offset or past the log end offset."""

    code = 1


class CorruptRecordError(LogError):
    """CORRUPT_MESSAGE (2): a batch whose CRC does not match, or a batch cut short (torn)."""

    code = 2


class RecordTooLargeError(LogError):
    """MESSAGE_TOO_LARGE (10): a batch larger than the topic's ``max.message.bytes``."""

    code = 10


class RecordBatchTooLargeError(LogError):
    """RECORD_LIST_TOO_LARGE (18): one append larger than ``segment.bytes``; it cannot fit."""

    code = 18


class KafkaStorageError(LogError):
    """KAFKA_STORAGE_ERROR (56): a log file or checkpoint on disk cannot be read or written."""

    code = 56


class InvalidRecordError(LogError):
    """INVALID_RECORD (87): bad magic, malformed header, no batches, inconsistent lengths or counts."""

    code = 87
