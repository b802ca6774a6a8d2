"""How many partition replicas one broker may host: `max.broker.partitions` (KIP-578's name).

Every hosted partition keeps its active segment open for appends: the `.log` file and the two
memory-mapped indexes (Python's `mmap` holds a descriptor of its own), so `FDS_PER_PARTITION`
descriptors whatever the partition's size. Older segments are opened only when
read, and at most `segment.SEGMENT_HANDLE_POOL_SIZE` of them at once, broker-wide. A broker that
hosts more partitions than its open-file limit (RLIMIT_NOFILE, `ulimit -n`) allows stops accepting
connections, cannot answer requests or shut down, and cannot start again; so topics are refused
before anything is created, with POLICY_VIOLATION, as Kafka refuses a CreateTopics over its
per-request partition cap.

Left unset, the limit is derived from the soft RLIMIT_NOFILE: a quarter of the descriptors is kept
for client and replica connections, ZooKeeper, checkpoints and sendfile (each send opens the segment
again), then the pool of older segments, and the rest divided by `FDS_PER_PARTITION`. An explicit
value larger than that is lowered to it (with a warning at start-up): a limit the broker cannot
honour is no limit.
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Iterable, Mapping

from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.segment import FDS_PER_SEGMENT, SEGMENT_HANDLE_POOL_SIZE

#: Descriptors held by one hosted partition: its active segment (`.log` and the two index mappings).
FDS_PER_PARTITION = FDS_PER_SEGMENT


def open_file_limit() -> int:
    """The process's soft RLIMIT_NOFILE (`ulimit -n`)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def derived_partition_limit(nofile: int) -> int:
    """Most partitions `nofile` descriptors can hold, after the reserve and the segment pool."""
    usable = nofile - nofile // 4 - SEGMENT_HANDLE_POOL_SIZE * FDS_PER_SEGMENT
    return max(usable // FDS_PER_PARTITION, 0)


def partition_limit(configured: int | None, nofile: int | None = None) -> tuple[int, str]:
    """(limit, where it comes from): `max.broker.partitions` capped by what the fd limit allows."""
    nofile = open_file_limit() if nofile is None else nofile
    derived = derived_partition_limit(nofile)
    why = (
        f"derived from the open-file limit (ulimit -n {nofile}, {FDS_PER_PARTITION} descriptors "
        "per partition)"
    )
    if configured is None or configured > derived:
        return derived, f"max.broker.partitions={derived}, {why}"
    return configured, f"max.broker.partitions={configured}"


def replicas_per_broker(assignments: Iterable[Mapping[int, list[int]]]) -> Counter[int]:
    """How many partition replicas each broker hosts under these topic assignments."""
    count: Counter[int] = Counter()
    for assignment in assignments:
        for replicas in assignment.values():
            count.update(replicas)
    return count


def check_partition_count(
    num_partitions: int, replication_factor: int, brokers: int, limit: int, why: str
) -> None:
    """Refuse early, before placing replicas, a request no assignment could fit.

    `num_partitions x replication_factor` replicas over `brokers` brokers put at least the
    average on one of them.
    """
    least_on_busiest = -(-num_partitions * replication_factor // max(brokers, 1))
    if least_on_busiest > limit:
        raise KafkaError(
            ErrorCode.POLICY_VIOLATION,
            f"{num_partitions} partitions x replication factor {replication_factor} would put "
            f"{least_on_busiest} partition replicas on a broker, over {why}; create fewer "
            "partitions, or raise the limit (ulimit -n, max.broker.partitions)",
        )


def check_partition_budget(
    hosted: Mapping[int, int], assignment: Mapping[int, list[int]], limit: int, why: str
) -> None:
    """POLICY_VIOLATION if `assignment` would take any broker past `limit` hosted replicas."""
    for broker, added in sorted(replicas_per_broker([assignment]).items()):
        already = hosted.get(broker, 0)
        if already + added > limit:
            raise KafkaError(
                ErrorCode.POLICY_VIOLATION,
                f"broker {broker} hosts {already} partition replicas; {added} more would exceed "
                f"{why}; create fewer partitions, delete topics, or raise the limit "
                "(ulimit -n, max.broker.partitions)",
            )
