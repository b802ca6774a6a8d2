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
