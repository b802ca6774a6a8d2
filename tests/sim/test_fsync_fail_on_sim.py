"""The ``fsync-fail`` nemesis on the simulator (`durable.fsync_fails`, the flag
`nemeses.fsyncshim` watches on real nodes): every fsync of the targets' brokers fails with EIO
until ``stop-fsync-fail``.

It found a bug (session 16): a leader whose flush-policy fsync failed refused the produce but
kept the batch in its log without the producer state that goes with it, so the idempotent
producer's retry was appended again: `idempotence-duplicate` on 20 of 20 seeds of `isrlab sim
--nemesis fsync-fail --flush-policy every-append`. The broker now takes its log dir offline and
halts (`Log._storage_failed`, Kafka's LogDirFailureChannel): the same seeds are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from isrlab.broker.log.log import Log
from isrlab.harness.sim.cli import SIM_DEFAULTS
from isrlab.harness.sim.run import simulate_queue

BASE = {**SIM_DEFAULTS, "nemesis": "fsync-fail", "flush_policy": "every-append"}


@pytest.mark.parametrize("seed", [1, 2])
def test_failed_fsyncs_halt_brokers_and_lose_or_duplicate_nothing(
    tmp_path: Path, seed: int
) -> None:
    run, results = simulate_queue({**BASE, "seed": seed}, tmp_path, report=False)
    assert results["valid"] is True, results["anomaly_types"]
    trace = (Path(run) / "trace.txt").read_text()
    assert "fsync-fail on " in trace and " halted (exit status 1)" in trace


def test_without_the_offline_rule_the_retry_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Log, "_storage_failed", lambda self, exc: None)  # the bug, planted
    _, results = simulate_queue({**BASE, "seed": 1}, tmp_path, report=False)
    assert results["valid"] is False
    assert "idempotence-duplicate" in results["anomaly_types"], results["anomaly_types"]
