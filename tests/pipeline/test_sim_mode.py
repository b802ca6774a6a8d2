"""The pipeline reads `isrlab sim`'s runs like real runs, with a ``mode`` column: ``sim`` for a
test.json that says ``"mode": "sim"``, ``real`` for one without the key (every run before the
simulator)."""

from __future__ import annotations

import csv
from typing import Any

import pyarrow.parquet as pq
import pytest

from isrlab.pipeline.fixtures.synthetic import make_test, write_run
from isrlab.pipeline.report import switch_tables
from isrlab.pipeline.store import CONFIG_COLUMNS, config_of, run_mode

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


def test_mode_is_a_grouping_column_absent_meaning_real() -> None:
    assert "mode" in CONFIG_COLUMNS and CONFIG_COLUMNS[0] == "workload"
    assert config_of({"acks": "1"})["mode"] == "real"
    assert config_of({"acks": "1", "mode": "real"})["mode"] == "real"
    assert config_of({"acks": "1", "mode": "sim"})["mode"] == "sim"
    assert run_mode({"simulated": True}) == "sim"  # (test.json before the mode key)
    from isrlab.harness.sim.run import sim_test

    assert run_mode(sim_test({"seed": 1})) == "sim"


def test_switch_tables_pool_by_mode() -> None:
    def cfg(mode: str | None, count: int) -> dict[str, Any]:
        c = {
            **config_of({"acks": "1", **({"mode": mode} if mode else {})}),
            "runs": 1,
            "acked_writes": 100,
            "invalid": {"count": count},
            "anomalies": {},
        }
        if mode is None:
            del c["mode"]  # a configuration from before the column
        return c

    table = switch_tables([cfg("sim", 5), cfg(None, 0)])["mode"]
    cells = {row["value"]: row["cells"]["1"] for row in table["rows"]}
    assert list(cells) == ["real", "sim"]
    assert cells["sim"]["count"] == 5 and cells["real"]["count"] == 0


def test_a_sim_run_is_analysed_beside_a_real_one(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from isrlab.harness.sim.cli import SeedJob, run_seed
    from isrlab.pipeline.analyze import analyze

    store = tmp_path_factory.mktemp("sim-store")
    real = write_run(store, make_test(acks="1", nemesis="kill", seed=1), 600)
    sim = run_seed(
        SeedJob(
            seed=2,
            overrides={
                "name": "sim_acks-1_kill",
                "seed": 2,
                "acks": "1",
                "nemesis": "kill",
                "concurrency": 3,
                "rate": 30,
                "key_count": 1,
                "time_limit": 6,
                "recovery_time": 2,
                "final_time_limit": 10,
            },
            run_dir=str(store / "sim_acks-1_kill" / "seed-2"),
            check_invariants=False,
        )
    )
    assert sim.status in ("valid", "invalid"), sim
    analysis = analyze(store, tmp_path_factory.mktemp("sim-analysis"), spark=spark)
    assert analysis.checked == 2 and not analysis.malformed
    modes = {r["run_id"]: r["mode"] for r in analysis.per_run}
    assert modes == {
        real.relative_to(store).as_posix(): "real",
        "sim_acks-1_kill/seed-2": "sim",
    }
    # the same configuration otherwise: two configurations, one per mode
    assert sorted((c["mode"], c["acks"], c["nemesis"]) for c in analysis.configs) == [
        ("real", "1", "kill"),
        ("sim", "1", "kill"),
    ]
    runs = pq.read_table(analysis.out / "parquet" / "runs").to_pylist()
    assert {r["run_id"]: r["mode"] for r in runs} == modes
    with (analysis.out / "summary.csv").open() as fh:
        assert sorted(r["mode"] for r in csv.DictReader(fh)) == ["real", "sim"]
    html = (analysis.out / "index.html").read_text()
    assert "<h3>mode</h3>" in html and "sim, min.insync=2" in html
