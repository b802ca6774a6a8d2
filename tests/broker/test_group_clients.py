"""Consumer groups as users use them: real group clients (librdkafka via confluent-kafka, kcat -G,
kafka-python, aiokafka) against one broker process, which coordinates every group itself."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kafka.errors
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.consumer import JoinGroupResponse

from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient
from tests.broker.rawgroup import find_coordinator, join, join_request, sync, sync_request

pytestmark = pytest.mark.integration

#: a small offsets topic and no initial rebalance delay keep the tests quick
GROUP_BROKER = {
    "offsets.topic.num.partitions": "5",
    "offsets.topic.replication.factor": "1",
    "group.initial.rebalance.delay.ms": "0",
}


def group_broker(broker_factory: Any, **overrides: str) -> BrokerProcess:
    return broker_factory({**GROUP_BROKER, **overrides})


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """`per_partition` records to each partition; record i of partition p holds b"p-i"."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[Any] = []
    for i in range(per_partition):
        for part in range(partitions):
            p.produce(
                topic,
                value=f"{part}-{i}".encode(),
                partition=part,
                on_delivery=lambda err, _m: errors.append(err) if err else None,
            )
        p.poll(0)
    assert p.flush(30) == 0
    assert not errors


def consumer(bootstrap: str, group: str, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            **conf,
        }
    )


def poll_until(
    consumers: list[Consumer],
    done: Callable[[], bool],
    on_message: Callable[[int, Any], None] | None = None,
    timeout: float = 30,
    what: str = "condition",
) -> None:
    """Poll every consumer in turn (a group member must keep polling) until `done()`."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        for i, c in enumerate(consumers):
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer {i}: {m.error()}")
            if on_message is not None:
                on_message(i, m)


def commit_message(c: Consumer, m: Any, timeout: float = 30) -> None:
    """Commit past `m`, synchronously. A member that keeps consuming during a rebalance (the
    cooperative protocol) can be told REBALANCE_IN_PROGRESS while the group completes it, as
    Kafka does; the commit is then retried (librdkafka finishes the rebalance meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c.commit(message=m, asynchronous=False)
            return
        except KafkaException as e:
            if e.args[0].code() != KafkaError.REBALANCE_IN_PROGRESS:
                raise
            assert time.monotonic() < deadline, "the rebalance never completed"
            time.sleep(0.1)


def read_all(c: Consumer, expect: int, timeout: float = 30) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []

    def keep(_i: int, m: Any) -> None:
        out.append((m.partition(), m.offset(), m.value()))

    poll_until([c], lambda: len(out) >= expect, keep, timeout, f"{expect} records")
    return out


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as a client outside the group reads them (OffsetFetch)."""
    c = consumer(bootstrap, group)
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()
    for tp in tps:
        assert tp.error is None, tp.error
    return {tp.partition: tp.offset for tp in tps}


# ----- confluent-kafka -----------------------------------------------------------------------


def test_confluent_subscribe_commit_committed_and_resume(broker_factory: Any) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "orders", 3)
    produce(b.bootstrap, "orders", 3, 20)

    c = consumer(b.bootstrap, "billing")
    c.subscribe(["orders"])
    got = read_all(c, 60)
    assert sorted((p, o) for p, o, _ in got) == [(p, o) for p in range(3) for o in range(20)]
    assert all(v == f"{p}-{o}".encode() for p, o, v in got)
    # commit part of partition 0 explicitly, the rest from the positions
    c.commit(offsets=[TopicPartition("orders", 0, 7)], asynchronous=False)
    assert committed(b.bootstrap, "billing", "orders", 3) == {0: 7, 1: -1001, 2: -1001}
    c.commit(asynchronous=False)
    got_tps = c.committed([TopicPartition("orders", p) for p in range(3)], timeout=10)
    assert {tp.partition: tp.offset for tp in got_tps} == {0: 20, 1: 20, 2: 20}
    c.close()

    # the group resumes where it committed: only the new records are read
    produce(b.bootstrap, "orders", 3, 5)
    c = consumer(b.bootstrap, "billing")
    c.subscribe(["orders"])
    got = read_all(c, 15)
    assert sorted((p, o) for p, o, _ in got) == [(p, o) for p in range(3) for o in range(20, 25)]
    # and a second group reads the topic on its own, from the beginning
    other = consumer(b.bootstrap, "audit")
    other.subscribe(["orders"])
    assert len(read_all(other, 75)) == 75
    other.close()
    c.close()


def test_admin_list_describe_delete_consumer_groups(broker_factory: Any) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "events", 4)
    produce(b.bootstrap, "events", 4, 3)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})

    c = consumer(b.bootstrap, "dashboard", **{"client.id": "dash-1"})
    c.subscribe(["events"])
    read_all(c, 12)
    c.commit(asynchronous=False)

    listed = admin.list_consumer_groups().result(10)
    assert not listed.errors
    states = {g.group_id: g.state.name for g in listed.valid}
    assert states == {"dashboard": "STABLE"}
    assert {g.group_id: g.is_simple_consumer_group for g in listed.valid} == {"dashboard": False}

    d = admin.describe_consumer_groups(["dashboard"])["dashboard"].result(10)
    assert d.state.name == "STABLE"
    assert not d.is_simple_consumer_group
    assert d.partition_assignor == "range"
    assert d.coordinator.id == 0
    assert len(d.members) == 1
    (m,) = d.members
    assert m.client_id == "dash-1"
    assert m.member_id.startswith("dash-1-")
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1, 2, 3]
    assert {tp.topic for tp in m.assignment.topic_partitions} == {"events"}

    # a group with a live member cannot be deleted
    with pytest.raises(KafkaException) as e:
        admin.delete_consumer_groups(["dashboard"])["dashboard"].result(10)
    assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    assert committed(b.bootstrap, "dashboard", "events", 4) == {p: 3 for p in range(4)}

    c.close()  # LeaveGroup: the group is empty at once
    d = admin.describe_consumer_groups(["dashboard"])["dashboard"].result(10)
    assert d.state.name == "EMPTY"
    assert d.members == []
    listed = admin.list_consumer_groups().result(10)
    assert {g.group_id: g.state.name for g in listed.valid} == {"dashboard": "EMPTY"}

    assert admin.delete_consumer_groups(["dashboard"])["dashboard"].result(10) is None
    assert admin.list_consumer_groups().result(10).valid == []
    # its offsets went with it: a new member starts from auto.offset.reset
    assert committed(b.bootstrap, "dashboard", "events", 4) == {p: -1001 for p in range(4)}
    with pytest.raises(KafkaException) as e:
        admin.delete_consumer_groups(["dashboard"])["dashboard"].result(10)
    assert e.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND


def test_admin_alter_list_and_delete_consumer_group_offsets(broker_factory: Any) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "ledger", 2)
    produce(b.bootstrap, "ledger", 2, 10)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})

    req = ConsumerGroupTopicPartitions(
        "reindex", [TopicPartition("ledger", 0, 4), TopicPartition("ledger", 1, 9)]
    )
    altered = admin.alter_consumer_group_offsets([req])["reindex"].result(10)
    assert {(tp.partition, tp.offset) for tp in altered.topic_partitions} == {(0, 4), (1, 9)}
    assert all(tp.error is None for tp in altered.topic_partitions)

    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("reindex")])[
        "reindex"
    ].result(10)
    assert {(tp.topic, tp.partition, tp.offset) for tp in listed.topic_partitions} == {
        ("ledger", 0, 4),
        ("ledger", 1, 9),
    }
    # a member of that group starts from the altered offsets
    c = consumer(b.bootstrap, "reindex")
    c.subscribe(["ledger"])
    got = read_all(c, 7)
    assert sorted((p, o) for p, o, _ in got) == [(0, o) for o in range(4, 10)] + [(1, 9)]
    c.close()

    # OffsetDelete (the group is empty now; confluent-kafka has no call for it, kafka-python has)
    kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        deleted = kadmin.delete_group_offsets("reindex", [KpTopicPartition("ledger", 0)])
    finally:
        kadmin.close()
    assert deleted == {KpTopicPartition("ledger", 0): kafka.errors.NoError}
    assert committed(b.bootstrap, "reindex", "ledger", 2) == {0: -1001, 1: 9}


# ----- kcat, kafka-python, aiokafka ----------------------------------------------------------


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer_reads_everything_and_exits(broker_factory: Any) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "clicks", 3)
    produce(b.bootstrap, "clicks", 3, 40)
    args = ["kcat", "-b", b.bootstrap, "-G", "kcat-group", "clicks", "-e"]
    # (-o beginning would make kcat override the committed offsets on every assignment)
    args += ["-X", "auto.offset.reset=earliest", "-f", "%p %o %s\\n", "-q"]
    run = subprocess.run(args, capture_output=True, timeout=60, text=True)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()]
    assert sorted((int(p), int(o)) for p, o, _ in rows) == [
        (p, o) for p in range(3) for o in range(40)
    ]
    assert all(v == f"{p}-{o}" for p, o, v in rows)
    # kcat commits (auto commit, and on close): a second run of the group reads nothing more
    assert committed(b.bootstrap, "kcat-group", "clicks", 3) == {p: 40 for p in range(3)}
    produce(b.bootstrap, "clicks", 3, 1)
    run = subprocess.run(args, capture_output=True, timeout=60, text=True)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()]
    assert sorted((int(p), int(o)) for p, o, _ in rows) == [(p, 40) for p in range(3)]


def test_kafka_python_group_consumer_subscribe_and_commit(broker_factory: Any) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "kp", 2)
    produce(b.bootstrap, "kp", 2, 15)

    def group_consumer() -> KafkaConsumer:
        return KafkaConsumer(
            "kp",
            bootstrap_servers=b.bootstrap,
            group_id="kp-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )

    kc = group_consumer()
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(seen) < 30 and time.monotonic() < deadline:
        for tp, records in kc.poll(timeout_ms=500).items():
            seen += [(tp.partition, r.offset) for r in records]
    assert sorted(seen) == [(p, o) for p in range(2) for o in range(15)]
    assert kc.assignment() == {KpTopicPartition("kp", 0), KpTopicPartition("kp", 1)}
    kc.commit()
    assert kc.committed(KpTopicPartition("kp", 0)) == 15
    assert kc.committed(KpTopicPartition("kp", 1)) == 15
    kc.close()
    assert committed(b.bootstrap, "kp-group", "kp", 2) == {0: 15, 1: 15}

    produce(b.bootstrap, "kp", 2, 2)
    kc = group_consumer()
    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < 4 and time.monotonic() < deadline:
        for tp, records in kc.poll(timeout_ms=500).items():
            seen += [(tp.partition, r.offset) for r in records]
    kc.close()
    assert sorted(seen) == [(0, 15), (0, 16), (1, 15), (1, 16)]


def test_aiokafka_group_consumer_subscribe_and_commit(broker_factory: Any) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "aio", 2)
    produce(b.bootstrap, "aio", 2, 12)

    async def run() -> tuple[list[tuple[int, int]], dict[int, int | None]]:
        c = AIOKafkaConsumer(
            "aio",
            bootstrap_servers=b.bootstrap,
            group_id="aio-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await c.start()
        seen: list[tuple[int, int]] = []
        try:
            deadline = time.monotonic() + 30
            while len(seen) < 24 and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500)
                for tp, records in batches.items():
                    seen += [(tp.partition, r.offset) for r in records]
            await c.commit()
            got = {p: await c.committed(AioTopicPartition("aio", p)) for p in range(2)}
        finally:
            await c.stop()
        return seen, got

    seen, got = asyncio.run(run())
    assert sorted(seen) == [(p, o) for p in range(2) for o in range(12)]
    assert got == {0: 12, 1: 12}
    assert committed(b.bootstrap, "aio-group", "aio", 2) == {0: 12, 1: 12}


# ----- two members: the split, and the take-over after one is killed ------------------------

#: a group member in its own process, so the test can kill it with SIGKILL (no LeaveGroup).
#: It reads slowly, commits every record synchronously after reading it, and reports on stdout.
MEMBER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Consumer, TopicPartition

    bootstrap, group, topic = sys.argv[1:4]
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
    })

    def say(*row):
        print(json.dumps(row), flush=True)

    c.subscribe([topic], on_assign=lambda _c, tps: say("assigned", sorted(t.partition for t in tps)),
                on_revoke=lambda _c, tps: say("revoked", sorted(t.partition for t in tps)))
    while True:
        m = c.poll(0.2)
        if m is None or m.error() is not None:
            continue
        say("read", m.partition(), m.offset())
        time.sleep(0.02)
        c.commit(offsets=[TopicPartition(topic, m.partition(), m.offset() + 1)],
                 asynchronous=False)
        say("committed", m.partition(), m.offset() + 1)
    """
)


class MemberProcess:
    """The subprocess member: its reports are read by a thread as they come."""

    def __init__(self, bootstrap: str, group: str, topic: str, log: Path):
        self.rows: list[list[Any]] = []
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER_SCRIPT, bootstrap, group, topic],
            stdout=subprocess.PIPE,
            stderr=open(log, "wb"),  # noqa: SIM115 - closed with the process
            text=True,
        )
        import threading

        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.rows.append(json.loads(line))

    def assignment(self) -> list[int] | None:
        for row in reversed(list(self.rows)):
            if row[0] == "assigned":
                return list(row[1])
            if row[0] == "revoked":
                return []
        return None

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(5)


def test_two_members_split_the_partitions_and_one_takes_over_after_the_other_is_killed(
    broker_factory: Any, tmp_path: Path
) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "jobs", 4)
    take_over_after_kill(
        b.bootstrap, "jobs", 4, lambda n: produce(b.bootstrap, "jobs", 4, n), tmp_path
    )


def take_over_after_kill(
    bootstrap: str,
    topic: str,
    partitions: int,
    produce_each: Callable[[int], None],
    tmp: Path,
    group: str = "workers",
) -> None:
    """Two members of `group` split `topic`; the other one (a subprocess) is killed
    with SIGKILL mid-stream; this one takes everything over from the committed offsets."""
    per_partition = 400
    other = MemberProcess(bootstrap, group, topic, tmp / "member.stderr")
    try:
        # the other member joins first and owns everything until this one joins
        deadline = time.monotonic() + 30
        while other.assignment() != list(range(partitions)):
            assert time.monotonic() < deadline, (other.rows, other.log.read_text()[-2000:])
            assert other.proc.poll() is None, other.log.read_text()[-2000:]
            time.sleep(0.1)
        mine: list[int] = []
        reads: list[tuple[int, int]] = []  # (partition, offset) read here, in order
        takeover_at: list[int] = []  # index into reads where the full assignment arrived

        def on_assign(_c: Any, tps: list[TopicPartition]) -> None:
            mine[:] = sorted(tp.partition for tp in tps)
            if len(mine) == partitions and other.proc.poll() is not None:
                takeover_at.append(len(reads))

        def on_revoke(_c: Any, _tps: list[TopicPartition]) -> None:
            mine.clear()

        c = consumer(bootstrap, group, **{"heartbeat.interval.ms": 500})
        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)

        def keep(_i: int, m: Any) -> None:
            reads.append((m.partition(), m.offset()))
            commit_message(c, m)

        def split() -> bool:
            theirs = other.assignment()
            return bool(mine) and bool(theirs) and sorted(mine + theirs) == list(range(partitions))

        # both members hold a share: disjoint, together all partitions
        poll_until([c], split, keep, 30, "the two members to split the partitions")
        theirs = other.assignment() or []
        assert not set(mine) & set(theirs)
        assert len(mine) == len(theirs) == partitions // 2  # range assignor, 2 members, 4 parts
        produce_each(per_partition)

        # let the other member read and commit some of its records, then kill it mid-stream
        def other_committed_some() -> bool:
            return sum(1 for r in other.rows if r[0] == "committed") >= 20

        poll_until([c], other_committed_some, keep, 30, "the other member to commit")
        other.kill9()
        theirs = other.assignment() or []
        assert theirs and not set(theirs) & set(mine)
        # what the dead member committed, as the coordinator holds it (nobody else commits there)
        at_kill = committed(bootstrap, group, topic, partitions)
        their_commits = {p: 0 for p in theirs}
        for row in other.rows:
            if row[0] == "committed":
                their_commits[row[1]] = max(their_commits[row[1]], row[2])
        their_reads = [(r[1], r[2]) for r in other.rows if r[0] == "read"]
        for p in theirs:
            # the last reported commit is there; at most the one record read after it is not
            assert their_commits[p] <= at_kill[p] <= their_commits[p] + 1 or at_kill[p] == -1001

        # the session times out (no LeaveGroup); the survivor gets everything and reads on
        total = partitions * per_partition
        poll_until(
            [c],
            lambda: bool(takeover_at) and len(set(reads) | set(their_reads)) >= total,
            keep,
            60,
            "the survivor to take over and read everything",
        )
        assert mine == list(range(partitions))
        after = reads[takeover_at[0] :]
        for p in theirs:
            first = next(o for q, o in after if q == p)
            # it resumes exactly at the committed offset: nothing committed is read again,
            # nothing is skipped
            assert first == max(at_kill[p], 0), (p, first, at_kill[p])
        # nothing lost: every record was read by one of the two
        assert set(reads) | set(their_reads) == {
            (p, o) for p in range(partitions) for o in range(per_partition)
        }
        # and the survivor read each of its records once after the take-over
        assert len(after) == len(set(after))
        assert committed(bootstrap, group, topic, partitions) == {
            p: per_partition for p in range(partitions)
        }
        c.close()
    finally:
        other.kill9()


def test_cooperative_sticky_members_rebalance_incrementally(broker_factory: Any) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "coop", 4)
    produce(b.bootstrap, "coop", 4, 10)
    events: list[tuple[int, str, list[int]]] = []
    owned: dict[int, set[int]] = {0: set(), 1: set()}

    def member(i: int) -> Consumer:
        c = consumer(
            b.bootstrap,
            "coop-group",
            **{"partition.assignment.strategy": "cooperative-sticky", "client.id": f"coop-{i}"},
        )

        def on_assign(cc: Consumer, tps: list[TopicPartition]) -> None:
            events.append((i, "assign", sorted(t.partition for t in tps)))
            owned[i] |= {t.partition for t in tps}

        def on_revoke(_cc: Consumer, tps: list[TopicPartition]) -> None:
            events.append((i, "revoke", sorted(t.partition for t in tps)))
            owned[i] -= {t.partition for t in tps}

        c.subscribe(["coop"], on_assign=on_assign, on_revoke=on_revoke)
        return c

    reads: list[tuple[int, int, int]] = []
    members: list[Consumer] = []

    def keep(i: int, m: Any) -> None:
        reads.append((i, m.partition(), m.offset()))
        commit_message(members[i], m)

    c0 = member(0)
    members.append(c0)
    poll_until([c0], lambda: owned[0] == {0, 1, 2, 3}, keep, 30, "member 0 to own all")
    c1 = member(1)
    members.append(c1)
    poll_until(
        [c0, c1],
        lambda: len(owned[0]) == 2 and len(owned[1]) == 2,
        keep,
        30,
        "the incremental hand-over",
    )
    assert owned[0].isdisjoint(owned[1])
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    d = admin.describe_consumer_groups(["coop-group"])["coop-group"].result(10)
    assert d.partition_assignor == "cooperative-sticky"
    assert {
        m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in d.members
    } == {"coop-0": sorted(owned[0]), "coop-1": sorted(owned[1])}
    # cooperative: member 0 gave up only what member 1 got, and kept the rest throughout
    revoked = [e for e in events if e[0] == 0 and e[1] == "revoke"]
    assert revoked == [(0, "revoke", sorted(owned[1]))]
    poll_until([c0, c1], lambda: len(reads) >= 40, keep, 30, "every record")
    # every record once: each was committed before its partition moved
    assert sorted((p, o) for _i, p, o in reads) == [(p, o) for p in range(4) for o in range(10)]
    assert committed(b.bootstrap, "coop-group", "coop", 4) == {p: 10 for p in range(4)}
    # member 1 leaves: its partitions go back to member 0, which loses none of its own
    mark = len(events)
    given_back = sorted(owned[1])
    c1.close()
    poll_until([c0], lambda: owned[0] == {0, 1, 2, 3}, None, 30, "member 0 to own all again")
    # member 0 revoked nothing: it was only given member 1's partitions
    assert [e for e in events[mark:] if e[0] == 0] == [(0, "assign", given_back)]
    c0.close()


def test_static_member_is_fenced_by_a_second_instance_with_the_same_id(
    broker_factory: Any,
) -> None:
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "static", 2)
    produce(b.bootstrap, "static", 2, 5)
    first = consumer(b.bootstrap, "static-group", **{"group.instance.id": "worker-a"})
    first.subscribe(["static"])
    read_all(first, 10)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    (m,) = admin.describe_consumer_groups(["static-group"])["static-group"].result(10).members
    assert m.group_instance_id == "worker-a"
    first_id = m.member_id

    second = consumer(b.bootstrap, "static-group", **{"group.instance.id": "worker-a"})
    second.subscribe(["static"])
    fatal: list[Any] = []

    def first_fenced() -> bool:
        m = first.poll(0.1)
        if m is not None and m.error() is not None:
            fatal.append(m.error())
        return bool(fatal)

    got: list[tuple[int, int]] = []

    def keep(_i: int, m: Any) -> None:
        got.append((m.partition(), m.offset()))

    poll_until([second], first_fenced, keep, 30, "the first instance to be fenced")
    # librdkafka raises the broker's FENCED_INSTANCE_ID as a fatal consumer error
    assert fatal[0].code() == KafkaError._FATAL, fatal
    assert "Static consumer fenced by other consumer" in fatal[0].str(), fatal
    # the group goes on with the second instance under a new member id
    (m,) = admin.describe_consumer_groups(["static-group"])["static-group"].result(10).members
    assert m.group_instance_id == "worker-a"
    assert m.member_id != first_id
    produce(b.bootstrap, "static", 2, 1)
    poll_until([second], lambda: len(got) >= 12, keep, 30, "12 records")
    assert sorted(got) == [(p, o) for p in range(2) for o in range(6)]
    second.close()
    first.close()


# ----- restart: the coordinator loads __consumer_offsets -------------------------------------


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_committed_offsets_survive_a_broker_restart(
    broker_factory: Any, tmp_path: Path, how: str
) -> None:
    log_dir = tmp_path / "restart-logs"
    b = broker_factory({**GROUP_BROKER}, log_dir=log_dir)
    create_topic(b.bootstrap, "payments", 3)
    produce(b.bootstrap, "payments", 3, 10)
    c = consumer(b.bootstrap, "settle")
    c.subscribe(["payments"])
    read_all(c, 30)
    c.commit(
        offsets=[
            TopicPartition("payments", 0, 10),
            TopicPartition("payments", 1, 4),
            TopicPartition("payments", 2, 7, metadata="checkpoint-7"),
        ],
        asynchronous=False,
    )
    other = consumer(b.bootstrap, "other")
    other.commit(offsets=[TopicPartition("payments", 1, 2)], asynchronous=False)
    other.close()
    c.close()
    if how == "clean":
        b.stop()
    else:
        b.kill9()  # acks=all commits are in the log; nothing is flushed on the way out

    b2 = broker_factory({**GROUP_BROKER}, log_dir=log_dir)
    assert committed(b2.bootstrap, "settle", "payments", 3) == {0: 10, 1: 4, 2: 7}
    assert committed(b2.bootstrap, "other", "payments", 3) == {0: -1001, 1: 2, 2: -1001}
    probe = consumer(b2.bootstrap, "settle")
    (tp,) = probe.committed([TopicPartition("payments", 2)], timeout=10)
    assert tp.metadata == "checkpoint-7"
    probe.close()
    assert "loaded __consumer_offsets" in b2.log_text()
    # the group resumes from them
    c = consumer(b2.bootstrap, "settle")
    c.subscribe(["payments"])
    got = read_all(c, 9)
    assert sorted((p, o) for p, o, _ in got) == [(1, o) for o in range(4, 10)] + [
        (2, o) for o in range(7, 10)
    ]
    c.close()


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
    broker_factory: Any,
) -> None:
    """KIP-345: a static member that closes (librdkafka sends no LeaveGroup for it) and comes
    back within session.timeout.ms takes its old partitions again; the other member is not
    disturbed (no revocation)."""
    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "static2", 4)
    events: list[tuple[str, str, list[int]]] = []

    def member(instance: str) -> Consumer:
        c = consumer(
            b.bootstrap,
            "static-pair",
            **{"group.instance.id": instance, "session.timeout.ms": 20000},
        )
        c.subscribe(
            ["static2"],
            on_assign=lambda _c, tps: events.append(
                (instance, "assign", sorted(t.partition for t in tps))
            ),
            on_revoke=lambda _c, tps: events.append(
                (instance, "revoke", sorted(t.partition for t in tps))
            ),
        )
        return c

    def owned(instance: str) -> list[int] | None:
        for who, what, parts in reversed(events):
            if who == instance:
                return parts if what == "assign" else []
        return None

    a = member("a")
    poll_until([a], lambda: owned("a") == [0, 1, 2, 3], None, 30, "a to own all")
    b2 = member("b")
    poll_until(
        [a, b2], lambda: owned("a") == [0, 1] and owned("b") == [2, 3], None, 30, "the split"
    )
    a.close()  # a static member: no LeaveGroup, the group keeps its place
    before = len(events)
    a = member("a")
    poll_until([a, b2], lambda: len(events) > before and owned("a") == [0, 1], None, 30, "a back")
    # b was never revoked and a got exactly its old partitions
    assert [e for e in events[before:]] == [("a", "assign", [0, 1])]
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # its futures die with it
    members = admin.describe_consumer_groups(["static-pair"])["static-pair"].result(10).members
    assert sorted(m.group_instance_id for m in members) == ["a", "b"]
    a.close()
    b2.close()


@pytest.mark.parametrize("version", [5, 9])
def test_the_static_leader_restarting_causes_no_rebalance(
    broker_factory: Any, version: int
) -> None:
    """KIP-345/KIP-814 at the protocol level: the leader's instance rejoins with a new member id
    in a Stable group. No rebalance (same generation); before JoinGroup v9 the answer names the
    old leader id, so the client does not compute an assignment the group would ignore; from v9
    it is the leader with skip_assignment."""
    b = group_broker(broker_factory)
    leader_c, follower_c = RawClient(b.port), RawClient(b.port)
    assert find_coordinator(leader_c, "sl").error_code == 0
    first = join(leader_c, "sl", instance_id="lead")
    assert first.error_code == 0 and first.leader == first.member_id
    follower_c.send_frame(follower_c.encode(join_request("sl", instance_id="follow")))
    rejoin = leader_c.call(join_request("sl", first.member_id, instance_id="lead"))  # rebalance
    follower = JoinGroupResponse[5].decode(follower_c.recv_frame(), header=True)
    assert rejoin.generation_id == follower.generation_id == 2
    assert rejoin.leader == rejoin.member_id == first.member_id
    follower_c.send_frame(follower_c.encode(sync_request("sl", 2, follower.member_id)))
    assigned = {first.member_id: b"L", follower.member_id: b"F"}
    assert sync(leader_c, "sl", 2, first.member_id, assigned).error_code == 0
    follower_c.recv_frame()

    restarted = RawClient(b.port)
    r = restarted.call(join_request("sl", instance_id="lead", version=version))
    assert r.error_code == 0
    assert r.generation_id == 2  # no rebalance
    assert r.member_id != first.member_id
    if version >= 9:
        assert (r.leader, r.skip_assignment) == (r.member_id, True)
        assert len(r.members) == 2
    else:
        assert (r.leader, list(r.members)) == (first.member_id, [])
    answer = sync(restarted, "sl", 2, r.member_id)
    assert (answer.error_code, bytes(answer.assignment)) == (0, b"L")
    for c in (leader_c, follower_c, restarted):
        c.close()


def test_every_advertised_version_of_the_group_apis_serves_a_member(broker_factory: Any) -> None:
    """Old and new clients alike: for each JoinGroup version 0..9 one member joins, syncs,
    heartbeats, commits, fetches its offset and leaves, each API at a matching version
    (SyncGroup 0-5, Heartbeat 0-4, OffsetCommit 2-8, OffsetFetch 1-8, LeaveGroup 0-5); then
    FindCoordinator 0-4, DescribeGroups 0-5, ListGroups 0-4 and DeleteGroups 0-2."""
    from kafka.protocol.admin import DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest
    from kafka.protocol.consumer import (
        HeartbeatRequest,
        JoinGroupRequest,
        LeaveGroupRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        SyncGroupRequest,
    )
    from kafka.protocol.metadata import FindCoordinatorRequest

    b = group_broker(broker_factory)
    create_topic(b.bootstrap, "t", 1)
    c = RawClient(b.port)
    for v in range(5):
        r = c.call(FindCoordinatorRequest[v](key="g", key_type=0, coordinator_keys=["g"]))
        found = r.coordinators[0] if v >= 4 else r
        assert (found.error_code, found.node_id, found.port) == (0, 0, b.port), (v, r)
    for jv in range(10):
        g = f"g{jv}"
        J = JoinGroupRequest[jv]
        protocols = [J.JoinGroupRequestProtocol(name="range", metadata=b"m")]
        join_kw = dict(group_id=g, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                       group_instance_id=None, protocol_type="consumer", protocols=protocols,
                       reason=None)  # fmt: skip
        r = c.call(J(member_id="", **join_kw))
        if jv >= 4:  # KIP-394: the member id first
            assert r.error_code == 79
            r = c.call(J(member_id=r.member_id, **join_kw))
        assert (r.error_code, r.generation_id, r.leader) == (0, 1, r.member_id), (jv, r)
        S = SyncGroupRequest[min(jv, 5)]
        s = c.call(
            S(group_id=g, generation_id=1, member_id=r.member_id, group_instance_id=None,
              protocol_type="consumer", protocol_name="range",
              assignments=[S.SyncGroupRequestAssignment(member_id=r.member_id, assignment=b"a")])
        )  # fmt: skip
        assert (s.error_code, bytes(s.assignment)) == (0, b"a"), (jv, s)
        hb = c.call(
            HeartbeatRequest[min(jv, 4)](
                group_id=g, generation_id=1, member_id=r.member_id, group_instance_id=None
            )
        )
        assert hb.error_code == 0, (jv, hb)
        C = OffsetCommitRequest[max(2, min(jv, 8))]
        T = C.OffsetCommitRequestTopic
        part = T.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=3 + jv, committed_leader_epoch=-1,
            commit_timestamp=-1, committed_metadata=f"m{jv}",
        )  # fmt: skip
        oc = c.call(
            C(group_id=g, generation_id_or_member_epoch=1, member_id=r.member_id,
              group_instance_id=None, retention_time_ms=-1, topics=[T(name="t", partitions=[part])])
        )  # fmt: skip
        assert [p.error_code for t in oc.topics for p in t.partitions] == [0], (jv, oc)
        F = OffsetFetchRequest[max(1, min(jv, 8))]
        if min(jv, 8) >= 8:
            fetched = c.call(
                F(groups=[F.OffsetFetchRequestGroup(group_id=g, topics=None)], require_stable=False)
            ).groups[0]
        else:
            topic = F.OffsetFetchRequestTopic(name="t", partition_indexes=[0])
            fetched = c.call(F(group_id=g, topics=[topic], require_stable=False))
        (p,) = fetched.topics[0].partitions
        assert (p.committed_offset, p.metadata, p.error_code) == (3 + jv, f"m{jv}", 0), (jv, p)
        L = LeaveGroupRequest[min(jv, 5)]
        if min(jv, 5) >= 3:
            who = L.MemberIdentity(member_id=r.member_id, group_instance_id=None, reason=None)
            left = c.call(L(group_id=g, members=[who]))
        else:
            left = c.call(L(group_id=g, member_id=r.member_id))
        assert left.error_code == 0, (jv, left)
    for v in range(6):
        d = c.call(DescribeGroupsRequest[v](groups=["g1"], include_authorized_operations=True))
        assert (d.groups[0].error_code, d.groups[0].group_state) == (0, "Empty"), (v, d)
    for v in range(5):
        listed = c.call(ListGroupsRequest[v](states_filter=[], types_filter=[]))
        assert sorted(x.group_id for x in listed.groups) == [f"g{i}" for i in range(10)], v
    for v in range(3):
        deleted = c.call(DeleteGroupsRequest[v](groups_names=[f"g{v}"]))
        assert [(x.group_id, x.error_code) for x in deleted.results] == [(f"g{v}", 0)], v
    c.close()


def test_a_member_rides_through_a_broker_restart_without_a_rebalance(tmp_path: Path) -> None:
    """The coordinator restarts (same address, same log dir) under a live member: it loads the
    Stable group with its members from __consumer_offsets, so the member's heartbeats (same
    member id and generation) are accepted: no revocation, no new assignment, it reads on."""
    from tests.broker.conftest import free_port

    port = free_port()
    b = BrokerProcess(tmp_path / "logs", port, GROUP_BROKER)
    b.start()
    events: list[str] = []
    try:
        create_topic(b.bootstrap, "steady", 2)
        produce(b.bootstrap, "steady", 2, 5)
        c = consumer(b.bootstrap, "steady-group", **{"session.timeout.ms": 30000})
        c.subscribe(
            ["steady"],
            on_assign=lambda _c, _tps: events.append("assign"),
            on_revoke=lambda _c, _tps: events.append("revoke"),
        )
        read_all(c, 10)
        assert events == ["assign"]
        b.stop()
        b = BrokerProcess(tmp_path / "logs", port, GROUP_BROKER)
        b.start()
        produce(b.bootstrap, "steady", 2, 1)
        got = read_all(c, 2, timeout=40)
        assert sorted((p, o) for p, o, _ in got) == [(0, 5), (1, 5)]
        c.commit(asynchronous=False)
        assert events == ["assign"]  # the group never rebalanced
        assert committed(b.bootstrap, "steady-group", "steady", 2) == {0: 6, 1: 6}
        c.close()
    finally:
        b.stop()
