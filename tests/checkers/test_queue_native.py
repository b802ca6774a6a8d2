"""The native explaining path (`Screen.explain` + checkers.queue.native) against the checker.

A history with anomalies is checked by the native core, which counts every case and keeps
the raw fields of the reported examples, and by `checkers.queue.cases`' builders, which
write them: the results must be the checker's (`check_queue(..., screen=False)`), byte
for byte, counts, examples, explanations and stats. Checked on histories like those of
acks=1 runs (truncated leaders, retried sends), on mutated ones (each mutation models a
broker bug or an odd shape), with small example budgets, and through `isrlab check`.
Every anomaly the native passes count must show up here through the native path, so
that a rule removed from them fails a test.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.history import write_history
from isrlab.checkers.queue import check_queue, native, screen
from isrlab.pipeline.fixtures.simulate import simulate
from tests.checkers.test_queue_index import mutated
from tests.checkers.test_queue_load import Ops

# Every anomaly whose cases the native passes find (cycles are found by checkers.queue.cycles
# over the native region graph, garbage reads checked against the invokes in Python).
NATIVE = {
    "inconsistent-offsets",
    "duplicate",
    "idempotence-duplicate",
    "lost-write",
    "unseen",
    "garbage-read",
    "precommitted-read",
    "G1a",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "poll-skip",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "int-send-skip",
    "int-nonmonotonic-send",
    "realtime-send-order",
    "hw-regression",
    "hw-regression-realtime",
    "committed-truncation",
    "G0",
    "G0-process",
    "G0-realtime",
}


def _acks1(seed: int) -> Ops:
    rng = random.Random(seed)
    return simulate(
        rng.randint(300, 3000),
        processes=rng.randint(2, 8),
        keys=rng.randint(1, 4),
        seed=seed,
        txn_rate=rng.choice([0.0, 0.0, 0.3]),
        info_rate=rng.choice([0.0, 0.02]),
        fail_rate=rng.choice([0.0, 0.03]),
        assign_rate=rng.choice([0.0, 0.02]),
        late_acks=rng.choice([0.0, 0.3]),
        truncate_rate=rng.choice([0.0, 0.01, 0.03]),
        retry_dup_rate=rng.choice([0.0, 0.01]),
    )


def _both_ways(ops: Ops, found: set[str], **opts: Any) -> bool:
    """Assert the native path gives the checker's results; whether it took the history."""
    try:
        want = check_queue(ops, screen=False, **opts)
    except ValueError:
        return False  # a history the checker rejects: test_queue_screen's business
    got = screen.screen_ops(ops, ww_deps=opts.get("ww_deps", True), max_examples=32)
    assert check_queue(ops, **opts) == want, opts
    if got.explained is not None:
        found.update(want["anomaly_types"])
        return True
    return False


def test_acks1_histories_and_mutated_ones_get_the_checkers_results() -> None:
    found: set[str] = set()
    native_runs = 0
    for seed in range(40):
        ops = _acks1(seed)
        for opts in ({}, {"ww_deps": False}, {"max_examples": 3}):
            native_runs += _both_ways(ops, found, **opts)
    for seed in range(300):
        rng = random.Random(seed)
        ops = mutated(seed, seed % 4 == 3, rng, (1, 3))
        for opts in ({}, {"ww_deps": False, "max_examples": 2}):
            native_runs += _both_ways(ops, found, **opts)
    assert native_runs > 400, native_runs
    # Each natively found anomaly was found, and matched, here.
    assert found >= NATIVE, NATIVE - found


def test_a_tie_at_the_lost_write_bound_goes_to_the_checker() -> None:
    """Two ok-read values at the highest offset read: which the checker names depends on
    its set's order, so the native path leaves that history to it."""
    from tests.checkers.hist import H

    h = H()
    h.send(0, "k", 1, 0)
    h.send(0, "k", 2, 1)  # lost: never read
    h.send(1, "k", 3, 2)
    h.poll(2, {"k": [[0, 1], [2, 3]]})
    h.poll(3, {"k": [[2, 4]]})  # a second value at offset 2
    got = screen.screen_ops(h.ops, max_examples=32)
    assert got.explained is None
    want = check_queue(h.ops, screen=False)
    assert {"lost-write", "inconsistent-offsets"} <= set(want["anomaly_types"])
    assert check_queue(h.ops) == want


def test_isrlab_check_prints_and_writes_the_same_bytes_with_anomalies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from tests.checkers.test_queue_load import app

    ops = simulate(
        3000, processes=6, keys=3, seed=4, txn_rate=0.0, truncate_rate=0.01, retry_dup_rate=0.01
    )
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    assert screen.screen_file(p, max_examples=32).explained is not None
    outs = {}
    for natively in (True, False):
        with monkeypatch.context() as m:
            if not natively:
                m.setattr(native, "explain", lambda *a, **k: None)
            d = tmp_path / f"out-{natively}"
            runs = [
                CliRunner().invoke(app, [str(p), "-w", "queue", *extra])
                for extra in (["--json"], [], ["--json", "--out", str(d)])
            ]
        outs[natively] = (
            [(r.exit_code, r.output) for r in runs],
            # (matplotlib's SVGs carry a date and random ids: only their names compare)
            {f.name: b"" if f.suffix == ".svg" else f.read_bytes() for f in sorted(d.iterdir())},
        )
    assert outs[True][0] == outs[False][0]
    assert set(outs[True][1]) == set(outs[False][1])
    differ = sorted(n for n in outs[True][1] if outs[True][1][n] != outs[False][1][n])
    assert differ == [], differ
    assert outs[True][0][0][0] != 0  # invalid
    assert b"lost-write" in outs[True][1]["results.json"]
