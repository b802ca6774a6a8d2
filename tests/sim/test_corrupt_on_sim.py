"""The ``corrupt`` nemesis on the simulator (`harness/sim/corrupt.py`): the real
`nemeses.corrupt.CorruptFault` on the simulated brokers' data directories.

A seed's strikes damage real files of the run (bit flips, cuts, an old disk put back), the
completions name them relative to the run, the safe configuration stays valid with the
invariants on, one seed gives one history, a broker killed while it was starting no longer
hangs the run, and a damaged segment is left out of the committed-data comparison only."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from isrlab.harness.sim.cluster import SimCluster
from isrlab.harness.sim.invariants import InvariantViolation
from isrlab.harness.sim.run import simulate_queue
from tests.sim.test_nemesis_on_sim import TP, create_topic, produce, run_sim

#: small segments and a recovery point checkpointed every second, as the real corrupt
#: cluster test has them, so strikes meet rolled segments that a restart trusts
SMALL_SEGMENTS = {"log.segment.bytes": "32768", "log.flush.offset.checkpoint.interval.ms": "1000"}


def _run(tmp: Path, seed: int, **over: Any) -> tuple[Path, dict[str, Any]]:
    test = {
        "name": "corrupt-sim",
        "concurrency": 4,
        "rate": 20,
        "key_count": 1,
        "time_limit": 30,
        "recovery_time": 3,
        "final_time_limit": 20,
        "nemesis": "corrupt+kill",
        "nemesis_interval": 3,
        "seed": seed,
        "broker_config": SMALL_SEGMENTS,
        **over,
    }
    return simulate_queue(test, tmp, report=False)


def _strikes(run_dir: Path) -> list[dict[str, Any]]:
    ops = [json.loads(line) for line in (run_dir / "history.jsonl").open()]
    return [o["value"] for o in ops if o["f"] == "start-corrupt" and o["value"].get("damage")]


def test_corrupt_damages_the_runs_files_valid_and_one_history_per_seed(tmp_path: Path) -> None:
    """Seeds 1-3 of corrupt+kill: bit flips, cuts and old disks done to the simulated
    brokers' files (named relative to the run), every run valid with the invariants checked,
    and seed 1 twice gives one history."""
    done: list[dict[str, Any]] = []
    shas = []
    for seed, where in ((1, "a"), (1, "b"), (2, "c"), (3, "d")):
        run_dir, res = _run(tmp_path / where, seed)
        assert res["valid"] is True, (seed, res.get("anomalies"), res["sim"])
        assert res["sim"].get("violation") is None
        if seed == 1:
            shas.append(hashlib.sha256((run_dir / "history.jsonl").read_bytes()).hexdigest())
        done += [d for s in _strikes(run_dir) for d in s["damage"] if "error" not in d]
    assert shas[0] == shas[1]
    kinds = {k for d in done for k in ("flips", "truncated_to", "copy") if k in d}
    assert kinds == {"flips", "truncated_to", "copy"}, done
    for d in done:
        path = d.get("file") or d["copy"]
        assert path.startswith(f"{d['node']}/") or path.startswith(f"{d['node']}."), d
        assert str(tmp_path) not in json.dumps(d)


def test_a_broker_killed_while_starting_does_not_hang_the_run(tmp_path: Path) -> None:
    """A start under way when its broker is killed (a strike restarts a broker, the next
    kills it before it registered) ends as a failed start, and the cluster closes; before,
    the waiter hung on the frozen start and the loop stalled at its end."""

    async def body(c: SimCluster) -> None:
        c.crash(1)
        start = asyncio.get_running_loop().create_task(c.restart(1))
        await asyncio.sleep(0.01)  # the start is under way: not registered yet
        assert not start.done() and c.brokers[1].alive
        c.crash(1)
        with pytest.raises(RuntimeError, match="killed while starting"):
            await asyncio.wait_for(start, 5)
        assert c.brokers[1].crashed and not c.brokers[1].alive
        await c.restart(1)  # and it starts again afterwards
        assert c.brokers[1].alive

    run_sim(tmp_path, body)


def test_only_a_damaged_copy_is_left_out_of_the_data_check(tmp_path: Path) -> None:
    """The committed-data check still reads every other member: a follower's batch changed
    in memory's view (its log read returns other bytes) is a violation unless the nemesis
    declared that broker's segment damaged."""

    async def body(c: SimCluster, declare: bool) -> None:
        leader = await create_topic(c)
        await produce(c, leader, 5, "d")
        follower = next(b for b in c.brokers if b != leader)
        hp = c.server(follower).replica_manager.partitions[TP]  # type: ignore[index]
        log = hp.log
        real_read = log.read

        def flipped(*a: Any, **k: Any) -> Any:
            out = real_read(*a, **k)
            data = bytearray(out.read_bytes())
            data[-1] ^= 1

            class _R:
                def read_bytes(self) -> bytes:
                    return bytes(data)

            return _R()

        if declare:
            c.damaged(follower, TP)
        c.invariants.verified.clear()  # read every member again
        log.read = flipped
        try:
            c.invariants.check(c.brokers.values(), None)
        finally:
            log.read = real_read

    run_sim(tmp_path / "declared", lambda c: body(c, True))
    with pytest.raises(InvariantViolation, match="differs on broker"):
        run_sim(tmp_path / "undeclared", lambda c: body(c, False))
