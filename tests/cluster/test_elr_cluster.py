"""KIP-966's "last replica standing" on real processes: ZooKeeper and four brokers.

Broker 1 is the controller and holds no replica; brokers 2 (leader), 3 and 4 replicate the
partition, min.insync.replicas=2, acks=all, Kafka's default flush policy (never fsync).

1. 200 records are acknowledged by all three replicas.
2. The followers stop (cleanly, one after the other): the ISR is the leader alone. 10 records
   produced with acks=1 are taken, but the HW stays at 200 (strict min ISR).
3. The leader is killed (kill -9) and loses what a power loss takes: its files are cut back to
   their last fsync by ``broker.log.durable.apply_power_loss`` (the journal of synced lengths,
   the same cut as ``isrlab-broker power-loss``). With the default flush policy that is every
   record.
4. The leader restarts first, then the followers (eligible: the follower that left the ISR
   last, usually F2; both if the controller saw both stops in one watch event).

With ``eligible.leader.replicas.enable=false`` (before KIP-966) the leader, last ISR member,
is elected again with what it kept, and the followers truncate to it: acknowledged records are
gone from every replica. With it (the default) the leader registers after an unclean shutdown,
leaves the eligible leader replicas, and the partition stays offline until an eligible
follower returns and is elected: nothing acknowledged is lost.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from isrlab.broker.log.durable import apply_power_loss
from tests.cluster.test_replication import produce_all

pytestmark = pytest.mark.integration

TOPIC = "lrs"
N = 200
LEADER, F1, F2 = 2, 3, 4


def zk_state(c) -> dict:  # type: ignore[no-untyped-def]
    return c.state_znode(TOPIC)  # type: ignore[no-any-return]


def high_watermark(c) -> int:  # type: ignore[no-untyped-def]
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "hw"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1])
    finally:
        consumer.close()


def last_replica_standing(cluster_factory, elr: bool):  # type: ignore[no-untyped-def]
    c = cluster_factory(
        4,
        {
            "min.insync.replicas": "2",
            "eligible.leader.replicas.enable": str(elr).lower(),
        },
        per_broker={LEADER: {"zookeeper.session.timeout.ms": "2000"}},
    )
    assert c.admin().list_topics(timeout=10).controller_id == 1, "broker 1 started first"
    c.admin().create_topics(
        [NewTopic(TOPIC, num_partitions=1, replica_assignment=[[LEADER, F1, F2]])]
    )[TOPIC].result(20)
    c.wait_for(lambda: c.partition(TOPIC).isrs == [LEADER, F1, F2], what="ISR of three")
    values = [f"v-{i}".encode() for i in range(N)]
    acked = produce_all(c.bootstrap, TOPIC, values, acks="all", **{"batch.num.messages": 10})
    assert sorted(acked) == list(range(N))

    c.brokers[F1].stop()
    c.brokers[F2].stop()
    c.wait_for(lambda: zk_state(c)["isr"] == [LEADER], what="ISR of the leader alone")
    # Strict min ISR: acks=1 writes are taken, but the HW stays below them.
    late = produce_all(c.bootstrap, TOPIC, [b"late"] * 10, acks=1)
    assert sorted(late) == list(range(N, N + 10))
    assert high_watermark(c) == N
    state = zk_state(c)
    if elr:
        # Whoever left the ISR last, when it fell below min ISR, is eligible: usually F2; F1
        # and F2 when the controller saw both stops in one watch event; F1 when the leader
        # had dropped a lagging F2 first (under load).
        assert state.get("eligible_leader_replicas"), state
        assert set(state["eligible_leader_replicas"]) <= {F1, F2}, state
    else:
        assert "eligible_leader_replicas" not in state, state

    c.brokers[LEADER].kill9()
    report = apply_power_loss(c.brokers[LEADER].log_dir)
    assert report.truncated or report.emptied or report.deleted, "nothing to lose?"
    kept = len(c.stored_records(LEADER, TOPIC)) if c.partition_dir(LEADER, TOPIC).exists() else 0
    assert kept < N, "the power loss took acknowledged records from the leader"
    c.wait_for(lambda: zk_state(c)["leader"] == -1, what="partition offline", timeout=30)

    c.brokers[LEADER].start()
    return c, values, kept, set(state.get("eligible_leader_replicas", []))


def test_last_replica_standing_without_elr_loses_acknowledged_records(cluster_factory):
    c, values, kept, _ = last_replica_standing(cluster_factory, elr=False)
    c.wait_for(lambda: zk_state(c)["leader"] == LEADER, what="the damaged leader re-elected")
    c.brokers[F1].start()
    c.brokers[F2].start()
    c.wait_for(
        lambda: sorted(zk_state(c)["isr"]) == [LEADER, F1, F2], what="followers back", timeout=60
    )
    read = [v for _, v in c.read_all(TOPIC)]
    assert read == values[:kept] and kept < N  # acknowledged records lost for good ...
    for b in (F1, F2):  # ... on every replica: the followers truncated to the leader
        assert len(c.stored_records(b, TOPIC)) <= kept


def test_last_replica_standing_with_elr_loses_nothing(cluster_factory):
    c, values, _kept, eligible = last_replica_standing(cluster_factory, elr=True)
    time.sleep(5)  # the controller has seen the unclean registration by now
    state = zk_state(c)
    assert state["leader"] == -1, f"the damaged replica must not lead: {state}"
    assert state["isr"] == [] and LEADER not in state.get("eligible_leader_replicas", []), state
    c.brokers[F1].start()
    c.brokers[F2].start()
    c.wait_for(lambda: zk_state(c)["leader"] in eligible, what="an eligible replica elected")
    c.wait_for(
        lambda: sorted(zk_state(c)["isr"]) == [LEADER, F1, F2], what="all in sync", timeout=60
    )
    read = [v for _, v in c.read_all(TOPIC)]
    assert read == values
    assert [r.value for r in c.stored_records(LEADER, TOPIC)] == values
