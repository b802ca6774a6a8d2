"""A real cluster on one machine: Debian's ZooKeeper and broker processes on 127.0.0.x."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from harness.zookeeper import LocalZooKeeper, ZooKeeperMissing, check_installed
from tests.broker.conftest import BrokerProcess, free_port


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory) -> Iterator[LocalZooKeeper]:
    try:
        check_installed()
    except ZooKeeperMissing as e:
        pytest.skip(str(e))
    zk = LocalZooKeeper(tmp_path_factory.mktemp("zk")).start()
    yield zk
    zk.stop()


class Cluster:
    def __init__(
        self,
        zk: LocalZooKeeper,
        base: Path,
        n: int,
        overrides: dict[str, str],
        per_broker: dict[int, dict[str, str]] | None = None,
    ):
        chroot = "/t" + uuid.uuid4().hex[:8]
        self._admin: AdminClient | None = None
        self.brokers: dict[int, BrokerProcess] = {}
        for i in range(1, n + 1):
            host = f"127.0.0.{i}"
            self.brokers[i] = BrokerProcess(
                base / f"b{i}" / "logs",
                free_port(host),
                {
                    "zookeeper.connect": zk.connect + chroot,
                    "zookeeper.session.timeout.ms": "4000",
                    "replica.lag.time.max.ms": "3000",
                    **overrides,
                    **(per_broker or {}).get(i, {}),
                },
                host=host,
                broker_id=i,
            )
            (base / f"b{i}").mkdir(parents=True, exist_ok=True)

    @property
    def bootstrap(self) -> str:
        """The brokers that are running and not paused (a paused broker stalls clients)."""
        serving = [b.bootstrap for b in self.brokers.values() if b.serving]
        return ",".join(serving or [b.bootstrap for b in self.brokers.values()])

    def start(self) -> Cluster:
        for b in self.brokers.values():
            b.start()
        self.wait_for_brokers(len(self.brokers))
        return self

    def stop(self) -> None:
        for b in self.brokers.values():
            b.kill9()

    def admin(self) -> AdminClient:
        # One client for the cluster's life: futures die with the client that made them.
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def wait_for_brokers(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            md = self.admin().list_topics(timeout=5)
            if len(md.brokers) >= n:
                return
            time.sleep(0.2)
        raise AssertionError(f"fewer than {n} brokers registered")

    def create_topic(self, name: str, partitions: int, rf: int, **config: str) -> None:
        fut = self.admin().create_topics([NewTopic(name, partitions, rf, config=config)])[name]
        fut.result(20)

    def partition(self, topic: str, p: int = 0):  # type: ignore[no-untyped-def]
        md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=10)
        return md.topics[topic].partitions[p]

    def wait_for(self, predicate, timeout: float = 30, what: str = "condition"):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except Exception as e:
                last = e
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r})")

    def read_all(self, topic: str, p: int = 0, timeout: float = 30) -> list[tuple[int, bytes]]:
        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "r", "enable.auto.commit": False}
        )
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        c.assign([TopicPartition(topic, p, low)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline and high > low:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    out.append((m.offset(), m.value()))
        c.close()
        return out


@pytest.fixture
def cluster_factory(zookeeper, tmp_path) -> Iterator:  # type: ignore[no-untyped-def]
    made: list[Cluster] = []

    def make(
        n: int = 3,
        overrides: dict[str, str] | None = None,
        per_broker: dict[int, dict[str, str]] | None = None,
    ) -> Cluster:
        c = Cluster(zookeeper, tmp_path / f"c{len(made)}", n, overrides or {}, per_broker)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()
