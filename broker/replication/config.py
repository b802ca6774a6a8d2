"""Replication settings, named after the Kafka configs they mirror.

``from_properties`` reads Kafka-style ``name=value`` properties (``min.insync.replicas``,
``replica.lag.time.max.ms``, ...). ``replica.truncation.mode`` is isrlab's switch for the
historic follower-truncation algorithms:

- ``leader-epoch`` (default): KIP-101 with the KIP-279 fix, what Kafka does since 2.0;
- ``leader-epoch-v0``: KIP-101 as first shipped (Kafka 0.11/1.x), which trusts the leader's end
  offset without checking the epoch it belongs to and so can diverge after fast leader changes;
- ``high-watermark``: pre-KIP-101, a follower truncates to its own, possibly stale, high
  watermark whenever it starts following a new leader (acked data can be lost).

``eligible.leader.replicas.enable`` (KIP-966, default true): a leader that shrinks the ISR below
``min.insync.replicas`` records the replicas it removed as eligible leader replicas in the state
znode (``broker.replication.state.next_elr``); false writes no ELR (Kafka before 4.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class TruncationMode(StrEnum):
    """How a replica that starts following a leader decides where to truncate."""

    LEADER_EPOCH = "leader-epoch"
    LEADER_EPOCH_V0 = "leader-epoch-v0"
    HIGH_WATERMARK = "high-watermark"


@dataclass(frozen=True)
class ReplicationConfig:
    """Per-partition replication settings (Kafka defaults unless noted)."""

    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 10_000
    truncation_mode: TruncationMode = TruncationMode.LEADER_EPOCH
    # How long the leader parks a follower fetch that found no new data (long poll).
    replica_fetch_wait_max_ms: int = 500
    # How long a follower waits before retrying after an error response.
    replica_fetch_backoff_ms: int = 1_000
    # How long a follower waits for a response before it gives up and re-sends.
    replica_socket_timeout_ms: int = 30_000
    # KIP-966: keep the eligible leader replicas in the state znode on ISR changes.
    eligible_leader_replicas_enable: bool = True

    def __post_init__(self) -> None:
        if self.min_insync_replicas < 1:
            raise ValueError(
                f"min.insync.replicas must be at least 1, got {self.min_insync_replicas}"
            )
        for name in (
            "replica_lag_time_max_ms",
            "replica_fetch_wait_max_ms",
            "replica_fetch_backoff_ms",
            "replica_socket_timeout_ms",
        ):
            if getattr(self, name) < 0:
                kafka_name = name.replace("_", ".")
                raise ValueError(f"{kafka_name} must not be negative, got {getattr(self, name)}")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> ReplicationConfig:
        """Build from Kafka-style properties; unknown keys are ignored (they belong elsewhere)."""
        kwargs: dict[str, object] = {}
        for key, field_name in (
            ("min.insync.replicas", "min_insync_replicas"),
            ("replica.lag.time.max.ms", "replica_lag_time_max_ms"),
            ("replica.fetch.wait.max.ms", "replica_fetch_wait_max_ms"),
            ("replica.fetch.backoff.ms", "replica_fetch_backoff_ms"),
            ("replica.socket.timeout.ms", "replica_socket_timeout_ms"),
        ):
            if key in props:
                try:
                    kwargs[field_name] = int(props[key])
                except ValueError:
                    raise ValueError(f"{key} must be an integer, got {props[key]!r}") from None
        if "eligible.leader.replicas.enable" in props:
            value = props["eligible.leader.replicas.enable"].strip().lower()
            if value not in ("true", "false"):
                raise ValueError(
                    f"eligible.leader.replicas.enable must be true or false, got {value!r}"
                )
            kwargs["eligible_leader_replicas_enable"] = value == "true"
        if "replica.truncation.mode" in props:
            value = props["replica.truncation.mode"]
            try:
                kwargs["truncation_mode"] = TruncationMode(value)
            except ValueError:
                choices = ", ".join(m.value for m in TruncationMode)
                raise ValueError(
                    f"replica.truncation.mode must be one of {choices}, got {value!r}"
                ) from None
        return cls(**kwargs)  # type: ignore[arg-type]
