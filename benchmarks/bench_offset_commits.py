"""Offset commits per second for one group with acks=all on three brokers, next to produce
requests per second of the same size in the same run.

ZooKeeper and three brokers on 127.0.0.1-3 of this machine; __consumer_offsets with replication
factor 3 (offsets.commit.required.acks=-1, the default: a commit is answered once all in-sync
replicas have its record). Committers: confluent-kafka consumers that subscribed to the group and
hold its partitions, each calling commit(offsets=[one partition], asynchronous=False) in a loop:
one OffsetCommit round trip, one record in __consumer_offsets, per call. Producers (the baseline,
same run, same kind of client): confluent-kafka producers with acks=all, linger.ms=0, each
producing one record whose key and value have the byte sizes of an offset commit record's key and
value to the one partition of a replication-factor-3 topic, then flush(): one Produce round trip per record. With
--clients 1,4 the committers are 1 and then 4 concurrent members of the same group (threads of
this process, one client each), each next to as many concurrent producers.

    flock /tmp/isrlab-cluster.lock python benchmarks/bench_offset_commits.py \
        [--seconds 5] [--rounds 2] [--clients 1,4]

(the brokers listen on 127.0.0.1-3, shared with the cluster tests: hold the lock while it runs)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import (  # noqa: E402
    Consumer,
    ConsumerGroupState,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks._cluster import progress, running_cluster  # noqa: E402
from isrlab.broker.coordinator.group.records import (  # noqa: E402
    OffsetKey,
    OffsetValue,
    encode_key,
    encode_offset_value,
)

GROUP = "bench-commits"
COMMIT_TOPIC = "bench-committed"  # the partitions the group consumes and commits
PRODUCE_TOPIC = "bench-produced"


#: __consumer_offsets with replication factor 3 and acks=all commits; joins are not measured
#: here: no initial delay before the first rebalance
BROKER = {
    "offsets.topic.replication.factor": "3",
    "offsets.commit.required.acks": "-1",
    "group.initial.rebalance.delay.ms": "0",
}


def record_sizes(partition: int) -> tuple[int, int]:
    """Key and value bytes of the __consumer_offsets record one commit of `partition` writes
    (value version 3: offset, leader epoch, metadata "", commit timestamp)."""
    key = encode_key(OffsetKey(GROUP, COMMIT_TOPIC, partition))
    value = encode_offset_value(
        OffsetValue(offset=1, leader_epoch=-1, metadata="", commit_timestamp=0)
    )
    return len(key), len(value)


def join_group(
    bootstrap: str,
    admin: AdminClient,
    n: int,
    partitions: int,
    members: list[tuple[Consumer, list[int]]],
) -> None:
    """n members of GROUP subscribe to COMMIT_TOPIC (appended to `members`, each with the
    partitions it holds); returns once the group is Stable with n members that each hold a
    partition and together hold them all."""
    for _ in range(n):
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 30000,
            }
        )
        owned: list[int] = []

        def on_assign(_c: Consumer, parts: list[TopicPartition], owned: list[int] = owned) -> None:
            owned[:] = [tp.partition for tp in parts]

        def on_revoke(_c: Consumer, _parts: list[TopicPartition], owned: list[int] = owned) -> None:
            owned.clear()

        c.subscribe([COMMIT_TOPIC], on_assign=on_assign, on_revoke=on_revoke)
        members.append((c, owned))
    deadline = time.monotonic() + 60
    while True:
        for c, _ in members:
            c.poll(0.05)
        owned_all = sorted(p for _, owned in members for p in owned)
        if owned_all == list(range(partitions)) and all(owned for _, owned in members):
            desc = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
            if desc.state == ConsumerGroupState.STABLE and len(desc.members) == n:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("the group did not settle within 60 s")
    return members


def run_threads(
    n: int, seconds: float, step: Callable[[int, int], None]
) -> tuple[int, list[float]]:
    """n threads call step(thread, i) for i = 0, 1, ... for `seconds`; returns the calls made
    and each call's latency."""
    counts = [0] * n
    lats: list[list[float]] = [[] for _ in range(n)]
    errors: list[BaseException] = []
    start = threading.Barrier(n + 1)
    stop_at: list[float] = []

    def loop(t: int) -> None:
        start.wait()
        end = stop_at[0]
        i = 0
        try:
            while (now := time.perf_counter()) < end:
                step(t, i)
                lats[t].append(time.perf_counter() - now)
                i += 1
        except BaseException as e:
            errors.append(e)
        counts[t] = i

    threads = [threading.Thread(target=loop, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    stop_at.append(time.perf_counter() + seconds)
    start.wait()
    for th in threads:
        th.join(seconds + 60)
    if errors:
        raise RuntimeError(f"{len(errors)} failed, first: {errors[0]!r}")
    return sum(counts), [x for per in lats for x in per]


def commits(
    members: list[tuple[Consumer, list[int]]], seconds: float, first: int, last: dict[int, int]
) -> tuple[int, list[float]]:
    """Each member commits offset first+i of its first partition, synchronously; `last` gets
    each partition's last acknowledged offset."""

    def step(t: int, i: int) -> None:
        c, owned = members[t]
        c.commit(offsets=[TopicPartition(COMMIT_TOPIC, owned[0], first + i)], asynchronous=False)
        last[owned[0]] = first + i

    return run_threads(len(members), seconds, step)


def produces(
    producers: list[Producer], seconds: float, key: bytes, value: bytes
) -> tuple[int, list[float]]:
    """Each producer sends one record to partition 0 and waits for it (flush): one Produce
    round trip. One partition, as all of a group's commits go to its one __consumer_offsets
    partition (one leader, the coordinator)."""
    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    def step(t: int, i: int) -> None:
        p = producers[t]
        p.produce(PRODUCE_TOPIC, key=key, value=value, partition=0, on_delivery=report)
        if p.flush(30):
            raise RuntimeError("a record was not delivered within 30 s")
        if failed:
            raise RuntimeError(f"produce failed: {failed[0]}")

    return run_threads(len(producers), seconds, step)


def close_clients(members: list[tuple[Consumer, list[int]]], producers: list[Producer]) -> None:
    for c, _ in members:
        c.close()
    for p in producers:
        p.flush(10)
    members.clear()
    producers.clear()


def pct(lats: list[float], q: float) -> float:
    lats = sorted(lats)
    return lats[min(len(lats) - 1, int(len(lats) * q))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    ap.add_argument(
        "--rounds", type=int, default=2, help="produce/commit alternations per client count"
    )
    ap.add_argument("--clients", default="1,4", help="comma-separated concurrent client counts")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.clients.split(",")]
    except ValueError:
        ap.error(f"--clients wants numbers separated by commas, not {args.clients!r}")
    if not counts or min(counts) < 1 or args.seconds <= 0 or args.rounds < 1:
        ap.error("need --clients >= 1, --seconds > 0 and --rounds >= 1")
    most = max(counts)
    key_len, value_len = record_sizes(0)
    key, value = b"k" * key_len, b"v" * value_len
    rows = []
    members: list[tuple[Consumer, list[int]]] = []
    producers: list[Producer] = []
    progress("starting ZooKeeper and 3 brokers")
    with running_cluster("bench-commits-", BROKER) as cluster:
        bootstrap = cluster.bootstrap
        progress("cluster is up")
        # log_level 2: this client's errors reach us as exceptions; its logs are muted because
        # confluent-kafka keeps an AdminClient that answered a future alive until the process
        # exits, and it would log every refused reconnect once the brokers stop
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        try:
            for name, parts in [(COMMIT_TOPIC, most), (PRODUCE_TOPIC, 1)]:
                admin.create_topics([NewTopic(name, parts, 3)])[name].result(30)
            offset = 0
            for n in counts:
                progress(f"{n} members join the group")
                join_group(bootstrap, admin, n, most, members)
                committers = list(members)
                producers.extend(
                    Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
                    for _ in range(n)
                )
                progress(f"{n} committers and {n} producers measure")
                last: dict[int, int] = {}
                # warm up: connections, metadata, the coordinator's partition
                commits(committers, 0.5, offset, last)
                produces(producers, 0.5, key, value)
                offset += 1_000_000
                c_n, p_n, c_lat, p_lat = 0, 0, [], []
                c_s = p_s = 0.0
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    k, lat = produces(producers, args.seconds, key, value)
                    p_s += time.perf_counter() - t0
                    p_n, p_lat = p_n + k, p_lat + lat
                    t0 = time.perf_counter()
                    k, lat = commits(committers, args.seconds, offset, last)
                    c_s += time.perf_counter() - t0
                    offset += k + 1
                    c_n, c_lat = c_n + k, c_lat + lat
                # every commit was acknowledged: the last one of each partition reads back
                got = members[0][0].committed(
                    [TopicPartition(COMMIT_TOPIC, p) for p in sorted(last)], timeout=10
                )
                back = {tp.partition: tp.offset for tp in got}
                if back != last:
                    raise RuntimeError(f"committed offsets read back {back}, last acked {last}")
                rows.append(
                    (
                        n,
                        c_n / c_s,
                        pct(c_lat, 0.5),
                        pct(c_lat, 0.99),
                        p_n / p_s,
                        pct(p_lat, 0.5),
                        pct(p_lat, 0.99),
                    )
                )
                close_clients(members, producers)
                del committers
            desc = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
            coordinator = desc.coordinator.id if desc.coordinator else "?"
            md = admin.list_topics(PRODUCE_TOPIC, timeout=10).topics[PRODUCE_TOPIC]
            leaders = sorted({p.leader for p in md.partitions.values()})
        finally:
            close_clients(members, producers)
            del admin  # collected with the other clients before the brokers stop

    load = os.getloadavg()[0]
    print(
        f"\n3 brokers on 127.0.0.1-3, RF=3, acks=all; records of {key_len}+{value_len} bytes "
        f"(key+value of an offset commit); {args.rounds} x {args.seconds:g} s per figure; "
        f"coordinator broker {coordinator}, produce leaders {leaders}; {os.cpu_count()} cores, "
        f"load average {load:.1f}\n"
    )
    print(
        "| concurrent clients | commits/s | p50 ms | p99 ms | produce requests/s (baseline) | p50 ms | p99 ms | commits vs produce |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for n, cps, c50, c99, pps, p50, p99 in rows:
        ratio = cps / pps
        ok = ok and ratio >= 0.5
        print(
            f"| {n} | {cps:,.0f} | {c50:.1f} | {c99:.1f} | {pps:,.0f} | {p50:.1f} | {p99:.1f} | {ratio:.2f}x |"
        )
    print(
        f"\ntarget (offset commits/s >= 0.5x produce requests/s of the same size): {'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
