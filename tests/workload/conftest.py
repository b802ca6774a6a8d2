"""Fixtures for the workload tests: one real broker process for the module, fresh topics.

The broker process helpers come from tests/broker/conftest.py and the ZooKeeper-backed
cluster fixtures from tests/cluster/conftest.py (imported, not copied).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.conftest import BrokerProcess, free_port
from tests.cluster.conftest import cluster_factory, zookeeper

__all__ = ["cluster_factory", "zookeeper"]


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("broker")
    b = BrokerProcess(base / "logs", free_port(), {"auto.create.topics.enable": "false"})
    b.start()
    yield b
    if b.paused:
        b.signal(18)  # SIGCONT, so the process can be stopped
    b.stop()


def make_topics(bootstrap: str, n: int, rf: int = 1, partitions: int = 1) -> list[str]:
    """Create n fresh single-partition topics; return their keys ("topic/0")."""
    prefix = "w" + uuid.uuid4().hex[:8]
    names = [f"{prefix}-{i}" for i in range(n)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, partitions, rf) for t in names])
    for fut in futures.values():
        fut.result(20)
    return [f"{t}/{p}" for t in names for p in range(partitions)]


@pytest.fixture
def fresh_keys(module_broker: BrokerProcess) -> Callable[[int], list[str]]:
    return lambda n: make_topics(module_broker.bootstrap, n)


@pytest.fixture
def history_path(tmp_path: Path) -> Path:
    return tmp_path / "history.jsonl"
