"""Process faults on brokers: pause (SIGSTOP/SIGCONT) and crash (kill -9, then start again).

``start-pause`` with ``{"target": T}`` sends SIGSTOP to the broker process group on the target
nodes (``nemeses.base.resolve_targets``); ``stop-pause`` sends SIGCONT to every broker this fault
paused. ``start-kill`` sends SIGKILL (no clean shutdown, so unflushed page-cache writes survive
but nothing else does); ``stop-kill`` starts every broker this fault killed. Completions:
``{"target": T, "nodes": [...]}`` for starts and ``{"nodes": [...]}`` for stops.

``start-lagging-failover`` (`LaggingFailoverFault`) is a targeted sequence: it holds back the
in-sync followers of one key's partition (``how`` ``pause``: SIGSTOP them; ``cut``: drop their
broker traffic to the leader's node only, iptables chain ``ISRLAB-LAG``), kills the leader
after a lag, and lets the followers go again (see the class).

``heal()`` does not trust the bookkeeping: it resumes every node's broker and starts every broker
that is not running (lagging-failover: and removes its chain from every node), so it also
repairs what a crashed harness left behind.
"""

from __future__ import annotations

import random
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isrlab.nemeses.base import BROKER_PORT, ClusterDB, default_key, resolve_targets

#: how lagging-failover holds the followers back (``pause``, the first way, is the default)
LAG_HOWS: tuple[str, ...] = ("pause", "cut")
LAG_CHAIN = "ISRLAB-LAG"


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
    """``start-lagging-failover`` with ``{"key": K, "lag_ms": N, "how": "pause" | "cut"}``: a
    leader dies while its followers lag behind it, the sequence behind every "acknowledged by
    the leader alone" loss (acks=1 data; transaction markers with
    ``transaction.marker.required.acks=1``).

    1. hold back the in-sync followers of key K's partition (as the metadata names them):
       ``how`` ``pause`` (the default) SIGSTOPs them; ``cut`` leaves them running and, on the
       leader's node only, drops their TCP traffic to the broker port and the leader's
       answers on those connections (iptables chain ``ISRLAB-LAG``, jumped to from INPUT and
       OUTPUT: ``-s F --dport 9092`` and ``-d F --sport 9092``), so they stop fetching from
       the leader while everything else goes on: they replicate the partitions other
       brokers lead (the ``__transaction_state`` partitions among them, whose acks=all
       appends a paused broker in their ISR would stall), the leader still fetches from
       them, and ZooKeeper, the controller's session checks and the clients are untouched;
    2. wait ``lag_ms``: what the leader acknowledges alone now stays unreplicated, while the
       followers are still in the ISR (keep ``lag_ms`` below ``replica.lag.time.max.ms`` and
       the ZooKeeper session timeout);
    3. kill -9 the leader, then let the followers go (SIGCONT; or remove the chain): the
       controller elects one of them, without that tail, and the old leader truncates to it
       when it comes back.

    ``stop-lagging-failover`` starts the killed leader again (and removes a chain a failed
    start left). The completion names the ``leader`` and ``followers`` hit (with ``cut``,
    also ``how`` and the ``cut`` addresses); a key whose leader has no in-sync follower is
    left alone (``error``). ``heal()`` removes the chain from every node, resumes the
    followers it left paused and starts the leaders it killed."""

    kind = "lagging-failover"

    def __init__(self, db: ClusterDB, rng: random.Random, sleep: Any = None) -> None:
        self.db = db
        self.rng = rng
        self._kills = KillFault(db, rng)  # the killed leaders, started again by stop
        self._sleep = sleep or time.sleep
        self.cut: set[str] = set()  # nodes that may still hold our chain
        self._paused: set[str] = set()  # followers paused by a start that did not finish

    def start(self, value: Any) -> dict[str, Any]:
        value = value or {}
        key = str(value.get("key") or default_key(self.db))
        lag_ms = int(value.get("lag_ms", 1000))
        how = str(value.get("how", "pause"))
        if how not in LAG_HOWS:
            return {"key": key, "error": f"unknown how {how!r}; use {', '.join(LAG_HOWS)}"}
        topic, _, part = key.rpartition("/")
        try:
            leader, followers = self.db.replicas_of(topic, int(part))
        except Exception as e:
            return {"key": key, "error": f"no partition state: {type(e).__name__}: {e}"}
        if leader is None or not followers:
            return {"key": key, "leader": leader, "error": "no leader with in-sync followers"}
        if how == "cut":
            return self._cut_then_kill(key, lag_ms, leader, followers)
        self._paused.update(followers)
        paused = [n for n, ok in zip(followers, _each(followers, self.db.pause), strict=True) if ok]
        try:
            self._sleep(lag_ms / 1000)
            killed = self.db.kill(leader)
        finally:
            _each(paused, self.db.resume)
            self._paused.difference_update(followers)
        if killed:
            self._kills.killed.add(leader)
        hit = leader if killed else None
        return {"key": key, "lag_ms": lag_ms, "leader": hit, "followers": paused}

    def _cut_then_kill(
        self, key: str, lag_ms: int, leader: str, followers: list[str]
    ) -> dict[str, Any]:
        """``how: cut``: the followers' broker connections to the leader dropped on its node,
        the lag, the kill, then the chain removed (also when the kill fails)."""
        shell = self.db.remote(leader)
        addresses = [_address(shell, self.db.remote(f).node.host) for f in followers]
        self.cut.add(leader)
        try:
            shell.exec(_cut_command(addresses))
            self._sleep(lag_ms / 1000)
            killed = self.db.kill(leader)
        finally:
            _uncut(self.db, leader)
            self.cut.discard(leader)
        if killed:
            self._kills.killed.add(leader)
        return {
            "key": key,
            "lag_ms": lag_ms,
            "how": "cut",
            "leader": leader if killed else None,
            "followers": list(followers),
            "cut": addresses,
        }

    def stop(self, value: Any = None) -> dict[str, Any]:
        for node in sorted(self.cut):  # a start that failed before removing its chain
            _uncut(self.db, node)
        self.cut.clear()
        return self._kills.stop(value)

    def heal(self) -> list[str]:
        """Remove the chain from every node (a harness that lost its fault may have left
        one), resume the followers this fault left paused and start the leaders it killed:
        only those, as the targeted faults do (heal_all also heals from a fresh fault of this
        kind, and its pause and kill heals cover every node and report what they find)."""
        uncut = [n for n in self.db.names if _uncut(self.db, n)]
        self.cut.clear()
        paused = sorted(self._paused)
        _each(paused, self.db.resume)
        self._paused.clear()
        killed = sorted(self._kills.killed)
        _each(killed, self.db.start)
        self._kills.killed.clear()
        return sorted(set(uncut) | set(paused) | set(killed))


def _address(shell: Any, host: str) -> str:
    """``host`` as the node resolves it (an IP literal resolves to itself; iptables wants one
    address, not a name that may resolve to several)."""
    res = shell.exec(f"getent ahostsv4 {shlex.quote(host)} | head -n1", check=False)
    words = (res.stdout or "").split() if res.ok else []
    return words[0] if words else host


def _cut_command(addresses: list[str], port: int = BROKER_PORT) -> str:
    """Our chain, jumped to from INPUT and OUTPUT, dropping both directions of the connections
    from ``addresses`` to the broker port (not the node's own connections to their brokers)."""
    parts = [
        f"iptables -w -N {LAG_CHAIN} 2>/dev/null || true",
        f"iptables -w -C INPUT -j {LAG_CHAIN} 2>/dev/null || iptables -w -I INPUT -j {LAG_CHAIN}",
        f"iptables -w -C OUTPUT -j {LAG_CHAIN} 2>/dev/null || iptables -w -I OUTPUT -j {LAG_CHAIN}",
    ]
    for a in addresses:
        parts.append(f"iptables -w -A {LAG_CHAIN} -p tcp -s {a} --dport {port} -j DROP")
        parts.append(f"iptables -w -A {LAG_CHAIN} -p tcp -d {a} --sport {port} -j DROP")
    return "; ".join(parts)


def _uncut(db: ClusterDB, node: str) -> bool:
    """Remove our chain and its jumps from INPUT and OUTPUT on `node`; True if there was one."""
    res = db.remote(node).exec(
        f"if iptables -w -L {LAG_CHAIN} -n >/dev/null 2>&1; then "
        f"iptables -w -F {LAG_CHAIN}; "
        f"while iptables -w -D INPUT -j {LAG_CHAIN} 2>/dev/null; do :; done; "
        f"while iptables -w -D OUTPUT -j {LAG_CHAIN} 2>/dev/null; do :; done; "
        f"iptables -w -X {LAG_CHAIN}; echo removed; fi",
        check=False,
    )
    return "removed" in (res.stdout or "")
