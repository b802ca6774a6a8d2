"""Planted bugs (benchmarks/planted_bugs.py) are found by the simulator: three of the
catalogue's one-line broker bugs, applied only while the test runs, each make a seeded
simulated queue test fail (the checker's INVALID or an invariant violation) where the same
configuration and seed on the unpatched broker is valid."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from isrlab.harness.sim.shrink import run_once

ROOT = Path(__file__).resolve().parents[2]


def _planted_bugs() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "planted_bugs", ROOT / "benchmarks" / "planted_bugs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("planted_bugs", module)
    spec.loader.exec_module(module)
    return module


pb = _planted_bugs()


@pytest.mark.parametrize(
    ("bug", "seed", "found_as"),
    [
        # the HW taken as the max of the ISR's LEOs: an ISR member's log ends below the HW
        ("hw-max", 1, "invariant:isr-member-below-hw"),
        # acks=all answered at once: acknowledged writes lost at a failover
        ("acks-all-as-1", 3, "lost-write"),
        # a follower that keeps no producer state leads after a kill: the producer's retry of
        # a batch the follower already had is appended again
        ("follower-no-producer-state", 4, "idempotence-duplicate"),
    ],
)
def test_a_planted_bug_is_found_and_the_unpatched_broker_is_valid(
    tmp_path: Path, bug: str, seed: int, found_as: str
) -> None:
    planted = pb.BY_NAME[bug]
    overrides = {**pb.BASE, **planted.overrides, "seed": seed}
    original = pb._target(planted)[2]
    with pb.planted(planted):
        assert pb._target(planted)[2] is not original
        broken = run_once(overrides, tmp_path / "patched")
    assert pb._target(planted)[2] is original  # put back
    assert broken.failed and found_as in broken.kinds(), broken
    clean = run_once(overrides, tmp_path / "unpatched")
    assert clean.valid is True and clean.violation is None, clean


def test_every_planted_bug_is_one_line_of_the_current_source() -> None:
    for bug in pb.BUGS:
        d = pb.diff(bug)
        assert sum(1 for line in d.splitlines() if line.startswith("-") and "---" not in line) == 1
        with pb.planted(bug):
            pass
