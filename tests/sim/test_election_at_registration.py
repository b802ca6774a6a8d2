"""A broker elected the moment it registers leads, however late it reads its registration.

A starting broker registers in ZooKeeper, then reads its registration back to learn its broker
epoch (`ClusterKafkaServer._learn_broker_epoch`); a state znode naming it leader counts only if
written after that epoch (`_may_lead`, no zombie leaders). The controller may elect the broker
as soon as it sees the registration: KIP-966's eligible replica coming back to an offline
partition. When that state's watch event reached the broker before the read returned, the
state was held back for good (the controller writes nothing more), so ZooKeeper named a leader
that never led and its followers never rejoined the ISR. Seen once in CI as
tests/cluster/test_elr_cluster.py's "all in sync" never reached after "an eligible replica
elected"; here the read is made late on purpose, in virtual time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest

from isrlab.broker.cluster import ClusterKafkaServer
from isrlab.broker.network.client import KafkaConnection
from isrlab.harness.sim.cluster import PORT, SimCluster
from tests.sim.test_cluster_on_sim import run_cluster

TOPIC = "solo"
TP = (TOPIC, 0)
ALONE = 2  # the only replica (broker 1 is the controller: it started first)


async def create_solo_topic(c: SimCluster) -> None:
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=TOPIC,
        num_partitions=-1,
        replication_factor=-1,
        assignments=[C.CreatableTopic.CreatableReplicaAssignment(0, [ALONE])],
        configs=[],
    )
    conn = KafkaConnection("n1", PORT, "admin", c.net.host("admin"))
    r = await conn.request(C(topics=[topic], timeout_ms=10000, validate_only=False), 30)
    conn.close()
    assert r.topics[0].error_code == 0, r
    await c.wait_for(lambda: c.leader_of(TP) == ALONE, 30, "broker 2 leading solo-0")


def test_a_broker_elected_before_it_reads_its_registration_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    learn = ClusterKafkaServer._learn_broker_epoch

    async def body(c: SimCluster) -> list[str]:
        await create_solo_topic(c)
        await c.stop_broker(ALONE)  # clean: its replica stays eligible (KIP-966's ELR)

        def offline() -> bool:
            state = c.server(1)._states.get(TP)
            return state is not None and state.leader == -1

        await c.wait_for(offline, 30, "solo-0 offline")

        async def late(self: Any) -> None:
            await asyncio.sleep(1.0)  # the controller elects the broker meanwhile
            await learn(self)

        monkeypatch.setattr(ClusterKafkaServer, "_learn_broker_epoch", late)
        await c.restart(ALONE)
        monkeypatch.setattr(ClusterKafkaServer, "_learn_broker_epoch", learn)
        server = c.server(ALONE)
        state = server._states[TP]
        # the premise: the election was written, and seen by the broker, before it knew its
        # broker epoch (it now does: `restart` returns once the start has finished)
        assert state.leader == ALONE and server._broker_epoch is not None, state
        await c.wait_for(lambda: c.leader_of(TP) == ALONE, 10, "broker 2 leading solo-0 again")
        return [f"epoch {state.leader_epoch}"]

    out, c = run_cluster(tmp_path, body)
    assert out == ["epoch 2"], out
    assert c.violation is None
