"""Transaction dependency graphs and the cycle anomalies found in them.

Nodes are ints (history positions of committed ops; negative ids are virtual realtime
nodes). Every edge carries a bit mask of kinds: `WW` (version order), `WR` (a read of
another op's write), `PROCESS` (consecutive ops of one process) and `REALTIME`.

Realtime order is encoded without a quadratic number of edges: `add_realtime_chain`
threads a chain of virtual nodes through the history, op -> (event after its completion)
-> ... -> (event before an invoke) -> op, so A reaches B through virtual nodes exactly
when A completed before B was invoked. Cycles that pass through virtual nodes are
reported with those stretches collapsed into one realtime step.

`find_cycles` implements the anomalies.md cycle rules:

| name | edges allowed | a cycle must use |
|---|---|---|
| G0 / G0-process / G0-realtime | ww (+process / +realtime) | ww (+process / +realtime) |
| G1c / -process / -realtime | wr (+...) | wr (+...) |
| G1c-ww / -process / -realtime | ww, wr (+...) | ww and wr (+...) |

Steps: nodes that cannot lie on any cycle (no in- or no out-edges, repeatedly) are
trimmed in plain Python, so a valid history costs one linear pass; what is left for each
anomaly's edge set becomes a networkx graph whose strongly connected components are the
candidates, and each component is explained by a shortest simple cycle that uses every
required kind, found by breadth-first search over (node, kinds used) states.
(`scc_lists`, a Tarjan over integer adjacency lists, serves the queue checker's
pre-filter of the cycle region, `checkers.queue.cycles`, where the graph is the whole
region and building networkx objects would cost more than the search.)
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

__all__ = [
    "CYCLE_RULES",
    "PROCESS",
    "REALTIME",
    "WR",
    "WW",
    "DepGraph",
    "find_cycles",
    "kind_name",
    "realtime_chain",
    "scc_lists",
    "strong_components",
    "trim",
]

WW, WR, PROCESS, REALTIME = 1, 2, 4, 8
_KIND_NAMES = {WW: "ww", WR: "wr", PROCESS: "process", REALTIME: "realtime"}

# name -> (allowed edge kinds, kinds a cycle must contain); order matters: weaker first.
CYCLE_RULES: dict[str, tuple[int, int]] = {
    "G0": (WW, WW),
    "G1c": (WR, WR),
    "G1c-ww": (WW | WR, WW | WR),
    "G0-process": (WW | PROCESS, WW | PROCESS),
    "G1c-process": (WR | PROCESS, WR | PROCESS),
    "G1c-ww-process": (WW | WR | PROCESS, WW | WR | PROCESS),
    "G0-realtime": (WW | REALTIME, WW | REALTIME),
    "G1c-realtime": (WR | REALTIME, WR | REALTIME),
    "G1c-ww-realtime": (WW | WR | REALTIME, WW | WR | REALTIME),
}


def kind_name(bit: int) -> str:
    return _KIND_NAMES[bit]


class DepGraph:
    """A directed multigraph-by-mask over int nodes, cheap to build in one pass."""

    __slots__ = ("_next_virtual", "succ")

    def __init__(self) -> None:
        self.succ: dict[int, dict[int, int]] = {}
        self._next_virtual = -1

    def link(self, a: int, b: int, kind: int) -> None:
        if a == b:
            return
        s = self.succ.get(a)
        if s is None:
            self.succ[a] = {b: kind}
        else:
            s[b] = s.get(b, 0) | kind

    def add_realtime_chain(self, events: Iterable[tuple[int, bool]]) -> None:
        """Link a `realtime_chain` over `events` into this graph."""
        for a, b in realtime_chain(events, start=self._next_virtual):
            self.link(a, b, REALTIME)
            self._next_virtual = min(self._next_virtual, a - 1, b - 1)

    def edge_count(self) -> int:
        return sum(len(s) for s in self.succ.values())


def realtime_chain(events: Iterable[tuple[int, bool]], start: int = -1) -> list[tuple[int, int]]:
    """Edges encoding realtime order through virtual nodes (ids start, start-1, ...).

    `events` in history order: (node, True) at a completion, (node, False) at an invoke.
    Afterwards A reaches B exactly when A's completion event precedes B's invoke event.
    Consecutive completions share one virtual node, so there are at most two edges per
    event. Give completion events only for ops whose completion is certain.
    """
    edges: list[tuple[int, int]] = []
    append = edges.append
    nxt = start
    last: int | None = None
    fresh = False  # does `last` already precede some invoke?
    for node, completed in events:
        if completed:
            if last is None or fresh:
                v = nxt
                nxt -= 1
                if last is not None:
                    append((last, v))
                last = v
                fresh = False
            append((node, last))
        elif last is not None:
            append((last, node))
            fresh = True
    return edges


def strong_components(succ: Mapping[int, Iterable[int]]) -> list[list[int]]:
    """Strongly connected components with two or more nodes, without a graph object.

    A node without successors of its own cannot lie on a cycle, so `succ`'s keys are
    every node that matters.
    """
    return [list(c) for c in _components(succ, succ)]


def trim(succ: Mapping[int, Iterable[int]]) -> set[int]:
    """Nodes that may lie on a cycle: peel sources forward, then sinks backward."""
    indeg = Counter(chain.from_iterable(succ.values()))
    stack = [n for n in succ if n not in indeg]
    while stack:
        n = stack.pop()
        for b in succ.get(n, ()):
            d = indeg[b] - 1
            indeg[b] = d
            if d == 0:
                stack.append(b)
    survivors = {n for n, d in indeg.items() if d > 0}
    if not survivors:
        return survivors
    sub = {a: [b for b in succ.get(a, ()) if b in survivors] for a in survivors}
    outdeg = {a: len(bs) for a, bs in sub.items()}
    stack = [a for a, d in outdeg.items() if d == 0]
    if stack:  # else no sinks: nothing to peel backward
        pred: dict[int, list[int]] = {}
        for a, bs in sub.items():
            for b in bs:
                pred.setdefault(b, []).append(a)
        while stack:
            n = stack.pop()
            for a in pred.get(n, ()):
                outdeg[a] -= 1
                if outdeg[a] == 0:
                    stack.append(a)
    return {a for a, d in outdeg.items() if d > 0}


def scc_lists(adj: Sequence[Sequence[int]]) -> list[list[int]]:
    """Strongly connected components of two or more nodes of the graph over ``0..len(adj)-1``
    whose node i has successors ``adj[i]`` (iterative Tarjan, lists for its bookkeeping).

    In networkx's order: components come as `networkx.strongly_connected_components`
    yields them for a graph with nodes in index order and successors in list order, each
    as the node where the search leaves it, then the others latest finished first (the
    order networkx inserts them into its set).
    """
    size = len(adj)
    pre = [0] * size  # preorder number, from 1; 0 = not yet visited
    low = [0] * size
    done = [False] * size  # assigned to a component
    finished: list[int] = []  # finished nodes that are not a component's first node
    comps: list[list[int]] = []
    counter = 0
    for root in range(size):
        if pre[root]:
            continue
        counter += 1
        pre[root] = low[root] = counter
        work_nodes = [root]
        work_iters = [iter(adj[root])]
        while work_nodes:
            node = work_nodes[-1]
            advanced = False
            for nxt in work_iters[-1]:
                if not pre[nxt]:
                    counter += 1
                    pre[nxt] = low[nxt] = counter
                    work_nodes.append(nxt)
                    work_iters.append(iter(adj[nxt]))
                    advanced = True
                    break
                if not done[nxt] and pre[nxt] < low[node]:
                    low[node] = pre[nxt]
            if advanced:
                continue
            work_nodes.pop()
            work_iters.pop()
            lo = low[node]
            if work_nodes:
                parent = work_nodes[-1]
                if lo < low[parent]:
                    low[parent] = lo
            if lo == pre[node]:
                done[node] = True
                if finished and pre[finished[-1]] > lo:
                    comp = [node]
                    while finished and pre[finished[-1]] > lo:
                        k = finished.pop()
                        done[k] = True
                        comp.append(k)
                    comps.append(comp)
            else:
                finished.append(node)
    return comps


def _components(succ: Mapping[int, Iterable[int]], keep: Collection[int]) -> list[set[int]]:
    """Strongly connected components of two or more nodes of the dependency graph.

    The graph is a networkx `DiGraph` of the edges (a, b) for a in `keep` and b in
    `succ[a]`, in turn, that have b in `keep`; the components are networkx's, in its
    order (which decides which cycles are explained first). networkx is imported here, on
    the first cycle search: it is a tenth of a second of `isrlab check`'s start-up otherwise.
    """
    import networkx as nx

    g = nx.DiGraph()
    g.add_edges_from((a, b) for a in keep for b in succ.get(a, ()) if b in keep)
    return [c for c in nx.strongly_connected_components(g) if len(c) > 1]


def _bits(mask: int) -> list[int]:
    return _BITS[mask & 15]


_BITS = [[b for b in (WW, WR, PROCESS, REALTIME) if m & b] for m in range(16)]


def _cycle_through(
    adj: dict[int, dict[int, int]], u: int, v: int, first: int, required: int, limit: int
) -> list[tuple[int, int, int]] | None:
    """Shortest closed walk u -(first)-> v ~> u whose steps use every `required` kind."""
    start = (v, first & required)
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    goal = None
    while queue:
        state = queue.popleft()
        node, mask = state
        if node == u and mask == required:
            goal = state
            break
        if len(parent) > limit:
            return None
        for nxt, kinds in adj[node].items():
            for b in _bits(kinds):
                ns = (nxt, mask | (b & required))
                if ns not in parent:
                    parent[ns] = (state, b)
                    queue.append(ns)
    if goal is None:
        return None
    steps: list[tuple[int, int, int]] = []
    cur = goal
    while True:
        link = parent[cur]
        if link is None:
            break
        prev, b = link
        steps.append((prev[0], cur[0], b))
        cur = prev
    steps.reverse()
    return [(u, v, first), *steps]


def _collapse(steps: list[tuple[int, int, int]]) -> list[tuple[int, int, int]] | None:
    """Collapse virtual stretches into realtime steps; None if the cycle is not simple."""
    # Rotate so the cycle starts at a real node.
    for i, (a, _b, _k) in enumerate(steps):
        if a >= 0:
            steps = steps[i:] + steps[:i]
            break
    else:
        return None
    out: list[tuple[int, int, int]] = []
    src: int | None = None
    for a, b, k in steps:
        if a >= 0 and b >= 0:
            out.append((a, b, k))
        elif a >= 0:
            src = a
        elif b >= 0:
            assert src is not None
            out.append((src, b, REALTIME))
            src = None
    seen = [a for a, _b, _k in out]
    if len(seen) != len(set(seen)) or len(out) < 2:
        return None
    return out


def find_cycles(
    graph: DepGraph,
    explain_step: Callable[[int, int, int], dict[str, Any]],
    *,
    rules: Iterable[str] | None = None,
    tries: int = 8,
    state_limit: int = 200_000,
    max_examples: int = 32,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Find cycle anomalies; return ({name: [case, ...]}, stats).

    One case per strongly connected component of a rule's graph that holds a qualifying
    cycle; only the first `max_examples` per rule carry a full explanation.

    Per rule, the graph is cut down to the rule's edge kinds and trimmed before its
    strongly connected components are computed (`_components`, networkx's), so
    only the part that can hold such a cycle is searched. Each component is explained by the shortest
    simple cycle through one of its edges of the rarest required kind (up to `tries`
    edges, fewer in very large components; each search is bounded by `state_limit`).
    """
    succ = graph.succ
    alive = trim(succ)
    stats = {
        "graph_nodes": len({*succ, *(b for s in succ.values() for b in s)}),
        "graph_edges": graph.edge_count(),
        "cyclic_nodes": len(alive),
    }
    found: dict[str, list[dict[str, Any]]] = {}
    if not alive:
        return found, stats
    # Every rule's components lie inside a component of the union of all edge kinds:
    # one pass over the union keeps only those nodes (and edges inside them).
    comp_of: dict[int, int] = {}
    for i, comp in enumerate(_components(succ, alive)):
        for n in comp:
            comp_of[n] = i
    stats["cyclic_nodes"] = len(comp_of)
    core = {
        a: {b: k for b, k in succ.get(a, {}).items() if comp_of.get(b) == c}
        for a, c in comp_of.items()
    }
    explained: dict[str, set[frozenset[int]]] = {}
    for name in rules or CYCLE_RULES:
        allowed, required = CYCLE_RULES[name]
        base = name.replace("-process", "").replace("-realtime", "")
        rule_adj: dict[int, dict[int, int]] = {}
        for a, out in core.items():
            kept = {b: k & allowed for b, k in out.items() if k & allowed}
            if kept:
                rule_adj[a] = kept
        live = trim(rule_adj)
        if not live:
            continue
        for scc in _components(rule_adj, live):
            real = frozenset(n for n in scc if n >= 0)
            if real in explained.get(base, ()):
                continue
            adj = {n: {b: k for b, k in rule_adj.get(n, {}).items() if b in scc} for n in scc}
            counts: dict[int, list[tuple[int, int]]] = {b: [] for b in _bits(required)}
            for a, out in adj.items():
                for b, kinds in out.items():
                    for bit in _bits(kinds & required):
                        counts[bit].append((a, b))
            if any(not edges for edges in counts.values()):
                continue
            # Past max_examples a component is only counted: a single-kind rule needs no
            # search at all (any component holds such a cycle), others stop at the first.
            counting = len(found.get(name, ())) >= max_examples
            if counting and allowed == required and len(real) == len(scc):
                explained.setdefault(base, set()).add(real)
                found[name].append({"scc_size": len(real), "explanation": f"{name} cycle"})
                continue
            anchor = min(counts, key=lambda bit: len(counts[bit]))
            best: list[tuple[int, int, int]] | None = None
            n_tries = tries if len(scc) <= 5000 else 2
            for a, b in counts[anchor][:n_tries]:
                walk = _cycle_through(adj, a, b, anchor, required, state_limit)
                if walk is None:
                    continue
                cyc = _collapse(walk)
                if cyc is not None and (best is None or len(cyc) < len(best)):
                    best = cyc
                    if counting:
                        break
            if best is None:
                continue
            explained.setdefault(base, set()).add(real)
            if counting:
                found[name].append({"scc_size": len(real), "explanation": f"{name} cycle"})
                continue
            steps = [
                {"from": a, "to": b, "type": kind_name(k), **explain_step(a, b, k)}
                for a, b, k in best
            ]
            text = "; ".join(s["explanation"] for s in steps)
            found.setdefault(name, []).append(
                {
                    "cycle": [s["from"] for s in steps],
                    "steps": steps,
                    "scc_size": len(real),
                    "explanation": f"{name} cycle over {len(best)} ops (one of a strongly "
                    f"connected component of {len(real)}): {text}; which closes the cycle",
                }
            )
    return found, stats
