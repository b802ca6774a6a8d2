"""Scheduling for `make test`, which runs the suite on two pytest-xdist workers.

Tests that start real processes (ZooKeeper, brokers, network namespaces, sshd, Spark) spend
most of their time waiting on the cluster's timers, while the in-process tests (hypothesis
state machines, the simulator, the checkers) keep a core busy. `--dist loadgroup` sends every
process test to one worker, one after the other, as a plain `pytest` run would; the other
worker takes the in-process tests. Process tests never run next to each other: they share
127.0.0.x addresses, the namespaces' names and the machine's iptables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent
# Folders whose every test drives real processes (or shares machine-wide state with them).
_PROCESS_FOLDERS = ("cluster", "nemeses", "workload", "harness")
_PROCESS_MARKS = ("integration", "root")


def _starts_processes(item: pytest.Item) -> bool:
    try:
        rel = Path(str(item.path)).relative_to(_HERE)
    except ValueError:
        return True
    if rel.parts and rel.parts[0] in _PROCESS_FOLDERS:
        return True
    return any(item.get_closest_marker(m) is not None for m in _PROCESS_MARKS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.xdist_group("processes"))
