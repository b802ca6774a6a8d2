"""isrlab broker.replication: the sans-IO replication core.

- ``partition.Partition``: leader/follower logic of one partition replica (HW, ISR, acks,
  delayed produce, fetch epoch checks, KIP-101/KIP-279 truncation);
- ``replica.Replica``: what a leader knows about a follower;
- ``replica_log.ReplicaLog`` / ``MemoryLog``: the log interface the core drives, in memory;
- ``state``: the partition state znode (``LeaderAndIsr``) and the ``WriteStateZnode`` action;
- ``actions``: what the core asks its shell to do; ``errors``: Kafka error codes;
- ``config.ReplicationConfig``: min.insync.replicas, replica.lag.time.max.ms, truncation mode.
"""

from isrlab.broker.replication.actions import (
    CONSUMER_REPLICA_ID,
    Action,
    FetchResponse,
    ListOffsetsResponse,
    OffsetsForLeaderEpochResponse,
    ProduceResponse,
    SendFetch,
    SendOffsetsForLeaderEpoch,
)
from isrlab.broker.replication.config import ReplicationConfig, TruncationMode
from isrlab.broker.replication.errors import ErrorCode, follower_error
from isrlab.broker.replication.partition import (
    ACKS_ALL,
    FollowerPhase,
    Partition,
    Role,
    valid_acks,
)
from isrlab.broker.replication.replica import Replica
from isrlab.broker.replication.replica_log import MemoryLog, ReplicaLog, TxnValue
from isrlab.broker.replication.state import (
    NO_LEADER,
    LeaderAndIsr,
    TopicPartition,
    WriteStateZnode,
    partition_state_path,
)

__all__ = [
    "ACKS_ALL",
    "CONSUMER_REPLICA_ID",
    "NO_LEADER",
    "Action",
    "ErrorCode",
    "FetchResponse",
    "FollowerPhase",
    "LeaderAndIsr",
    "ListOffsetsResponse",
    "MemoryLog",
    "OffsetsForLeaderEpochResponse",
    "Partition",
    "ProduceResponse",
    "Replica",
    "ReplicaLog",
    "ReplicationConfig",
    "Role",
    "SendFetch",
    "SendOffsetsForLeaderEpoch",
    "TopicPartition",
    "TruncationMode",
    "TxnValue",
    "WriteStateZnode",
    "follower_error",
    "partition_state_path",
    "valid_acks",
]
