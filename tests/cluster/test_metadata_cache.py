"""A broker's metadata covers every partition of the cluster, not only those it hosts, also
after it restarts (clients bootstrap from any broker and ask it where every leader is)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from kafka.protocol.metadata import MetadataRequest

from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient

pytestmark = pytest.mark.integration


def leaders_seen_by(broker: BrokerProcess, topic: str) -> dict[int, int]:
    """The leaders in this broker's own Metadata answer (a client library would ask any
    broker it knows, so the request goes over a raw connection)."""
    client = RawClient(broker.port, host=broker.host)
    try:
        resp = client.call(
            MetadataRequest[8](
                topics=[MetadataRequest[8].MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )
    finally:
        client.close()
    return {p.partition_index: p.leader_id for t in resp.topics for p in t.partitions}


def test_a_restarted_broker_knows_the_leaders_of_partitions_it_does_not_host(
    cluster_factory: Any,
) -> None:
    c = cluster_factory(3, {})
    c.admin().create_topics(
        [NewTopic("elsewhere", num_partitions=2, replica_assignment=[[2], [3]])]
    )["elsewhere"].result(20)
    b1 = c.brokers[1]
    c.wait_for(
        lambda: leaders_seen_by(b1, "elsewhere") == {0: 2, 1: 3},
        what="broker 1 sees both leaders",
    )
    b1.kill9()
    b1.start()
    c.wait_for(
        lambda: leaders_seen_by(b1, "elsewhere") == {0: 2, 1: 3},
        what="the restarted broker 1 sees both leaders",
    )
