"""Root-only tests of this directory are skipped (not failed) without root and sshd; and
``RecordingDB``, the fake cluster the nemesis unit tests share."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from isrlab.harness.cluster import sshd


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0 and os.access(sshd.SSHD, os.X_OK):
        return
    why = "needs root and openssh-server (network namespaces, sshd, iptables)"
    here = Path(__file__).parent
    for item in items:
        if "root" in item.keywords and item.path.is_relative_to(here):
            item.add_marker(pytest.mark.skip(reason=why))


class LocalResult:
    """A command's outcome, shaped as ``nemeses.base.CommandResult``."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> LocalResult:
        if not self.ok:
            raise RuntimeError(f"exit {self.returncode}: {self.stderr}")
        return self


class LocalShell:
    """A node's shell that runs commands on this machine (bash), recording them in the DB."""

    def __init__(self, db: RecordingDB, name: str) -> None:
        self.db = db
        self.node = SimpleNamespace(name=name, host=name)

    def exec(self, cmd: str, *, check: bool = True) -> LocalResult:
        self.db.calls.append(("exec", self.node.name))
        self.db.commands.append((self.node.name, cmd))
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=False)
        res = LocalResult(done.returncode, done.stdout, done.stderr)
        return res.check() if check else res


class RecordingDB:
    """The one fake cluster of the nemesis unit tests: the ``ClusterDB`` calls a fault makes
    are recorded in ``calls`` as (method, node); ``kill``/``start`` keep ``down`` (what
    ``broker_state`` answers); cluster questions answer what the constructor was given. With
    ``root``, ``path(node, ...)`` is a directory under it and ``remote(node).exec`` runs the
    command here (``commands`` records them), so a fault's file operations really happen."""

    def __init__(
        self,
        n: int = 5,
        *,
        leader: str | None = "n3",
        followers: tuple[str, ...] = ("n4", "n5"),
        controller: str | None = "n2",
        keys: tuple[str, ...] = ("t0/0",),
        root: Path | None = None,
    ) -> None:
        self.test: dict[str, Any] = {"keys": list(keys), "seed": 1}
        self._names = [f"n{i}" for i in range(1, n + 1)]
        self.leader = leader
        self.followers = list(followers)
        self._controller = controller
        self.root = root
        self.calls: list[tuple[str, str]] = []
        self.commands: list[tuple[str, str]] = []
        self.down: set[str] = set()
        self.kill_fails = False

    @property
    def names(self) -> list[str]:
        return self._names

    def leader_of(self, topic: str, partition: int) -> str | None:
        return self.leader

    def replicas_of(self, topic: str, partition: int) -> tuple[str | None, list[str]]:
        self.calls.append(("replicas_of", f"{topic}/{partition}"))
        return self.leader, list(self.followers)

    def controller(self) -> str | None:
        return self._controller

    def pause(self, node: str) -> bool:
        self.calls.append(("pause", node))
        return True

    def resume(self, node: str) -> bool:
        self.calls.append(("resume", node))
        return True

    def kill(self, node: str) -> bool:
        self.calls.append(("kill", node))
        if self.kill_fails:
            raise RuntimeError("ssh went away")
        was_up = node not in self.down
        self.down.add(node)
        return was_up

    def start(self, node: str) -> int:
        self.calls.append(("start", node))
        self.down.discard(node)
        return 1

    def broker_state(self, node: str) -> str:
        return "down" if node in self.down else "running"

    def path(self, node: str, *parts: str) -> str:
        assert self.root is not None, "RecordingDB(root=...) for faults that touch files"
        return str(self.root.joinpath(node, *parts))

    def remote(self, name: str) -> LocalShell:
        return LocalShell(self, name)
