"""Group coordinator failover on a 3-broker cluster: committed offsets survive the coordinator's
death when commits are acknowledged once replicated (Kafka's acks=all for __consumer_offsets), and
go backwards under the historic switch `offsets.commit.required.acks=1`.

The scenario: commit offset 10 (replicated everywhere), pause the two followers of the group's
offsets partition, commit offset 20, kill -9 the coordinator, resume the followers. A follower
becomes leader and coordinator with only what was replicated: offset 10.
- acks=all (default): the commit of 20 is never acknowledged (it times out while the followers
  are paused), so the group sees 10 and nothing it was told is lost.
- offsets.commit.required.acks=1: the commit of 20 is acknowledged at once, and the new
  coordinator says 10: a committed offset went backwards.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from isrlab.broker.coordinator.ownership import partition_for

GROUP = "failover-group"
OFFSETS_PARTITIONS = 3


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "socket.timeout.ms": 4000,
        }
    )


def _commit(bootstrap: str, offset: int) -> bool:
    """A simple (non-member) commit of t-0 = offset; True if acknowledged."""
    c = _consumer(bootstrap)
    try:
        c.commit(offsets=[TopicPartition("t", 0, offset)], asynchronous=False)
        return True
    except KafkaException:
        return False
    finally:
        c.close()


def _high_watermark(bootstrap: str, p: int) -> int:
    c = _consumer(bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=5)[1]
    finally:
        c.close()


class _BackgroundCommit(threading.Thread):
    """A commit that may hang (its coordinator cannot replicate): the test goes on meanwhile and
    reads `acked` at the end."""

    def __init__(self, bootstrap: str, offset: int):
        super().__init__(daemon=True)
        self.bootstrap, self.offset = bootstrap, offset
        self.acked: bool | None = None

    def run(self) -> None:
        self.acked = _commit(self.bootstrap, self.offset)


def _committed(bootstrap: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        c = _consumer(bootstrap)
        try:
            return c.committed([TopicPartition("t", 0)], timeout=5)[0].offset
        except KafkaException as e:
            last = e
            time.sleep(0.5)
        finally:
            c.close()
    raise AssertionError(f"could not fetch committed offsets: {last}")


def _scenario(cluster_factory, required_acks: str) -> tuple[bool, bool, int]:  # type: ignore[no-untyped-def]
    c = cluster_factory(
        3,
        {
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "offsets.commit.required.acks": required_acks,
            "offsets.commit.timeout.ms": "2000",
            "replica.lag.time.max.ms": "15000",
            "replica.fetch.wait.max.ms": "200",
            "group.initial.rebalance.delay.ms": "0",
        },
    )
    c.create_topic("t", 1, 3)
    assert _commit(c.bootstrap, 10)
    p = partition_for(GROUP, OFFSETS_PARTITIONS)
    c.wait_for(
        lambda: (
            len(c.partition("__consumer_offsets", p).isrs) == 3
            and _high_watermark(c.bootstrap, p) >= 1
        ),
        what="the commit of 10 on every replica (the high watermark past it)",
    )
    coordinator = c.partition("__consumer_offsets", p).leader
    assert _committed(c.bootstrap) == 10
    followers = [b for b in c.brokers if b != coordinator]
    for b in followers:
        c.brokers[b].signal(signal.SIGSTOP)
    try:
        # The followers' parked fetches are answered (empty) after replica.fetch.wait.max.ms;
        # a commit before that would reach their socket buffers and survive the pause.
        time.sleep(0.6)
        # Sent to the coordinator alone; given 1.5 s (the followers must be resumed before their
        # ZooKeeper sessions expire, or the controller would shrink the ISR to the coordinator).
        commit = _BackgroundCommit(c.brokers[coordinator].bootstrap, 20)
        commit.start()
        commit.join(1.5)
        acked_before_kill = commit.acked is True
        c.brokers[coordinator].kill9()
    finally:
        for b in followers:
            c.brokers[b].signal(signal.SIGCONT)
    c.wait_for(
        lambda: c.partition("__consumer_offsets", p).leader in followers,
        what="a new coordinator",
        timeout=40,
    )
    commit.join(30)
    return acked_before_kill, commit.acked is True, _committed(c.bootstrap)


def test_acks_all_commits_survive_coordinator_failover(cluster_factory):
    acked_before_kill, acked, seen = _scenario(cluster_factory, "-1")
    assert not acked_before_kill, "a commit acknowledged without its followers"
    # librdkafka may retry the commit on the new coordinator: then it is a new, replicated
    # commit, and the group must see it
    assert seen == (20 if acked else 10)


def test_required_acks_1_commit_goes_backwards_on_failover(cluster_factory):
    """The historic switch reproduces the loss: an acknowledged commit is gone."""
    acked_before_kill, _, seen = _scenario(cluster_factory, "1")
    assert acked_before_kill
    assert seen == 10, "the acknowledged commit of 20 should have been lost with acks=1"


@pytest.mark.parametrize("n", [3])
def test_committed_offsets_survive_a_clean_coordinator_move(cluster_factory, n):
    """Kill the coordinator after fully replicated commits: the new one loads them."""
    c = cluster_factory(
        n,
        {
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "group.initial.rebalance.delay.ms": "0",
        },
    )
    c.create_topic("t", 1, 3)
    for offset in (5, 7, 9):
        assert _commit(c.bootstrap, offset)
    p = partition_for(GROUP, OFFSETS_PARTITIONS)
    c.wait_for(
        lambda: (
            len(c.partition("__consumer_offsets", p).isrs) == 3
            and _high_watermark(c.bootstrap, p) >= 3
        ),
        what="the commits on every replica",
    )
    coordinator = c.partition("__consumer_offsets", p).leader
    c.brokers[coordinator].kill9()
    c.wait_for(
        lambda: c.partition("__consumer_offsets", p).leader not in (coordinator, -1),
        what="a new coordinator",
        timeout=40,
    )
    assert _committed(c.bootstrap) == 9


def test_a_live_group_moves_to_the_new_coordinator(cluster_factory):
    """Two subscribed members consume and commit; the coordinator is killed mid-run. The group
    finds the new coordinator, rebalances, consumes everything produced, and no committed offset
    it was told about goes backwards."""
    from confluent_kafka import Producer

    c = cluster_factory(
        3,
        {
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "group.initial.rebalance.delay.ms": "0",
            "min.insync.replicas": "2",
        },
    )
    c.create_topic("in", 3, 3)
    p = partition_for(GROUP, OFFSETS_PARTITIONS)
    stop = threading.Event()
    seen: set[bytes] = set()
    acked_commits: dict[int, int] = {}  # partition -> highest acknowledged commit
    regressions: list[str] = []
    lock = threading.Lock()

    def member(name: str) -> None:
        cons = Consumer(
            {
                "bootstrap.servers": c.bootstrap,
                "group.id": GROUP,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )

        def on_assign(consumer, partitions):  # type: ignore[no-untyped-def]
            got = consumer.committed(partitions, timeout=10)
            with lock:
                for tp in got:
                    if tp.offset >= 0 and tp.offset < acked_commits.get(tp.partition, -1):
                        regressions.append(
                            f"{name}: in-{tp.partition} committed {tp.offset} < acknowledged "
                            f"{acked_commits[tp.partition]}"
                        )

        cons.subscribe(["in"], on_assign=on_assign)
        try:
            while not stop.is_set():
                msg = cons.poll(0.2)
                if msg is None or msg.error():
                    continue
                with lock:
                    seen.add(msg.value())
                try:
                    tp = TopicPartition("in", msg.partition(), msg.offset() + 1)
                    cons.commit(offsets=[tp], asynchronous=False)
                    with lock:
                        prev = acked_commits.get(msg.partition(), -1)
                        acked_commits[msg.partition()] = max(prev, msg.offset() + 1)
                except KafkaException:
                    pass  # not acknowledged: the coordinator moved or the group rebalanced
        finally:
            cons.close()

    threads = [threading.Thread(target=member, args=(f"m{i}",), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
    sent: list[bytes] = []

    def produce(n: int) -> None:
        for _ in range(n):
            v = f"v{len(sent)}".encode()
            producer.produce("in", v, partition=len(sent) % 3)
            sent.append(v)
            time.sleep(0.005)
        assert producer.flush(30) == 0

    produce(300)
    c.wait_for(lambda: len(seen) >= 300, what="the group consuming", timeout=60)
    coordinator = c.partition("__consumer_offsets", p).leader
    c.brokers[coordinator].kill9()
    produce(300)
    c.wait_for(
        lambda: c.partition("__consumer_offsets", p).leader not in (coordinator, -1),
        what="a new coordinator",
        timeout=40,
    )
    c.wait_for(lambda: set(sent) <= seen, what="everything consumed after the move", timeout=90)
    stop.set()
    for t in threads:
        t.join(30)
    assert not regressions, regressions
    assert acked_commits, "no commit was acknowledged"
    final = _committed_all(c.bootstrap)
    for part, off in acked_commits.items():
        assert final.get(part, -1) >= off, (part, final, acked_commits)


def _committed_all(bootstrap: str) -> dict[int, int]:
    cons = _consumer(bootstrap)
    try:
        got = cons.committed([TopicPartition("in", i) for i in range(3)], timeout=20)
        return {tp.partition: tp.offset for tp in got}
    finally:
        cons.close()
