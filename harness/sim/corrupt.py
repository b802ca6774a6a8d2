"""The ``corrupt`` nemesis on a simulated cluster: the real `nemeses.corrupt.CorruptFault`,
acting on the simulated brokers' data directories.

A simulated broker keeps its log dir in a real directory of the run (`SimBroker.log_dirs`), so
the real fault runs unchanged: the same draws from the nemesis's generator, the same file
choice (`FILES`, first/middle/last segment), the same damage (bit flips through the same
Python snippet, truncation, the data directory copied aside and put back), the same
completion values. What differs is under it:

- `SimShell`: a node's shell is a local ``bash -c`` (the files are on this machine); its
  commands take real time, not virtual time, so the strike is instantaneous on the loop;
- `SimCorruptDB`: the `CorruptDB` the fault asks (`names`, `test`, `path`, `remote`,
  `replicas_of`, `kill`, `start`, the target questions of `SimTargets`): a node's
  ``broker/data`` is its broker's log dir and ``venv/bin/python`` this interpreter;
  ``kill`` is the simulated kill -9 and ``start`` starts the broker without waiting for its
  registration, as a real ``db.start`` starts the daemon;
- the nodes are acted on one after another, in the order the real fault draws them (the
  real one uses a thread per node: on the loop's one thread there is no order to race);
- paths in the completion are relative to the run's directory (``n1/t0-0/...log``), so a
  history names no temporary directory and two runs of a seed are byte-identical.

A segment the fault damages (bit flips or a cut) holds other bytes than its replicas from then
on, as a damaged disk does: `SimCluster.damaged` tells the invariants, which stop comparing
that broker's copy of the partition (every other invariant still holds it, and the clients'
checker judges what it serves). Damage to the other files (indexes, snapshots, checkpoints)
leaves the batches as they were, and is checked as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.corrupt import FILES, CorruptFault

if TYPE_CHECKING:
    from isrlab.harness.sim.nemesis import SimNemesis


@dataclass(frozen=True)
class SimResult:
    """A command's outcome (`nemeses.base.CommandResult`)."""

    node: str
    cmd: str
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def check(self) -> SimResult:
        if not self.ok:
            raise NemesisError(f"{self.node}: {self.cmd!r} failed: {self.stderr.strip()}")
        return self


@dataclass(frozen=True)
class _Address:
    name: str
    host: str


class SimShell:
    """A simulated node's shell: commands run here, on the run's files."""

    def __init__(self, node: str) -> None:
        self.node = _Address(node, node)

    def exec(self, cmd: str, *, check: bool = True) -> SimResult:
        out = subprocess.run(
            ["bash", "-c", cmd],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
        res = SimResult(self.node.name, cmd, out.returncode, out.stdout, out.stderr)
        return res.check() if check else res


class SimCorruptDB:
    """What `CorruptFault` asks of its cluster, answered by the simulated one (see the module
    docstring)."""

    def __init__(self, nemesis: SimNemesis) -> None:
        self.nemesis = nemesis
        self.targets = nemesis.targets
        self.test = nemesis.test

    @property
    def names(self) -> list[str]:
        return self.targets.names

    def __getattr__(self, name: str) -> Any:  # leader_of, controller, coordinator, ...
        return getattr(self.targets, name)

    def remote(self, node: str) -> SimShell:
        return SimShell(node)

    def path(self, node: str, *parts: str) -> str:
        b = self.nemesis.cluster.brokers[self.targets.broker_id(node)]
        if parts[:2] == ("broker", "data"):
            (log_dir,) = b.log_dirs  # the real fault knows one data directory per node
            return str(Path(log_dir, *parts[2:]))
        if parts == ("venv", "bin", "python"):
            return sys.executable
        raise NemesisError(f"a simulated node has no {'/'.join(parts)}")

    def replicas_of(self, topic: str, partition: int) -> tuple[str | None, list[str]]:
        """The leader and its in-sync followers, from the state znode (what the metadata of a
        real run names)."""
        try:
            leader, isr, _ = self.targets.partition_state(topic, partition)
        except (KeyError, ValueError):
            return None, []
        if leader is None:
            return None, []
        return leader, [n for n in isr if n != leader]

    def kill(self, node: str) -> bool:
        return self.nemesis._crash(node)

    def start(self, node: str) -> int:
        self.nemesis._spawn_start(node)
        return 0


def _in_order(nodes: list[str], fn: Any) -> list[Any]:
    return [fn(n) for n in nodes]


class SimCorrupt:
    """`CorruptFault` on the simulated cluster, its completions made relative to the run."""

    def __init__(self, nemesis: SimNemesis) -> None:
        self.nemesis = nemesis
        self.fault = CorruptFault(SimCorruptDB(nemesis), nemesis.rng, each=_in_order)

    def start(self, value: dict[str, Any]) -> dict[str, Any]:
        out = self.fault.start(value)
        cluster = self.nemesis.cluster
        segment = FILES[str(value.get("file", "segment"))][1] == ".log"
        if out.get("mode") in ("bitflip", "truncate") and segment:
            topic, _, part = str(out["key"]).rpartition("/")
            for d in out["damage"]:
                if "error" not in d:
                    cluster.damaged(self.nemesis.targets.broker_id(d["node"]), (topic, int(part)))
        for d in out["damage"]:
            for field in ("file", "copy"):
                if field in d:
                    d[field] = cluster.relative(d[field])
            if "error" in d:
                d["error"] = cluster.scrub(d["error"])
        return out

    def stop(self) -> dict[str, Any]:
        return self.fault.stop()

    def heal(self) -> None:
        """Delete the copies of old disks left behind (the brokers are `heal_all`'s)."""
        self.fault.drop_copies()


__all__ = ["SimCorrupt", "SimCorruptDB", "SimShell"]
