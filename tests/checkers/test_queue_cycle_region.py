"""The cycle search's pruning: only ops inside spans of backward dependency edges are examined.

`checkers.queue.cycles` skips every op outside the spans of edges that point against
completion order. These tests check that the ops it finds on cycles are exactly the ops
in non-trivial strongly connected components of the full dependency graph, built here
naively (realtime as explicit edges) with networkx, on simulated histories with injected
cross reads that create cycles.
"""

from __future__ import annotations

import random
from typing import Any

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isrlab.checkers.queue import check_queue
from isrlab.checkers.queue.analysis import QueueAnalysis
from isrlab.checkers.queue.cycles import (
    _cyclic_indices,
    _events,
    _link_realtime,
    _region,
    cyclic_ops,
)
from isrlab.checkers.queue.ops import OK
from isrlab.checkers.txn_graph import realtime_chain
from isrlab.pipeline.fixtures.simulate import simulate
from tests.checkers.hist import H


def full_graph_cyclic(a: QueueAnalysis) -> set[int]:
    """Ops on a cycle of the full graph: ww chains, every wr, process and realtime edge."""
    nodes = [r for r in a.records if r.committed and r.f not in ("assign", "subscribe")]
    g: nx.DiGraph[int] = nx.DiGraph()
    g.add_nodes_from(r.pos for r in nodes)
    if a.ww_deps:
        for k, vo in a.orders.items():
            ws = a.writer.get(k, {})
            prev = None
            for o in vo.offsets:
                w = ws.get(vo.log[o])
                if w is None or not w.committed:
                    continue
                if prev is not None and prev is not w:
                    g.add_edge(prev.pos, w.pos)
                prev = w
    for r in nodes:
        for k, pairs in r.reads.items():
            for _o, v in pairs:
                w = a.writer.get(k, {}).get(v)
                if w is not None and w is not r and w.committed:
                    g.add_edge(w.pos, r.pos)
    last: dict[Any, int] = {}
    for r in nodes:
        if r.process in last:
            g.add_edge(last[r.process], r.pos)
        last[r.process] = r.pos
    for x in nodes:
        if x.kind == OK:
            for y in nodes:
                if x.pos < y.inv:
                    g.add_edge(x.pos, y.pos)
    return {n for c in nx.strongly_connected_components(g) if len(c) > 1 for n in c}


def cross_reads(ops: list[dict[str, Any]], rng: random.Random, n: int) -> None:
    """Make ok polls read values that other ops sent (at their acked offsets): wr edges
    in both directions of completion order, hence cycles."""
    acked = []
    for op in ops:
        if op["type"] == "ok" and op["f"] in ("send", "txn"):
            for mop in op["value"]:
                if mop[0] == "send" and isinstance(mop[2], list) and mop[2][0] is not None:
                    acked.append((mop[1], mop[2][0], mop[2][1]))
    readers = [
        mop[1]
        for op in ops
        if op["type"] == "ok" and op["f"] in ("poll", "txn")
        for mop in op["value"]
        if mop[0] == "poll"
    ]
    if not acked or not readers:
        return
    for _ in range(n):
        k, o, v = rng.choice(acked)
        reads = rng.choice(readers)
        reads.setdefault(k, []).append([o, v])


shapes = st.fixed_dictionaries(
    {
        "n_ops": st.integers(40, 260),
        "processes": st.integers(1, 5),
        "keys": st.integers(1, 3),
        "seed": st.integers(0, 2**32 - 1),
        "txn_rate": st.sampled_from([0.0, 0.5, 0.9]),
        "info_rate": st.sampled_from([0.0, 0.1]),
        "fail_rate": st.sampled_from([0.0, 0.1]),
        "interleave": st.booleans(),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(0, 6), st.booleans())
def test_ops_on_cycles_match_the_full_graph(
    shape: dict[str, Any], injected: int, ww_deps: bool
) -> None:
    ops = simulate(**shape)
    cross_reads(ops, random.Random(shape["seed"]), injected)
    a = QueueAnalysis(ops, ww_deps=ww_deps)
    a.run()
    assert cyclic_ops(a) == full_graph_cyclic(a)


def test_region_is_the_union_of_spans() -> None:
    positions = [1, 3, 5, 7, 9, 11, 13]
    assert _region([], positions) == set()
    assert _region([(3, 5), (4, 9), (13, 20)], positions) == {3, 5, 7, 9, 13}
    assert _region([(2, 2), (10, 12)], positions) == {11}


def test_history_in_completion_order_has_no_backward_edges() -> None:
    h = H()
    h.send(0, "k", 1, 0)
    h.send(1, "k", 2, 1)
    h.poll(2, {"k": [[0, 1], [1, 2]]})
    r = check_queue(h.ops)
    assert r["valid"] is True
    assert r["stats"]["backward_edges"] == 0 and r["stats"]["cyclic_nodes"] == 0


def test_reader_completing_before_its_writer_still_closes_a_cycle() -> None:
    # Two transactions each read the other's write; whichever completes first read a
    # value whose writer completed later (a backward wr edge), and the cycle is G1c.
    h = H()
    h.invoke(0, "txn", [["send", "x", 1], ["poll"]])
    h.invoke(1, "txn", [["send", "y", 1], ["poll"]])
    h.complete(0, "ok", "txn", [["send", "x", [0, 1]], ["poll", {"y": [[0, 1]]}]])
    h.complete(1, "ok", "txn", [["send", "y", [0, 1]], ["poll", {"x": [[0, 1]]}]])
    h.poll(2, {"x": [[0, 1]], "y": [[0, 1]]})
    r = check_queue(h.ops)
    assert "G1c" in r["anomaly_types"] and r["valid"] is False
    assert r["stats"]["backward_edges"] == 1


def test_cyclic_indices_match_networkx_on_random_graphs() -> None:
    rng = random.Random(11)
    for _ in range(300):
        size = rng.randint(1, 60)
        n_real = rng.randint(0, size)
        adj: list[list[int]] = [[] for _ in range(size)]
        for _e in range(rng.randint(0, 3 * size)):
            a, b = rng.randrange(size), rng.randrange(size)
            if a != b:
                adj[a].append(b)
        g: nx.DiGraph[int] = nx.DiGraph()
        g.add_nodes_from(range(size))
        g.add_edges_from((a, b) for a, bs in enumerate(adj) for b in bs)
        want = {n for c in nx.strongly_connected_components(g) if len(c) > 1 for n in c}
        got = _cyclic_indices(adj, n_real)
        assert len(got) == len(set(got))
        assert set(got) == {n for n in want if n < n_real}


def test_link_realtime_matches_realtime_chain() -> None:
    for seed in range(40):
        ops = simulate(n_ops=120, processes=4, keys=2, seed=seed, info_rate=0.1, interleave=True)
        a = QueueAnalysis(ops)
        a.run()
        nodes = [r for r in a.records if r.committed and r.f not in ("assign", "subscribe")]
        adj: list[list[int]] = [[] for _ in nodes]
        _link_realtime(adj, nodes)
        n = len(nodes)
        got: nx.DiGraph[int] = nx.DiGraph()
        got.add_edges_from((x, y) for x, ys in enumerate(adj) for y in ys)
        want: nx.DiGraph[int] = nx.DiGraph()
        # realtime_chain's virtual nodes are negative; name real nodes by index
        idx = {r.pos: i for i, r in enumerate(nodes)}
        want.add_edges_from(
            (idx.get(x, x) if x >= 0 else x, idx.get(y, y) if y >= 0 else y)
            for x, y in realtime_chain(_events(nodes))
        )
        for i in range(n):
            reach_got = {j for j in nx.descendants(got, i) if j < n} if i in got else set()
            reach_want = {j for j in nx.descendants(want, i) if j >= 0} if i in want else set()
            assert reach_got == reach_want
        assert got.number_of_edges() == want.number_of_edges()
