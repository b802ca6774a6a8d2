"""Power loss of nodes: everything the broker had not fsynced is gone.

``start-power`` with ``{"target": T}`` (``nemeses.base.resolve_targets``: one, minority, majority,
all for a coordinated power failure, leader, controller, ...) kills the broker on each target
node with SIGKILL, then runs ``isrlab-broker power-loss`` on its log dir over SSH: every file is
cut back to the length its last successful fsync put on disk and files whose directory entry
never reached disk are deleted (the broker's journal of synced lengths, ``broker/log/durable.py``;
the model and how it compares with lazyfs: docs/durability.md, "Power loss"). The broker stays
down until ``stop-power``, which starts it again (it recovers as after any unclean shutdown).

``power-torn`` (``start-power-torn`` / ``stop-power-torn``, value ``{"target": T, "torn_seed":
S}``) is the same loss on a disk that wrote back part of the page cache first (LazyFS's torn
writes): ``isrlab-broker power-loss --torn-seed`` keeps, drawn from the seed, none, all or a
prefix of each file's unsynced tail, its last page possibly zeros (docs/durability.md, "Torn
power loss"). Each node tears with its own seed, derived from S and its name.

``power-zookeeper`` (the same ops with ``f`` ``start-power-zookeeper`` / ``stop-power-zookeeper``)
is the power loss of the ZooKeeper servers among the target nodes instead: ZooKeeper fsyncs its transaction log before it acknowledges (``forceSync=yes``,
its default), so such a loss is modelled as kill -9 of the server with nothing it acknowledged
lost; ``stop-power`` starts it again. (Nodes of the target that run no ZooKeeper server are
skipped.)

Completions: ``{"target": T, "nodes": [...], "power_loss": {node: summary}}`` (or
``{"target": T, "zookeeper": [...]}``) for starts, ``{"nodes": [...]}`` for stops; a node whose
log dir could not be cut back is named under ``error``. ``heal()`` starts every dead broker and
every ZooKeeper server this fault killed.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Protocol

from isrlab.nemeses.base import ClusterDB, resolve_targets
from isrlab.nemeses.process import KillFault, _each


class PowerDB(ClusterDB, Protocol):
    """What the power fault needs beyond ``ClusterDB`` (``harness.db.KafkaDB`` has it)."""

    def power_loss(self, node: str, torn_seed: int | None = None) -> str: ...

    def zookeeper_nodes(self) -> list[str]: ...

    def kill_zookeeper(self, node: str) -> bool: ...

    def start_zookeeper_on(self, node: str) -> int: ...


def node_torn_seed(torn_seed: int, node: str) -> int:
    """The tear seed of `node` in a ``power-torn`` start whose value has ``torn_seed``."""
    return zlib.crc32(f"{torn_seed}:{node}".encode())


class PowerFault:
    def __init__(
        self, db: PowerDB, rng: random.Random, *, zookeeper: bool = False, torn: bool = False
    ) -> None:
        if zookeeper and torn:
            raise ValueError("a ZooKeeper power loss loses nothing ZooKeeper acknowledged: no tear")
        self.db = db
        self.rng = rng
        self.zookeeper = zookeeper
        self.torn = torn
        self.kind = "power-zookeeper" if zookeeper else "power-torn" if torn else "power"
        self._kills = KillFault(db, rng)  # the brokers down, started again by stop/heal
        self.zk_down: set[str] = set()

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        target = str(value.get("target", "one"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        if self.zookeeper:
            members = set(self.db.zookeeper_nodes())
            hit_zk = [n for n in nodes if n in members]
            done = _each(hit_zk, self.db.kill_zookeeper)
            killed = [n for n, ok in zip(hit_zk, done, strict=True) if ok]
            self.zk_down.update(killed)
            return {"target": target, "zookeeper": killed}
        killed = [n for n, ok in zip(nodes, _each(nodes, self.db.kill), strict=True) if ok]
        self._kills.killed.update(killed)
        # A broker not running (killed earlier) lost its power too: cut its log dir as well.
        summaries: dict[str, str] = {}
        errors: dict[str, str] = {}
        torn_seed: int | None = None
        if self.torn:
            torn_seed = int(value.get("torn_seed", self.rng.randrange(2**31)))

        def cut(node: str) -> None:
            try:
                if torn_seed is None:
                    summaries[node] = self.db.power_loss(node)
                else:
                    summaries[node] = self.db.power_loss(node, node_torn_seed(torn_seed, node))
            except Exception as e:
                errors[node] = f"{type(e).__name__}: {e}"

        down = [n for n in nodes if n in killed or self._kills._dead(n)]
        _each(down, cut)
        out: dict[str, Any] = {"target": target, "nodes": killed, "power_loss": summaries}
        if torn_seed is not None:
            out["torn_seed"] = torn_seed
        if errors:
            out["error"] = "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
        return out

    def stop(self, value: Any = None) -> dict[str, Any]:
        zk = sorted(self.zk_down)
        _each(zk, self.db.start_zookeeper_on)
        self.zk_down.clear()
        out = self._kills.stop(value)
        if zk:
            out["zookeeper"] = zk
        return out

    def heal(self) -> list[str]:
        zk = sorted(self.zk_down)
        _each(zk, self.db.start_zookeeper_on)
        self.zk_down.clear()
        return [*(f"zookeeper:{n}" for n in zk), *self._kills.heal()]


__all__ = ["PowerFault", "node_torn_seed"]
