"""`isrlab test` end to end on the embedded cluster: short runs for CI (every fault kind, abort
cleanup), and long runs (`-m slow`) that must find the data loss theory predicts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from isrlab.checkers.history import load_history

pytestmark = [pytest.mark.root, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "ci-runner"


@pytest.fixture(scope="module", autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("the embedded cluster needs root")
    yield
    from isrlab.harness.cluster import embedded

    embedded.down(CLUSTER)


def short_test(tmp_path: Path, **over: object) -> dict:
    from isrlab.harness.runner import make_test

    conf = {
        "name": "ci",
        "store": str(tmp_path / "store"),
        "cluster_name": CLUSTER,
        "keep_cluster": True,
        "node_count": 5,
        "concurrency": 8,
        "time_limit": 16,
        "final_time_limit": 30,
        "recovery_time": 4,
        "nemesis_interval": 1.5,
        "acks": "all",
        "idempotence": True,
        "min_insync_replicas": 2,
        "replica_lag_time_max_ms": 4000,
        "zk_session_timeout_ms": 4000,
        "key_count": 4,
        "seed": 7,
    }
    conf.update(over)
    return make_test(conf)


@pytest.mark.parametrize(
    "kinds",
    [
        ["partition", "kill", "clock"],
        # pause and the iptables partition are each driven on the embedded cluster by
        # tests/nemeses; this whole-run twin goes with the soak (make soak)
        pytest.param(["pause", "partition-iptables"], marks=pytest.mark.slow),
    ],
)
def test_short_run_per_fault_kind(tmp_path, kinds):
    from isrlab.harness.runner import run_test

    run_dir, results = run_test(short_test(tmp_path, nemesis=kinds), progress=False)
    for name in ("test.json", "history.jsonl", "results.json", "report.html", "summary.txt"):
        assert (run_dir / name).exists(), name
    assert (run_dir.parent / "latest").resolve() == run_dir.resolve()
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["n1", "n2", "n3", "n4", "n5"]
    ops = load_history(run_dir / "history.jsonl")
    started = {
        o["f"][len("start-") :]
        for o in ops
        if o["process"] == "nemesis" and o["f"].startswith("start-")
    }
    assert started & set(kinds), f"no fault of {kinds} was started: {started}"
    assert any(o["process"] == "nemesis" and o["f"] == "heal-all" for o in ops)
    oks = [o for o in ops if o["type"] == "ok" and o["f"] in ("send", "poll")]
    assert len(oks) > 50, "the workload made progress"
    # acks=all, min.insync.replicas=2, idempotent producers, clean elections: nothing acked is lost
    assert "lost-write" not in results["anomaly_types"]
    assert "inconsistent-offsets" not in results["anomaly_types"]
    assert "duplicate" not in results["anomaly_types"]
    report = (run_dir / "report.html").read_text()
    assert "<svg" in report and "heal-all" in report


def _leftovers() -> list[str]:
    out = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [line for line in ns.splitlines() if f"isrlab-{CLUSTER}" in line]
    procs = subprocess.run(
        ["pgrep", "-af", "broker start|QuorumPeerMain"], capture_output=True, text=True
    )
    out += [p for p in procs.stdout.splitlines() if CLUSTER in p]
    return out


def test_abort_heals_and_leaves_nothing_behind(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from isrlab.harness.cli import main; main()",
            "test",
            "--name",
            "abort",
            "--store",
            str(store),
            "--nemesis",
            "partition-iptables+pause",
            "--nemesis-interval",
            "1",
            "--time-limit",
            "120",
            "--concurrency",
            "4",
            "--key-count",
            "2",
            "--node-count",
            "3",
            "--cluster-name",
            CLUSTER,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    history = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        hs = list(store.glob("abort/*/history.jsonl"))
        if hs and b"start-" in hs[0].read_bytes():
            history = hs[0]
            break
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    assert history is not None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode != 0, out[-2000:]
    load_history(history)  # every line written before the abort is readable
    test = json.loads((history.parent / "test.json").read_text())
    assert test["cluster_name"] == CLUSTER
    deadline = time.monotonic() + 30
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(1)
    assert _leftovers() == []
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    assert "ISRLAB-NEMESIS" not in rules


@pytest.mark.slow
@pytest.mark.parametrize(
    "over",
    [
        {
            "acks": "1",
            "idempotence": False,
            "nemesis": ["partition"],
            "nemesis_targets": ["leader"],
        },
        {
            "unclean_leader_election": True,
            "min_insync_replicas": 1,
            "nemesis": ["partition", "kill"],
        },
    ],
    ids=["acks1-leader-partition", "unclean-isr-of-one"],
)
def test_long_runs_find_lost_writes(tmp_path, over):
    """Theory: acks=1 under leader isolation, and unclean election with an ISR of one, lose
    acknowledged writes. A few minutes and a few seeds are enough to see it."""
    from isrlab.harness.runner import run_test

    found = []
    for seed in (1, 2, 3):
        test = short_test(
            tmp_path / str(seed),
            time_limit=150,
            nemesis_interval=10,
            concurrency=10,
            seed=seed,
            **over,
        )
        _, results = run_test(test, progress=False)
        found.append(results["anomaly_types"])
        if "lost-write" in results["anomaly_types"]:
            return
    pytest.fail(f"no lost-write in 3 runs: {found}")


@pytest.mark.slow
def test_subscribe_run_survives_coordinator_kills(tmp_path):
    """A demo-like subscribe run (acks=all, min ISR 2, idempotence) whose faults kill the group's
    coordinator: the group rebalances onto the new coordinator, the committed offsets survive
    (members assigned after a kill fetch what the group committed before it) and the history
    is valid, committed-offset-regression included."""
    from isrlab.harness.runner import run_test

    test = short_test(
        tmp_path,
        subscribe=True,
        commit_p=0.05,
        nemesis=["kill"],
        nemesis_targets=["coordinator"],
        nemesis_interval=8,
        time_limit=35,
        concurrency=6,
        key_count=6,
        seed=23,
    )
    run_dir, results = run_test(test, progress=False)
    saved = json.loads((run_dir / "test.json").read_text())
    assert saved["subscribe"] is True and saved["group"] == "isrlab-ci-23"
    assert results["valid"] is True, results["anomaly_types"]
    assert results["stats"]["subscribe_mode"] is True
    ops = load_history(run_dir / "history.jsonl")
    kills = [
        o
        for o in ops
        if o["process"] == "nemesis"
        and o["f"] == "start-kill"
        and o["type"] == "info"
        and isinstance(o["value"], dict)
        and o["value"].get("nodes")
    ]
    assert kills and all(o["value"]["target"] == "coordinator" for o in kills)
    first_kill = kills[0]["time"]
    commits = [o for o in ops if o["f"] == "commit" and o["type"] == "ok"]
    assert [o for o in commits if o["time"] < first_kill], "commits before the first kill"
    after = [
        o["rebalance"]
        for o in ops
        if "rebalance" in o and o["time"] > first_kill and o["rebalance"]["assigned"]
    ]
    assert after, "the group rebalanced after the coordinator was killed"
    assert any(v is not None for r in after for v in r["committed"].values())
