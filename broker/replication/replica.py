"""What a leader knows about one remote replica of its partition (Kafka's ``Replica``).

Fetching is acknowledging: the offset a follower fetches from is its log end offset. The
leader keeps that LEO (``UNKNOWN_OFFSET`` until the first fetch after the leader took over),
when the follower last fetched, the leader's own LEO at that fetch, and the last time the
follower was caught up. "Caught up at time t" follows Kafka's rule: a fetch at t from an offset
>= the leader's LEO means caught up at t; a fetch from an offset >= the leader's LEO at the
previous fetch means caught up at the previous fetch's time.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass
class Replica:
    """Leader-side state of a follower replica."""

    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET

    def update_fetch_state(self, fetch_offset: int, leader_log_end_offset: int, now: int) -> None:
        """Record a follower fetch from ``fetch_offset`` at ``now``."""
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset >= 0:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_time_ms = now

    def is_caught_up(self, leader_log_end_offset: int, now: int, max_lag_ms: int) -> bool:
        """Kafka's in-sync test: at the leader's LEO, or caught up within ``max_lag_ms``."""
        return (
            self.log_end_offset == leader_log_end_offset
            or now - self.last_caught_up_time_ms <= max_lag_ms
        )

    def reset(self, in_isr: bool, now: int) -> None:
        """Forget everything on a leadership change: the new leader knows no follower's LEO."""
        self.log_end_offset = UNKNOWN_OFFSET
        self.last_caught_up_time_ms = now if in_isr else 0
        self.last_fetch_time_ms = 0
        self.last_fetch_leader_log_end_offset = UNKNOWN_OFFSET
