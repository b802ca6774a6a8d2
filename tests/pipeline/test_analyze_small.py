"""`isrlab analyze` sized to the store (issue 15): a small store starts Spark for a short job and
shuffles into few partitions, a large one keeps the previous settings; pyspark's pandas warning
has its cause removed (pandas < 3, which pyspark 4 supports). Speed itself is measured by
benchmarks/bench_analyze.py, not here."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest

from isrlab.pipeline import analyze as analyze_mod
from isrlab.pipeline.analyze import SMALL_STORE_RUNS, analyze, shuffle_partitions_for
from isrlab.pipeline.fixtures.synthetic import make_test, write_store

ROOT = Path(__file__).resolve().parents[2]


def test_shuffle_partitions_scale_with_the_runs() -> None:
    assert shuffle_partitions_for(0) == 1
    assert shuffle_partitions_for(1) == 1
    assert shuffle_partitions_for(SMALL_STORE_RUNS) == 1
    assert shuffle_partitions_for(60) == 3
    # Large stores keep the 8 partitions every store had before.
    assert shuffle_partitions_for(176) == 8 and shuffle_partitions_for(5000) == 8


@pytest.mark.parametrize("tuned, small, partitions", [(True, True, "1"), (False, False, "8")])
def test_a_one_run_store_is_analysed_as_a_small_job(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tuned: bool,
    small: bool,
    partitions: str,
) -> None:
    store = tmp_path / "store"
    write_store(store, [make_test(acks="all", nemesis="kill", seed=3)], 300)
    seen: dict[str, Any] = {}

    def session(master: str, *, small: bool = False) -> Any:
        seen["small"] = small
        return spark

    frame = analyze_mod._runs_frame

    def runs_frame(s: Any, rows: list[dict[str, Any]]) -> Any:
        seen["partitions"] = s.conf.get("spark.sql.shuffle.partitions")
        return frame(s, rows)

    monkeypatch.setattr(analyze_mod, "spark_session", session)
    monkeypatch.setattr(analyze_mod, "_runs_frame", runs_frame)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    result = analyze(store, tmp_path / "out", tuned=tuned, report=False)
    assert result.checked == 1
    assert seen == {"small": small, "partitions": partitions}
    assert spark.conf.get("spark.sql.shuffle.partitions") == before  # restored


def test_small_sessions_start_the_jvm_for_a_short_job(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from isrlab.pipeline import spark as spark_mod

    captured: dict[str, str] = {}

    class Builder:
        def master(self, m: str) -> Builder:
            return self

        def appName(self, n: str) -> Builder:
            return self

        def config(self, k: str, v: str) -> Builder:
            captured[k] = v
            return self

        def getOrCreate(self) -> Any:
            raise RuntimeError("not started in this test")

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(SparkSession, "builder", Builder())
    monkeypatch.setattr(spark_mod, "check_java", lambda: "java 17")
    for small in (False, True):
        captured.clear()
        with pytest.raises(spark_mod.SparkUnavailable):
            spark_mod.spark_session("local[2]", small=small)
        opts = captured.get("spark.driver.extraJavaOptions")
        assert (opts == spark_mod.SMALL_STORE_JAVA_OPTIONS) is small
        assert (captured.get("spark.sql.codegen.wholeStage") == "false") is small


def test_no_pandas_warning_from_pyspark() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        require_minimum_pandas_version()
    assert not [w for w in caught if "pandas" in str(w.message)], [str(w.message) for w in caught]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spark_pins = extras["optional-dependencies"]["spark"]
    assert any(p.startswith("pandas") and "<3" in p for p in spark_pins)
