"""Synthetic subscribe runs (pipeline/fixtures/synthetic.py with ``subscribe``): a consumer
group over the simulated replicated log, valid with safe settings, and the historic switch
``offsets_commit_required_acks=1`` losing commits under coordinator faults, as the checker and
the pipeline's per-run check report them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from isrlab.checkers.api import check, policy_from_test
from isrlab.checkers.history import validate
from isrlab.harness.testconfig import consumer_mode
from isrlab.pipeline.check import check_run
from isrlab.pipeline.fixtures.synthetic import make_test, simulate_run, write_run

REGRESSION = "committed-offset-regression"


def _check(test: dict[str, Any], n: int = 2000) -> dict[str, Any]:
    ops = simulate_run(test, n)
    validate(ops)
    policy = policy_from_test(test)
    return check(ops, str(policy.pop("workload")), **policy)


def test_a_subscribe_test_names_its_group_and_mode() -> None:
    t = make_test(nemesis="kill", seed=3, subscribe=True)
    assert t["subscribe"] is True and t["commit_p"] == 0.1
    assert consumer_mode(t) == "subscribe" and t["group"] == f"isrlab-{t['name']}-3"
    assert t["name"] != make_test(nemesis="kill", seed=3)["name"]
    switched = make_test(nemesis="kill", seed=3, subscribe=True, offsets_commit_required_acks=1)
    assert switched["name"] != t["name"] and "commit-acks1" in switched["name"]
    assert "subscribe" not in make_test() and "group" not in make_test()


def test_a_safe_group_under_faults_is_valid_and_really_rebalances() -> None:
    for nemesis in ("kill", "partition", "combined"):
        for seed in range(3):
            r = _check(make_test(acks="all", nemesis=nemesis, seed=seed, subscribe=True))
            assert r["valid"] is True, (nemesis, seed, r["anomaly_types"])
            assert r["stats"]["subscribe_mode"] is True
            assert r["stats"]["rebalances"] > 10 and r["stats"]["commits"] > 5


def test_commits_acknowledged_by_the_coordinator_alone_go_back_under_its_faults() -> None:
    found = []
    for seed in range(8):
        t = make_test(
            acks="all",
            nemesis="combined",
            seed=seed,
            subscribe=True,
            offsets_commit_required_acks=1,
        )
        r = _check(t)
        assert set(r["anomaly_types"]) <= {REGRESSION}, r["anomaly_types"]
        found.append(REGRESSION in r["anomaly_types"])
    assert sum(found) >= 2, found


def test_the_pipeline_check_counts_the_regression(tmp_path: Path) -> None:
    for seed in range(8):
        t = make_test(
            acks="all",
            nemesis="combined",
            seed=seed,
            subscribe=True,
            offsets_commit_required_acks=1,
        )
        run = write_run(tmp_path, t, 2000)
        test = orjson.loads((run / "test.json").read_bytes())
        row = check_run("r", run, test)
        counts = dict(row["anomaly_counts"])
        if counts:
            assert row["status"] == "checked" and row["valid"] == "false"
            assert set(counts) == {REGRESSION} and row["not_allowed"] == [REGRESSION]
            assert (
                "the group's committed offset went backwards"
                in dict(row["anomaly_examples"])[REGRESSION]
            )
            return
    raise AssertionError("no seed of 8 lost a commit")
