"""The embedded cluster's state file: the inventory of everything ``up`` created.

One JSON file per cluster, ``/run/isrlab/cluster-<name>.json`` (``/run`` is a tmpfs, so the
file disappears with the namespaces on reboot). ``up`` writes the full plan *before* creating
anything and updates it as it goes, so whatever exists on the host after a crash at any point is
listed in it, and ``down`` removes exactly what it lists (each removal tolerates a resource that
is already gone). Fields:

``name``, ``subnet`` (CIDR), ``bridge``, ``host_address`` (the bridge's address), ``run_dir``
(keys, sshd configs and logs), ``data_dir`` (the nodes' working directories), ``key_file``,
``known_hosts``, ``iptables`` (host rules as argument lists, e.g. ``["FORWARD", "-i", ...]``),
``complete`` (``up`` finished), ``created_by_pid`` and ``created_at``, and ``nodes``: a list of
``{name, netns, address, veth_host, etc_netns_dir, workdir, sshd_config, sshd_pidfile,
sshd_log, sshd_pid, host_key_pub}``.

A lock file next to it (``cluster-<name>.lock``, ``flock``) serialises ``up``/``down`` of one
cluster across processes; it is deleted whenever no state file remains.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_DIR = Path(os.environ.get("ISRLAB_STATE_DIR", "/run/isrlab"))
DATA_ROOT = Path(os.environ.get("ISRLAB_DATA_ROOT", "/var/lib/isrlab"))


@dataclass
class NodeState:
    name: str
    netns: str
    address: str
    veth_host: str
    etc_netns_dir: str
    workdir: str
    sshd_config: str
    sshd_pidfile: str
    sshd_log: str
    sshd_pid: int | None = None
    host_key_pub: str = ""


@dataclass
class ClusterState:
    name: str
    subnet: str
    bridge: str
    host_address: str
    run_dir: str
    data_dir: str
    key_file: str
    known_hosts: str
    nodes: list[NodeState]
    iptables: list[list[str]] = field(default_factory=list)
    complete: bool = False
    created_by_pid: int = 0
    created_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterState:
        nodes = [NodeState(**n) for n in d.get("nodes", [])]
        rest = {k: v for k, v in d.items() if k != "nodes"}
        return cls(nodes=nodes, **rest)


def state_path(name: str) -> Path:
    return STATE_DIR / f"cluster-{name}.json"


def lock_path(name: str) -> Path:
    return STATE_DIR / f"cluster-{name}.lock"


def load_state(name: str) -> ClusterState | None:
    """The recorded state of cluster ``name``, or None if there is none (or it is unreadable)."""
    try:
        return ClusterState.from_dict(json.loads(state_path(name).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        # a torn write is impossible (atomic rename) but a hand-edited file is not
        return None


def save_state(st: ClusterState) -> None:
    """Atomically replace the state file (write a temp file, fsync, rename)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = state_path(st.name)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(st.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_state(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(name).unlink()


def all_states() -> list[ClusterState]:
    """Every cluster recorded on this host (for subnet-conflict checks and listings)."""
    out = []
    if STATE_DIR.is_dir():
        for p in sorted(STATE_DIR.glob("cluster-*.json")):
            st = load_state(p.stem.removeprefix("cluster-"))
            if st is not None:
                out.append(st)
    return out


@contextlib.contextmanager
def cluster_lock(name: str) -> Iterator[None]:
    """Hold the exclusive per-cluster lock for the duration of an up or down.

    The lock file lives only as long as the cluster's state file: when the holder leaves no
    state behind (a down, a failed up) it deletes the lock file before releasing it. A process
    that was waiting on the deleted file notices that the path no longer names the file it
    locked and tries again, so two holders never coexist.
    """
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = lock_path(name)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        if not state_path(name).exists():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(fd)


class ClusterBusy(Exception):
    """Another run holds the cluster (see `run_lock`)."""


@contextlib.contextmanager
def run_lock(name: str) -> Iterator[None]:
    """Hold cluster ``name`` for one run (a test, the demo) for the duration of the block.

    Two runs on one embedded cluster corrupt each other: they share the brokers, topics and
    ZooKeeper, and the one that ends first tears the cluster down under the other. A second
    run gets `ClusterBusy` at once, naming the process that holds the cluster. The lock is an
    flock on ``cluster-<name>.run.lock``, released when the holder exits, however it exits."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = STATE_DIR / f"cluster-{name}.run.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ClusterBusy(
                f"the embedded cluster {name!r} is in use by another isrlab run (pid {holder}); "
                "wait for it to finish, or give this run a cluster of its own with "
                "--cluster-name NAME"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
