"""`isrlab sim` (harness/sim/cli.py): many seeds on the simulator in parallel processes.

- a safe configuration (acks=all, idempotent, min ISR 2, leader kills) over seeds 1-4 on two
  workers: exit 0, four valid, run directories like real runs' marked ``mode: sim``;
- acks=1 under partitions: exit 1, the failing seed listed with a replay command that, run,
  gives the same history byte for byte;
- --check-determinism: every seed run twice, same sha256;
- options the simulator cannot honour, and bad seeds, are refused with exit 2 and a message.

The runs go through the installed `isrlab` command (a subprocess: the forkserver pool, the
progress output and the exit code as a user sees them)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from isrlab.harness.cli import app
from isrlab.harness.sim.cli import parse_seeds, replay_command

ISRLAB = str(Path(sys.executable).with_name("isrlab"))
#: short runs: one key, 3 clients at 30 ops/s, 8 s of faults
SHORT = [
    "--key-count", "1", "--concurrency", "3", "--rate", "30",
    "--time-limit", "8", "--recovery-time", "2", "--final-time-limit", "10",
]  # fmt: skip


def isrlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ISRLAB, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_safe_configuration_is_valid_for_every_seed(tmp_path: Path) -> None:
    res = isrlab(
        "sim", "--seeds", "1-4", "--workers", "2", "--store", str(tmp_path),
        "--nemesis", "kill", "--nemesis-interval", "4", *SHORT,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 of 4 seeds run (2 workers" in res.stdout
    assert re.search(r"valid 4\s+invalid 0\s+unknown 0\s+crashed 0", res.stdout), res.stdout
    assert "anomalies: none" in res.stdout and "simulated" in res.stdout
    cell = tmp_path / "sim_acks-all_kill_idem_isr2"
    assert sorted(p.name for p in cell.iterdir()) == [f"seed-{s}" for s in range(1, 5)]
    run = cell / "seed-2"
    for name in ("test.json", "history.jsonl", "results.json", "trace.txt", "sim.log"):
        assert (run / name).is_file(), name
    test = json.loads((run / "test.json").read_text())
    results = json.loads((run / "results.json").read_text())
    assert test["mode"] == "sim" and test["seed"] == 2 and test["node_count"] == 3
    assert results["mode"] == "sim" and results["valid"] is True
    assert results["sim"]["history_sha256"] == sha256(run / "history.jsonl")
    assert '"f":"start-kill"' in (run / "history.jsonl").read_text()


def test_acks_1_under_partitions_fails_and_the_replay_reproduces_it(tmp_path: Path) -> None:
    # seed 3: the leader partitioned away keeps acknowledging acks=1 writes it loses on rejoining
    res = isrlab(
        "sim", "--seeds", "3-4", "--workers", "2", "--store", str(tmp_path),
        "--acks", "1", "--nemesis", "partition", "--nemesis-interval", "8", "--key-count", "1",
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert "lost-write: 1 seed(s): 3" in res.stdout, res.stdout
    assert "seed 3: invalid (" in res.stdout
    replay = re.search(r"replay: (isrlab sim --seed 3 .*)", res.stdout)
    assert replay, res.stdout
    words = shlex.split(replay.group(1))
    assert words[:4] == ["isrlab", "sim", "--seed", "3"] and "--acks" in words
    first = tmp_path / "sim_acks-1_partition_isr2" / "seed-3"
    again = isrlab(*words[1:])
    assert again.returncode == 1, again.stdout + again.stderr
    second = first.with_name("seed-3-2")  # the replay never overwrites the run it replays
    assert sha256(second / "history.jsonl") == sha256(first / "history.jsonl")
    assert "lost-write" in json.loads((second / "results.json").read_text())["anomaly_types"]


def test_check_determinism_runs_each_seed_twice(tmp_path: Path) -> None:
    res = isrlab(
        "sim", "--seeds", "1-2", "--workers", "2", "--store", str(tmp_path),
        "--check-determinism", "--no-invariants", "--nemesis", "partition+kill",
        "--nemesis-interval", "3", *SHORT,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "valid 2" in res.stdout and "not deterministic" not in res.stdout
    assert not list(tmp_path.glob("*/*-second"))  # a second history is kept only if it differs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nemesis", "kill+power-zookeeper"], "power-zookeeper not simulated"),
        (["--txn", "--acks", "1"], "txn (--txn) needs acks=all"),
        (
            ["--subscribe", "--set", "assignment_strategy=sticky"],
            "assignment_strategy",
        ),
        (["--nodes", "n1,n2,n3"], "--nodes: the simulator runs its brokers in this process"),
        (["--seeds", "5-2"], "A <= B"),
        (["--seeds", "many"], "--seeds takes a count N"),
        (["--seed", "1", "--seeds", "3"], "not both"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--acks", "2"], "acks (--acks) must be one of 0, 1, all"),
        (["--acks", "1", "--idempotence"], "needs acks=all"),
        (["--switch", "no_such_switch=1"], "unknown switch"),
        (["--set", "no_such_knob=1"], "unknown test option"),
        (["--broker-config", "log.segment.bytes"], "takes KEY=VALUE"),
        (["--broker-config", "log.segment.bytes=abc"], "log.segment.bytes: invalid value 'abc'"),
        (["--broker-config", "log.segment.bytes=3"], "must be >= 14"),
        (["--broker-config", "no.such.key=1"], "unknown configuration key 'no.such.key'"),
        (["--broker-config", "min.insync.replicas=1"], "give it as --min-insync-replicas"),
        (["--broker-config", "log.flush.interval.messages=1"], "--flush-policy every-append"),
        (["--broker-config", "listeners=PLAINTEXT://:1"], "the harness sets it for each broker"),
    ],
)
def test_bad_options_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["sim", "--store", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert not any(tmp_path.iterdir())  # nothing ran


def test_seeds_and_the_replay_command() -> None:
    assert parse_seeds("3") == [1, 2, 3] and parse_seeds("7-9") == [7, 8, 9]
    cmd = replay_command(
        5,
        {"acks": "1", "nemesis": "kill", "node_count": 3, "idempotence": False},
        {"op_timeout_ms": "5000"},
        ["--report"],
    )
    assert cmd == (
        "isrlab sim --seed 5 --acks 1 --nemesis kill --no-idempotence "
        "--set op_timeout_ms=5000 --report"
    )
    cmd = replay_command(
        5, {"broker_config": {"log.segment.bytes": "20000", "log.cleaner.backoff.ms": "200"}}, {}
    )
    assert cmd == (
        "isrlab sim --seed 5 --broker-config log.segment.bytes=20000 "
        "--broker-config log.cleaner.backoff.ms=200"
    )


def test_broker_config_reaches_every_simulated_broker_and_the_replay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`isrlab sim --broker-config KEY=VALUE` as a user types it (CliRunner): the seed's
    brokers run with the keys (their `BrokerConfig`), test.json keeps them, and the failing
    seed's replay command carries them, giving the same seed's job again. (The seeds run in
    this process here, not in the pool, so the brokers can be looked at.)"""
    from isrlab.harness.sim import cli as sim_cli
    from isrlab.harness.sim import run as sim_run
    from isrlab.harness.sim.cluster import SimCluster

    configs: list[dict[int, Any]] = []

    class Recording(SimCluster):
        async def __aexit__(self, *exc: Any) -> None:
            configs.append({i: b.server.config for i, b in self.brokers.items() if b.server})
            await super().__aexit__(*exc)

    calls: list[tuple[list[sim_cli.SeedJob], Any]] = []

    def in_process(jobs: Any, workers: int, **kw: Any) -> sim_cli.SimSummary:
        calls.append((list(jobs), kw["replay"]))
        summary = sim_cli.SimSummary([j.seed for j in jobs], replay=kw["replay"])
        summary.results = [sim_cli.run_seed(j) for j in jobs]
        return summary

    monkeypatch.setattr(sim_run, "SimCluster", Recording)
    monkeypatch.setattr(sim_cli, "run_seeds", in_process)
    args = [
        "sim", "--seed", "1", "--time-limit", "3", "--final-time-limit", "3",
        "--recovery-time", "1", "--nemesis", "none", "--store", str(tmp_path),
        "--broker-config", "log.segment.bytes=20000",
        "--broker-config", "offsets.topic.segment.bytes=16384",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    [(jobs, replay)] = calls
    [job] = jobs
    expected = {"log.segment.bytes": "20000", "offsets.topic.segment.bytes": "16384"}
    assert job.overrides["broker_config"] == expected
    # every broker of the run was started with them
    [brokers] = configs
    assert sorted(brokers) == [1, 2, 3]
    for config in brokers.values():
        assert config["log.segment.bytes"] == 20000
        assert config["offsets.topic.segment.bytes"] == 16384
        assert config.is_explicit("log.segment.bytes")
    test = json.loads((Path(job.run_dir) / "test.json").read_text())
    assert test["broker_config"] == expected and test["mode"] == "sim"
    # the replay command names them, and gives the same seed's job again
    words = shlex.split(replay(1))
    assert words[:4] == ["isrlab", "sim", "--seed", "1"]
    pairs = [words[i + 1] for i, w in enumerate(words) if w == "--broker-config"]
    assert pairs == ["log.segment.bytes=20000", "offsets.topic.segment.bytes=16384"]
    res = CliRunner().invoke(app, [*words[1:], "--store", str(tmp_path)])
    assert res.exit_code == 0, res.output
    [_, (again, _)] = calls
    assert again[0].overrides == job.overrides and again[0].run_dir != job.run_dir


def test_every_seed_runs_in_a_process_of_its_own(tmp_path: Path) -> None:
    """A sweep's verdict of a seed is its replay's: each seed runs in a fresh process forked
    from the forkserver, even with one worker, never after other seeds in one process (a
    sweep that ran them one after another leaked a crashed broker's files from run to run,
    and a seed was invalid in the sweep and valid alone)."""
    import os

    from isrlab.harness.sim.cli import SeedJob, run_seeds

    jobs = [
        SeedJob(
            seed,
            {"seed": seed, "key_count": 1, "concurrency": 2, "rate": 20, "time_limit": 3,
             "final_time_limit": 5, "recovery_time": 1},
            str(tmp_path / f"seed-{seed}"),
        )
        for seed in (1, 2, 3)
    ]  # fmt: skip
    summary = run_seeds(jobs, 1)
    pids = [r.pid for r in summary.results]
    assert [r.status for r in summary.results] == ["valid"] * 3, summary.results
    assert len(set(pids)) == 3 and os.getpid() not in pids, pids
