"""Shared fixtures: skip root-only tests cleanly, and a checker for leftovers of a cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from isrlab.harness.cluster import embedded, sshd
from isrlab.harness.cluster import state as st


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0 and os.access(sshd.SSHD, os.X_OK):
        return
    why = "needs root and openssh-server (network namespaces, sshd)"
    here = Path(__file__).parent
    for item in items:
        # this hook sees the whole session: only mark the tests of this directory
        if "root" in item.keywords and item.path.is_relative_to(here):
            item.add_marker(pytest.mark.skip(reason=why))


class Refusals(list[str]):
    """The names of the calls a test refused: ``refuse(obj, attr)`` replaces ``obj.attr`` by a
    function that records ``name`` (default: the attribute's name) and fails the call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self._monkeypatch = monkeypatch

    def refuse(self, obj: object, attr: str, name: str | None = None) -> None:
        label = name or attr

        def refused(*a: object, **k: object) -> None:
            self.append(label)
            raise AssertionError(f"{label} called")

        self._monkeypatch.setattr(obj, attr, refused)


def leftovers(name: str, subnet: str) -> list[str]:
    """Everything of cluster ``name`` still present on the host (empty when clean)."""
    p = embedded.plan(name, 1, subnet)
    tag = embedded._tag(name)
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [
        f"netns {line.split()[0]}" for line in netns.splitlines() if f"isrlab-{name}-" in line
    ]
    links = os.listdir("/sys/class/net")
    found += [f"link {x}" for x in links if x == p.bridge or x.startswith(f"isv{tag}")]
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    found += [f"rule {r}" for r in rules.splitlines() if f"isrlab:{name} " in r + " "]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if p.run_dir.encode() + b"/" in cmd:
                found.append(f"process {pid} {cmd!r}")
    etc = Path("/etc/netns")
    if etc.is_dir():
        found += [f"etc {x}" for x in etc.iterdir() if x.name.startswith(f"isrlab-{name}-")]
    for path in (st.state_path(name), st.lock_path(name), Path(p.run_dir), Path(p.data_dir)):
        if path.exists():
            found.append(f"path {path}")
    return found
