"""Scheduling for `make test`, which runs the suite as two pytest processes side by side.

Tests that start real processes (ZooKeeper, brokers, network namespaces, sshd, Spark) spend
most of their time waiting on the cluster's timers, while the in-process tests (hypothesis
state machines, the simulator, the checkers) keep a core busy. Each test that starts
processes gets the `processes` mark here; `make test` runs `-m processes` in one pytest, one
test after the other as a plain `pytest` run would, and `-m 'not processes'` in another.
Process tests never run next to each other: they share 127.0.0.x addresses, the namespaces'
names and the machine's iptables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent
# Folders whose every test drives real processes (or shares machine-wide state with them).
_PROCESS_FOLDERS = ("cluster", "nemeses", "workload", "harness")
_PROCESS_MARKS = ("integration", "root")


def starts_processes(item: pytest.Item) -> bool:
    try:
        rel = Path(str(item.path)).relative_to(_HERE)
    except ValueError:
        return True
    if rel.parts and rel.parts[0] in _PROCESS_FOLDERS:
        return True
    return any(item.get_closest_marker(m) is not None for m in _PROCESS_MARKS)


# as each test is collected, before `-m` selects
def pytest_itemcollected(item: pytest.Item) -> None:
    if starts_processes(item):
        item.add_marker(pytest.mark.processes)
