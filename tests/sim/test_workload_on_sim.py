"""The harness's queue workload on the simulator (harness/sim/run.py): `queue_test`'s phases,
simulated clients (harness/sim/client.py) under the asyncio interpreter
(harness/sim/interpreter.py) against three real brokers on the virtual-time loop, the history
written in the project's format and checked by the project's queue checker.

- acks=all with idempotent producers while the leader of a key is killed and restarted twice:
  valid, with acknowledged sends and reads;
- one seed gives a byte-identical history.jsonl, another seed another one;
- acks=1 (not idempotent) while the leader of a key is cut off from the other brokers (and so
  from ZooKeeper, which runs on them) and clients keep writing to it: the checker finds the
  acknowledged writes the old leader lost when it rejoined (Kafka's acks=1 failover loss,
  docs/historic-failures.md).

The nemesis here is a small one of this test (harness/sim/nemesis.py is the full one)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from isrlab.harness.generator import seq, sleep
from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.run import simulate_queue
from isrlab.harness.workloads.queue.client import parse_key

Op = dict[str, Any]


class LeaderNemesis:
    """Faults aimed at the current leader of a key: "kill-leader" (kill -9), "restart" (every
    killed broker), "isolate-leader" (cut from the other brokers; clients still reach it),
    "heal" (the network); heal-all does both of the last two."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.dead: list[int] = []

    async def invoke(self, op: Op) -> Op:
        c, f = self.cluster, op["f"]
        if f in ("kill-leader", "isolate-leader"):
            leader = c.leader_of(parse_key(op["value"]))
            if leader is None:
                return {**op, "error": "no-leader"}
            if f == "kill-leader":
                c.crash(leader)
                self.dead.append(leader)
                return {**op, "value": {"key": op["value"], "killed": f"n{leader}"}}
            grudge = c.partition_shape("isolate-leader", leader=f"n{leader}")
            return {**op, "value": {k: sorted(v) for k, v in sorted(grudge.items())}}
        if f == "restart":
            return {**op, "value": await self._restart()}
        if f == "heal":
            c.heal()
            return op
        return {**op, "error": f"unknown-f:{f}"}

    async def _restart(self) -> list[str]:
        dead, self.dead = self.dead, []
        for b in dead:
            await self.cluster.restart(b)
        return [f"n{b}" for b in dead]

    async def heal_all(self) -> Any:
        self.cluster.heal()
        return {"restarted": await self._restart()}


def kills(key: str, times: int, every: float) -> Any:
    steps: list[Any] = []
    for _ in range(times):
        steps += [
            sleep(2),
            {"f": "kill-leader", "value": key},
            sleep(every),
            {"f": "restart", "value": None},
        ]
    return seq(*steps)


BASE: dict[str, Any] = {
    "name": "sim-queue",
    "concurrency": 4,
    "rate": 40,
    "key_count": 2,
    "recovery_time": 4,
    "final_time_limit": 30,
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ok_ops(run_dir: Path) -> tuple[int, int]:
    """(ok sends that got an offset, ok polls that read something) in the history."""
    import orjson

    sends = reads = 0
    for line in (run_dir / "history.jsonl").read_bytes().splitlines():
        op = orjson.loads(line)
        if op["type"] != "ok":
            continue
        for m in op.get("value") or []:
            if not isinstance(m, list) or not m:
                continue
            if m[0] == "send" and isinstance(m[2], list) and m[2][0] is not None:
                sends += 1
            elif m[0] == "poll" and any(m[1].values()):
                reads += 1
    return sends, reads


def test_acks_all_idempotent_survives_leader_kills(tmp_path: Path) -> None:
    wall = time.monotonic()
    run_dir, results = simulate_queue(
        {
            **BASE,
            "seed": 11,
            "acks": "all",
            "idempotence": True,
            "time_limit": 24,
            # below the ~6.5 s a new leader takes (session expiry): sends in flight at a kill
            # complete as info
            "op_timeout_ms": 5000,
        },
        tmp_path,
        LeaderNemesis,
        kills("t0/0", 2, 9),
    )
    elapsed = time.monotonic() - wall
    sim = results["sim"]
    assert sim["violation"] is None and not sim["errors"] and not sim["timed_out"], sim
    assert results["valid"] is True, (results["anomaly_types"], results.get("anomalies"))
    sends, reads = ok_ops(run_dir)
    assert sends > 100 and reads > 20, (sends, reads)
    history = (run_dir / "history.jsonl").read_text()
    assert history.count('"killed":"n') == 2  # both kills found a leader
    assert '"type":"info","f":"send"' in history and "msg-timed-out" in history
    assert sim["virtual_s"] >= 24 + 4  # time limit + recovery, then the drain
    assert (run_dir / "results.json").is_file() and (run_dir / "test.json").is_file()
    print(
        f"\nwall {elapsed:.1f} s, virtual {sim['virtual_s']:.1f} s, ops {sim['invoked']}, "
        f"invariant checks {sim['invariant_checks']}, ok sends {sends}, ok reads {reads}"
    )


def small_run(tmp: Path, seed: int) -> Path:
    run_dir, results = simulate_queue(
        {**BASE, "seed": seed, "time_limit": 8, "recovery_time": 2, "final_time_limit": 15},
        tmp,
        LeaderNemesis,
        kills("t1/0", 1, 3),
        check_invariants=False,
        report=False,
    )
    assert results["valid"] is True, results["anomaly_types"]
    return run_dir / "history.jsonl"


def test_one_seed_one_history(tmp_path: Path) -> None:
    one = small_run(tmp_path / "1", 5)
    two = small_run(tmp_path / "2", 5)
    other = small_run(tmp_path / "3", 6)
    assert sha256(one) == sha256(two)
    assert sha256(one) != sha256(other)
    assert '"killed":"n' in one.read_text()


@pytest.mark.parametrize("acks", ["1", "all"])
def test_acks_1_loses_acknowledged_writes_when_the_leader_is_cut_off(
    tmp_path: Path, acks: str
) -> None:
    """The leader of the key is cut off from the other brokers for 12 s; clients still reach
    it and keep writing there (their metadata names it) while the others elect a new leader
    once its ZooKeeper session expired. With acks=1 it acknowledges alone and truncates those
    records when it rejoins; with acks=all (the control) it cannot acknowledge them."""
    nemesis = seq(
        sleep(3),
        {"f": "isolate-leader", "value": "t0/0"},
        sleep(12),
        {"f": "heal", "value": None},
    )
    _run_dir, results = simulate_queue(
        {
            **BASE,
            "seed": 3,
            "acks": acks,
            "idempotence": acks == "all",
            "key_count": 1,
            "time_limit": 20,
        },
        tmp_path,
        LeaderNemesis,
        nemesis,
        report=False,
    )
    assert results["sim"]["violation"] is None
    assert results["stats"]["max_offset"] > 50
    if acks == "1":
        assert results["valid"] is False, results
        assert "lost-write" in results["anomaly_types"], results["anomaly_types"]
        assert results["anomalies"]["lost-write"]["count"] > 10
    else:
        assert results["valid"] is True, results["anomaly_types"]


def test_the_tests_own_nemesis_schedule_runs_on_the_simulator(tmp_path: Path) -> None:
    """`nemesis: partition+kill` as `isrlab test` takes it: the harness's schedule
    (runner.ScheduleGenerator) performed by harness/sim/nemesis.py's SimNemesis."""
    run_dir, results = simulate_queue(
        {
            **BASE,
            "seed": 1,
            "nemesis": "partition+kill",
            "nemesis_interval": 5,
            "time_limit": 30,
            "op_timeout_ms": 5000,
        },
        tmp_path,
        report=False,
    )
    assert results["sim"]["violation"] is None and not results["sim"]["errors"]
    assert results["valid"] is True, results["anomaly_types"]
    history = (run_dir / "history.jsonl").read_text()
    assert '"f":"start-kill"' in history and '"f":"start-partition"' in history
    assert ok_ops(run_dir)[0] > 100


def test_a_seed_gives_the_same_history_under_another_hash_seed(tmp_path: Path) -> None:
    """No set or dict order of the process decides the history: the same seed in a process
    with another PYTHONHASHSEED gives the same bytes."""
    import os
    import subprocess
    import sys

    here = small_run(tmp_path / "here", 5)
    script = (
        "import sys; from pathlib import Path; "
        "from tests.sim.test_workload_on_sim import small_run; "
        "print(small_run(Path(sys.argv[1]), 5))"
    )
    hash_seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "there")],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    there = Path(out.stdout.strip().splitlines()[-1])
    assert sha256(here) == sha256(there)


class _ScriptedClient:
    """Thread 0: process 0 cannot open once, then raises in invoke; process 2 hangs; process 4
    works. Thread 1: process 1 answers info; process 3 works but reports itself broken;
    process 5 works."""

    opened: ClassVar[list[int]] = []

    def __init__(self, process: int) -> None:
        self.process = process
        self.broken = False

    async def open(self) -> None:
        if self.process == 0 and 0 not in self.opened:
            self.opened.append(0)
            raise RuntimeError("no broker")

    async def invoke(self, op: Op) -> Op:
        await asyncio.sleep(0.5)
        if self.process == 0:
            raise ValueError("boom")
        if self.process == 2:
            await asyncio.sleep(3600)  # the hang bound cuts it
        if self.process == 1:
            return {**op, "type": "info", "error": "timeout"}
        if self.process == 3:
            self.broken = True
        return {**op, "type": "ok", "_hint": 1, "time": -5}

    async def close(self) -> None:
        return None


def test_the_sim_interpreter_renumbers_processes_as_the_threaded_one(tmp_path: Path) -> None:
    import orjson

    from isrlab.harness.generator import clients, limit, repeat
    from isrlab.harness.history import HistoryWriter
    from isrlab.harness.sim import clock
    from isrlab.harness.sim.interpreter import SimInterpreter

    _ScriptedClient.opened = []

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        history = HistoryWriter(tmp_path / "h.jsonl", clock=lambda: round(loop.time() * 1e9))
        gen = clients(limit(40, repeat({"f": "poll", "value": None})))
        interp = SimInterpreter(
            gen, history, lambda p, t: _ScriptedClient(p), 2, hang_timeout=10, run_timeout=600
        )
        stats = await interp.run()
        history.close(fsync=False)
        return stats

    stats = clock.run(main())
    ops = [orjson.loads(line) for line in (tmp_path / "h.jsonl").read_bytes().splitlines()]
    assert [o["index"] for o in ops] == list(range(len(ops)))
    assert all(a["time"] <= b["time"] for a, b in itertools.pairwise(ops))
    done: dict[int, list[tuple[str, Any]]] = {}
    for o in ops:
        if o["type"] != "invoke":
            err = o.get("error")
            done.setdefault(o["process"], []).append((o["type"], err[0] if err else None))
            assert "_hint" not in o and o["time"] >= 0
    assert done[0] == [("fail", "client-open"), ("info", "client-crash")]
    assert done[2] == [("info", "hung")]
    assert done[1] == [("info", "t")]  # (the client's own error string)
    assert done[3] == [("ok", None)]  # broken: a new process after it
    assert done[4] and done[5] and all(t == "ok" for t, _ in done[4] + done[5])
    assert set(done) == {0, 1, 2, 3, 4, 5}
    assert stats["invoked"] == 40 and not stats["timed_out"] and not stats["errors"]
    hung = next(o for o in ops if o["process"] == 2 and o["type"] == "info")
    assert hung["time"] - next(o for o in ops if o["process"] == 2)["time"] == 10 * 10**9


def test_the_sim_interpreter_bounds_the_run_in_virtual_time(tmp_path: Path) -> None:
    import orjson

    from isrlab.harness.generator import clients, repeat
    from isrlab.harness.history import HistoryWriter
    from isrlab.harness.sim import clock
    from isrlab.harness.sim.interpreter import SimInterpreter

    _ScriptedClient.opened = [0]  # process 0 opens, then raises; process 2 hangs for good

    async def main() -> tuple[dict[str, Any], float]:
        loop = asyncio.get_running_loop()
        history = HistoryWriter(tmp_path / "h.jsonl", clock=lambda: round(loop.time() * 1e9))
        gen = clients(repeat({"f": "poll", "value": None}))
        interp = SimInterpreter(gen, history, lambda p, t: _ScriptedClient(p), 1, run_timeout=30)
        stats = await interp.run()
        history.close(fsync=False)
        return stats, loop.time()

    wall = time.monotonic()
    (stats, virtual), elapsed = clock.run(main()), time.monotonic() - wall
    ops = [orjson.loads(line) for line in (tmp_path / "h.jsonl").read_bytes().splitlines()]
    assert stats["timed_out"] and 30 <= virtual < 31 and elapsed < 5
    assert ops[-1]["process"] == 2 and ops[-1]["type"] == "info"
    assert ops[-1]["error"][0] == "run-timeout"
