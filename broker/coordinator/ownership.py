"""Which internal-topic partitions a coordinator core serves (both cores, sans-IO).

A core leads partition `partition_for(key)` of its internal topic for a key (group id or
transactional id); `owned` and `loading` map the partitions it has loaded or is loading to the
leader epoch.
"""

from __future__ import annotations

from isrlab.broker.errors import ErrorCode


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, num_partitions: int) -> int:
    """Kafka's `Utils.abs(key.hashCode) % num_partitions`."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


class PartitionOwnership:
    """`partition_for` and `coordinator_error` over the core's `owned` / `loading` maps."""

    num_partitions: int
    owned: dict[int, int]
    loading: dict[int, int]

    def partition_for(self, key: str) -> int:
        return partition_for(key, self.num_partitions)

    def coordinator_error(self, key: str) -> ErrorCode:
        """NONE if this broker serves the key now, else the error a client retries on."""
        p = self.partition_for(key)
        if p in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if p not in self.owned:
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE
