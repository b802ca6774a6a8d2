"""`analyze(store, out)`: the Spark job from a store of runs to the published report.

Stages (each a Spark job over the ``runs`` DataFrame, one row per run, so every run is
handled whole by one task and nothing shuffles the histories):

1. ingest: ``runs`` and ``records`` (pipeline.ingest schemas) written as Parquet under
   ``OUT/parquet/``; each task loads its runs' histories with checkers.history and
   flattens them with `pipeline.ingest.records_of` (mapInArrow);
2. check: each task calls `pipeline.check.check_run` (the checkers' own functions, as
   `isrlab check` does) for its runs; the ``results`` table goes to
   ``OUT/parquet/results``;
3. aggregate: Spark SQL sums per configuration and per (configuration, anomaly type);
   `pipeline.aggregate.summarize` adds rates, intervals and worst runs;
4. publish: ``OUT/anomalies.parquet`` (one row per run and anomaly type, written by
   Spark) and `pipeline.report.write_report` (index.html, plots, summary.csv,
   summary.json).

Run directories must be readable by the executors at the same absolute path (one
machine, or a shared filesystem on a cluster). Malformed runs (bad test.json, missing or
unreadable history) are reported in the summary and skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from rich.console import Console

from checkers.queue.policy import DEFAULT_ALLOWED
from pipeline.aggregate import summarize
from pipeline.check import RESULTS_DDL, check_run, results_table
from pipeline.ingest import RECORDS_DDL, RUNS_DDL, RUNS_SCHEMA, records_of, run_row
from pipeline.spark import StageProgress, spark_session
from pipeline.store import CONFIG_COLUMNS, discover_runs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """What one analysis produced (also written to OUT/summary.json)."""

    store: Path
    out: Path
    runs: int
    checked: int
    malformed: list[dict[str, str]]
    configs: list[dict[str, Any]]
    per_run: list[dict[str, Any]]
    seconds: dict[str, float] = field(default_factory=dict)


def _ingest_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from checkers.history import HistoryError, load_history

    for batch in batches:
        for run_id, path in zip(
            batch.column("run_id").to_pylist(), batch.column("path").to_pylist(), strict=True
        ):
            try:
                ops = load_history(Path(path) / "history.jsonl")
            except HistoryError:
                continue  # the check stage reports it with the reason
            yield from records_of(run_id, ops).to_batches(max_chunksize=65_536)


def _check_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        rows = [
            check_run(run_id, path, orjson.loads(test_json))
            for run_id, path, test_json in zip(
                batch.column("run_id").to_pylist(),
                batch.column("path").to_pylist(),
                batch.column("test_json").to_pylist(),
                strict=True,
            )
        ]
        yield from results_table(rows).to_batches()


def _runs_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    names = RUNS_SCHEMA.names
    df = spark.createDataFrame([tuple(r[n] for n in names) for r in rows], schema=RUNS_DDL)
    # One task per few runs: whole runs per task, enough tasks to balance the cores.
    parallelism = max(1, spark.sparkContext.defaultParallelism)
    return df.repartition(max(1, min(len(rows), parallelism * 8)))


def analyze(
    store: Path,
    out: Path,
    master: str = "local[*]",
    *,
    spark: SparkSession | None = None,
    console: Console | None = None,
    report: bool = True,
) -> Analysis:
    """Analyse every run of `store` into `out` (see the module doc); returns the figures."""
    from pyspark.sql import functions as F

    console = console or Console(stderr=True)
    store = Path(store)
    out = Path(out).resolve()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    runs, bad = discover_runs(store)
    malformed = [{"run_id": b.run_id, "path": str(b.path), "reason": b.reason} for b in bad]
    for b in bad:
        console.print(f"[yellow]skipping malformed run {b.run_id}:[/] {b.reason}")
    out.mkdir(parents=True, exist_ok=True)
    spark = spark or spark_session(master)
    seconds["start"] = time.perf_counter() - t0
    parquet = out / "parquet"
    rows = [run_row(r) for r in runs]
    with StageProgress(spark, console) as progress:
        runs_df = _runs_frame(spark, rows) if rows else None
        t = time.perf_counter()
        if runs_df is not None:
            progress.stage("ingest")
            runs_df.drop("test_json").write.mode("overwrite").parquet(str(parquet / "runs"))
            (
                runs_df.select("run_id", "path")
                .mapInArrow(_ingest_batches, RECORDS_DDL)
                .write.mode("overwrite")
                .parquet(str(parquet / "records"))
            )
        seconds["ingest"] = time.perf_counter() - t
        t = time.perf_counter()
        per_run: list[dict[str, Any]] = []
        configs: list[dict[str, Any]] = []
        if runs_df is not None:
            progress.stage("check")
            (
                runs_df.select("run_id", "path", "test_json")
                .mapInArrow(_check_batches, RESULTS_DDL)
                .write.mode("overwrite")
                .parquet(str(parquet / "results"))
            )
            seconds["check"] = time.perf_counter() - t
            t = time.perf_counter()
            progress.stage("aggregate")
            results = spark.read.parquet(str(parquet / "results"))
            meta = spark.read.parquet(str(parquet / "runs")).select(
                "run_id", "path", *CONFIG_COLUMNS
            )
            # Small from here on (one row per run): cached, as every figure reads it.
            joined = results.drop("results_json").join(F.broadcast(meta), "run_id").cache()
            # Malformed runs are listed apart; configurations count checked runs only.
            checked_df = joined.where(F.col("status") == "checked")
            config_sums = checked_df.groupBy(*CONFIG_COLUMNS).agg(
                F.count("*").alias("runs"),
                F.sum(F.when(F.col("valid") == "true", 1).otherwise(0)).alias("valid"),
                F.sum(F.when(F.col("valid") == "false", 1).otherwise(0)).alias("invalid"),
                F.sum(F.when(F.col("valid") == "unknown", 1).otherwise(0)).alias("unknown"),
                F.coalesce(F.sum("acked_writes"), F.lit(0)).alias("acked_writes"),
            )
            exploded = checked_df.select(
                "run_id",
                "path",
                *CONFIG_COLUMNS,
                "acked_writes",
                "anomaly_examples",
                F.explode("anomaly_counts").alias("type", "count"),
            )
            type_sums = exploded.groupBy(*CONFIG_COLUMNS, "type").agg(
                F.sum("count").alias("count"), F.count("*").alias("runs_with")
            )
            allowed = F.col("type").isin(sorted(DEFAULT_ALLOWED))
            (
                exploded.select(
                    "run_id",
                    *CONFIG_COLUMNS,
                    "type",
                    "count",
                    (~allowed).alias("invalidating"),
                    "acked_writes",
                    F.when(
                        F.col("acked_writes") > 0,
                        F.col("count") / F.col("acked_writes") * 10_000,
                    ).alias("rate_per_10k"),
                    F.col("anomaly_examples")[F.col("type")].alias("example"),
                    F.concat(F.col("path"), F.lit("/report.html")).alias("report"),
                )
                .coalesce(1)
                .write.mode("overwrite")
                .parquet(str(out / "anomalies.parquet"))
            )
            run_rows = joined.select(
                "run_id",
                "path",
                *CONFIG_COLUMNS,
                "status",
                "error",
                "valid",
                "ops",
                "acked_writes",
                "anomaly_counts",
            ).collect()
            per_run = sorted((r.asDict() for r in run_rows), key=lambda r: r["run_id"])
            for r in per_run:
                r["anomaly_counts"] = dict(sorted((r["anomaly_counts"] or {}).items()))
                r["invalid_count"] = sum(
                    n for t, n in r["anomaly_counts"].items() if t not in DEFAULT_ALLOWED
                )
                if r["status"] != "checked":
                    console.print(f"[yellow]skipping malformed run {r['run_id']}:[/] {r['error']}")
                    malformed.append(
                        {"run_id": r["run_id"], "path": r["path"], "reason": r["error"] or ""}
                    )
            configs = summarize(
                [r.asDict() for r in config_sums.collect()],
                [r.asDict() for r in type_sums.collect()],
                per_run,
            )
            joined.unpersist()
            seconds["aggregate"] = time.perf_counter() - t
    checked = sum(1 for r in per_run if r["status"] == "checked")
    analysis = Analysis(
        store=store.resolve(),
        out=out,
        runs=len(runs) + len(bad),
        checked=checked,
        malformed=sorted(malformed, key=lambda m: m["run_id"]),
        configs=configs,
        per_run=per_run,
        seconds=seconds,
    )
    if report:
        from pipeline.report import write_report

        t = time.perf_counter()
        write_report(analysis)
        seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    return analysis
