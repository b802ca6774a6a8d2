"""Consumer groups on a 3-broker cluster, as users use them: the group's coordinator is whichever
broker leads its partition of __consumer_offsets (replication factor 3), not the broker the
client bootstraps from. confluent-kafka, kcat -G, kafka-python and aiokafka group consumers."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaConsumer

from isrlab.broker.coordinator.group.records import (
    OffsetKey,
    RecordFormatError,
    decode_key,
    decode_value,
    iter_batch_records,
)
from isrlab.broker.coordinator.ownership import partition_for
from isrlab.broker.log.inventory import segment_files
from tests.broker.test_group_clients import (
    commit_message,
    poll_until,
    read_all,
    take_over_after_kill,
)
from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.integration

OFFSETS_PARTITIONS = 5
OFFSETS_TOPIC = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster(zookeeper: Any, tmp_path_factory: Any) -> Iterator[Cluster]:
    """One cluster for the module (each test uses its own topic and groups)."""
    c = Cluster(
        zookeeper,
        tmp_path_factory.mktemp("groups"),
        3,
        {
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "group.initial.rebalance.delay.ms": "0",
            "replica.fetch.wait.max.ms": "100",
        },
    )
    c.start()
    yield c
    c.stop()


def bootstrap_first(c: Cluster) -> str:
    """Broker 1 only: every client starts there and must find its coordinator elsewhere."""
    return c.brokers[1].bootstrap


def offsets_leaders(c: Cluster) -> dict[int, int]:
    """{offsets partition: leader}, once __consumer_offsets exists and every partition has a
    leader and all three replicas in sync (a FindCoordinator creates it)."""
    probe = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "probe"})
    try:
        probe.committed([TopicPartition("nothing", 0)], timeout=20)  # creates the topic
    except KafkaException:
        pass
    finally:
        probe.close()

    def leaders() -> dict[int, int] | None:
        md = c.admin().list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC]
        if md.error is not None or len(md.partitions) != OFFSETS_PARTITIONS:
            return None
        if any(
            p.leader < 0 or len(p.replicas) != 3 or len(p.isrs) != 3 for p in md.partitions.values()
        ):
            return None
        return {p: m.leader for p, m in md.partitions.items()}

    return c.wait_for(leaders, what="__consumer_offsets with leaders and 3 in-sync replicas")


def group_away_from_broker_1(c: Cluster, prefix: str) -> tuple[str, int]:
    """A group id whose coordinator is not broker 1, and that coordinator."""
    leaders = offsets_leaders(c)
    for i in range(1000):
        group = f"{prefix}-{i}"
        leader = leaders[partition_for(group, OFFSETS_PARTITIONS)]
        if leader != 1:
            return group, leader
    raise AssertionError(f"every offsets partition is led by broker 1: {leaders}")


def produce(c: Cluster, topic: str, partitions: int, per_partition: int) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(per_partition):
        for part in range(partitions):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part)
        p.poll(0)
    assert p.flush(30) == 0


def member(c: Cluster, group: str, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap_first(c),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            **conf,
        }
    )


def committed(c: Cluster, group: str, topic: str, partitions: int) -> dict[int, int]:
    probe = member(c, group)
    try:
        tps = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    finally:
        probe.close()
    return {tp.partition: tp.offset for tp in tps}


def stored_commits(c: Cluster, broker: int, group: str) -> dict[tuple[str, int], int]:
    """The latest offset commit of each of the group's partitions in one replica's files of the
    group's __consumer_offsets partition (whole batches only: the broker is running)."""
    directory = c.partition_dir(broker, OFFSETS_TOPIC, partition_for(group, OFFSETS_PARTITIONS))
    out: dict[tuple[str, int], int] = {}
    for path in segment_files(directory):
        data = path.read_bytes()
        try:
            records = list(iter_batch_records(data))
        except RecordFormatError:
            continue  # a batch being written: the next look sees it whole
        for _offset, key, value in records:
            if key is None:
                continue
            k = decode_key(key)
            if isinstance(k, OffsetKey) and k.group == group:
                v = decode_value(k, value)
                if v is not None:
                    out[(k.topic, k.partition)] = v.offset  # type: ignore[union-attr]
    return out


def test_subscribe_commit_describe_delete_with_the_coordinator_on_another_broker(
    cluster: Cluster,
) -> None:
    c = cluster
    c.create_topic("orders", 3, 3)
    produce(c, "orders", 3, 30)
    group, coordinator = group_away_from_broker_1(c, "billing")

    consumer = member(c, group, **{"client.id": "billing-1"})
    consumer.subscribe(["orders"])
    got = read_all(consumer, 90)
    assert sorted((p, o) for p, o, _ in got) == [(p, o) for p in range(3) for o in range(30)]
    consumer.commit(asynchronous=False)
    tps = consumer.committed([TopicPartition("orders", p) for p in range(3)], timeout=15)
    assert {tp.partition: tp.offset for tp in tps} == {0: 30, 1: 30, 2: 30}

    # the commit is a record on every replica of the group's offsets partition (rf 3, acks=all)
    for b in (1, 2, 3):
        c.wait_for(
            lambda b=b: stored_commits(c, b, group) == {("orders", p): 30 for p in range(3)},
            what=f"broker {b}'s replica of the group's offsets partition",
        )

    admin = c.admin()
    d = admin.describe_consumer_groups([group])[group].result(15)
    assert d.coordinator.id == coordinator != 1
    assert d.state.name == "STABLE"
    assert [m.client_id for m in d.members] == ["billing-1"]
    assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1, 2]
    listed = admin.list_consumer_groups().result(15)  # asks every broker
    assert not listed.errors
    assert {g.group_id: g.state.name for g in listed.valid}.get(group) == "STABLE"

    with pytest.raises(KafkaException) as e:
        admin.delete_consumer_groups([group])[group].result(15)
    assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    consumer.close()
    assert admin.describe_consumer_groups([group])[group].result(15).state.name == "EMPTY"
    assert committed(c, group, "orders", 3) == {0: 30, 1: 30, 2: 30}
    assert admin.delete_consumer_groups([group])[group].result(15) is None
    assert committed(c, group, "orders", 3) == {p: -1001 for p in range(3)}


def test_two_members_split_and_one_takes_over(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("jobs", 4, 3)
    produce(c, "jobs", 4, 10)
    group, _ = group_away_from_broker_1(c, "workers")
    owned: dict[int, set[int]] = {0: set(), 1: set()}
    consumers: list[Consumer] = []
    reads: list[tuple[int, int, int]] = []

    def make(i: int) -> Consumer:
        m = member(c, group)

        def on_assign(_c: Any, tps: list[TopicPartition]) -> None:
            owned[i] = {tp.partition for tp in tps}

        def on_revoke(_c: Any, _tps: list[TopicPartition]) -> None:
            owned[i] = set()

        m.subscribe(["jobs"], on_assign=on_assign, on_revoke=on_revoke)
        consumers.append(m)
        return m

    def keep(i: int, m: Any) -> None:
        reads.append((i, m.partition(), m.offset()))
        commit_message(consumers[i], m)

    first = make(0)
    poll_until([first], lambda: owned[0] == {0, 1, 2, 3}, keep, 30, "the first member")
    second = make(1)
    poll_until(
        [first, second],
        lambda: len(owned[0]) == 2 and len(owned[1]) == 2,
        keep,
        30,
        "the split",
    )
    assert owned[0].isdisjoint(owned[1])
    # the second member leaves: the first takes everything back and reads on from the commits
    poll_until([first, second], lambda: len(reads) >= 40, keep, 30, "every record")
    second.close()
    consumers[1] = first  # nothing polls it any more
    produce(c, "jobs", 4, 5)
    poll_until(
        [first], lambda: owned[0] == {0, 1, 2, 3} and len(reads) >= 60, keep, 30, "the take-over"
    )
    assert sorted((p, o) for _i, p, o in reads) == [(p, o) for p in range(4) for o in range(15)]
    assert committed(c, group, "jobs", 4) == {p: 15 for p in range(4)}
    first.close()


def test_the_survivor_takes_over_from_the_commits_after_the_other_member_is_killed(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    c.create_topic("tasks", 4, 3)
    group, _ = group_away_from_broker_1(c, "workers")
    take_over_after_kill(
        bootstrap_first(c), "tasks", 4, lambda n: produce(c, "tasks", 4, n), tmp_path, group
    )


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_group_consumer(cluster: Cluster) -> None:
    c = cluster
    c.create_topic("clicks", 3, 3)
    produce(c, "clicks", 3, 20)
    group, _ = group_away_from_broker_1(c, "kcat")
    args = ["kcat", "-b", bootstrap_first(c), "-G", group, "clicks", "-e", "-q"]
    args += ["-X", "auto.offset.reset=earliest", "-f", "%p %o\\n"]
    run = subprocess.run(args, capture_output=True, timeout=60, text=True)
    assert run.returncode == 0, run.stderr
    rows = sorted(tuple(int(x) for x in line.split()) for line in run.stdout.splitlines())
    assert rows == [(p, o) for p in range(3) for o in range(20)]
    assert committed(c, group, "clicks", 3) == {p: 20 for p in range(3)}


def test_kafka_python_and_aiokafka_group_consumers(cluster: Cluster) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    c = cluster
    c.create_topic("kp", 2, 3)
    produce(c, "kp", 2, 10)
    every = [(p, o) for p in range(2) for o in range(10)]

    group, _ = group_away_from_broker_1(c, "kafka-python")
    kc = KafkaConsumer(
        "kp",
        bootstrap_servers=bootstrap_first(c),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(seen) < 20 and time.monotonic() < deadline:
        for tp, records in kc.poll(timeout_ms=500).items():
            seen += [(tp.partition, r.offset) for r in records]
    kc.commit()
    kc.close()
    assert sorted(seen) == every
    assert committed(c, group, "kp", 2) == {0: 10, 1: 10}

    group, _ = group_away_from_broker_1(c, "aiokafka")

    async def run() -> tuple[list[tuple[int, int]], dict[int, int | None]]:
        a = AIOKafkaConsumer(
            "kp",
            bootstrap_servers=bootstrap_first(c),
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await a.start()
        got: list[tuple[int, int]] = []
        try:
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                for tp, records in (await a.getmany(timeout_ms=500)).items():
                    got += [(tp.partition, r.offset) for r in records]
            await a.commit()
            offsets = {p: await a.committed(AioTopicPartition("kp", p)) for p in range(2)}
        finally:
            await a.stop()
        return got, offsets

    got, offsets = asyncio.run(run())
    assert sorted(got) == every
    assert offsets == {0: 10, 1: 10}
    assert committed(c, group, "kp", 2) == {0: 10, 1: 10}
