"""Targeted schedules (nemeses.targeted, issue 17) against a fake cluster whose state znode
answers as a controller would: each fault waits for the state it needs, then strikes, and
undoes what it did."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.compose import TARGETED, parse_kinds, schedule
from isrlab.nemeses.targeted import (
    LATE_CHAIN,
    ZKCUT_CHAIN,
    IsrSqueezeFault,
    LateProduceFault,
    LeaderFlapFault,
    ZkCutFault,
)


@dataclass
class Result:
    stdout: str = ""
    ok: bool = True


@dataclass
class Node:
    name: str

    @property
    def host(self) -> str:
        return "10.0.0." + self.name.removeprefix("n")


@dataclass
class FakeCluster:
    """Three brokers; partition t0/0 led by n1 with ISR [n1, n2, n3]. A paused follower drops
    out of the ISR after `lag_polls` state reads; a killed leader is replaced by the first live
    ISR member."""

    test: dict[str, Any] = field(
        default_factory=lambda: {
            "keys": ["t0/0"],
            "min_insync_replicas": 2,
            "replica_lag_time_max_ms": 1000,
        }
    )
    names: list[str] = field(default_factory=lambda: ["n1", "n2", "n3"])
    leader: str | None = "n1"
    isr: list[str] = field(default_factory=lambda: ["n1", "n2", "n3"])
    epoch: int = 0
    lag_polls: int = 3
    shrinks: bool = True
    paused: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)
    rules: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    polls: int = 0
    client: str = "10.77.0.1"
    #: black-hole routes (the partition nemesis's route method): node -> hosts it cannot reach
    routes: dict[str, set[str]] = field(default_factory=dict)
    #: who the controller elects when the leader dies (default: the first live ISR member,
    #: in the order of `assigned` when set)
    successor: str | None = None
    #: the assigned replicas as the topic znode lists them (None: unreadable)
    assigned: list[str] | None = None
    #: a started broker rejoins the ISR (as a follower that caught up would)
    rejoin: bool = False

    def assignment(self, topic: str, partition: int) -> list[str]:
        if self.assigned is None:
            raise KeyError("/brokers/topics/t0")
        return list(self.assigned)

    def partition_state(self, topic: str, partition: int) -> tuple[str | None, list[str], int]:
        self.polls += 1
        if self.shrinks and self.polls > self.lag_polls:
            self.isr = [n for n in self.isr if n not in self.paused]
        return self.leader, list(self.isr), self.epoch

    def pause(self, node: str) -> bool:
        self.calls.append(("pause", node))
        self.paused.add(node)
        return True

    def resume(self, node: str) -> bool:
        self.calls.append(("resume", node))
        self.paused.discard(node)
        return True

    def kill(self, node: str) -> bool:
        self.calls.append(("kill", node))
        alive = node not in self.dead
        self.dead.add(node)
        if node == self.leader:
            self.isr = [n for n in self.isr if n != node] or self.isr
            order = [n for n in (self.assigned or self.isr) if n in self.isr]
            nxt = self.successor or next(
                (n for n in order if n not in self.dead and n != node), None
            )
            self.leader, self.epoch = nxt, self.epoch + 1
        return alive

    def power_loss(self, node: str) -> str:
        self.calls.append(("power-loss", node))
        assert node in self.dead, "a power loss cuts the files of a broker that is down"
        return "1 file cut"

    def start(self, node: str) -> int:
        self.calls.append(("start", node))
        self.dead.discard(node)
        if self.rejoin and node not in self.isr:
            self.isr.append(node)
        return 1

    def broker_state(self, node: str) -> str:
        return "down" if node in self.dead else "up"

    def remote(self, name: str) -> Any:
        cluster, node = self, name

        class Shell:
            node = Node(name)

            def exec(self, cmd: str, check: bool = True) -> Result:
                cluster.calls.append(("exec", node))
                if "SSH_CLIENT" in cmd:
                    return Result(f"client={cluster.client}\n")
                if "ip route replace" in cmd:
                    for line in cmd.splitlines():
                        if line.startswith("ip route replace "):
                            host = line.split()[3].removesuffix("/32")
                            cluster.routes.setdefault(node, set()).add(host)
                            cluster.calls.append(("route+", f"{node}->{host}"))
                    return Result()
                if "ip route show" in cmd:  # the partition nemesis's heal of one node
                    gone = sorted(cluster.routes.pop(node, set()))
                    for host in gone:
                        cluster.calls.append(("route-", f"{node}->{host}"))
                    return Result("".join(f"route {h}/32\n" for h in gone))
                for chain in (ZKCUT_CHAIN, LATE_CHAIN):
                    if f"-X {chain}" in cmd:
                        if cluster.rules.pop((node, chain), None):
                            return Result("removed\n")
                        return Result()
                    # rules are added (-A) and deleted (-D) in the command's order
                    rules = cluster.rules.setdefault((node, chain), [])
                    for part in cmd.split("; "):
                        if part.startswith(f"iptables -w -A {chain} "):
                            rules.append(part.removeprefix(f"iptables -w -A {chain} "))
                            cluster.calls.append(("rule+", rules[-1]))
                        elif part.startswith(f"iptables -w -D {chain} "):
                            rules.remove(part.removeprefix(f"iptables -w -D {chain} "))
                            cluster.calls.append(("rule-", part.split(f"-D {chain} ")[1]))
                    if not rules:
                        del cluster.rules[(node, chain)]
                return Result()

        return Shell()


def fault(cls: type, cluster: FakeCluster) -> Any:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    return cls(cluster, random.Random(1), sleep=sleep, clock=lambda: now[0])


def test_isr_squeeze_to_min_isr_kills_the_leader_once_the_isr_shrank() -> None:
    c = FakeCluster()
    done = fault(IsrSqueezeFault, c).start({"key": "t0/0", "to": "min", "then": "kill"})
    assert "error" not in done, done
    assert len(done["paused"]) == 1 and done["isr_before"] == ["n1", "n2", "n3"]
    assert len(done["isr_at_failure"]) == 2 and done["killed"] == "n1"
    # the follower is paused before the kill and resumed after it
    order = [k for k, n in c.calls if k in ("pause", "kill", "resume")]
    assert order == ["pause", "kill", "resume"]
    assert not c.paused


def test_isr_squeeze_to_the_leader_alone_pauses_every_follower() -> None:
    c = FakeCluster()
    f = fault(IsrSqueezeFault, c)
    done = f.start({"key": "t0/0", "to": "leader"})
    assert sorted(done["paused"]) == ["n2", "n3"] and done["isr_at_failure"] == ["n1"]
    assert f.stop(None) == {"nodes": ["n1"]}
    assert ("start", "n1") in c.calls


def test_isr_squeeze_then_power_cuts_the_killed_leader_before_the_followers_resume() -> None:
    c = FakeCluster()
    f = fault(IsrSqueezeFault, c)
    done = f.start({"key": "t0/0", "to": "leader", "then": "power"})
    assert "error" not in done, done
    assert done["killed"] == "n1" and done["power_loss"] == "1 file cut"
    order = [(k, n) for k, n in c.calls if k in ("kill", "power-loss", "resume")]
    assert order[:2] == [("kill", "n1"), ("power-loss", "n1")]
    assert {k for k, _ in order[2:]} == {"resume"} and not c.paused
    assert f.stop(None) == {"nodes": ["n1"]}


def test_schedules_draw_the_isr_squeeze_failures_asked_for() -> None:
    def thens(squeeze_then: list[str] | None) -> set[str]:
        stream = schedule(["isr-squeeze"], 1.0, 3, keys=["t0/0"], squeeze_then=squeeze_then)
        ops = itertools.islice((o for o in stream if o.get("f") == "start-isr-squeeze"), 40)
        return {o["value"]["then"] for o in ops}

    assert thens(None) == {"kill", "isolate"}
    assert thens(["power"]) == {"power"}
    assert thens(["kill", "power"]) == {"kill", "power"}
    with pytest.raises(NemesisError, match="unknown isr-squeeze failure"):
        next(schedule(["isr-squeeze"], 1.0, 3, squeeze_then=["melt"]))


def test_isr_squeeze_gives_up_when_the_isr_does_not_shrink() -> None:
    c = FakeCluster(shrinks=False)
    done = fault(IsrSqueezeFault, c).start({"key": "t0/0", "wait_s": 2})
    assert "did not shrink" in done["error"]
    assert not any(k == "kill" for k, _ in c.calls) and not c.paused
    assert done["waited_s"] >= 2


def test_leader_flap_changes_leaders_twice_with_a_follower_restarted_between() -> None:
    c = FakeCluster()
    f = fault(LeaderFlapFault, c)
    done = f.start({"key": "t0/0", "gap_ms": 200})
    assert done["leaders"] == ["n1", "n2", "n3"] and done["epochs"] == [0, 1, 2]
    assert done["restarted"] == "n3"
    kills = [n for k, n in c.calls if k == "kill"]
    assert kills == ["n1", "n3", "n2"]  # the first leader, the restarted follower, the second
    f.stop(None)
    assert not c.dead


def test_leader_flap_cut_parts_two_followers_then_kills_both_leaders() -> None:
    c = FakeCluster()
    f = recording_fault(LeaderFlapFault, c)
    done = f.start({"key": "t0/0", "gap_ms": 200, "follower": "cut"})
    assert "error" not in done, done
    assert done["leaders"] == ["n1", "n2", "n3"] and done["epochs"] == [0, 1, 2]
    assert done["cut"] == ["n2", "n3"] and done["truncating"] == "n3"
    assert done["isr_at_second_kill"] == ["n2", "n3"]
    events = [(k, n) for k, n in c.calls if k in ("route+", "route-", "kill", "start", "sleep")]
    # the followers cut apart, both ways, before the first leader dies; the next leader
    # killed after the gap, while the cut holds; nobody restarted or healed meanwhile
    assert sorted(events[:2]) == [("route+", "n2->10.0.0.3"), ("route+", "n3->10.0.0.2")]
    assert events[2:] == [("kill", "n1"), ("sleep", "0.2"), ("kill", "n2")]
    assert c.routes == {"n2": {"10.0.0.3"}, "n3": {"10.0.0.2"}}
    # stop: the cut healed first, then the two leaders started again
    c.calls.clear()
    stopped = f.stop(None)
    assert stopped["nodes"] == ["n1", "n2"] and "healed" in stopped
    events = [(k, n) for k, n in c.calls if k in ("route-", "start")]
    assert sorted(events[:2]) == [("route-", "n2->10.0.0.3"), ("route-", "n3->10.0.0.2")]
    assert events[2:] == [("start", "n1"), ("start", "n2")]
    assert not c.routes and not c.dead
    assert f.stop(None) == {"nodes": []}  # nothing left to heal: no second heal of the cut


def test_leader_flap_cut_is_undone_by_heal() -> None:
    c = FakeCluster()
    f = fault(LeaderFlapFault, c)
    f.start({"key": "t0/0", "follower": "cut"})
    assert c.routes and c.dead == {"n1", "n2"}
    assert f.heal() == ["n1", "n2", "n3"]  # routes removed on n2 and n3, n1 and n2 started
    assert not c.routes and not c.dead


def test_leader_flap_cut_stops_when_another_replica_is_elected() -> None:
    c = FakeCluster(names=["n1", "n2", "n3", "n4"], isr=["n1", "n2", "n3", "n4"])
    f = fault(LeaderFlapFault, c)
    rng_pair = sorted(random.Random(1).sample(["n2", "n3", "n4"], 2))
    c.successor = next(n for n in ["n2", "n3", "n4"] if n not in rng_pair)
    done = f.start({"key": "t0/0", "follower": "cut"})
    assert done["cut"] == rng_pair and "not one of the cut pair" in done["error"]
    assert [n for k, n in c.calls if k == "kill"] == ["n1"]  # the outsider lives
    f.stop(None)
    assert not c.routes and not c.dead


def test_leader_flap_cut_needs_two_followers() -> None:
    c = FakeCluster(isr=["n1", "n2"])
    done = fault(LeaderFlapFault, c).start({"key": "t0/0", "follower": "cut"})
    assert "no two followers" in done["error"]
    assert not any(k in ("kill", "route+") for k, _ in c.calls)


def test_leader_flap_diverge_lags_the_next_leader_then_hands_over_twice() -> None:
    # assigned n1, n3, n2: n3 is elected after n1, so n3 is the one made to lag
    c = FakeCluster(assigned=["n1", "n3", "n2"], rejoin=True)
    f = recording_fault(LeaderFlapFault, c)
    done = f.start({"key": "t0/0", "follower": "diverge", "lag_ms": 400, "lead_ms": 2000})
    assert "error" not in done, done
    assert done["cut"] == ["n2", "n3"] and done["lagging"] == "n3"
    # n1, then the lagging n3, then n2 (which never reached n3), then n3 again
    assert done["leaders"] == ["n1", "n3", "n2", "n3"] and done["epochs"] == [0, 1, 2, 3]
    assert done["isr_at_third_kill"] == ["n2", "n3"]
    events = [
        (k, n)
        for k, n in c.calls
        if k in ("route+", "route-", "pause", "resume", "kill", "start", "sleep")
    ]
    assert sorted(events[:2]) == [("route+", "n2->10.0.0.3"), ("route+", "n3->10.0.0.2")]
    assert events[2:] == [
        ("pause", "n3"),  # n3 lags while n2 fetches the leader's last records
        ("sleep", "0.4"),
        ("kill", "n1"),  # n1 dies while n3 is behind
        ("resume", "n3"),
        ("sleep", "2.0"),  # n3 leads and appends
        ("kill", "n3"),  # n2, cut off from n3, is elected
        ("route-", "n2->10.0.0.3"),  # healed before n3 comes back
        ("route-", "n3->10.0.0.2"),
        ("start", "n3"),  # n3 follows n2 and rejoins its ISR
        ("sleep", "0.4"),
        ("kill", "n2"),  # n3 leads with whatever it kept
    ]
    assert not c.paused and not c.routes and c.dead == {"n1", "n2"}
    assert f.stop(None) == {"nodes": ["n1", "n2"]}  # the cut is already healed
    assert not c.dead


def test_leader_flap_diverge_reads_the_election_order_from_the_assignment() -> None:
    # without the topic znode the ISR's order stands in: n2 is next
    done = fault(LeaderFlapFault, FakeCluster(rejoin=True)).start(
        {"key": "t0/0", "follower": "diverge"}
    )
    assert done["lagging"] == "n2" and done["leaders"] == ["n1", "n2", "n3", "n2"]
    c = FakeCluster(assigned=["n2", "n1", "n3"], rejoin=True)
    assert (
        fault(LeaderFlapFault, c).start({"key": "t0/0", "follower": "diverge"})["lagging"] == "n2"
    )


def test_leader_flap_diverge_stops_where_the_sequence_breaks() -> None:
    # somebody else is elected after the first leader: nothing more is done, stop undoes it
    c = FakeCluster(assigned=["n1", "n3", "n2"], successor="n2")
    f = fault(LeaderFlapFault, c)
    done = f.start({"key": "t0/0", "follower": "diverge"})
    assert "n2 was elected, not the lagging follower n3" in done["error"]
    assert [n for k, n in c.calls if k == "kill"] == ["n1"] and not c.paused
    f.stop(None)
    assert not c.routes and not c.dead
    # the lagging follower does not come back into the ISR: no third kill
    c = FakeCluster(assigned=["n1", "n3", "n2"], rejoin=False)
    done = fault(LeaderFlapFault, c).start({"key": "t0/0", "follower": "diverge", "wait_s": 3})
    assert "n3 did not rejoin" in done["error"]
    assert [n for k, n in c.calls if k == "kill"] == ["n1", "n3"]
    # more than two followers: the second election could go to a third one
    c = FakeCluster(names=["n1", "n2", "n3", "n4"], isr=["n1", "n2", "n3", "n4"])
    done = fault(LeaderFlapFault, c).start({"key": "t0/0", "follower": "diverge"})
    assert "not exactly two followers" in done["error"] and not c.calls


def test_schedules_draw_the_leader_flap_follower_actions_asked_for() -> None:
    def values(flap_follower: list[str] | None) -> list[dict[str, Any]]:
        stream = schedule(["leader-flap"], 1.0, 3, keys=["t0/0"], flap_follower=flap_follower)
        ops = itertools.islice((o for o in stream if o.get("f") == "start-leader-flap"), 40)
        return [o["value"] for o in ops]

    # unset: no draw, so a seed gives the schedule it gave before the option existed (these
    # are the draws of seed 3 before it did)
    assert [(v["key"], v["gap_ms"]) for v in values(None)[:4]] == [
        ("t0/0", 1000),
        ("t0/0", 500),
        ("t0/0", 200),
        ("t0/0", 500),
    ]
    assert all("follower" not in v for v in values(None))
    assert {v["follower"] for v in values(["cut"])} == {"cut"}
    assert {v["follower"] for v in values(["restart", "cut"])} == {"restart", "cut"}
    with pytest.raises(NemesisError, match="unknown leader-flap follower"):
        next(schedule(["leader-flap"], 1.0, 3, flap_follower=["melt"]))


def test_zk_cut_drops_the_leaders_zookeeper_traffic_and_stop_removes_it() -> None:
    c = FakeCluster()
    f = fault(ZkCutFault, c)
    done = f.start({"key": "t0/0"})
    assert done["leader"] == "n1" and "--dport 2181 -j DROP" in c.rules[("n1", ZKCUT_CHAIN)][0]
    assert len(done["paused"]) == 1
    stopped = f.stop(None)
    assert stopped["nodes"] == ["n1"] and not c.rules and not c.paused
    # heal_all from a fresh fault (a harness that lost its nemesis) finds a leftover rule
    f.start({"key": "t0/0", "pause_follower": False})
    assert "n1" in fault(ZkCutFault, c).heal() and not c.rules


def test_no_leader_is_an_error_that_does_nothing() -> None:
    for cls in (IsrSqueezeFault, LeaderFlapFault, ZkCutFault, LateProduceFault):
        c = FakeCluster(leader=None)
        assert "no leader" in fault(cls, c).start({"key": "t0/0"})["error"]
        assert c.calls == []


def test_schedules_draw_the_targeted_kinds_with_a_key() -> None:
    assert parse_kinds(",".join(TARGETED)) == list(TARGETED)
    stream = schedule(list(TARGETED), 1.0, 3, keys=["t0/0", "t1/0"])
    ops = list(itertools.islice((o for o in stream if o.get("f")), 30))
    starts = [o for o in ops if o["f"].startswith("start-")]
    assert {o["f"] for o in starts} == {f"start-{k}" for k in TARGETED}
    assert all(o["value"]["key"] in ("t0/0", "t1/0") for o in starts)
    assert {o["value"]["to"] for o in starts if o["f"] == "start-isr-squeeze"} <= {"min", "leader"}


@pytest.mark.parametrize("kind", TARGETED)
def test_every_targeted_kind_is_a_nemesis_kind(kind: str) -> None:
    from isrlab.nemeses.compose import build

    nem = build(kind, FakeCluster(), {"seed": 1})  # type: ignore[arg-type]
    assert nem.kinds == [kind]


def recording_fault(cls: type, cluster: FakeCluster, fail_on_sleep: int = 0) -> Any:
    """A fault whose sleeps advance a fake clock and are recorded among the cluster's calls
    (so a test sees what happened between them); the `fail_on_sleep`-th sleep raises."""
    now = [0.0]

    def sleep(s: float) -> None:
        cluster.calls.append(("sleep", str(s)))
        if sum(k == "sleep" for k, _ in cluster.calls) == fail_on_sleep:
            raise RuntimeError("the harness was interrupted")
        now[0] += s

    return cls(cluster, random.Random(1), sleep=sleep, clock=lambda: now[0])


def test_late_produce_holds_the_clients_requests_then_lets_only_them_through() -> None:
    c = FakeCluster()
    c.test["op_timeout_ms"] = 4000
    f = recording_fault(LateProduceFault, c)
    done = f.start({"key": "t0/0"})
    assert "error" not in done, done
    assert done["leader"] == "n1" and done["client"] == "10.77.0.1" and done["port"] == 9092
    # held past the transaction's timeout (op_timeout_ms) + 2.5 s, then released for 3 s
    assert done["held_s"] == 6.5 and done["released_s"] == 3.0
    events = [(k, n) for k, n in c.calls if k in ("rule+", "rule-", "sleep")]
    everything = "-p tcp -s 10.77.0.1 --dport 9092 -j DROP"
    new_connections = "-p tcp -s 10.77.0.1 --dport 9092 --syn -j DROP"
    assert events == [
        ("rule+", everything),  # hold: nothing of the clients reaches the leader
        ("sleep", "6.5"),
        ("rule+", new_connections),  # release: first refuse new connections,
        ("rule-", everything),  # then let the held packets of open ones through
        ("sleep", "3.0"),
    ]
    # only the leader's node was touched, and nothing is left on it
    assert {n for k, n in c.calls if k == "exec"} == {"n1"}
    assert not c.rules and f.stop(None) == {"nodes": []}
    assert not c.paused and not c.dead


def test_late_produce_removes_its_rules_when_interrupted_and_heal_finds_leftovers() -> None:
    c = FakeCluster()
    f = recording_fault(LateProduceFault, c, fail_on_sleep=1)
    with pytest.raises(RuntimeError):
        f.start({"key": "t0/0", "hold_s": 5})
    assert not c.rules and f.stop(None) == {"nodes": []}
    # a rule left behind (a harness that died mid-hold) is found by heal_all's fresh fault
    fault(LateProduceFault, c)._hold("n2", "10.77.0.1", 9092)
    assert c.rules
    assert fault(LateProduceFault, c).heal() == ["n2"] and not c.rules


def test_late_produce_without_the_clients_address_does_nothing() -> None:
    c = FakeCluster(client="")
    done = recording_fault(LateProduceFault, c).start({"key": "t0/0"})
    assert "clients' address" in done["error"] and done["leader"] == "n1"
    assert not c.rules and not any(k == "sleep" for k, _ in c.calls)
