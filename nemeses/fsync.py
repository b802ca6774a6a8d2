"""Failing fsyncs: ``start-fsync-fail`` / ``stop-fsync-fail`` (the ``fsync-fail`` kind).

``start-fsync-fail`` with ``{"target": T}`` (``nemeses.base.resolve_targets``) makes every fsync
of the target nodes' brokers fail with EIO from then on (``db.set_fsync_failing``: the flag
file ``nemeses.fsyncshim`` watches; on the simulator, the same flag per simulated broker).
The broker takes its log dir offline at its first failed segment fsync and halts, as Kafka
does (docs/durability.md, "A failed fsync takes the log dir offline"): with
``log.flush.interval.messages=1`` at its next append, with the page cache at its next roll or
scheduled flush; a failed checkpoint fsync is logged and retried. ``stop-fsync-fail`` makes the
fsyncs work again and starts the target brokers that are down (halted), as a replaced disk
and a restart would. ``heal()`` removes the flag from every node (the kill fault's heal then
starts the brokers that died).

Completions: ``{"target": T, "nodes": [...]}`` for a start (the nodes whose flag was set),
``{"nodes": [...], "started": [...]}`` for a stop.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from isrlab.nemeses.base import ClusterDB, resolve_targets
from isrlab.nemeses.process import _each


class FsyncDB(ClusterDB, Protocol):
    """What the fault needs beyond ``ClusterDB`` (``harness.db.KafkaDB`` has it)."""

    def set_fsync_failing(self, node: str, failing: bool) -> bool:
        """Set (True: done) or remove (True: there was one) the node's flag."""
        ...

    def broker_state(self, node: str) -> str: ...


class FsyncFailFault:
    kind = "fsync-fail"

    def __init__(self, db: FsyncDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self.failing: set[str] = set()

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        target = str(value.get("target", "one"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        done = _each(nodes, lambda n: self.db.set_fsync_failing(n, True))
        hit = [n for n, ok in zip(nodes, done, strict=True) if ok]
        self.failing.update(hit)
        return {"target": target, "nodes": hit}

    def stop(self, value: Any = None) -> dict[str, Any]:
        nodes = sorted(self.failing)
        return {"nodes": nodes, "started": self._repair(nodes)}

    def heal(self) -> list[str]:
        """The flag off on every node (a run that ended mid-fault left it anywhere): the nodes
        that had it. The halted brokers are left to the kill fault's heal, which runs after
        this one in `compose.heal_all` and starts every broker that died."""
        names = list(self.db.names)
        removed = _each(names, lambda n: self.db.set_fsync_failing(n, False))
        self.failing.clear()
        return [n for n, was in zip(names, removed, strict=True) if was]

    def _repair(self, nodes: list[str]) -> list[str]:
        """The flag off on `nodes`, then the brokers among them that are down started."""
        _each(nodes, lambda n: self.db.set_fsync_failing(n, False))
        self.failing.difference_update(nodes)
        down = [n for n in nodes if self.db.broker_state(n) == "down"]
        _each(down, self.db.start)
        return down


__all__ = ["FsyncDB", "FsyncFailFault"]
