"""One seed, one history, whatever the interpreter's hash seed.

Python draws the seed of its string hashes at start-up (PYTHONHASHSEED unset), so the order
of a set of strings differs between two processes. A simulated run must not depend on it:
`isrlab sim --seed N` in another process (a replay, a CI run, a worker of a pool) has to give
the history the first one gave. Seed 2 of the isr-squeeze power schedule restarts a broker
that learns its topics as a set of names; when it started their partitions in the set's
order, its replica fetchers connected in a hash-seed order and the histories differed. The
event traces are compared as well (the simulated kazoo client called a path's watchers in the
order of their addresses, which moves from one process to the next)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ARGS = ["--seed", "2", "--nemesis", "isr-squeeze", "--squeeze-then", "power"]


def _history_sha(tmp: Path, hash_seed: int) -> str:
    store = tmp / f"h{hash_seed}"
    code = (
        "import sys; from isrlab.harness.cli import main; "
        f"sys.argv = ['isrlab', 'sim', '--workers', '1', '--store', {str(store)!r}, *{ARGS!r}]; "
        "main()"
    )
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (history,) = store.glob("*/seed-2/history.jsonl")
    trace = history.with_name("trace.txt")
    return (
        hashlib.sha256(history.read_bytes()).hexdigest()
        + "/"
        + hashlib.sha256(trace.read_bytes()).hexdigest()
    )


def test_a_seed_gives_one_history_under_different_hash_seeds(tmp_path: Path) -> None:
    shas = {h: _history_sha(tmp_path, h) for h in (1, 2, 3)}
    assert len(set(shas.values())) == 1, shas
