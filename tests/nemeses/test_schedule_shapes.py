"""Pure parts of the nemeses: partition shapes, targets, schedules, netem arguments, routing."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrlab import nemeses
from isrlab.nemeses.base import NemesisError, resolve_targets
from isrlab.nemeses.packet import netem_args
from isrlab.nemeses.partition import grudge
from tests.nemeses.conftest import RecordingDB


def reach(g: dict[str, list[str]], a: str) -> set[str]:
    return set(g) - set(g[a])


def nodes_of(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_halves_and_isolation_are_symmetric_two_sided_cuts(n: int, seed: int) -> None:
    names = nodes_of(n)
    for shape in ("halves", "isolate-one"):
        g = grudge(shape, names, random.Random(seed))
        assert sorted(g) == names
        for a, b in itertools.permutations(names, 2):
            assert (b in g[a]) == (a in g[b])  # symmetric
        sides = {frozenset(reach(g, a)) for a in names}
        assert len(sides) == 2 and set().union(*sides) == set(names)
        sizes = sorted(len(s) for s in sides)
        assert sizes == ([1, n - 1] if shape == "isolate-one" else [n // 2, n - n // 2])


def test_isolate_leader_cuts_exactly_the_leader() -> None:
    g = grudge("isolate-leader", nodes_of(5), random.Random(1), leader="n4")
    assert g["n4"] == ["n1", "n2", "n3", "n5"]
    assert all(g[x] == ["n4"] for x in ("n1", "n2", "n3", "n5"))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(4, 11), seed=st.integers(0, 10_000))
def test_majorities_ring_every_node_sees_a_distinct_majority(n: int, seed: int) -> None:
    g = grudge("majorities-ring", nodes_of(n), random.Random(seed))
    views = [frozenset(reach(g, a)) for a in g]
    assert all(len(v) >= n // 2 + 1 for v in views)
    assert all(len(v) < n for v in views)  # nobody sees everyone: it is a real partition
    assert len(set(views)) == n
    for a, b in itertools.permutations(g, 2):
        assert (b in g[a]) == (a in g[b])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(3, 9), seed=st.integers(0, 10_000))
def test_bridge_one_node_sees_both_sides_that_cannot_see_each_other(n: int, seed: int) -> None:
    g = grudge("bridge", nodes_of(n), random.Random(seed))
    bridges = [a for a in g if not g[a]]
    assert len(bridges) == 1
    b = bridges[0]
    others = [a for a in g if a != b]
    assert all(b not in g[a] for a in others)
    # without the bridge the rest splits into two groups that cannot reach each other
    sides = {frozenset(reach(g, a) - {b}) for a in others}
    assert len(sides) == 2 and not set.intersection(*map(set, sides))


def test_unknown_shapes_and_tiny_clusters_are_refused() -> None:
    with pytest.raises(NemesisError, match="unknown partition shape"):
        grudge("triangle", nodes_of(5), random.Random(0))
    with pytest.raises(NemesisError, match="at least 4"):
        grudge("majorities-ring", nodes_of(3), random.Random(0))
    with pytest.raises(NemesisError, match="at least 2"):
        grudge("halves", ["n1"], random.Random(0))


def test_targets() -> None:
    db: Any = RecordingDB()
    rng = random.Random(3)
    assert len(resolve_targets("one", db, rng)) == 1
    assert len(resolve_targets("minority", db, rng)) == 2
    assert len(resolve_targets("majority", db, rng)) == 3
    assert resolve_targets("all", db, rng) == db.names
    assert resolve_targets("leader", db, rng) == ["n3"]
    assert resolve_targets("controller", db, rng) == ["n2"]
    # no leader known: still one node, never an empty target
    assert len(resolve_targets("leader", RecordingDB(leader=None), rng)) == 1  # type: ignore[arg-type]
    with pytest.raises(NemesisError, match="unknown target"):
        resolve_targets("some", db, rng)


def test_schedule_alternates_start_and_stop_and_is_reproducible() -> None:
    kinds = ["partition", "kill", "clock"]
    a = list(itertools.islice(nemeses.schedule(kinds, 10, seed=5, keys=["t0/0"]), 200))
    b = list(itertools.islice(nemeses.schedule(kinds, 10, seed=5, keys=["t0/0"]), 200))
    c = list(itertools.islice(nemeses.schedule(kinds, 10, seed=6, keys=["t0/0"]), 200))
    assert a == b and a != c
    ops = [op for op in a if op["type"] != "sleep"]
    sleeps = [op["value"] for op in a if op["type"] == "sleep"]
    assert all(5 <= s <= 15 for s in sleeps)
    for start, stop in zip(ops[::2], ops[1::2], strict=True):
        kind = start["f"].removeprefix("start-")
        assert start["f"].startswith("start-") and stop["f"] == f"stop-{kind}"
        assert start["process"] == "nemesis" and start["type"] == "info"
    assert {op["f"] for op in ops} == {f"{v}-{k}" for v in ("start", "stop") for k in kinds}
    shapes = {op["value"]["shape"] for op in ops if op["f"] == "start-partition"}
    assert shapes <= set(nemeses.SHAPES) and len(shapes) > 1


def test_schedule_restricts_targets_and_shapes() -> None:
    ops = itertools.islice(
        nemeses.schedule(["pause", "partition"], 1, 0, targets=["leader"], shapes=["bridge"]), 400
    )
    starts = [op for op in ops if op.get("f", "").startswith("start-")]
    assert {op["value"].get("target") for op in starts if op["f"] == "start-pause"} == {"leader"}
    assert {op["value"].get("shape") for op in starts if op["f"] == "start-partition"} == {"bridge"}
    with pytest.raises(NemesisError, match="unknown target"):
        next(nemeses.schedule(["pause"], 1, 0, targets=["everyone"]))
    with pytest.raises(NemesisError, match="interval"):
        next(nemeses.schedule(["pause"], 0, 0))


def test_no_nemesis_only_sleeps_and_final_ops_stop_every_kind() -> None:
    ops = list(itertools.islice(nemeses.schedule("none", 2, 0), 10))
    assert all(op["type"] == "sleep" for op in ops)
    assert [op["f"] for op in nemeses.final_ops("partition,kill")] == [
        "stop-partition",
        "stop-kill",
    ]


def test_parse_kinds() -> None:
    assert nemeses.parse_kinds("partition, kill,partition") == ["partition", "kill"]
    assert nemeses.parse_kinds("none") == [] and nemeses.parse_kinds(None) == []
    with pytest.raises(NemesisError, match="unknown nemesis 'flood'"):
        nemeses.parse_kinds("partition,flood")


def test_netem_arguments() -> None:
    assert netem_args({"delay": "50ms", "jitter": "10ms", "loss": "20%"}) == [
        "delay", "50ms", "10ms", "distribution", "normal", "loss", "20%",
    ]  # fmt: skip
    assert netem_args({"reorder": "25%"}) == ["delay", "10ms", "reorder", "25%"]
    with pytest.raises(NemesisError, match="unknown netem behaviour"):
        netem_args({"explode": "1"})
    with pytest.raises(NemesisError, match="empty"):
        netem_args({})


def test_invoke_routes_ops_and_records_failures_as_errors() -> None:
    db: Any = RecordingDB()
    nem = nemeses.build(["pause"], db, db.test)
    done = nem.invoke({"process": "nemesis", "type": "info", "f": "start-pause",
                       "value": {"target": "leader"}})  # fmt: skip
    assert done["value"] == {"target": "leader", "nodes": ["n3"]}
    assert nem.active == {"pause"}
    stop = nem.invoke({"process": "nemesis", "type": "info", "f": "stop-pause", "value": None})
    assert stop["value"] == {"nodes": ["n3"]} and not nem.active
    assert db.calls == [("pause", "n3"), ("resume", "n3")]
    bad = nem.invoke({"process": "nemesis", "type": "info", "f": "start-pause",
                      "value": {"target": "nobody"}})  # fmt: skip
    assert bad["type"] == "info" and "unknown target" in bad["error"]
    assert "no fault handles" in nem.invoke({"f": "start-kill"})["error"]
    assert "no fault handles" in nem.invoke({"f": "bogus"})["error"]
