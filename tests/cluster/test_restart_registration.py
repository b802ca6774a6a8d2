"""A restarted broker answers no request before it is registered in ZooKeeper again.

Seen in embedded-cluster runs (lagging-failover and kill nemeses, read_committed queue
workload): a leader killed and started again within its ZooKeeper session timeout was listening
at once, but could register only when its old session expired (the old `/brokers/ids/<id>`
lingers until then). Meanwhile it answered Metadata from an empty membership view: no broker at
all, every topic listed. librdkafka (2.10 and later) decommissions every learned broker that a
Metadata response leaves out, so a consumer that happened to ask that broker lost its broker
handles and read nothing more: availability.stuck_consumers flagged it for the rest of the run
(e.g. 29 s of empty polls while its keys moved on by hundreds of offsets). Kafka processes
requests only once the broker is registered (KafkaServer.startup registers the broker, then
enables request processing; connections made earlier wait), and so does the broker now.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataRequest
from kazoo.client import KazooClient

from tests.broker.rawclient import RawClient

pytestmark = pytest.mark.integration

HOLD_S = 1.5  # how long the stand-in for the old session keeps the registration


def _metadata(client: RawClient) -> Any:
    M = MetadataRequest[9]
    return client.call(
        M(
            topics=None,
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )


def test_a_restarted_broker_answers_metadata_only_once_registered(cluster_factory: Any) -> None:
    cluster = cluster_factory(1)
    cluster.create_topic("t", 1, 1)
    broker = cluster.brokers[1]
    path = "/brokers/ids/1"
    old_session = KazooClient(hosts=broker.overrides["zookeeper.connect"], timeout=10)
    old_session.start()
    try:
        registration, _ = old_session.get(path)
        broker.kill9()
        # The killed broker's registration lingers until its session expires; a session of
        # ours then holds it, as a not yet expired old session would.
        deadline = time.monotonic() + 15
        while old_session.exists(path) is not None:
            assert time.monotonic() < deadline, "the killed broker's session never expired"
            time.sleep(0.05)
        old_session.create(path, registration, ephemeral=True)

        broker.start()  # returns once the broker listens
        client = RawClient(broker.port, host=broker.host, timeout=30)
        released = threading.Event()

        def release() -> None:
            time.sleep(HOLD_S)
            old_session.stop()  # the old registration goes: the broker can register
            released.set()

        threading.Thread(target=release, daemon=True).start()
        try:
            resp = _metadata(client)
        finally:
            client.close()
        answered_early = not released.is_set()
        released.wait(10)
    finally:
        old_session.stop()
        old_session.close()

    brokers = sorted(b.node_id for b in resp.brokers)
    topics = sorted(t.name for t in resp.topics)
    assert brokers == [1], (
        f"Metadata answered before the broker registered: brokers {brokers}, topics {topics} "
        "(librdkafka drops every broker a Metadata response leaves out)"
    )
    assert not answered_early
    assert "t" in topics
