"""Two listeners on every broker of a cluster (issue 15): clients use PLAINTEXT, the brokers
replicate over INTERNAL (inter.broker.listener.name); each broker registers both endpoints in
ZooKeeper, and a client is given the addresses of the listener it connected to."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.metadata import MetadataRequest
from kazoo.client import KazooClient

from tests.broker.conftest import free_port
from tests.broker.rawclient import RawClient
from tests.cluster.conftest import Cluster

pytestmark = pytest.mark.integration


def brokers_seen(host: str, port: int) -> dict[int, tuple[str, int]]:
    client = RawClient(port, host=host)
    try:
        M = MetadataRequest[9]
        resp = client.call(
            M(topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        )
    finally:
        client.close()
    return {b.node_id: (b.host, b.port) for b in resp.brokers}


def partitions_seen(host: str, port: int, topic: str, version: int) -> dict[int, tuple[int, int]]:
    """{partition: (error code, leader id)} of `topic` in a Metadata response of `version`."""
    client = RawClient(port, host=host)
    try:
        M = MetadataRequest[version]
        fields: dict[str, Any] = {"allow_auto_topic_creation": False}
        if version >= 8:
            fields["include_cluster_authorized_operations"] = False
            fields["include_topic_authorized_operations"] = False
        resp = client.call(M(topics=[M.MetadataRequestTopic(name=topic)], **fields))
    finally:
        client.close()
    [t] = resp.topics
    return {p.partition_index: (p.error_code, p.leader_id) for p in t.partitions}


def established(remote: tuple[str, int]) -> bool:
    """An established TCP connection to remote (read from /proc/net/tcp)."""

    def parse(field: str) -> tuple[str, int]:
        ip_hex, port_hex = field.split(":")
        ip = ".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
        return ip, int(port_hex, 16)

    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            fields = line.split()
            if fields[3] != "01":
                continue
            if parse(fields[2]) == remote:
                return True
    return False


def test_clients_on_plaintext_brokers_replicating_over_internal(zookeeper: Any, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = Cluster(
        zookeeper,
        tmp_path / "c",
        2,
        {
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"
            ),
            "inter.broker.listener.name": "INTERNAL",
            "min.insync.replicas": "2",
        },
    )
    internal: dict[int, int] = {}
    for i, b in c.brokers.items():
        internal[i] = free_port(b.host)
        b.overrides["listeners"] = (
            f"PLAINTEXT://{b.host}:{b.port},INTERNAL://{b.host}:{internal[i]}"
        )
    # broker 1 alone also has an EXTERNAL listener
    b1 = c.brokers[1]
    external = (b1.host, free_port(b1.host))
    b1.overrides["listeners"] += f",EXTERNAL://{external[0]}:{external[1]}"
    try:
        c.start()
        plaintext = {i: (b.host, b.port) for i, b in c.brokers.items()}
        inter = {i: (b.host, internal[i]) for i, b in c.brokers.items()}
        c.wait_for(lambda: brokers_seen(*plaintext[1]) == plaintext, what="PLAINTEXT view")
        assert brokers_seen(*inter[2]) == inter
        # the registration carries both endpoints; host/port are the inter-broker one's
        chroot = c.brokers[1].overrides["zookeeper.connect"].split("/", 1)[1]
        zk = KazooClient(hosts=zookeeper.connect + "/" + chroot)
        zk.start()
        try:
            data = json.loads(zk.get("/brokers/ids/1")[0])
        finally:
            zk.stop()
        assert sorted(data["endpoints"]) == sorted(
            [
                f"PLAINTEXT://{plaintext[1][0]}:{plaintext[1][1]}",
                f"INTERNAL://{inter[1][0]}:{inter[1][1]}",
                f"EXTERNAL://{external[0]}:{external[1]}",
            ]
        )
        assert (data["host"], data["port"]) == inter[1]
        # acks=all with min.insync.replicas=2 needs the follower: replication over INTERNAL
        c.create_topic("l", 1, 2)
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
        for i in range(20):
            p.produce("l", f"v{i}".encode(), partition=0)
        assert p.flush(30) == 0
        consumer = Consumer(
            {"bootstrap.servers": c.bootstrap, "group.id": "g", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("l", 0, 0)])
        got: list[bytes] = []
        for _ in range(40):
            got += [m.value() for m in consumer.consume(20, timeout=0.5) if m.error() is None]
            if len(got) >= 20:
                break
        consumer.close()
        assert got == [f"v{i}".encode() for i in range(20)]
        # the follower's fetcher is connected to the leader's INTERNAL port (no client is)
        assert established(inter[c.partition("l").leader])
        # A client on EXTERNAL sees broker 1 only; a partition led by broker 2 has no leader it
        # can reach: LISTENER_NOT_FOUND (Metadata v6+), LEADER_NOT_AVAILABLE before (Kafka's).
        assert brokers_seen(*external) == {1: external}
        c.create_topic("x", 4, 2)
        c.wait_for(lambda: all(c.partition("x", p).leader >= 0 for p in range(4)), what="leaders")
        leaders = {p: c.partition("x", p).leader for p in range(4)}
        assert set(leaders.values()) == {1, 2}
        for version, unreachable in ((9, 72), (5, 5)):
            got = partitions_seen(*external, "x", version)
            assert got == {
                p: (0, 1) if leader == 1 else (unreachable, -1) for p, leader in leaders.items()
            }
    finally:
        c.stop()
