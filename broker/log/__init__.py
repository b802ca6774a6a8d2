"""isrlab broker.log: the broker's segmented log storage, one module per on-disk artifact.

- ``record_batch``: RecordBatch v2 headers (parse, validate, stamp offsets)
- ``offset_index`` / ``time_index``: the ``.index`` and ``.timeindex`` files
- ``segment``: ``LogSegment``, a ``.log`` file plus its indexes
- ``checkpoint``: offset checkpoint files (recovery point, high watermark, log start)
- ``leader_epoch_checkpoint``: ``LeaderEpochFileCache`` (KIP-101)
- ``log``: ``Log``, one partition's segments and offsets
- ``dump``: kafka-dump-log style output
"""

from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from isrlab.broker.log.leader_epoch_checkpoint import LeaderEpochFileCache
from isrlab.broker.log.log import AppendOrigin, FetchDataInfo, Log, LogAppendInfo, LogConfig
from isrlab.broker.log.segment import FileRegion, LogSegment

__all__ = [
    "AppendOrigin",
    "CorruptRecordError",
    "FetchDataInfo",
    "FileRegion",
    "InvalidRecordError",
    "KafkaStorageError",
    "LeaderEpochFileCache",
    "Log",
    "LogAppendInfo",
    "LogConfig",
    "LogError",
    "LogSegment",
    "OffsetCheckpointFile",
    "OffsetOutOfRangeError",
    "RecordBatchTooLargeError",
    "RecordTooLargeError",
    "UnexpectedAppendOffsetError",
]
