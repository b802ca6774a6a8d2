"""The targeted nemesis kinds on the simulator (harness/sim/nemesis.py: isr-squeeze,
leader-flap, zk-cut): each sequence of `nemeses.targeted` performed on a 3-broker SimCluster in
virtual time, its completion shaped as the real fault's, the cluster in the state the sequence
aims at, the same seed giving the same completions and trace; and leader-flap's ``diverge``
finding the historic switch ``replica.truncation.mode=leader-epoch-v0`` (KIP-279) where the
default truncation stays valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from isrlab.harness.sim.cli import SIM_DEFAULTS
from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.nemesis import SimNemesis
from isrlab.harness.sim.shrink import run_once
from isrlab.nemeses import compose
from tests.sim.test_nemesis_on_sim import KEY, TP, create_topic, isr, produce, run_sim

NODES = ["n1", "n2", "n3"]


def _state(nem: SimNemesis) -> tuple[str | None, list[str], int]:
    return nem.targets.partition_state(*TP)


def _alive(c: SimCluster) -> list[str]:
    return sorted(b.host for b in c.live())


# ----- leader-flap -------------------------------------------------------------------------


def flap(tmp: Path, follower: str, seed: int = 5) -> tuple[list[dict[str, Any]], str]:
    """One leader-flap strike of `follower`'s way on an RF 3 topic, then its stop: the two
    completions and the cluster's trace."""

    async def body(c: SimCluster) -> list[dict[str, Any]]:
        nem = SimNemesis(c, "leader-flap", {"seed": seed, "keys": [KEY]})
        leader = await create_topic(c)
        await produce(c, leader, 5, "f")
        value = {"key": KEY, "gap_ms": 500, "follower": follower}
        start = await nem.invoke(compose._op("start-leader-flap", value))
        down = sorted(b.host for b in c.brokers.values() if not b.alive)
        stop = await nem.invoke(compose._op("stop-leader-flap", None))
        await c.wait_for(lambda: len(isr(c)) == 3, 60, "the full ISR again")
        assert _alive(c) == NODES
        nem.close()
        return [start, stop, {"down_after_start": down}]

    done, c = run_sim(tmp, body, seed=seed)
    return done, "\n".join(c.trace)


def test_leader_flap_diverge_elects_the_lagging_follower_then_the_other_then_it_again(
    tmp_path: Path,
) -> None:
    """``follower: diverge``: B (next in the assignment) paused while A dies, B leads; B dies,
    C leads; B comes back into C's ISR and C dies: B leads again. Deterministic."""
    (start, stop, after), trace = flap(tmp_path / "1", "diverge")
    v = start["value"]
    assert "error" not in start and "error" not in v, start
    a, b, c, b_again = v["leaders"]
    assert v["lagging"] == b == b_again and v["cut"] == sorted([b, c]) and a not in v["cut"]
    assert v["epochs"] == sorted(set(v["epochs"])) and len(v["epochs"]) == 4, v
    assert set(v["isr_at_third_kill"]) == {b, c}
    assert v["healed"] == {n: [] for n in NODES}
    assert (v["lag_ms"], v["lead_ms"], v["gap_ms"]) == (500, 1500, 500)
    assert v["waited_s"] > 10  # two session expiries (6 s) at least, in virtual time
    assert after["down_after_start"] == sorted([a, c])
    assert stop["value"] == {"nodes": sorted([a, c])}, stop
    # the lag, the cut and the kills are in the trace, in that order
    lines = [ln.split(" ", 1)[1] for ln in trace.splitlines()]
    order = [
        f"net partition {{'{min(b, c)}': ['{max(b, c)}'], '{max(b, c)}': ['{min(b, c)}']}}",
        f"pause broker {b[1:]}",
        f"resume broker {b[1:]}",
        "net heal",
    ]
    at = 0
    for want in order:
        at = lines.index(want, at)
    (start2, stop2, _), trace2 = flap(tmp_path / "2", "diverge")
    assert (start2, stop2) == (start, stop)
    assert trace2 == trace


def test_leader_flap_cut_kills_the_elected_one_of_the_cut_pair(tmp_path: Path) -> None:
    (start, stop, after), _ = flap(tmp_path, "cut")
    v = start["value"]
    assert "error" not in v, v
    a, second, third = v["leaders"]
    assert second in v["cut"] and v["truncating"] in v["cut"] and v["truncating"] != second
    assert third == v["truncating"] and a not in v["cut"]
    assert after["down_after_start"] == sorted([a, second])
    # stop: the cut healed first, then the killed brokers started
    assert stop["value"] == {"nodes": sorted([a, second]), "healed": {n: [] for n in NODES}}


def test_leader_flap_restart_restarts_the_other_follower_and_kills_the_second(
    tmp_path: Path,
) -> None:
    (start, stop, after), _ = flap(tmp_path, "restart")
    v = start["value"]
    assert "error" not in v, v
    # (a third leader only if one is eligible: the restarted follower registered after an
    # unclean shutdown leaves the ISR and the eligible replicas, so the partition may stay
    # offline until the stop starts the others again)
    a, second = v["leaders"][:2]
    assert v["restarted"] not in (a, second) and len(v["leaders"]) in (2, 3)
    # the restarted follower is not the fault's to start again: it runs (or is starting)
    assert after["down_after_start"] == sorted([a, second])
    assert stop["value"] == {"nodes": sorted([a, second])}


# ----- isr-squeeze -------------------------------------------------------------------------


@pytest.mark.parametrize("then", ["kill", "isolate", "power"])
def test_isr_squeeze_shrinks_the_isr_to_min_then_fails_the_leader(
    tmp_path: Path, then: str
) -> None:
    async def body(c: SimCluster) -> tuple[dict[str, Any], dict[str, Any], int]:
        test = {"seed": 3, "keys": [KEY], "min_insync_replicas": 2}
        nem = SimNemesis(c, "isr-squeeze", test)
        leader = await create_topic(c)
        await produce(c, leader, 5, "s")
        value = {"key": KEY, "to": "min", "then": then}
        start = await nem.invoke(compose._op("start-isr-squeeze", value))
        assert not any(b.paused for b in c.brokers.values())  # followers resumed
        if then == "isolate":
            assert c.net.grudge[f"n{leader}"] == sorted(n for n in NODES if n != f"n{leader}")
        else:
            assert not c.brokers[leader].alive
        stop = await nem.invoke(compose._op("stop-isr-squeeze", None))
        assert c.net.grudge == {} and _alive(c) == NODES
        nem.close()
        return start, stop, leader

    (start, stop, leader), _ = run_sim(tmp_path, body)
    v = start["value"]
    assert "error" not in v, v
    me = f"n{leader}"
    assert (v["leader"], v["to"], v["then"], v["isr_before"][0]) == (me, "min", then, me)
    assert len(v["paused"]) == 1 and v["paused"][0] != me
    assert set(v["isr_at_failure"]) == set(v["isr_before"]) - set(v["paused"])
    assert 0 < v["waited_s"] < 30
    if then == "isolate":
        assert set(v["isolated"]) == set(NODES) and stop["value"]["healed"] == {
            n: [] for n in NODES
        }
        assert stop["value"]["nodes"] == []
    else:
        assert v["killed"] == me and stop["value"] == {"nodes": [me]}
        if then == "power":
            assert v["power_loss"].startswith(f"{me}: "), v


def test_isr_squeeze_refuses_an_isr_already_at_its_target(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> dict[str, Any]:
        nem = SimNemesis(c, "isr-squeeze", {"seed": 3, "keys": [KEY], "min_insync_replicas": 3})
        await create_topic(c)
        done = await nem.invoke(compose._op("start-isr-squeeze", {"key": KEY, "to": "min"}))
        assert all(b.alive and not b.paused for b in c.brokers.values())
        return done

    done, _ = run_sim(tmp_path, body)
    assert "nothing to squeeze" in done["value"]["error"]


# ----- zk-cut --------------------------------------------------------------------------------


def test_zk_cut_cuts_the_leaders_session_only_and_another_broker_leads(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> tuple[dict[str, Any], dict[str, Any], int, str | None]:
        nem = SimNemesis(c, "zk-cut", {"seed": 3, "keys": [KEY]})
        leader = await create_topic(c)
        start = await nem.invoke(compose._op("start-zk-cut", {"key": KEY}))
        assert c.net.grudge == {}  # the network is untouched: peers and clients reach it
        assert not c.reaches_zookeeper(f"n{leader}")
        assert all(c.reaches_zookeeper(n) for n in NODES if n != f"n{leader}")
        # its session expires (6 s); the controller elects the follower that is not paused
        await c.wait_for(lambda: _state(nem)[0] not in (None, f"n{leader}"), 30, "a new leader")
        elected = _state(nem)[0]
        stop = await nem.invoke(compose._op("stop-zk-cut", None))
        assert c.reaches_zookeeper(f"n{leader}") and not any(b.paused for b in c.brokers.values())
        await c.wait_for(lambda: len(_state(nem)[1]) == 3, 60, "the full ISR again")
        nem.close()
        return start, stop, leader, elected

    (start, stop, leader, elected), c = run_sim(tmp_path, body)
    v = start["value"]
    me = f"n{leader}"
    assert (v["leader"], v["isr"][0]) == (me, me) and len(v["paused"]) == 1
    assert elected not in (me, v["paused"][0])
    assert stop["value"] == {"nodes": [me], "resumed": v["paused"]}
    assert f"zk-cut broker {leader}" in "\n".join(c.trace)


def test_heal_all_undoes_a_zk_cut_and_a_targeted_cut(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> dict[str, Any]:
        nem = SimNemesis(c, "zk-cut,partition", {"seed": 3, "keys": [KEY]})
        leader = await create_topic(c)
        await nem.invoke(compose._op("start-zk-cut", {"key": KEY, "pause_follower": False}))
        await nem.invoke(compose._op("start-partition", {"grudge": {"n1": ["n2"]}}))
        assert not c.reaches_zookeeper(f"n{leader}")
        healed = await nem.heal_all()
        assert c.net.grudge == {} and all(c.reaches_zookeeper(n) for n in NODES)
        return {"healed": healed, "leader": leader}

    out, _ = run_sim(tmp_path, body)
    assert out["healed"]["zk-cut"] == [f"n{out['leader']}"]
    assert out["healed"]["partition"] == {"n1": ["n2"]}


# ----- the historic switch leader-epoch-v0 ---------------------------------------------------


def _overrides(seed: int, truncation: str, **more: Any) -> dict[str, Any]:
    return {
        **SIM_DEFAULTS,
        "name": "sim_targeted",
        "seed": seed,
        "truncation_mode": truncation,
        "nemesis": "leader-flap",
        "flap_follower": "diverge",
        **more,
    }


def test_leader_flap_diverge_finds_leader_epoch_v0_and_leader_epoch_stays_valid(
    tmp_path: Path,
) -> None:
    """KIP-279's divergence: the first of seeds 1..4 (one key, so the strike's key has
    traffic) invalid with leader-epoch-v0 is valid with the default leader-epoch."""
    found = None
    for seed in range(1, 5):
        out = run_once(_overrides(seed, "leader-epoch-v0", key_count=1), tmp_path / f"v0-{seed}")
        if out.failed:
            found = (seed, out)
            break
    assert found is not None, "leader-epoch-v0 not found in seeds 1..4"
    seed, out = found
    assert "committed batch" in str(out.violation) or "inconsistent-offsets" in out.kinds(), out
    clean = run_once(_overrides(seed, "leader-epoch", key_count=1), tmp_path / "le")
    assert clean.valid is True and clean.violation is None, clean


@pytest.mark.slow
def test_isrlab_sim_seed_5_finds_leader_epoch_v0_with_the_default_keys(tmp_path: Path) -> None:
    """`isrlab sim --seed 5 --truncation-mode leader-epoch-v0 --nemesis leader-flap
    --flap-follower diverge` (the first invalid seed of docs/simulation.md's measurement)."""
    out = run_once(_overrides(5, "leader-epoch-v0"), tmp_path / "v0")
    assert out.failed and "committed batch" in str(out.violation), out


# ----- the other broker switches, each on the targeted schedule that finds it ---------------

SWITCHES = [
    # (switch on, switch off, schedule): docs/simulation.md's first table
    (
        {"truncation_mode": "high-watermark"},
        {"truncation_mode": "leader-epoch"},
        {"nemesis": "leader-flap", "flap_follower": "cut"},
    ),
    (
        {"min_insync_replicas": 1},
        {"min_insync_replicas": 2},
        {"nemesis": "isr-squeeze", "squeeze_then": "power"},
    ),
    (
        {"eligible_leader_replicas": False},
        {"eligible_leader_replicas": True},
        {"nemesis": "isr-squeeze", "squeeze_then": "power"},
    ),
    (
        {"unclean_leader_election": True, "min_insync_replicas": 1},
        {"unclean_leader_election": False, "min_insync_replicas": 1},
        {"nemesis": "isr-squeeze", "squeeze_then": "kill,isolate"},
    ),
]


@pytest.mark.parametrize(("on", "off", "schedule"), SWITCHES, ids=lambda v: str(v))
def test_a_historic_switch_is_found_on_its_schedule_and_not_without_it(
    tmp_path: Path, on: dict[str, Any], off: dict[str, Any], schedule: dict[str, Any]
) -> None:
    """The first of seeds 1..3 that is invalid with the switch is valid with it off (the
    safe setting's rule, e.g. leader-epoch truncation or the ISR's minimum, is what tells
    them apart)."""
    base = {**SIM_DEFAULTS, "name": "sim_switch", **schedule}
    found = None
    for seed in range(1, 4):
        out = run_once({**base, **on, "seed": seed}, tmp_path / f"on-{seed}")
        if out.failed:
            found = (seed, out)
            break
    assert found is not None, f"{on} not found in seeds 1..3 of {schedule}"
    seed, out = found
    clean = run_once({**base, **off, "seed": seed}, tmp_path / "off")
    assert clean.valid is True and clean.violation is None, clean
