"""A real ZooKeeper for the differential tests: harness/zookeeper.py's LocalZooKeeper (Debian's
package), skipped with the reason when it is not installed or does not start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from isrlab.harness.zookeeper import LocalZooKeeper, ZooKeeperMissing, check_installed


@pytest.fixture(scope="session")
def real_zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    try:
        check_installed()
        zk = LocalZooKeeper(tmp_path_factory.mktemp("sim-zk")).start()
    except (ZooKeeperMissing, RuntimeError, OSError) as e:
        pytest.skip(f"no real ZooKeeper to compare the simulated one with: {e}")
    yield zk
    zk.stop()
