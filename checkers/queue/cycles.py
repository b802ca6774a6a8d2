"""Cycle anomalies of a queue history: G0, G1c, G1c-ww and their -process/-realtime variants.

Builds the dependency graph of an analysed history (`QueueAnalysis`) over committed ops:
ww edges between consecutive committed writers in each key's version order (unless
ww_deps is off), wr edges from a value's writer to every committed op that read it,
process edges between consecutive ops of a process and realtime order (an ok op precedes
every op invoked after it completed; an info op precedes nothing). `checkers.txn_graph`
names and explains the cycles; this module decides which part of the graph it sees.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from isrlab.checkers.queue.cases import fmt as _fmt
from isrlab.checkers.queue.ops import OK, QueueOp
from isrlab.checkers.txn_graph import (
    PROCESS,
    REALTIME,
    WR,
    WW,
    DepGraph,
    find_cycles,
    realtime_chain,
    scc_lists,
)

if TYPE_CHECKING:
    from isrlab.checkers.queue.analysis import QueueAnalysis

__all__ = ["cycle_anomalies", "cyclic_ops", "explain_cycles", "explain_step"]


def _events(nodes: Sequence[QueueOp]) -> list[tuple[int, bool]]:
    """Invoke and completion events of `nodes` in history order, for a realtime chain.

    An info op's effects may land any time later, so it gets no completion event and
    never precedes anything in real time.
    """
    slots: dict[int, tuple[int, bool]] = {}
    for rec in nodes:
        if rec.inv >= 0:
            slots[rec.inv] = (rec.pos, False)
        if rec.kind == OK:
            slots[rec.pos] = (rec.pos, True)
    return [slots[i] for i in sorted(slots)]


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of the closed intervals `spans` as disjoint intervals, in order."""
    spans.sort()
    if not spans:
        return []
    lo, hi = spans[0]
    merged = []
    for a, b in spans:
        if a > hi:
            merged.append((lo, hi))
            lo, hi = a, b
        elif b > hi:
            hi = b
    merged.append((lo, hi))
    return merged


def _region(spans: list[tuple[int, int]], positions: Sequence[int]) -> set[int]:
    """The positions lying inside the union of the closed intervals `spans`.

    `positions` must be increasing.
    """
    region: set[int] = set()
    for lo, hi in _merge(spans):
        region.update(positions[bisect_left(positions, lo) : bisect_right(positions, hi)])
    return region


def cyclic_ops(analysis: QueueAnalysis) -> set[int]:
    """Completion positions of the committed ops that lie on some dependency cycle.

    The dependency graph is the one `cycle_anomalies` explains: ww (consecutive committed
    writers in a key's version order, with ww_deps), wr, process and realtime edges.
    `analysis` must have run (its read checks note the backward wr edges).
    """
    return _cyclic_core(analysis)[0]


def _cyclic_core(analysis: QueueAnalysis) -> tuple[set[int], list[QueueOp], list[tuple[int, int]]]:
    """(positions of ops on a cycle, the committed ops, the ww chain edges); see below.

    Ordering ops by completion position, realtime edges always point forward (A completed
    before B was invoked, hence before B completed), so a cycle needs an explicit edge
    pointing backward, and every op of a cycle lies within the span (from the head's to
    the tail's completion) of one of the cycle's backward edges: the cycle has to cross
    every position between its first and its last op going down. `QueueAnalysis` notes
    the backward wr edges while it checks reads, the ww chains are walked here, and only
    the ops inside those spans (the region) are looked at further; a history whose
    dependencies all follow completion order costs one pass over the version orders.

    Within the region, a reduced graph keeps reachability but not every edge: a reader
    gets a wr edge only from the writer of the highest offset it read of each key (the
    others reach that writer along the key's ww chain, through ops of the same strongly
    connected component, hence of the region), process edges are left out (an ok op
    completes before its process's next invoke, so realtime covers them) and realtime
    order is a chain of virtual nodes (`_link_realtime`). Its strongly connected
    components are found without networkx, over adjacency lists of ints, and only their
    nodes get their full edges and go to `find_cycles`.
    """
    writer = analysis.writer
    orders = analysis.orders
    nodes = [r for r in analysis.records if r.committed and r.f != "assign" and r.f != "subscribe"]
    spans = list(analysis.backward_wr)
    chains: list[tuple[int, int]] = []
    if analysis.ww_deps:
        for k, vo in orders.items():
            ws = writer.get(k)
            if not ws:
                continue
            prev: QueueOp | None = None
            prev_pos = -1
            for w in map(ws.get, map(vo.log.__getitem__, vo.offsets)):
                if w is None or w is prev or not w.committed:
                    continue
                pos = w.pos
                if prev is not None:
                    chains.append((prev_pos, pos))
                    if prev_pos > pos:
                        spans.append((pos, prev_pos))
                prev = w
                prev_pos = pos
    analysis.stats.update(graph_nodes=len(nodes), backward_edges=len(spans), cyclic_nodes=0)
    if not spans:
        return set(), nodes, chains
    positions = [r.pos for r in nodes]
    inside: list[QueueOp] = []
    for lo, hi in _merge(spans):
        inside.extend(nodes[bisect_left(positions, lo) : bisect_right(positions, hi)])
    nodes = inside
    # Region ops become 0..n-1 (completion order); virtual realtime nodes follow.
    # idx[position] is the op's index, -1 outside the region.
    idx = [-1] * (max(r.pos for r in analysis.records) + 1)
    for i, rec in enumerate(nodes):
        idx[rec.pos] = i
    adj: list[list[int]] = [[] for _ in nodes]
    for a, b in chains:
        ia = idx[a]
        if ia >= 0:
            ib = idx[b]
            if ib >= 0:
                adj[ia].append(ib)
    ww_deps = analysis.ww_deps
    for i, rec in enumerate(nodes):
        for k, pairs in rec.reads.items():
            ws = writer.get(k)
            if not ws or not pairs:
                continue
            if ww_deps and not orders[k].conflicts:
                try:
                    top = max(pairs)  # the highest offset read (pairs are [offset, value])
                except TypeError:  # a null offset
                    top = None
                if top is not None:
                    w = ws.get(top[1])
                    if w is not None and w is not rec and w.committed:
                        iw = idx[w.pos]
                        if iw >= 0:
                            adj[iw].append(i)
                        continue
            for _o, v in pairs:
                w = ws.get(v)
                if w is not None and w is not rec and w.committed:
                    iw = idx[w.pos]
                    if iw >= 0:
                        adj[iw].append(i)
    _link_realtime(adj, nodes)
    cyclic = _cyclic_indices(adj, len(nodes))
    return {nodes[i].pos for i in cyclic}, nodes, chains


def _link_realtime(adj: list[list[int]], nodes: Sequence[QueueOp]) -> None:
    """Append a realtime chain over `nodes` (adjacency indices) to `adj`.

    As `realtime_chain` over `_events(nodes)`: virtual nodes get the indices after the
    existing ones, and node i reaches node j through them exactly when i's completion is
    certain and precedes j's invoke.
    """
    inv = [r.inv for r in nodes]
    invokes = sorted((i for i in range(len(nodes)) if inv[i] >= 0), key=inv.__getitem__)
    n_inv = len(invokes)
    j = 0
    last = -1
    fresh = False  # does `last` already precede some invoke?
    for i, rec in enumerate(nodes):
        pos = rec.pos
        while j < n_inv and inv[invokes[j]] < pos:
            if last >= 0:
                adj[last].append(invokes[j])
                fresh = True
            j += 1
        if rec.kind == OK:
            if last < 0 or fresh:
                v = len(adj)
                adj.append([])
                if last >= 0:
                    adj[last].append(v)
                last = v
                fresh = False
            adj[i].append(last)
    if last >= 0:
        tail = adj[last]
        tail.extend(invokes[j:])


def _cyclic_indices(adj: list[list[int]], n_real: int) -> list[int]:
    """Indices below `n_real` in strongly connected components of two or more nodes."""
    return [n for comp in scc_lists(adj) for n in comp if n < n_real]


def cycle_anomalies(analysis: QueueAnalysis) -> None:
    """Dependency-graph cycles (G0, G1c, G1c-ww and variants), added to analysis.anomalies.

    Only the ops on some cycle (`cyclic_ops`) get their full edges and go to
    `find_cycles`, which names and explains the cycles.
    """
    alive, nodes, chains = _cyclic_core(analysis)
    if not alive:
        return
    members = [r for r in nodes if r.pos in alive]
    explain_cycles(analysis, members, [(a, b) for a, b in chains if a in alive and b in alive])


def explain_cycles(
    analysis: Any, members: list[QueueOp], chains: Sequence[tuple[int, int]]
) -> None:
    """The cycles among `members` (the ops on some cycle, in completion order), named and
    explained into analysis.anomalies; `chains`: the ww chain edges between them (completion
    positions, in the version orders' order). `analysis` gives `writer`, `orders`,
    `anomalies` and `stats` (a `QueueAnalysis`, or the native core's view of one)."""
    writer = analysis.writer
    alive = {r.pos for r in members}
    full = DepGraph()
    for a, b in chains:
        full.link(a, b, WW)
    last_by_process: dict[Any, QueueOp] = {}
    for rec in members:
        prior = last_by_process.get(rec.process)
        if prior is not None:
            full.link(prior.pos, rec.pos, PROCESS)
        last_by_process[rec.process] = rec
        for k, pairs in rec.reads.items():
            ws = writer.get(k)
            if not ws:
                continue
            for _o, v in pairs:
                w = ws.get(v)
                if w is not None and w is not rec and w.committed and w.pos in alive:
                    full.link(w.pos, rec.pos, WR)
    for a, b in realtime_chain(_events(members)):
        full.link(a, b, REALTIME)
    analysis.by_pos = {r.pos: r for r in members}  # every op find_cycles may explain
    found, gstats = find_cycles(
        full, partial(explain_step, analysis), max_examples=analysis.anomalies.max_examples
    )
    analysis.stats["cyclic_nodes"] = gstats["cyclic_nodes"]
    for name, cases in found.items():
        analysis.anomalies.add_all(name, cases)


def explain_step(analysis: Any, a: int, b: int, kind: int) -> dict[str, Any]:
    ra, rb = analysis.by_pos[a], analysis.by_pos[b]
    base: dict[str, Any] = {"from": ra.index, "to": rb.index}
    if kind == WR:
        for k, pairs in rb.reads.items():
            ws = analysis.writer.get(k, {})
            for o, v in pairs:
                if ws.get(v) is ra:
                    return {
                        **base,
                        "key": k,
                        "value": v,
                        "explanation": f"{ra.describe()} sent {_fmt(v)} to {_fmt(k)}, "
                        f"which {rb.describe()} read (offset {o})",
                    }
    if kind == WW:
        for k, o2, v2 in rb.sends:
            vo = analysis.orders.get(k)
            i2 = None if vo is None else vo.index_of(o2, v2)
            if vo is None or i2 is None:
                continue
            for k1, o1, v1 in ra.sends:
                i1 = vo.index_of(o1, v1) if k1 == k else None
                if i1 is not None and i1 < i2:
                    return {
                        **base,
                        "key": k,
                        "values": [v1, v2],
                        "explanation": f"{ra.describe()} sent {_fmt(v1)} to {_fmt(k)} "
                        f"(offset {vo.offsets[i1]}) before {rb.describe()} sent "
                        f"{_fmt(v2)} (offset {vo.offsets[i2]})",
                    }
        # A duplicated value sits at several offsets: the edge may come from another copy.
        for k, _, v2 in rb.sends:
            vo = analysis.orders.get(k)
            if vo is None:
                continue
            offs2 = vo.value_offsets(v2)
            for k1, _, v1 in ra.sends:
                offs1 = vo.value_offsets(v1) if k1 == k else []
                pairs = [(o1, o2) for o1 in offs1 for o2 in offs2 if o1 < o2]
                if not pairs:
                    continue
                o1, o2 = min(pairs, key=lambda p: p[1] - p[0])
                copies = "; ".join(
                    f"{_fmt(v)} is at offsets {offs}"
                    for v, offs in ((v1, offs1), (v2, offs2))
                    if len(offs) > 1
                )
                return {
                    **base,
                    "key": k,
                    "values": [v1, v2],
                    "explanation": f"{ra.describe()} sent {_fmt(v1)} to {_fmt(k)} "
                    f"(offset {o1}) before {rb.describe()} sent {_fmt(v2)} (offset {o2})"
                    + (f" ({copies})" if copies else ""),
                }
    if kind == PROCESS:
        return {
            **base,
            "explanation": f"{ra.describe()} preceded {rb.describe()} on process {ra.process}",
        }
    return {
        **base,
        "explanation": f"{ra.describe()} completed before {rb.describe()} was invoked",
    }
