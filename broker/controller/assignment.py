"""Initial replica placement for new topics, as Kafka's rack-unaware
``AdminUtils.assignReplicasToBrokers`` does it.

Brokers are taken in ascending id order. Partition ``p``'s first replica is broker
``(p + start_index) % n``; the remaining replicas follow at a shift that grows by one every
``n`` partitions, so that leaders and followers both spread evenly:
replica ``j`` (``j >= 0`` after the first) sits at ``first + 1 + (shift + j) % (n - 1)``.
Kafka picks ``start_index`` and the initial ``shift`` at random; this function takes them as
arguments so the caller (the shell) owns the randomness and tests are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable


def assign_replicas_to_brokers(
    broker_ids: Iterable[int],
    n_partitions: int,
    replication_factor: int,
    start_index: int = 0,
    replica_shift: int = 0,
    start_partition_id: int = 0,
) -> dict[int, tuple[int, ...]]:
    """Map partition id -> assigned replicas (the first one is the preferred leader).

    Raises ValueError, naming the problem, for non-positive counts or a replication factor
    above the number of brokers (Kafka's INVALID_REPLICATION_FACTOR).
    """
    brokers = sorted(set(broker_ids))
    if n_partitions <= 0:
        raise ValueError(f"number of partitions must be larger than 0, got {n_partitions}")
    if replication_factor <= 0:
        raise ValueError(f"replication factor must be larger than 0, got {replication_factor}")
    if replication_factor > len(brokers):
        raise ValueError(
            f"replication factor {replication_factor} larger than available brokers "
            f"{len(brokers)}: start more brokers or lower the replication factor"
        )
    n = len(brokers)
    start = start_index % n
    shift = replica_shift % n
    assignment: dict[int, tuple[int, ...]] = {}
    partition = max(0, start_partition_id)
    for _ in range(n_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        assignment[partition] = tuple(replicas)
        partition += 1
    return assignment
