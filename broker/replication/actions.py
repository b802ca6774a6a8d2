"""Actions the replication core asks its shell to perform, and the replies it builds.

Every ``Partition`` event handler returns a list of these values; the shell executes them in
order (send a response, send a request to the leader, write the state znode). Nothing here does
IO. A :class:`FetchResponse` names the offset range ``[fetch_offset, records_end)`` to serve
rather than carrying record bytes, so the shell can read and send stored batches unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from isrlab.broker.replication.errors import ErrorCode
from isrlab.broker.replication.state import TopicPartition, WriteStateZnode

CONSUMER_REPLICA_ID = -1


@dataclass(frozen=True)
class FetchResponse:
    """Answer a Fetch from ``replica_id`` (``CONSUMER_REPLICA_ID`` for consumers).

    The shell sends the records in ``[fetch_offset, records_end)`` (empty on error).
    ``request_id`` echoes the id the shell gave the fetch (matters for parked long polls).
    """

    tp: TopicPartition
    request_id: int
    replica_id: int
    error: ErrorCode
    fetch_offset: int
    records_end: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    leader_epoch: int
    last_stable_offset: int


@dataclass(frozen=True)
class ProduceResponse:
    """Answer a Produce (never emitted for acks=0 successes); ``message`` explains an error."""

    tp: TopicPartition
    request_id: int
    error: ErrorCode
    base_offset: int = -1
    last_offset: int = -1
    message: str | None = None


@dataclass(frozen=True)
class SendFetch:
    """Follower side: send a Fetch to the leader; answer with ``Partition.on_fetch_response``."""

    tp: TopicPartition
    request_id: int
    leader_id: int
    replica_id: int
    fetch_offset: int
    current_leader_epoch: int
    max_wait_ms: int


@dataclass(frozen=True)
class SendOffsetsForLeaderEpoch:
    """Follower side: ask the leader where ``leader_epoch`` ends (KIP-101/KIP-279)."""

    tp: TopicPartition
    request_id: int
    leader_id: int
    replica_id: int
    current_leader_epoch: int
    leader_epoch: int


@dataclass(frozen=True)
class OffsetsForLeaderEpochResponse:
    """Leader side reply to an OffsetsForLeaderEpoch request (returned directly)."""

    tp: TopicPartition
    error: ErrorCode
    leader_epoch: int
    end_offset: int


@dataclass(frozen=True)
class ListOffsetsResponse:
    """Leader side reply to ListOffsets (returned directly): the offsets the requester may be
    told about, ``[earliest, latest)`` (-1 on error)."""

    tp: TopicPartition
    error: ErrorCode
    earliest: int
    latest: int
    leader_epoch: int


Action = FetchResponse | ProduceResponse | SendFetch | SendOffsetsForLeaderEpoch | WriteStateZnode
