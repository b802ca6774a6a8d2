"""Process faults on brokers: pause (SIGSTOP/SIGCONT) and crash (kill -9, then start again).

``start-pause`` with ``{"target": T}`` sends SIGSTOP to the broker process group on the target
nodes (``nemeses.base.resolve_targets``); ``stop-pause`` sends SIGCONT to every broker this fault
paused. ``start-kill`` sends SIGKILL (no clean shutdown, so unflushed page-cache writes survive
but nothing else does); ``stop-kill`` starts every broker this fault killed. Completions:
``{"target": T, "nodes": [...]}`` for starts and ``{"nodes": [...]}`` for stops.

``heal()`` does not trust the bookkeeping: it resumes every node's broker and starts every broker
that is not running, so it also repairs what a crashed harness left behind.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isrlab.nemeses.base import ClusterDB, resolve_targets


def _each(names: list[str], fn: Any) -> list[Any]:
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=len(names)) as ex:
        return list(ex.map(fn, names))


class PauseFault:
    kind = "pause"

    def __init__(self, db: ClusterDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self.paused: set[str] = set()

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        target = str(value.get("target", "one"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        done = _each(nodes, self.db.pause)
        hit = [n for n, ok in zip(nodes, done, strict=True) if ok]
        self.paused.update(hit)
        return {"target": target, "nodes": hit}

    def stop(self, value: Any = None) -> dict[str, Any]:
        nodes = sorted(self.paused)
        _each(nodes, self.db.resume)
        self.paused.clear()
        return {"nodes": nodes}

    def heal(self) -> list[str]:
        names = self.db.names
        resumed = _each(names, self.db.resume)
        self.paused.clear()
        return [n for n, ok in zip(names, resumed, strict=True) if ok]


class KillFault:
    kind = "kill"

    def __init__(self, db: ClusterDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self.killed: set[str] = set()

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        target = str(value.get("target", "one"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        done = _each(nodes, self.db.kill)
        hit = [n for n, ok in zip(nodes, done, strict=True) if ok]
        self.killed.update(hit)
        return {"target": target, "nodes": hit}

    def stop(self, value: Any = None) -> dict[str, Any]:
        nodes = sorted(self.killed)
        _each(nodes, self.db.start)
        self.killed.clear()
        return {"nodes": nodes}

    def heal(self) -> list[str]:
        # restart exactly the brokers that died (pid file left behind), never one that was
        # not started or was stopped on purpose (after a failed setup, say)
        names = self.db.names
        dead = [n for n, d in zip(names, _each(names, self._dead), strict=True) if d]
        _each(dead, self.db.start)
        self.killed.clear()
        return dead

    def _dead(self, node: str) -> bool:
        state_of = getattr(self.db, "broker_state", None)
        return state_of is not None and state_of(node) == "down"
