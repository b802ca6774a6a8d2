"""A real cluster on one machine: Debian's ZooKeeper and broker processes on 127.0.0.x."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatch
from kazoo.client import KazooClient

from isrlab.broker.log.checkpoint import REPLICATION_CHECKPOINT, OffsetCheckpointFile
from isrlab.broker.log.inventory import segment_files, whole_batches
from isrlab.broker.log.log import CLEAN_SHUTDOWN_FILE
from isrlab.broker.log.record_batch import check_crc
from isrlab.harness.zookeeper import LocalZooKeeper, ZooKeeperMissing, check_installed
from tests.broker.conftest import BrokerProcess, free_port


@dataclass(frozen=True)
class StoredRecord:
    """One record as a replica holds it on disk."""

    offset: int
    leader_epoch: int  # the batch's partitionLeaderEpoch: which leader wrote it
    value: bytes | None


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

    def state_znode(self, topic: str, p: int = 0) -> dict:  # type: ignore[type-arg]
        """The partition state znode, read straight from ZooKeeper."""
        zk = KazooClient(hosts=next(iter(self.brokers.values())).overrides["zookeeper.connect"])
        zk.start(timeout=10)
        try:
            data, _ = zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")
            return orjson.loads(data)  # type: ignore[no-any-return]
        finally:
            zk.stop()
            zk.close()

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

    # ----- one replica's files (read straight from disk, so each replica is seen alone) -------

    def partition_dir(self, broker_id: int, topic: str, p: int = 0) -> Path:
        return self.brokers[broker_id].log_dir / f"{topic}-{p}"

    def stored_records(self, broker_id: int, topic: str, p: int = 0) -> list[StoredRecord]:
        """Every record of one replica's segments, in offset order, CRCs checked.

        Reads whole batches only: safe on a running broker, whose last batch may be half
        written. A corrupt batch fails the test: a replica must never serve one.
        """
        out: list[StoredRecord] = []
        for path in segment_files(self.partition_dir(broker_id, topic, p)):
            data = path.read_bytes()
            for header in whole_batches(data):
                check_crc(data, header)
                batch = DefaultRecordBatch(data[header.position : header.end_position])
                for record in batch:
                    value = None if record.value is None else bytes(record.value)
                    out.append(StoredRecord(record.offset, header.partition_leader_epoch, value))
        return out

    def checkpointed_high_watermark(self, broker_id: int, topic: str, p: int = 0) -> int:
        """The HW a replica last wrote to replication-offset-checkpoint (-1 if none yet)."""
        path = self.brokers[broker_id].log_dir / REPLICATION_CHECKPOINT
        if not path.exists():
            return -1
        return OffsetCheckpointFile(path).read().get((topic, p), -1)

    def cut_log_tail(
        self, broker_id: int, topic: str, p: int, keep_below: int, *, mid_batch: bool
    ) -> int:
        """Simulate a stopped replica losing its unflushed tail (a power loss, not kill -9).

        Cuts the active segment at the batch holding offset ``keep_below``: at its first byte,
        or, with ``mid_batch``, halfway through it (a torn write recovery must drop). Removes
        the clean-shutdown marker so the next start recovers. Returns the offset the log ends
        at once recovered: the cut batch's base offset.
        """
        broker = self.brokers[broker_id]
        if broker.proc is not None:
            raise AssertionError(f"broker {broker_id} must be down to lose its unflushed tail")
        directory = self.partition_dir(broker_id, topic, p)
        active = segment_files(directory)[-1]
        data = active.read_bytes()
        cut = next((h for h in whole_batches(data) if h.last_offset >= keep_below), None)
        if cut is None:
            raise AssertionError(f"{active} holds no offset at or past {keep_below}")
        position = cut.position + (cut.size // 2 if mid_batch else 0)
        with open(active, "r+b") as f:
            f.truncate(position)
            f.flush()
            os.fsync(f.fileno())
        (directory / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
        return cut.base_offset


#: the clusters a test made, for the report of a failure
CLUSTERS = pytest.StashKey[list["Cluster"]]()
#: how much of each broker's log a failure report shows
LOG_TAIL_LINES = 120


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """A cluster test that fails reports the end of each broker's log: a failure seen once
    in CI is then explained by the CI's log rather than by a local rerun that may pass."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for i, c in enumerate(item.stash.get(CLUSTERS, [])):
        for broker_id, b in c.brokers.items():
            lines = b.log_text().splitlines()[-LOG_TAIL_LINES:]
            report.sections.append((f"cluster {i} broker {broker_id} log (end)", "\n".join(lines)))


@pytest.fixture
def cluster_factory(zookeeper, tmp_path, request) -> Iterator:  # type: ignore[no-untyped-def]
    made: list[Cluster] = []
    request.node.stash[CLUSTERS] = made

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
