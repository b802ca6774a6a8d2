"""File corruption on brokers' disks: bit flips, truncation, and an old disk coming back.

``start-corrupt`` with ``{"target": T, "key": K, "mode": M, ...}`` acts on the target nodes,
chosen by ``nemeses.base.resolve_targets`` (one, minority, majority, all, leader of K, ...)
among the replicas of K's partition (its leader and the in-sync followers the metadata names;
every node when the cluster cannot tell): a minority is a minority of the copies. Each node's
broker is killed (SIGKILL), its files are damaged, and it is started again: a disk returns
what was written to it, so damage is only seen by a process that reads the file after the page
cache let go of it, which is what a restart gives. The broker meets the damage at its start (the
recovery of docs/durability.md) or when it first reads the damaged batch.

Modes:

- ``bitflip``: flip ``bits`` (default 1) random bits in byte range ``range`` = ``[lo, hi]``
  (fractions of the file's length, default ``[0, 1]``) of ``file`` (below) of key K's
  partition on the node;
- ``truncate``: cut ``file`` to fraction ``at`` of its length (default: a random point);
- ``snapshot``: copy the node's whole data directory aside (broker killed, copied, started
  again); ``stop-corrupt`` later kills the broker, puts the copy back in place of the data
  directory and starts it: a node coming back with an old disk.

``file`` is one of ``FILES``: ``segment`` (a ``.log`` file), ``index``, ``timeindex``,
``txnindex`` (of that segment), ``snapshot`` (a producer state ``.snapshot``),
``leader-epoch`` (the partition's ``leader-epoch-checkpoint``), and the log dir's
``recovery-point``, ``replication-offset`` (high watermarks) and ``log-start-offset``
checkpoints. ``segment`` = ``first`` (default: the oldest segment, below the recovery point
once the log has rolled), ``last`` (the active one) or ``middle`` picks the segment for the
segment files.

Completions: ``{"target": T, "key": K, "mode": M, "replicas": [...], "nodes": [...], "damage": [{"node",
"file", "size", "flips": [[byte offset, bit], ...]} | {..., "truncated_to": n} | {"node",
"copy"} | {"node", "error"}]}``: exactly what was done, so a history says which bytes changed.
``stop-corrupt`` answers ``{"nodes": [...], "restored": [...]}`` (bit flips and truncations
are not undone: the broker and its replicas repair or refuse them). ``heal()`` deletes
snapshot copies left behind (without restoring them) and starts every dead broker.

The random choices (which bits, where to cut) come from the fault's seeded random, so a run is
reproducible given the same files.
"""

from __future__ import annotations

import posixpath
import random
import shlex
from collections.abc import Callable
from typing import Any, Protocol, cast

from isrlab.nemeses.base import ClusterDB, NemesisError, default_key, resolve_targets
from isrlab.nemeses.process import KillFault, _each

MODES: tuple[str, ...] = ("bitflip", "truncate", "snapshot")

#: file kind -> (in the partition dir (True) or the log dir, suffix or name)
FILES: dict[str, tuple[bool, str]] = {
    "segment": (True, ".log"),
    "index": (True, ".index"),
    "timeindex": (True, ".timeindex"),
    "txnindex": (True, ".txnindex"),
    "snapshot": (True, ".snapshot"),
    "leader-epoch": (True, "leader-epoch-checkpoint"),
    "recovery-point": (False, "recovery-point-offset-checkpoint"),
    "replication-offset": (False, "replication-offset-checkpoint"),
    "log-start-offset": (False, "log-start-offset-checkpoint"),
}
SEGMENTS: tuple[str, ...] = ("first", "middle", "last")
SNAPSHOT_SUFFIX = ".isrlab-old-disk"

# flips bits in place: python FILE OFFSET:BIT ...
_FLIP = (
    "import sys\n"
    "with open(sys.argv[1], 'r+b') as f:\n"
    "    for arg in sys.argv[2:]:\n"
    "        o, b = (int(x) for x in arg.split(':'))\n"
    "        f.seek(o); c = f.read(1)[0]; f.seek(o); f.write(bytes([c ^ (1 << b)]))\n"
)


class CorruptDB(ClusterDB, Protocol):
    """What the corrupt fault needs beyond ``ClusterDB`` (``harness.db.KafkaDB`` has it)."""

    def path(self, node: str, *parts: str) -> str: ...


class _Replicas:
    """The DB seen through one partition's replicas: ``names`` are the replicas."""

    def __init__(self, db: ClusterDB, names: list[str]) -> None:
        self._db = db
        self.names = names

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def start_value(rng: random.Random, target: str, keys: list[str]) -> dict[str, Any]:
    """A random ``start-corrupt`` value (what the schedule draws)."""
    mode = rng.choice(["bitflip", "bitflip", "bitflip", "truncate", "snapshot"])
    value: dict[str, Any] = {"target": target, "mode": mode}
    if keys:
        value["key"] = rng.choice(keys)
    if mode == "snapshot":
        return value
    value["file"] = rng.choice(list(FILES))
    value["segment"] = rng.choice(["first", "first", "middle", "last"])
    if mode == "bitflip":
        lo = round(rng.uniform(0, 0.9), 3)
        value["range"] = [lo, round(min(1.0, lo + rng.choice([0.01, 0.1, 1.0])), 3)]
        value["bits"] = rng.choice([1, 1, 2, 8])
    else:
        value["at"] = round(rng.uniform(0, 1), 3)
    return value


def _fraction(value: Any, name: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise NemesisError(f"corrupt: {name} must be a number in [0, 1], not {value!r}") from None
    if not 0 <= f <= 1:
        raise NemesisError(f"corrupt: {name} must be in [0, 1], not {value!r}")
    return f


class CorruptFault:
    kind = "corrupt"

    def __init__(
        self,
        db: CorruptDB,
        rng: random.Random,
        each: Callable[[list[str], Callable[[str], Any]], list[Any]] = _each,
    ) -> None:
        """`each(nodes, fn)`: how the nodes are acted on (default: in parallel threads, one
        per node; the simulator passes a loop in node order, on its one thread)."""
        self.db = db
        self.rng = rng
        self._each = each
        self._kills = KillFault(db, rng)  # brokers that did not come back, started by heal
        self.copies: dict[str, str] = {}  # node -> its data dir's copy (snapshot mode)

    def _data(self, node: str) -> str:
        return self.db.path(node, "broker", "data")

    def _sh(self, node: str, cmd: str) -> str:
        res = self.db.remote(node).exec(cmd, check=False)
        if not res.ok:
            raise NemesisError(f"{node}: {cmd.split()[0]} failed: {(res.stderr or '').strip()}")
        return res.stdout

    def start(self, value: Any) -> dict[str, Any]:
        value = dict(value or {})
        mode = str(value.get("mode", "bitflip"))
        if mode not in MODES:
            raise NemesisError(f"corrupt: unknown mode {mode!r}; use one of {', '.join(MODES)}")
        file = str(value.get("file", "segment"))
        if mode != "snapshot" and file not in FILES:
            raise NemesisError(f"corrupt: unknown file {file!r}; use one of {', '.join(FILES)}")
        which = str(value.get("segment", "first"))
        if which not in SEGMENTS:
            raise NemesisError(f"corrupt: segment must be one of {', '.join(SEGMENTS)}")
        key = str(value.get("key") or default_key(self.db))
        target = str(value.get("target", "one"))
        if mode == "bitflip":
            lo, hi = (_fraction(x, "range") for x in value.get("range", [0, 1]))
            if hi < lo:
                raise NemesisError(f"corrupt: range {value['range']} is empty")
            bits = int(value.get("bits", 1))
            if bits < 1:
                raise NemesisError(f"corrupt: bits must be at least 1, not {bits}")
        if mode == "truncate" and "at" in value:
            _fraction(value["at"], "at")
        replicas = self._replicas(key)
        among = cast(ClusterDB, _Replicas(self.db, replicas)) if replicas else self.db
        nodes = resolve_targets(target, among, self.rng, key)
        # the random draws happen here, in node order, so they do not depend on thread timing
        plans = [(n, random.Random(self.rng.random())) for n in nodes]
        done = self._each(
            [n for n, _ in plans],
            lambda n: self._one(n, dict(plans)[n], mode, file, which, key, value),
        )
        hit = [d["node"] for d in done if "error" not in d]
        out = {"target": target, "key": key, "mode": mode, "nodes": hit, "damage": done}
        if replicas:
            out["replicas"] = replicas
        return out

    def _replicas(self, key: str) -> list[str]:
        topic, _, part = key.rpartition("/")
        try:
            leader, followers = self.db.replicas_of(topic, int(part))
        except Exception:
            return []
        return sorted({n for n in (leader, *followers) if n})

    def _one(
        self,
        node: str,
        rng: random.Random,
        mode: str,
        file: str,
        which: str,
        key: str,
        value: dict[str, Any],
    ) -> dict[str, Any]:
        self.db.kill(node)
        try:
            if mode == "snapshot":
                out = self._snapshot(node)
            else:
                out = self._damage(node, rng, mode, file, which, key, value)
        except NemesisError as e:
            out = {"node": node, "error": str(e)}
        finally:
            self.db.start(node)
        return out

    def _snapshot(self, node: str) -> dict[str, Any]:
        data = self._data(node)
        copy = data.rstrip("/") + SNAPSHOT_SUFFIX
        q, qc = shlex.quote(data), shlex.quote(copy)
        self._sh(node, f"rm -rf {qc} && cp -a {q} {qc}")
        self.copies[node] = copy
        return {"node": node, "copy": copy}

    def _target_file(self, node: str, file: str, which: str, key: str) -> str:
        topic, _, part = key.rpartition("/")
        in_partition, name = FILES[file]
        data = self._data(node)
        directory = posixpath.join(data, f"{topic}-{part}") if in_partition else data
        if not name.startswith("."):
            return posixpath.join(directory, name)
        listing = self._sh(node, f"ls -1 {shlex.quote(directory)}").split()
        segments = sorted(n[: -len(".log")] for n in listing if n.endswith(".log"))
        if name == ".snapshot":
            snaps = sorted(n for n in listing if n.endswith(".snapshot"))
            if not snaps:
                raise NemesisError(f"no producer state snapshot in {directory}")
            return posixpath.join(directory, snaps[-1])
        if not segments:
            raise NemesisError(f"no segment in {directory}")
        base = {"first": segments[0], "last": segments[-1]}.get(which, segments[len(segments) // 2])
        if base + name not in listing:
            raise NemesisError(f"no {base}{name} in {directory}")
        return posixpath.join(directory, base + name)

    def _damage(
        self,
        node: str,
        rng: random.Random,
        mode: str,
        file: str,
        which: str,
        key: str,
        value: dict[str, Any],
    ) -> dict[str, Any]:
        path = self._target_file(node, file, which, key)
        q = shlex.quote(path)
        size = int(self._sh(node, f"stat -c %s {q}").strip())
        out: dict[str, Any] = {"node": node, "file": path, "size": size}
        if mode == "truncate":
            at = float(value["at"]) if "at" in value else rng.random()
            to = int(size * at)
            self._sh(node, f"truncate -s {to} {q}")
            out["truncated_to"] = to
            return out
        if size == 0:
            raise NemesisError(f"{path} is empty: no bit to flip")
        lo, hi = (float(x) for x in value.get("range", [0, 1]))
        first = min(int(size * lo), size - 1)
        last = max(first + 1, min(size, int(size * hi)))
        flips = sorted(
            [rng.randrange(first, last), rng.randrange(8)] for _ in range(int(value.get("bits", 1)))
        )
        python = self.db.path(node, "venv", "bin", "python")
        args = " ".join(f"{o}:{b}" for o, b in flips)
        self._sh(node, f"{shlex.quote(python)} -c {shlex.quote(_FLIP)} {q} {args}")
        out["flips"] = flips
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        """Put every snapshot copy back (an old disk coming back)."""
        nodes = sorted(self.copies)
        restored = self._each(nodes, self._restore)
        self.copies.clear()
        return {
            "nodes": nodes,
            "restored": [n for n, ok in zip(nodes, restored, strict=True) if ok],
        }

    def _restore(self, node: str) -> bool:
        copy = self.copies[node]
        data = self._data(node)
        self.db.kill(node)
        try:
            self._sh(node, f"test -d {shlex.quote(copy)}")
            self._sh(
                node, f"rm -rf {shlex.quote(data)} && mv {shlex.quote(copy)} {shlex.quote(data)}"
            )
            return True
        except NemesisError:
            return False
        finally:
            self.db.start(node)

    def heal(self) -> list[str]:
        self.drop_copies()
        return self._kills.heal()

    def drop_copies(self) -> None:
        """Delete every node's snapshot copy, without putting it back (`heal`'s first half)."""
        for node in self.db.names:
            copy = self._data(node).rstrip("/") + SNAPSHOT_SUFFIX
            self.db.remote(node).exec(f"rm -rf {shlex.quote(copy)}", check=False)
        self.copies.clear()
