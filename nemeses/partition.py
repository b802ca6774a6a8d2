"""Network partitions: who cannot reach whom (a *grudge*), and two ways to impose it.

A grudge is ``{node: [nodes it cannot reach]}`` over every node of the test (a node that can
reach everyone maps to ``[]``); it is also the completion value of ``start-partition``.

Shapes (Jepsen's names), from ``grudge(shape, nodes, rng, leader=None)``:

``isolate-one``
    one random node against the rest.
``isolate-leader``
    the leader of a key (``value["key"]``, default the test's first key) against the rest.
``halves``
    a random minority (``n // 2`` nodes) against the majority.
``majorities-ring``
    nodes on a random ring; each reaches the nodes within ring distance ``ceil((n//2) / 2)``,
    so every node sees a majority but no two see the same one (needs at least 4 nodes).
``bridge``
    two halves that cannot reach each other and one node of the bigger half that reaches both.
``isolate-coordinator``
    the coordinator of the test's consumer group (``test["group"]``) against the rest; drawn
    by a schedule only when its targets include ``coordinator``.
``isolate-txn-coordinator``
    the transaction coordinator of one of the test's transactional ids
    (``test["transactional_ids"]``) against the rest; drawn by a schedule only when its
    targets include ``txn-coordinator``.

Methods:

``route`` (the seeds' way)
    on node A, for each B it must not reach, ``route add -host <B> gw 127.0.0.1``: packets to B
    go to loopback, so TCP connections break while both processes live on. Healed by deleting
    every route via 127.0.0.1 (we are the only ones adding such routes).
``iptables`` (Jepsen's way)
    on node A, ``iptables -A ISRLAB-NEMESIS -s <B> -j DROP`` in our own chain jumped to from
    INPUT. Established connections are not reset: they stall until their timeouts fire. Healed by
    flushing and deleting the chain and its jump; other rules on the node are never touched.

Only the test's nodes are ever cut off: the control host (SSH, clients) always reaches them.
"""

from __future__ import annotations

import math
import random
import shlex
from collections.abc import Sequence
from typing import Any

from isrlab.nemeses.base import (
    ClusterDB,
    NemesisError,
    Shell,
    coordinator_node,
    leader_node,
    txn_coordinator_node,
)

# The shapes a schedule draws from by default; ``isolate-coordinator`` joins them when the
# schedule's targets include ``coordinator`` (a test with a consumer group).
DEFAULT_SHAPES: tuple[str, ...] = (
    "isolate-one",
    "isolate-leader",
    "halves",
    "majorities-ring",
    "bridge",
)
SHAPES: tuple[str, ...] = (*DEFAULT_SHAPES, "isolate-coordinator", "isolate-txn-coordinator")
METHODS: tuple[str, ...] = ("route", "iptables")
CHAIN = "ISRLAB-NEMESIS"

Grudge = dict[str, list[str]]


def _from_components(nodes: Sequence[str], sides: Sequence[set[str]]) -> Grudge:
    """Nodes in different sides cannot reach each other."""
    side_of = {n: i for i, side in enumerate(sides) for n in side}
    return {a: sorted(b for b in nodes if side_of[a] != side_of[b]) for a in nodes}


def isolate(nodes: Sequence[str], victim: str) -> Grudge:
    return _from_components(nodes, [{victim}, set(nodes) - {victim}])


def grudge(
    shape: str, nodes: Sequence[str], rng: random.Random, leader: str | None = None
) -> Grudge:
    """The grudge of ``shape`` over ``nodes`` (see the module docstring); ``leader`` is the
    node ``isolate-leader``, ``isolate-coordinator`` or ``isolate-txn-coordinator`` cuts off
    (a random one when None)."""
    nodes = sorted(nodes)
    n = len(nodes)
    if n < 2:
        raise NemesisError(f"a partition needs at least 2 nodes, not {n}")
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    if shape == "isolate-one":
        return isolate(nodes, shuffled[0])
    if shape in ("isolate-leader", "isolate-coordinator", "isolate-txn-coordinator"):
        return isolate(nodes, leader or shuffled[0])
    if shape == "halves":
        k = n // 2
        return _from_components(nodes, [set(shuffled[:k]), set(shuffled[k:])])
    if shape == "majorities-ring":
        if n < 4:
            raise NemesisError(f"majorities-ring needs at least 4 nodes, not {n}")
        reach = math.ceil((n // 2) / 2)
        pos = {node: i for i, node in enumerate(shuffled)}
        out: Grudge = {}
        for a in nodes:
            out[a] = sorted(
                b for b in nodes if min((pos[a] - pos[b]) % n, (pos[b] - pos[a]) % n) > reach
            )
        return out
    if shape == "bridge":
        if n < 3:
            raise NemesisError(f"a bridge needs at least 3 nodes, not {n}")
        k = n // 2
        left, right = set(shuffled[:k]), set(shuffled[k:])
        bridge_node = shuffled[k]
        out = _from_components(nodes, [left, right])
        out[bridge_node] = []
        for a in left:
            out[a] = sorted(set(out[a]) - {bridge_node})
        return out
    raise NemesisError(f"unknown partition shape {shape!r}; use one of {', '.join(SHAPES)}")


def _address(r: Shell, host: str) -> str:
    """``host`` as the node resolves it (an IP literal resolves to itself)."""
    res = r.exec(f"getent ahostsv4 {shlex.quote(host)} | head -n1", check=False)
    return res.stdout.split()[0] if res.ok and res.stdout.split() else host


def heal_node(r: Shell) -> list[str]:
    """Remove every black-hole route and our iptables chain on one node; what was removed."""
    res = r.exec(
        f"""
ip route show | grep ' via 127.0.0.1 ' | while read -r dest _; do
  ip route del "$dest" via 127.0.0.1 2>/dev/null && echo "route $dest"
done
if iptables -w -L {CHAIN} -n >/dev/null 2>&1; then
  iptables -w -S {CHAIN} | grep -c '^-A' | sed 's/^/iptables-rules /'
  iptables -w -F {CHAIN}
  while iptables -w -D INPUT -j {CHAIN} 2>/dev/null; do :; done
  iptables -w -X {CHAIN}
fi
exit 0
"""
    )
    return [line for line in res.stdout.splitlines() if line.strip()]


class PartitionFault:
    """``start-partition`` / ``stop-partition`` by routes or iptables (see the module doc)."""

    def __init__(
        self, db: ClusterDB, rng: random.Random, method: str = "route", kind: str | None = None
    ) -> None:
        if method not in METHODS:
            raise NemesisError(f"unknown partition method {method!r}; use route or iptables")
        self.db = db
        self.rng = rng
        self.method = method
        self.kind = kind or ("partition" if method == "route" else "partition-iptables")
        self.current: Grudge = {}

    def _apply(self, node: str, peers: list[str]) -> None:
        if not peers:
            return
        r = self.db.remote(node)
        hosts = [_address(r, self._host(p)) for p in peers]
        if self.method == "route":
            # `ip route replace` is idempotent where `route add` fails on an existing route
            cmds = [f"ip route replace {shlex.quote(h)}/32 via 127.0.0.1 dev lo" for h in hosts]
        else:
            cmds = [
                f"iptables -w -N {CHAIN} 2>/dev/null || true",
                f"iptables -w -C INPUT -j {CHAIN} 2>/dev/null || iptables -w -I INPUT -j {CHAIN}",
            ]
            cmds += [f"iptables -w -A {CHAIN} -s {shlex.quote(h)} -j DROP" for h in hosts]
        r.exec("set -e\n" + "\n".join(cmds))

    def _host(self, node: str) -> str:
        return self.db.remote(node).node.host

    def start(self, value: Any) -> Grudge:
        value = value or {}
        shape = str(value.get("shape", "halves"))
        if "grudge" in value:
            g: Grudge = {k: sorted(v) for k, v in value["grudge"].items()}
        else:
            victim = None
            if shape == "isolate-leader":
                victim = leader_node(self.db, value.get("key"))
            elif shape == "isolate-coordinator":
                victim = coordinator_node(self.db)
            elif shape == "isolate-txn-coordinator":
                victim = txn_coordinator_node(self.db, self.rng)
            g = grudge(shape, self.db.names, self.rng, victim)
        if self.current:
            self.heal()
        self.current = {n: list(g.get(n, [])) for n in self.db.names}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(self.current)) as ex:
            list(ex.map(lambda kv: self._apply(*kv), self.current.items()))
        return self.current

    def stop(self, value: Any = None) -> Grudge:
        self.heal()
        return {n: [] for n in self.db.names}

    def heal(self) -> dict[str, list[str]]:
        from concurrent.futures import ThreadPoolExecutor

        names = self.db.names
        with ThreadPoolExecutor(max_workers=len(names)) as ex:
            removed = list(ex.map(lambda n: heal_node(self.db.remote(n)), names))
        self.current = {}
        return {n: r for n, r in zip(names, removed, strict=True) if r}
