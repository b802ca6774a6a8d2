"""Consumer groups on the simulator (harness/sim/group.py): the simulated group consumer against
three real brokers on the virtual-time loop, and `isrlab sim --subscribe`.

- two members split the keys (roundrobin), read them, commit; the coordinator is killed, the
  members rejoin the new coordinator and resume from the committed offsets;
- the assignors and the consumer protocol's bytes, read back by the broker's own readers;
- a commit acknowledged by a coordinator cut off from its followers is lost after the cut
  heals with offsets.commit.required.acks=1, and not acknowledged with the default (-1);
- the historic switch is found by `isrlab sim`'s schedule aimed at the coordinator (partitions
  isolating it) on one of seeds 1-6, and that seed is valid with the default;
- one `--subscribe` seed gives one history.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from isrlab.broker.coordinator.group.records import decode_consumer_assignment
from isrlab.harness.sim import clock
from isrlab.harness.sim.cli import SIM_DEFAULTS
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.group import (
    assign_range,
    assign_roundrobin,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from isrlab.harness.sim.run import broker_overrides, create_topics, sim_test, simulate_queue

#: the schedule that finds the switch: partitions that isolate the group's coordinator
SWITCH_RUN: dict[str, Any] = {
    **SIM_DEFAULTS,
    "subscribe": True,
    "commit_p": 0.1,
    "nemesis": ["partition"],
    "nemesis_targets": ["coordinator"],
}


def on_cluster(tmp_path: Path, test: dict[str, Any], keys: list[str], body: Any) -> Any:
    """`body(cluster)` on three simulated brokers (seed 1, the test's broker settings) with
    `keys` created, replication factor 3, min ISR 2."""

    async def main() -> Any:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(loop, tmp_path, 3, seed=1, overrides=broker_overrides(test))
        async with cluster:
            await create_topics(cluster, keys, 3, 2)
            return await body(cluster)

    return clock.run(main())


async def _poll(client: SimQueueClient, reads: dict[str, list[Any]], rebs: list[Any]) -> None:
    done = await client.invoke({"f": "poll", "value": [["poll"]], "_poll_ms": 200})
    assert done["type"] == "ok", done
    if "rebalance" in done:
        rebs.append(done["rebalance"])
    for k, pairs in done["value"][0][1].items():
        reads.setdefault(k, []).extend(pairs)


def test_members_split_the_keys_commit_and_resume_after_a_coordinator_failover(
    tmp_path: Path,
) -> None:
    test = sim_test({"seed": 1, "subscribe": True, "key_count": 2})
    keys = list(test["keys"])

    async def body(cluster: SimCluster) -> Any:
        hosts = [b.host for b in cluster.brokers.values()]
        make = SimQueueClient.factory(test, cluster.net, hosts)
        producer = await make(9, 2).open()
        for k in keys:
            sent = await producer.invoke(
                {"f": "send", "value": [["send", k, v] for v in (1, 2, 3)]}
            )
            assert sent["type"] == "ok", sent
        members = [await make(0, 0).open(), await make(1, 1).open()]
        for m in members:
            assert (await m.invoke({"f": "subscribe", "value": keys}))["type"] == "ok"
        reads: list[dict[str, list[Any]]] = [{}, {}]
        rebs: list[list[Any]] = [[], []]
        for _ in range(100):
            for i, m in enumerate(members):
                await _poll(m, reads[i], rebs[i])
            if sum(len(v) for r in reads for v in r.values()) >= 6:
                break
        owned = [set(m.assigned) for m in members]
        commits = [await m.invoke({"f": "commit", "value": [["commit", {}]]}) for m in members]
        coordinator = members[0].group.coordinator[0]
        cluster.crash(coordinator)
        before = [len(r) for r in rebs]
        after_reads: list[dict[str, list[Any]]] = [{}, {}]
        for _ in range(200):
            for i, m in enumerate(members):
                await _poll(m, after_reads[i], rebs[i])
            if all(len(r) > b and r[-1]["assigned"] for r, b in zip(rebs, before, strict=True)):
                break
        sent = [await producer.invoke({"f": "send", "value": [["send", k, 4]]}) for k in keys]
        for _ in range(100):
            for i, m in enumerate(members):
                await _poll(m, after_reads[i], rebs[i])
            if sum(len(v) for r in after_reads for v in r.values()) >= 2:
                break
        new_coordinator = members[0].group.coordinator[0]
        return owned, reads, commits, coordinator, new_coordinator, rebs, before, after_reads, sent

    owned, reads, commits, old, new, rebs, before, after_reads, sent = on_cluster(
        tmp_path, test, keys, body
    )
    # the group split the keys: one each (roundrobin), each read its key from the start
    assert sorted(len(o) for o in owned) == [1, 1] and owned[0] | owned[1] == set(keys)
    for i in range(2):
        (k,) = owned[i]
        assert reads[i] == {k: [[0, 1], [1, 2], [2, 3]]}
        assert rebs[i][0]["assigned"] == [k] and rebs[i][0]["committed"] == {k: None}
        assert commits[i]["type"] == "ok", commits[i]
        assert commits[i]["value"] == [["commit", {k: 3}]]
    # the coordinator moved; both members rejoined it, found the commits and resumed there
    assert new != old
    for i in range(2):
        last = rebs[i][-1]
        assert len(rebs[i]) > before[i] and last["generation"] > rebs[i][0]["generation"]
        assert last["committed"] == dict.fromkeys(last["assigned"], 3)
    assert all(s["type"] == "ok" for s in sent), sent
    got = {k: pairs for r in after_reads for k, pairs in r.items()}
    assert got == {k: [[3, 4]] for k in keys}


def _isolated_coordinator_commit(tmp: Path, required_acks: str) -> tuple[Any, Any, int]:
    """One member reads 3 records of a key and commits 3; reads 3 more; the group's
    coordinator is cut off from the other brokers (not from the clients) and the member
    commits 6 to it; 10 s later (the coordinator's ZooKeeper session expired: another broker
    leads its __consumer_offsets partition) the cut heals. Returns the commits made during the
    cut, the first rebalance the member then took, and the old coordinator's id."""
    test = sim_test({"seed": 1, "subscribe": True, "key_count": 1})
    test["broker_config"] = {"offsets.commit.required.acks": required_acks}
    (key,) = test["keys"]

    async def body(cluster: SimCluster) -> Any:
        hosts = [b.host for b in cluster.brokers.values()]
        make = SimQueueClient.factory(test, cluster.net, hosts)
        producer, member = await make(9, 1).open(), await make(0, 0).open()
        assert (await member.invoke({"f": "subscribe", "value": [key]}))["type"] == "ok"
        for batch in ((1, 2, 3), (4, 5, 6)):
            sent = await producer.invoke({"f": "send", "value": [["send", key, v] for v in batch]})
            assert sent["type"] == "ok", sent
            reads: dict[str, list[Any]] = {}
            for _ in range(100):
                await _poll(member, reads, [])
                if len(reads.get(key, [])) >= 3:
                    break
            if batch[0] == 1:
                first = await member.invoke({"f": "commit", "value": [["commit", {}]]})
                assert first["type"] == "ok" and first["value"] == [["commit", {key: 3}]]
        old = member.group.coordinator[0]
        others = [f"n{b}" for b in cluster.brokers if b != old]
        cluster.partition({f"n{old}": others, **{o: [f"n{old}"] for o in others}})
        during = await member.invoke({"f": "commit", "value": [["commit", {}]]})
        await asyncio.sleep(10)
        cluster.heal()
        rebs: list[Any] = []
        for _ in range(300):
            await _poll(member, {}, rebs)
            if any(key in r["committed"] for r in rebs):
                break
        return during, next(r for r in rebs if key in r["committed"]), old

    async def main() -> Any:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(loop, tmp, 3, seed=1, overrides=broker_overrides(test))
        async with cluster:
            await create_topics(cluster, [key], 3, 2)
            return await body(cluster)

    return clock.run(main())  # type: ignore[no-any-return]


def test_a_commit_to_an_isolated_coordinator_is_lost_only_with_required_acks_1(
    tmp_path: Path,
) -> None:
    during, after, _ = _isolated_coordinator_commit(tmp_path / "acks1", "1")
    # acknowledged by the coordinator alone, then gone: the group went back to 3
    assert during["type"] == "ok" and during["value"] == [["commit", {"t0/0": 6}]], during
    assert after["committed"] == {"t0/0": 3}, after
    during, after, _ = _isolated_coordinator_commit(tmp_path / "acks-1", "-1")
    # not acknowledged (it could not be replicated): nothing acknowledged is lost
    assert during["type"] != "ok", during
    assert after["committed"]["t0/0"] in (3, 6), after


def test_assignors_and_the_consumer_protocol_bytes() -> None:
    members = {"b": ["t0", "t1"], "a": ["t0", "t1"], "c": ["t1"]}
    parts = {"t0": 3, "t1": 2}
    rr = assign_roundrobin(members, parts)
    assert rr == {
        "a": [("t0", 0), ("t0", 2)],
        "b": [("t0", 1), ("t1", 0)],
        "c": [("t1", 1)],
    }
    assert assign_range(members, parts) == {
        "a": [("t0", 0), ("t0", 1), ("t1", 0)],
        "b": [("t0", 2), ("t1", 1)],
        "c": [],
    }
    assert decode_subscription(encode_subscription(["t1", "t0"])) == ["t0", "t1"]
    assert decode_consumer_assignment(encode_assignment(rr["b"])) == ([("t0", 1), ("t1", 0)], None)
    assert decode_consumer_assignment(encode_assignment([])) == ([], None)


def _run(tmp: Path, seed: int, **extra: Any) -> dict[str, Any]:
    name = f"{seed}-{extra.get('offsets_commit_required_acks', 'default')}"
    return simulate_queue({**SWITCH_RUN, "seed": seed, **extra}, tmp / name, report=False)[1]


def test_offsets_commit_required_acks_1_is_found_and_the_default_is_valid(tmp_path: Path) -> None:
    """`isrlab sim --subscribe --commit-p 0.1 --nemesis partition --nemesis-targets
    coordinator --switch offsets.commit.required.acks=1`: the first invalid seed of 1-6 (about
    one seed in three is: the seed that shows it moves with the broker's event order), then the
    same seed with the default."""
    found = None
    for seed in range(1, 7):
        switched = _run(tmp_path, seed, offsets_commit_required_acks="1")
        if switched["valid"] is False:
            found = seed
            break
    assert found is not None, "the switch was not found on seeds 1-6"
    assert switched["anomaly_types"] == ["committed-offset-regression"], switched["anomaly_types"]
    safe = _run(tmp_path, found)
    assert safe["valid"] is True, safe["anomaly_types"]
    assert safe["stats"]["commits"] > 0 and safe["stats"]["rebalances"] > 0


def test_a_subscribe_seed_gives_one_history(tmp_path: Path) -> None:
    shas = []
    for name in ("first", "second"):
        run_dir, results = simulate_queue(
            {**SIM_DEFAULTS, "seed": 3, "subscribe": True, "commit_p": 0.2, "time_limit": 12.0},
            tmp_path / name,
            report=False,
        )
        assert results["stats"]["rebalances"] > 0 and results["stats"]["commits"] > 0
        shas.append(hashlib.sha256((run_dir / "history.jsonl").read_bytes()).hexdigest())
    assert shas[0] == shas[1]
