"""CI's seed sweep: `isrlab sim` over 300 seeds of the safe configuration (acks=all,
idempotent producers, min.insync.replicas=2, clean elections, leader-epoch truncation) under
the default partition and kill schedule, short runs with a fault every 1.5 virtual seconds.
Every seed must be valid: an invalid one prints the command that replays it. This is the
simulator's regression net for the broker's safety rules (the full 200-seed default run is
`make sim-seeds`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SEEDS = 300


def test_the_safe_configuration_is_valid_over_300_short_seeds(tmp_path: Path) -> None:
    isrlab = Path(sys.executable).parent / "isrlab"
    args = [str(isrlab), "sim", "--seeds", f"1-{SEEDS}", "--workers", "2"]
    args += ["--time-limit", "6", "--nemesis-interval", "1.5", "--store", str(tmp_path)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    print(out[-3000:])
    assert r.returncode == 0, out[-3000:]
    assert f"{SEEDS} of {SEEDS} seeds run" in out and f"valid {SEEDS} " in out


def test_group_offsets_cleaned_under_faults_stay_valid(tmp_path: Path) -> None:
    """The group workload with `__consumer_offsets` in 1 KiB segments, so that every broker's
    cleaner compacts the group's offsets partition while the nemesis kills and partitions,
    its steps interleaved with the rest of the broker (`LogCleaner.interleave`): every seed
    valid (no `committed-offset-regression`), and the cleaner ran in each."""
    isrlab = Path(sys.executable).parent / "isrlab"
    args = [str(isrlab), "sim", "--seeds", "1-4", "--workers", "2", "--store", str(tmp_path)]
    args += ["--subscribe", "--commit-p", "0.5"]
    args += ["--broker-config", "offsets.topic.segment.bytes=1024"]
    args += ["--broker-config", "log.cleaner.backoff.ms=500"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    print(out[-3000:])
    assert r.returncode == 0, out[-3000:]
    assert "4 of 4 seeds run" in out and "valid 4 " in out
    logs = sorted(tmp_path.rglob("sim.log"))
    assert len(logs) == 4
    for log in logs:
        assert "Cleaned __consumer_offsets-" in log.read_text(), log
