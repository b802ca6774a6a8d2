"""Process faults on brokers: pause (SIGSTOP/SIGCONT) and crash (kill -9, then start again).

``start-pause`` with ``{"target": T}`` sends SIGSTOP to the broker process group on the target
nodes (``nemeses.base.resolve_targets``); ``stop-pause`` sends SIGCONT to every broker this fault
paused. ``start-kill`` sends SIGKILL (no clean shutdown, so unflushed page-cache writes survive
but nothing else does); ``stop-kill`` starts every broker this fault killed. Completions:
``{"target": T, "nodes": [...]}`` for starts and ``{"nodes": [...]}`` for stops.

``start-lagging-failover`` (`LaggingFailoverFault`) is a targeted sequence: it pauses the
in-sync followers of one key's partition, kills its leader after a lag, and resumes the
followers (see the class).

``heal()`` does not trust the bookkeeping: it resumes every node's broker and starts every broker
that is not running, so it also repairs what a crashed harness left behind.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isrlab.nemeses.base import ClusterDB, default_key, resolve_targets


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


class LaggingFailoverFault:
    """``start-lagging-failover`` with ``{"key": K, "lag_ms": N}``: a leader dies while its
    followers lag behind it, the sequence behind every "acknowledged by the leader alone"
    loss (acks=1 data; transaction markers with ``transaction.marker.required.acks=1``).

    1. SIGSTOP the in-sync followers of key K's partition (as the metadata names them);
    2. wait ``lag_ms``: what the leader acknowledges alone now stays unreplicated, while the
       followers are still in the ISR (keep ``lag_ms`` below ``replica.lag.time.max.ms`` and
       the ZooKeeper session timeout);
    3. kill -9 the leader, then SIGCONT the followers: the controller elects one of them,
       without that tail, and the old leader truncates to it when it comes back.

    ``stop-lagging-failover`` starts the killed leader again. The completion names the
    ``leader`` and ``followers`` hit; a key whose leader has no in-sync follower is left alone
    (``error``). ``heal()`` resumes every broker and starts every dead one."""

    kind = "lagging-failover"

    def __init__(self, db: ClusterDB, rng: random.Random, sleep: Any = None) -> None:
        self.db = db
        self.rng = rng
        self._kills = KillFault(db, rng)  # the killed leaders, started again by stop
        self._sleep = sleep or time.sleep

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        lag_ms = int(value.get("lag_ms", 1000))
        topic, _, part = key.rpartition("/")
        try:
            leader, followers = self.db.replicas_of(topic, int(part))
        except Exception as e:
            return {"key": key, "error": f"no partition state: {type(e).__name__}: {e}"}
        if leader is None or not followers:
            return {"key": key, "leader": leader, "error": "no leader with in-sync followers"}
        paused = [n for n, ok in zip(followers, _each(followers, self.db.pause), strict=True) if ok]
        try:
            self._sleep(lag_ms / 1000)
            killed = self.db.kill(leader)
        finally:
            _each(paused, self.db.resume)
        if killed:
            self._kills.killed.add(leader)
        hit = leader if killed else None
        return {"key": key, "lag_ms": lag_ms, "leader": hit, "followers": paused}

    def stop(self, value: Any = None) -> dict[str, Any]:
        return self._kills.stop(value)

    def heal(self) -> list[str]:
        resumed = PauseFault(self.db, self.rng).heal()
        started = self._kills.heal()
        return sorted(set(resumed) | set(started))
