"""Replication on a real cluster: ZooKeeper + three broker processes on 127.0.0.1-3, driven by
confluent-kafka. The historic-failure switches must lose data exactly where Kafka did, and the
safe defaults must not."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import NewTopic

from tests.cluster.conftest import StoredRecord

pytestmark = pytest.mark.integration


def produce_all(bootstrap: str, topic: str, values: list[bytes], **conf: object) -> list[int]:
    """Produce and return the offsets of acknowledged values (raises on any failure)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, **conf})
    acked: list[int] = []
    errors: list[object] = []

    def cb(err, msg):  # type: ignore[no-untyped-def]
        if err:
            errors.append(err)
        else:
            acked.append(msg.offset())

    for v in values:
        p.produce(topic, v, partition=0, on_delivery=cb)
        p.poll(0)
    p.flush(60)
    if errors:
        raise KafkaException(errors[0])
    return acked


def test_acks_all_survives_leader_kill9_and_restart(cluster_factory):
    c = cluster_factory(3, {"min.insync.replicas": "2"})
    c.create_topic("safe", 1, 3)
    leader = c.partition("safe").leader
    acked: list[tuple[int, bytes]] = []
    stop = threading.Event()

    def writer() -> None:
        p = Producer(
            {
                "bootstrap.servers": c.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 30000,
            }
        )

        def cb(err, msg):  # type: ignore[no-untyped-def]
            if err is None:
                acked.append((msg.offset(), msg.value()))

        i = 0
        while not stop.is_set():
            try:
                p.produce("safe", f"{i:08d}".encode(), partition=0, on_delivery=cb)
                i += 1
            except BufferError:
                time.sleep(0.005)
            p.poll(0.001)
        p.flush(40)

    t = threading.Thread(target=writer)
    t.start()
    c.wait_for(lambda: len(acked) > 3000, what="some acked writes")
    c.brokers[leader].kill9()
    c.wait_for(
        lambda: c.partition("safe").leader not in (leader, -1), what="a new leader", timeout=40
    )
    time.sleep(1)
    c.brokers[leader].start()
    c.wait_for(lambda: len(c.partition("safe").isrs) == 3, what="the old leader back in the ISR")
    stop.set()
    t.join()
    stored = dict(c.read_all("safe"))
    missing = [(o, v) for o, v in acked if stored.get(o) != v]
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"
    assert len(acked) > 3000


def test_not_enough_replicas_when_isr_below_min_insync(cluster_factory):
    c = cluster_factory(3, {"min.insync.replicas": "2"})
    c.create_topic("strict", 1, 3)
    leader = c.partition("strict").leader
    for b in c.brokers:
        if b != leader:
            c.brokers[b].kill9()
    c.wait_for(lambda: c.partition("strict").isrs == [leader], what="ISR shrink", timeout=40)
    with pytest.raises(KafkaException) as e:
        produce_all(c.bootstrap, "strict", [b"x"], acks="all", retries=0)
    assert "NOT_ENOUGH_REPLICAS" in str(e.value)
    # acks=1 is still accepted by the lone leader
    assert produce_all(c.bootstrap, "strict", [b"y"], acks=1) == [0]


def _kip101_scenario_1(cluster_factory, mode: str) -> tuple[int, int]:
    """KIP-101 scenario 1 with real processes. A (controller and leader) and B replicate; B
    restarts and, as follower, truncates; A is paused so B cannot re-fetch, then dies; B is
    elected; A comes back as B's follower. Returns (acked, readable after failover)."""
    c = cluster_factory(
        3,
        {
            "replica.truncation.mode": mode,
            "min.insync.replicas": "2",
            "replica.high.watermark.checkpoint.interval.ms": "3600000",
            # Kafka of KIP-101's time: with eligible leader replicas (KIP-966) B, restarted
            # after a kill -9, is not elected while A, eligible, may return.
            "eligible.leader.replicas.enable": "false",
        },
        per_broker={
            1: {"zookeeper.session.timeout.ms": "12000"},
            2: {"zookeeper.session.timeout.ms": "2000"},
        },
    )
    a, b = 1, 2
    md = c.admin().list_topics(timeout=10)
    assert md.controller_id == a, "broker 1 started first and is the controller"
    c.admin().create_topics([NewTopic("k101", num_partitions=1, replica_assignment=[[a, b]])])[
        "k101"
    ].result(20)
    c.wait_for(lambda: c.partition("k101").isrs == [a, b], what="ISR [A, B]")
    values = [f"m{i}".encode() for i in range(200)]
    acked = produce_all(c.bootstrap, "k101", values, acks="all")
    assert len(acked) == 200
    c.brokers[a].signal(signal.SIGSTOP)  # A can neither serve B nor react as controller
    c.brokers[b].kill9()
    c.brokers[b].start()  # B: stale HW checkpoint; becomes follower of A again
    c.wait_for(lambda: "following 1" in c.brokers[b].log_text(), what="B following A")
    time.sleep(1)
    c.brokers[a].kill9()  # A dies before B could catch up
    c.wait_for(lambda: c.partition("k101").leader == b, what="B elected", timeout=60)
    # A returns as a follower; with min.insync.replicas=2 the HW moves again once it is in sync.
    c.brokers[a].start()
    c.wait_for(lambda: len(c.partition("k101").isrs) == 2, what="A back in the ISR", timeout=60)
    stored = c.read_all("k101")
    assert [v for _, v in stored] == values[: len(stored)], "whatever survived is a prefix"
    return len(acked), len(stored)


def test_kip101_scenario_1_truncate_to_high_watermark_loses_acked_data(cluster_factory):
    acked, stored = _kip101_scenario_1(cluster_factory, "high-watermark")
    assert stored < acked, "pre-KIP-101 truncation must lose acknowledged records here"


def test_kip101_scenario_1_leader_epochs_keep_acked_data(cluster_factory):
    acked, stored = _kip101_scenario_1(cluster_factory, "leader-epoch")
    assert stored == acked


def _out_of_sync_failover(cluster_factory, unclean: bool) -> tuple[int, int, int]:
    """The leader takes writes its follower never sees (follower paused, ISR shrinks to the
    leader), then the leader dies and the follower returns."""
    c = cluster_factory(
        3,
        {"min.insync.replicas": "1", "unclean.leader.election.enable": str(unclean).lower()},
    )
    a, b = 1, 2
    c.admin().create_topics([NewTopic("oos", num_partitions=1, replica_assignment=[[a, b]])])[
        "oos"
    ].result(20)
    c.wait_for(lambda: c.partition("oos").isrs == [a, b], what="ISR [A, B]")
    first = produce_all(c.bootstrap, "oos", [b"early"] * 50, acks="all")
    c.brokers[b].signal(signal.SIGSTOP)
    c.wait_for(lambda: c.partition("oos").isrs == [a], what="ISR of one", timeout=40)
    later = produce_all(c.bootstrap, "oos", [b"late"] * 50, acks="all")  # ISR of one: acked
    c.brokers[a].kill9()
    c.brokers[b].signal(signal.SIGCONT)
    time.sleep(8)
    leader = c.partition("oos").leader
    stored = c.read_all("oos") if leader == b else []
    return len(first) + len(later), len(stored), leader


def test_unclean_election_with_isr_of_one_loses_acked_writes(cluster_factory):
    acked, stored, leader = _out_of_sync_failover(cluster_factory, unclean=True)
    assert leader == 2
    assert stored < acked


def test_clean_election_keeps_partition_offline_instead(cluster_factory):
    _acked, _stored, leader = _out_of_sync_failover(cluster_factory, unclean=False)
    assert leader == -1, "no in-sync replica is alive: the partition stays offline"


KIP101_2_TOPIC = "k101s2"
KIP101_2_OLD = 200  # records A (leader) and B (follower) both hold, acked with acks=all
KIP101_2_KEEP = 100  # B loses its tail from the batch holding this offset on
KIP101_2_END = 250  # B, leading again, writes until its log ends here: past A's end


def _kip101_scenario_2(
    cluster_factory, mode: str, *, mid_batch: bool
) -> tuple[int, int, dict[int, StoredRecord], dict[int, StoredRecord]]:
    """KIP-101 scenario 2 with real processes. A (leader) and B (follower) hold the same acked
    records with checkpointed HWs; both crash (A first, so B leads and is the ISR's last
    member); B loses its unflushed tail (its active segment is cut on disk, at a batch boundary
    or mid-batch), restarts first and leads again, taking new writes at offsets A still holds;
    then A returns as B's follower. Broker 1 is the controller and hosts no replica.

    Returns (B's log end after recovery, the lower of the two replicas' HWs, A's records,
    B's records), records read from each replica's segment files, by offset."""
    c = cluster_factory(
        3,
        {
            "replica.truncation.mode": mode,
            "min.insync.replicas": "1",
            "replica.high.watermark.checkpoint.interval.ms": "100",
        },
        per_broker={
            2: {"zookeeper.session.timeout.ms": "2000"},
            3: {"zookeeper.session.timeout.ms": "2000"},
        },
    )
    a, b, topic = 2, 3, KIP101_2_TOPIC
    assert c.admin().list_topics(timeout=10).controller_id == 1, "broker 1 started first"
    c.admin().create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[a, b]])])[
        topic
    ].result(20)
    c.wait_for(lambda: c.partition(topic).isrs == [a, b], what="ISR [A, B]")
    old = [f"old-{i}".encode() for i in range(KIP101_2_OLD)]
    # Several records per batch, so that B's cut can fall inside one.
    acked = produce_all(c.bootstrap, topic, old, acks="all", **{"batch.num.messages": 10})
    assert sorted(acked) == list(range(KIP101_2_OLD))
    c.wait_for(
        lambda: all(c.checkpointed_high_watermark(r, topic) == KIP101_2_OLD for r in (a, b)),
        what="both replicas checkpointing HW 200",
    )

    c.brokers[a].kill9()
    c.wait_for(lambda: c.partition(topic).leader == b, what="B elected", timeout=40)
    c.brokers[b].kill9()
    c.wait_for(lambda: c.partition(topic).leader == -1, what="partition offline", timeout=40)
    survived = c.cut_log_tail(b, topic, 0, KIP101_2_KEEP, mid_batch=mid_batch)
    assert 0 < survived <= KIP101_2_KEEP

    c.brokers[b].start()  # A stays down: B, the ISR's last member, is the only candidate
    c.wait_for(lambda: c.partition(topic).leader == b, what="B leading again", timeout=40)
    new = [f"new-{i}".encode() for i in range(KIP101_2_END - survived)]
    # One record per batch: A, keeping its log up to 200, fetches from there.
    acked_new = produce_all(c.bootstrap, topic, new, acks="all", **{"batch.num.messages": 1})
    assert sorted(acked_new) == list(range(survived, KIP101_2_END)), "B writes where it lost data"

    c.brokers[a].start()
    c.wait_for(
        lambda: sorted(c.partition(topic).isrs) == [a, b], what="A back in the ISR", timeout=60
    )
    c.wait_for(
        lambda: all(c.checkpointed_high_watermark(r, topic) == KIP101_2_END for r in (a, b)),
        what="both replicas checkpointing HW 250",
    )
    hw = min(c.checkpointed_high_watermark(r, topic) for r in (a, b))
    a_log = {r.offset: r for r in c.stored_records(a, topic)}
    b_log = {r.offset: r for r in c.stored_records(b, topic)}
    assert all(o in a_log and o in b_log for o in range(hw)), "no replica has holes below HW"
    assert [b_log[o].value for o in range(hw)] == old[:survived] + new, "B kept its own writes"
    return survived, hw, a_log, b_log


@pytest.mark.parametrize(
    "mid_batch",
    # the batch-boundary twin behind `slow` (make soak): make test keeps the mid-batch case,
    # and tests/replication/test_scenarios.py holds the rule on the core
    [
        pytest.param(False, id="batch-boundary", marks=pytest.mark.slow),
        pytest.param(True, id="mid-batch"),
    ],
)
def test_kip101_scenario_2_truncate_to_high_watermark_diverges(cluster_factory, mid_batch):
    survived, hw, a_log, b_log = _kip101_scenario_2(
        cluster_factory, "high-watermark", mid_batch=mid_batch
    )
    differ = [o for o in range(hw) if a_log[o] != b_log[o]]
    # A trusted its HW (200) and kept the records B lost and then rewrote: silent divergence.
    assert differ == list(range(survived, KIP101_2_OLD)), (
        f"B recovered to {survived}, HW {hw}: offsets that differ: {differ}"
    )
    assert all(a_log[o].value == f"old-{o}".encode() for o in differ)


@pytest.mark.parametrize(
    "mid_batch",
    # the batch-boundary twin behind `slow` (make soak): make test keeps the mid-batch case,
    # and tests/replication/test_scenarios.py holds the rule on the core
    [
        pytest.param(False, id="batch-boundary", marks=pytest.mark.slow),
        pytest.param(True, id="mid-batch"),
    ],
)
def test_kip101_scenario_2_leader_epochs_keep_replicas_identical(cluster_factory, mid_batch):
    _survived, hw, a_log, b_log = _kip101_scenario_2(
        cluster_factory, "leader-epoch", mid_batch=mid_batch
    )
    differ = [o for o in range(hw) if a_log[o] != b_log[o]]
    assert not differ, f"replicas differ below HW {hw} at offsets {differ}"
