"""The cooperative-sticky assignor of the simulated group consumer (harness/sim/group.py,
KIP-429's incremental protocol as librdkafka runs it), and `isrlab sim --subscribe --set
assignment_strategy=cooperative-sticky`.

- the sticky assignment: balanced, every subscribed partition to one subscriber, a member keeps
  what it owns when nothing forces a move, the same output whatever the inputs' order;
- the cooperative adjustment: a partition moving from A to B is only taken from A in one
  generation and given to B in the next, once A no longer claims it;
- the subscription v1 bytes (owned partitions), read back by the broker's own reader;
- two members against three simulated brokers: A holds four keys, B joins; A revokes only the
  two that move (generation N, B gets nothing yet), keeps reading the other two from where it
  was, and B gets the two in generation N+1;
- A and B split four keys: A dropping a topic from its subscription revokes that key only; A
  cut off from the brokers past its session loses its assignment; back, it gets a key from B
  one generation after B revoked it;
- end to end: seeds 1-3 with the default nemesis (partition+kill) are valid, give one history
  per seed, and no key is held by two processes at once (`owners_at_once`, from the histories'
  rebalance fields); with the adjustment skipped (B gets the partition in the generation that
  takes it from A) keys are held by two processes at once, which the checker does not report:
  it has no rule for it (only committed-offset-regression looks at groups).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from isrlab.broker.coordinator.group.group import consumer_subscription_topics
from isrlab.harness.sim import group
from isrlab.harness.sim.cli import SIM_DEFAULTS
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.group import (
    assign_cooperative_sticky,
    assign_sticky,
    cooperative_adjust,
    decode_owned_partitions,
    encode_subscription,
)
from isrlab.harness.sim.run import sim_test, simulate_queue
from tests.sim.test_groups_on_sim import _poll, on_cluster

TP = tuple[str, int]

RUN: dict[str, Any] = {
    **SIM_DEFAULTS,
    "subscribe": True,
    "commit_p": 0.1,
    "assignment_strategy": "cooperative-sticky",
}


def _counts(plan: Mapping[str, list[TP]]) -> list[int]:
    return sorted(len(tps) for tps in plan.values())


def _covers(plan: Mapping[str, list[TP]], members: Mapping[str, list[str]], parts: Any) -> None:
    """Every partition of a subscribed topic goes to exactly one of its subscribers."""
    given = [tp for tps in plan.values() for tp in tps]
    assert len(given) == len(set(given))
    wanted = {(t, p) for ts in members.values() for t in ts for p in range(parts[t])}
    assert set(given) == wanted
    for m, tps in plan.items():
        assert all(t in members[m] for t, _ in tps)


def test_sticky_is_balanced() -> None:
    for n_members, n_parts in itertools.product(range(1, 6), range(0, 12)):
        members = {f"m{i}": ["a", "b"] for i in range(n_members)}
        parts = {"a": n_parts, "b": 3}
        plan = assign_sticky(members, parts)
        _covers(plan, members, parts)
        counts = _counts(plan)
        assert counts[-1] - counts[0] <= 1, (n_members, n_parts, plan)
    # unequal subscriptions: no partition can move to a member with two fewer
    members = {"a": ["t0", "t1"], "b": ["t1"], "c": ["t1", "t2"]}
    parts = {"t0": 4, "t1": 3, "t2": 1}
    plan = assign_sticky(members, parts)
    _covers(plan, members, parts)
    for x, y in itertools.permutations(plan, 2):
        if len(plan[x]) - len(plan[y]) >= 2:
            assert not [tp for tp in plan[x] if tp[0] in members[y]], plan


def test_sticky_keeps_what_members_own() -> None:
    members = {"a": ["t"], "b": ["t"], "c": ["t"]}
    parts = {"t": 6}
    owned = {"a": [("t", 5), ("t", 0)], "b": [("t", 1), ("t", 3)], "c": [("t", 2), ("t", 4)]}
    # balanced already: nothing moves
    assert assign_sticky(members, parts, owned) == {m: sorted(tps) for m, tps in owned.items()}
    # a new member takes one partition (2, 2, 1, 1): the others keep five of their six
    plan = assign_sticky({**members, "d": ["t"]}, parts, owned)
    assert _counts(plan) == [1, 1, 2, 2]
    kept = sum(len(set(plan[m]) & set(owned[m])) for m in owned)
    assert kept == 5 and len(plan["d"]) == 1
    # a member leaves: the others keep theirs and share its two
    plan = assign_sticky({"a": ["t"], "b": ["t"]}, parts, owned)
    assert set(owned["a"]) <= set(plan["a"]) and set(owned["b"]) <= set(plan["b"])
    assert _counts(plan) == [3, 3]
    # a partition two members claim is kept by neither claim (given as unowned)
    twice = {"a": [("t", 0)], "b": [("t", 0)], "c": []}
    _covers(assign_sticky(members, parts, twice), members, parts)
    # an owned partition of a topic the member left, or that does not exist: dropped
    plan = assign_sticky({"a": ["t"]}, {"t": 2}, {"a": [("u", 0), ("t", 7)]})
    assert plan == {"a": [("t", 0), ("t", 1)]}


def test_sticky_is_deterministic() -> None:
    rng = random.Random(7)
    members = {f"m{i}": sorted(rng.sample(["t0", "t1", "t2"], 2)) for i in range(5)}
    parts = {"t0": 5, "t1": 3, "t2": 4}
    owned = {"m0": [("t0", 1), ("t1", 2)], "m3": [("t2", 0), ("t2", 3), ("t0", 4)]}
    first = assign_cooperative_sticky(members, parts, owned)
    for _ in range(10):
        ms = list(members.items())
        rng.shuffle(ms)
        os_ = [(m, rng.sample(tps, len(tps))) for m, tps in owned.items()]
        rng.shuffle(os_)
        again = assign_cooperative_sticky(
            {m: list(reversed(ts)) for m, ts in ms}, dict(reversed(parts.items())), dict(os_)
        )
        assert again == first


def test_a_moving_partition_is_revoked_first_and_given_in_the_next_generation() -> None:
    members = {"a": ["t"], "b": ["t"]}
    parts = {"t": 4}
    owned: dict[str, list[TP]] = {"a": [("t", 0), ("t", 1), ("t", 2), ("t", 3)], "b": []}
    plan = assign_sticky(members, parts, owned)
    # (the first two move, as librdkafka moved them in a real run)
    assert plan == {"a": [("t", 2), ("t", 3)], "b": [("t", 0), ("t", 1)]}
    # generation N: a keeps two and loses two; b gets nothing yet (a still owns them)
    gen_n = assign_cooperative_sticky(members, parts, owned)
    assert gen_n == {"a": [("t", 2), ("t", 3)], "b": []}
    # a revokes what it lost and rejoins: generation N+1 gives them to b, a keeps its own
    owned = {m: list(tps) for m, tps in gen_n.items()}
    gen_n1 = assign_cooperative_sticky(members, parts, owned)
    assert gen_n1 == {"a": [("t", 2), ("t", 3)], "b": [("t", 0), ("t", 1)]}
    # nobody owns it: given at once; a partition two members claim stays with the claimant
    # the plan gives it to
    assert cooperative_adjust({"a": [("t", 0)], "b": [("t", 1)]}, {"a": [], "b": []}) == {
        "a": [("t", 0)],
        "b": [("t", 1)],
    }
    assert cooperative_adjust({"a": [("t", 0)], "b": []}, {"a": [("t", 0)], "b": [("t", 0)]}) == {
        "a": [("t", 0)],
        "b": [],
    }
    # owned, but the plan gives it to nobody (the topic missing from the metadata): kept
    assert cooperative_adjust({"a": [], "b": []}, {"a": [("u", 1)]}) == {"a": [("u", 1)], "b": []}


def test_subscription_v1_carries_the_owned_partitions() -> None:
    v1 = encode_subscription(["t1", "t0"], [("t1", 2), ("t0", 1), ("t1", 0)])
    assert v1[:2] == b"\x00\x01"
    assert consumer_subscription_topics(v1) == ["t0", "t1"]  # the broker's own reader
    assert decode_owned_partitions(v1) == [("t0", 1), ("t1", 0), ("t1", 2)]
    assert decode_owned_partitions(encode_subscription(["t0"], [])) == []
    v0 = encode_subscription(["t0"])
    assert v0[:2] == b"\x00\x00" and decode_owned_partitions(v0) == []
    with pytest.raises(ValueError):
        decode_owned_partitions(v1[:-3])


def test_a_joining_member_takes_partitions_in_two_generations(tmp_path: Path) -> None:
    test = sim_test(
        {"seed": 1, "subscribe": True, "key_count": 4, "assignment_strategy": "cooperative-sticky"}
    )
    keys = sorted(test["keys"])

    async def body(cluster: SimCluster) -> Any:
        hosts = [b.host for b in cluster.brokers.values()]
        make = SimQueueClient.factory(test, cluster.net, hosts)
        producer = await make(9, 2).open()

        async def send(v: int) -> None:
            sent = await producer.invoke({"f": "send", "value": [["send", k, v] for k in keys]})
            assert sent["type"] == "ok", sent

        a, b = await make(0, 0).open(), await make(1, 1).open()
        await send(1)
        assert (await a.invoke({"f": "subscribe", "value": keys}))["type"] == "ok"
        reads: list[dict[str, list[Any]]] = [{}, {}]
        rebs: list[list[Any]] = [[], []]
        for _ in range(100):
            await _poll(a, reads[0], rebs[0])
            if len(reads[0]) == 4:
                break
        assert (await b.invoke({"f": "subscribe", "value": keys}))["type"] == "ok"
        await send(2)
        sent3 = False
        for _ in range(300):
            await _poll(a, reads[0], rebs[0])
            await _poll(b, reads[1], rebs[1])
            if not sent3 and len(b.assigned) == 2:
                await send(3)  # after the handover: each key read by its new owner
                sent3 = True
            if sent3 and all(
                len(r.get(k, [])) == 3
                for m, r in ((a, reads[0]), (b, reads[1]))
                for k in m.assigned
            ):
                break
        return reads, rebs, set(a.assigned), set(b.assigned)

    reads, rebs, a_keys, b_keys = on_cluster(tmp_path, test, keys, body)
    # the first two keys move, as librdkafka 2.x moved them in a real run of the same steps
    assert sorted(b_keys) == keys[:2] and sorted(a_keys) == keys[2:]
    first, *later = rebs[0]
    assert first["assigned"] == keys and first["revoked"] == []
    # A: one revocation of exactly the two keys that moved, nothing else revoked, no reassign
    assert [r["revoked"] for r in later if r["revoked"]] == [sorted(b_keys)]
    assert all(r["assigned"] == [] for r in later)
    (lost,) = [r for r in later if r["revoked"]]
    # B: nothing in the generation that took them from A, the two keys in the next one
    (got,) = [r for r in rebs[1] if r["assigned"]]
    assert got["assigned"] == sorted(b_keys) and got["generation"] == lost["generation"] + 1
    assert any(r["generation"] == lost["generation"] and not r["assigned"] for r in rebs[1])
    # A read its kept keys on, from where it was: values 1, 2, 3 once each, in order
    for k in a_keys:
        assert reads[0][k] == [[0, 1], [1, 2], [2, 3]], reads[0][k]
    # B started the moved keys from the group's committed offset (none: the log start)
    assert got["committed"] == dict.fromkeys(sorted(b_keys))
    for k in b_keys:
        assert reads[1][k] == [[0, 1], [1, 2], [2, 3]], reads[1][k]


def test_a_subscription_change_and_a_lost_member_revoke_only_what_they_must(
    tmp_path: Path,
) -> None:
    """A and B split four keys. A drops one key's topic from its subscription: A revokes that
    key only, B gets it a generation later. A is cut off from the brokers for 10 s (session
    6 s): A's assignment is lost (revoked at its next poll), B gets A's key without waiting
    for A. After the heal A rejoins, the leader moves that key back to A (subscribed to its
    topic only) in two generations."""
    test = sim_test(
        {"seed": 1, "subscribe": True, "key_count": 4, "assignment_strategy": "cooperative-sticky"}
    )
    keys = sorted(test["keys"])
    brokers = ["n1", "n2", "n3"]

    async def body(cluster: SimCluster) -> Any:
        hosts = [b.host for b in cluster.brokers.values()]
        make = SimQueueClient.factory(test, cluster.net, hosts)
        a, b = await make(0, 0).open(), await make(1, 1).open()
        rebs: list[list[Any]] = [[], []]
        marks: dict[str, tuple[int, int]] = {}

        async def poll_until(done: Any, who: tuple[SimQueueClient, ...] = (a, b)) -> None:
            for _ in range(300):
                for m in who:
                    await _poll(m, {}, rebs[m.process])
                if done():
                    return
            raise AssertionError(f"not reached: {rebs}")

        for m in (a, b):
            assert (await m.invoke({"f": "subscribe", "value": keys}))["type"] == "ok"
        await poll_until(lambda: len(a.assigned) == len(b.assigned) == 2)
        split = (set(a.assigned), set(b.assigned))
        # A keeps one of its keys' topics only
        drop, keep = sorted(split[0])
        marks["resubscribed"] = (len(rebs[0]), len(rebs[1]))
        assert (await a.invoke({"f": "subscribe", "value": [keep]}))["type"] == "ok"
        await poll_until(lambda: b.assigned == split[1] | {drop})
        # A cut off from every broker for longer than its session
        marks["cut"] = (len(rebs[0]), len(rebs[1]))
        loop = asyncio.get_running_loop()
        heal_at = loop.time() + 10
        cluster.partition({"client0": brokers, **{n: ["client0"] for n in brokers}})
        await poll_until(lambda: keep in b.assigned, (b,))
        await asyncio.sleep(max(0.0, heal_at - loop.time()))
        cluster.heal()
        marks["healed"] = (len(rebs[0]), len(rebs[1]))
        await poll_until(lambda: a.assigned == {keep} and keep not in b.assigned)
        return split, drop, keep, rebs, marks

    split, drop, keep, rebs, marks = on_cluster(tmp_path, test, keys, body)
    assert len(split[0]) == len(split[1]) == 2 and split[0] | split[1] == set(keys)
    a0, b0 = marks["resubscribed"]
    a1, b1 = marks["cut"]
    # the subscription change: A revokes the dropped topic's key only, B gets it a generation on
    (changed,) = [r for r in rebs[0][a0:a1] if r["revoked"]]
    assert changed["revoked"] == [drop] and changed["assigned"] == []
    (got,) = [r for r in rebs[1][b0:b1] if r["assigned"]]
    assert got["assigned"] == [drop] and got["generation"] > changed["generation"]
    assert not any(r["revoked"] for r in rebs[1][b0:b1])
    # the cut: A's assignment lost (taken at its first poll after the heal); B got the key
    (lost,) = [r for r in rebs[0][a1:] if r["revoked"]]
    assert lost["revoked"] == [keep]
    (taken,) = [r for r in rebs[1][b1:] if keep in r["assigned"]]
    # back: B revokes it (alone), A gets it the generation after
    (given,) = [r for r in rebs[1][b1:] if r["revoked"]]
    assert given["revoked"] == [keep] and given["generation"] > taken["generation"]
    (back,) = [r for r in rebs[0][a1:] if r["assigned"]]
    assert back["assigned"] == [keep] and back["generation"] == given["generation"] + 1


def owners_at_once(history: Path) -> list[tuple[Any, ...]]:
    """Keys two processes held at once, by the histories' `rebalance` fields: a process
    certainly holds k from the completion of the op whose rebalance assigned it to the invoke
    of the op whose rebalance revoked it (or of its last op); two such spans of one key by two
    processes that overlap are returned as (key, process, start, end, process, start, end).
    A key both assigned and revoked in one rebalance starts no span (the order is unknown)."""
    invoked: dict[Any, int] = {}
    spans: dict[str, list[tuple[int, int, Any]]] = {}
    start: dict[tuple[Any, str], int] = {}
    for line in history.read_bytes().splitlines():
        r = orjson.loads(line)
        p = r["process"]
        if r["type"] == "invoke":
            invoked[p] = r["time"]
            continue
        reb = r.get("rebalance")
        if not reb:
            continue
        assigned, revoked = set(reb["assigned"]), set(reb["revoked"])
        for k in sorted(revoked):
            s = start.pop((p, k), None)
            if s is not None:
                spans.setdefault(k, []).append((s, invoked[p], p))
        for k in sorted(assigned - revoked):
            start.setdefault((p, k), r["time"])
    for (p, k), s in start.items():
        spans.setdefault(k, []).append((s, invoked[p], p))
    out = []
    for k, ks in sorted(spans.items()):
        for i, (s1, e1, p1) in enumerate(ks):
            for s2, e2, p2 in ks[i + 1 :]:
                if p1 != p2 and s1 < e2 and s2 < e1:
                    out.append((k, p1, s1, e1, p2, s2, e2))
    return out


def _sha(run_dir: Path) -> str:
    return hashlib.sha256((run_dir / "history.jsonl").read_bytes()).hexdigest()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cooperative_seeds_are_valid_deterministic_and_never_share_a_key(
    tmp_path: Path, seed: int
) -> None:
    """`isrlab sim --seed S --subscribe --commit-p 0.1 --set
    assignment_strategy=cooperative-sticky` (partition+kill), twice."""
    runs = [
        simulate_queue({**RUN, "seed": seed}, tmp_path / name, report=False)
        for name in ("first", "second")
    ]
    (run_dir, results), (run_dir2, _) = runs
    assert results["valid"] is True, results["anomaly_types"]
    assert results["stats"]["rebalances"] > 0 and results["stats"]["commits"] > 0
    assert _sha(run_dir) == _sha(run_dir2)
    records = [orjson.loads(line) for line in (run_dir / "history.jsonl").read_bytes().splitlines()]
    rebs = [r["rebalance"] for r in records if r.get("rebalance")]
    # incremental: some rebalance revokes part of what a member holds and keeps the rest
    assert any(reb["revoked"] and not reb["assigned"] for reb in rebs)
    assert owners_at_once(run_dir / "history.jsonl") == []


def test_without_the_cooperative_step_two_processes_hold_a_key_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader hands a moving partition to its new owner in the generation that takes it
    from the old one (the adjustment skipped): the histories show a key held by two processes
    at once; the checker finds nothing (no rule of it looks for two owners)."""
    monkeypatch.setattr(
        group, "cooperative_adjust", lambda plan, owned: {m: list(t) for m, t in plan.items()}
    )
    # (seed 2: seeds 2-6 each show it, seed 1 happens not to)
    run_dir, results = simulate_queue({**RUN, "seed": 2}, tmp_path / "broken", report=False)
    assert owners_at_once(run_dir / "history.jsonl") != []
    assert results["valid"] is True  # the finding: unseen by the checker
