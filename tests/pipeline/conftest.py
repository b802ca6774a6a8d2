"""Shared fixtures: one local[1] SparkSession and one small synthetic store per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from isrlab.pipeline.fixtures.synthetic import make_test, write_store

SMALL_OPS = 1500


def small_store_tests() -> list[dict[str, Any]]:
    return [
        make_test(acks="0", nemesis="partition", seed=1),
        make_test(acks="1", nemesis="partition", seed=2),
        make_test(acks="1", nemesis="partition", seed=3, repeat=1),
        make_test(acks="1", nemesis="clock", seed=4),
        make_test(acks="all", nemesis="partition", seed=5),
        make_test(acks="all", nemesis="kill", seed=6),
        make_test(acks="all", nemesis="partition", seed=7, min_insync_replicas=1),
        # a run whose processes subscribed: the report's consumer column tells it apart
        make_test(acks="all", nemesis="kill", seed=8, subscribe=True),
    ]


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    write_store(root, small_store_tests(), SMALL_OPS)
    # Malformed runs: each must be reported and skipped, never fatal.
    bad_json = root / "bad-json" / "1"
    bad_json.mkdir(parents=True)
    (bad_json / "test.json").write_text("{not json")
    no_history = root / "no-history" / "1"
    no_history.mkdir(parents=True)
    (no_history / "test.json").write_text('{"acks": "1"}')
    broken = root / "broken-history" / "1"
    broken.mkdir(parents=True)
    (broken / "test.json").write_text('{"acks": "1", "workload": "queue"}')
    (broken / "history.jsonl").write_text('{"index": 0, "time": 1, "type": "ok"}\n')
    # One run with a report.html, to check the published link points at it.
    first = sorted(root.glob("acks-0_*/*"))[0]
    (first / "report.html").write_text("<html>run report</html>")
    return root


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from isrlab.pipeline.spark import spark_session

    session = spark_session("local[1]", app_name="isrlab-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def analysis(spark: Any, store: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from isrlab.pipeline.analyze import analyze

    out = tmp_path_factory.mktemp("analysis")
    return analyze(store, out, spark=spark)
