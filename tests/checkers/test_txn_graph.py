"""Cycle finding over dependency graphs (checkers.txn_graph)."""

from __future__ import annotations

from typing import Any

from isrlab.checkers.txn_graph import (
    PROCESS,
    REALTIME,
    WR,
    WW,
    DepGraph,
    find_cycles,
    kind_name,
    realtime_chain,
    trim,
)


def explain(a: int, b: int, kind: int) -> dict[str, Any]:
    return {"explanation": f"{a} -{kind_name(kind)}-> {b}"}


def names(g: DepGraph) -> dict[str, list[dict[str, Any]]]:
    found, _stats = find_cycles(g, explain)
    return found


def test_trim_keeps_only_possible_cycles() -> None:
    succ = {1: [2], 2: [3], 3: [1], 4: [1], 3 + 10: [99]}
    assert trim(succ) == {1, 2, 3}
    assert trim({1: [2], 2: [3]}) == set()


def test_pure_cycles_are_named_by_their_edges() -> None:
    g = DepGraph()
    g.link(1, 2, WW)
    g.link(2, 1, WW)
    g.link(3, 4, WR)
    g.link(4, 3, WR)
    found = names(g)
    assert sorted(found) == ["G0", "G1c"]
    assert sorted(found["G0"][0]["cycle"]) == [1, 2]
    assert sorted(found["G1c"][0]["cycle"]) == [3, 4]


def test_mixed_cycle_needs_both_kinds_in_one_simple_cycle() -> None:
    g = DepGraph()
    g.link(1, 2, WW)
    g.link(2, 1, WR)
    assert sorted(names(g)) == ["G1c-ww"]
    # Two pure cycles sharing a node are not a mixed simple cycle.
    h = DepGraph()
    h.link(1, 2, WW)
    h.link(2, 1, WW)
    h.link(1, 3, WR)
    h.link(3, 1, WR)
    assert sorted(names(h)) == ["G0", "G1c"]


def test_process_and_realtime_variants() -> None:
    g = DepGraph()
    g.link(1, 2, PROCESS)
    g.link(2, 1, WR)
    found = names(g)
    assert sorted(found) == ["G1c-process"]
    steps = found["G1c-process"][0]["steps"]
    assert {s["type"] for s in steps} == {"process", "wr"}
    # realtime through the virtual chain: op 1 completes (event 0) before op 2 is invoked
    r = DepGraph()
    r.add_realtime_chain([(1, False), (1, True), (2, False), (2, True)])
    r.link(2, 1, WW)
    found = names(r)
    assert sorted(found) == ["G0-realtime"]
    steps = found["G0-realtime"][0]["steps"]
    assert [(s["from"], s["to"], s["type"]) for s in steps] in (
        [(1, 2, "realtime"), (2, 1, "ww")],
        [(2, 1, "ww"), (1, 2, "realtime")],
    )


def test_realtime_chain_encodes_interval_order() -> None:
    # a: [0, 2], b: [1, 4], c: [3, 5]  -> only a precedes c
    events = [(0, False), (1, False), (0, True), (2, False), (1, True), (2, True)]
    succ: dict[int, list[int]] = {}
    for x, y in realtime_chain(events):
        succ.setdefault(x, []).append(y)

    def reach(a: int) -> set[int]:
        seen, stack = set(), [a]
        while stack:
            for y in succ.get(stack.pop(), ()):
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return {n for n in seen if n >= 0}

    assert reach(0) == {2}
    assert reach(1) == set()
    assert reach(2) == set()


def test_stats_and_acyclic_graph() -> None:
    g = DepGraph()
    for i in range(100):
        g.link(i, i + 1, WW | WR)
        g.link(i, i + 2, REALTIME)
    found, stats = find_cycles(g, explain)
    assert found == {} and stats["cyclic_nodes"] == 0 and stats["graph_edges"] == 200


def test_strong_components_matches_networkx() -> None:
    import random

    import networkx as nx

    from isrlab.checkers.txn_graph import strong_components

    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(1, 40)
        succ: dict[int, list[int]] = {}
        for _e in range(rng.randint(0, 80)):
            a, b = rng.randrange(n) - 5, rng.randrange(n) - 5
            if a != b:
                succ.setdefault(a, []).append(b)
        g = nx.DiGraph()
        g.add_edges_from((a, b) for a, bs in succ.items() for b in bs)
        want = {frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1}
        assert {frozenset(c) for c in strong_components(succ)} == want


def test_scc_lists_match_networkx_including_order() -> None:
    """`scc_lists` (the cycle region's Tarjan) gives networkx's components, in its order."""
    import random

    import networkx as nx

    from isrlab.checkers.txn_graph import scc_lists

    rng = random.Random(5)
    for t in range(600):
        n = rng.randint(1, 200 if t % 10 == 0 else 40)
        adj: list[list[int]] = [[] for _ in range(n)]
        for _e in range(rng.randint(0, 3 * n)):
            a, b = rng.randrange(n), rng.randrange(n)
            if a != b and b not in adj[a]:
                adj[a].append(b)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((a, b) for a in range(n) for b in adj[a])
        want = [c for c in nx.strongly_connected_components(g) if len(c) > 1]
        assert [set(c) for c in scc_lists(adj)] == want
