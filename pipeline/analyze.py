"""`analyze(store, out)`: the Spark job from a store of runs to the published report.

Stages (the first is one Spark job over the ``runs`` DataFrame, one row per run, so
every run is handled whole by one task and nothing shuffles the histories):

1. ingest + check: the ``runs`` table is written as Parquet under ``OUT/parquet/runs``;
   then each task, for each of its runs, loads the history once with checkers.history,
   writes its ``records`` (pipeline.ingest schema, flattened by
   `pipeline.ingest.records_of`) as one Parquet file of ``OUT/parquet/records/`` with
   pyarrow, and checks it with `pipeline.check.check_run` (the checkers' own
   functions, as `isrlab check` does); the ``results`` rows come back through
   mapInArrow and Spark writes them to ``OUT/parquet/results``. Writing records from
   the task (not through Spark's writer) saves parsing every history twice and
   moving tens of millions of rows through the JVM;
2. aggregate: Spark SQL sums per configuration and per (configuration, anomaly type);
   `pipeline.aggregate.summarize` adds rates, intervals and worst runs;
3. publish: ``OUT/anomalies.parquet`` (one row per run and anomaly type, written by
   Spark) and `pipeline.report.write_report` (index.html, plots, summary.csv,
   summary.json).

Run directories must be readable by the executors at the same absolute path (one
machine, or a shared filesystem on a cluster). Malformed runs (bad test.json, missing or
unreadable history) are reported in the summary and skipped.
"""

from __future__ import annotations

import re
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from rich.console import Console

from isrlab.checkers.queue.policy import DEFAULT_ALLOWED
from isrlab.pipeline.aggregate import summarize
from isrlab.pipeline.check import RESULTS_DDL, check_run, results_table
from isrlab.pipeline.ingest import RUNS_DDL, RUNS_SCHEMA, records_of, run_row
from isrlab.pipeline.spark import StageProgress, spark_session
from isrlab.pipeline.store import CONFIG_COLUMNS, discover_runs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SMALL_STORE_RUNS", "Analysis", "analyze", "shuffle_partitions_for"]


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


def _file_name(run_id: str) -> str:
    """A flat, unique Parquet file name for a run id (``a/b`` -> ``a__b-<crc>.parquet``)."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", run_id)
    return f"{safe}-{zlib.crc32(run_id.encode()):08x}.parquet"


def _ingest_and_check(
    records_dir: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Per run: load once, write its records file, check; yield the results rows."""
    import pyarrow.parquet as pq

    for batch in batches:
        rows = []
        for run_id, path, test_json in zip(
            batch.column("run_id").to_pylist(),
            batch.column("path").to_pylist(),
            batch.column("test_json").to_pylist(),
            strict=True,
        ):

            def write_records(ops: list[dict[str, Any]], run_id: str = run_id) -> None:
                table = records_of(run_id, ops)
                target = Path(records_dir) / _file_name(run_id)
                tmp = target.parent / f".{target.name}.tmp"  # hidden from Parquet readers
                pq.write_table(table, tmp)
                tmp.replace(target)  # readers never see half a file

            rows.append(check_run(run_id, path, orjson.loads(test_json), write_records))
        yield from results_table(rows).to_batches()


def _runs_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    names = RUNS_SCHEMA.names
    df = spark.createDataFrame([tuple(r[n] for n in names) for r in rows], schema=RUNS_DDL)
    # One task per few runs: whole runs per task, enough tasks to balance the cores.
    parallelism = max(1, spark.sparkContext.defaultParallelism)
    return df.repartition(max(1, min(len(rows), parallelism * 8)))


#: A store of at most this many runs is small: `analyze` starts Spark for a short job
#: (`spark_session(small=True)`) and shuffles into fewer partitions.
SMALL_STORE_RUNS = 20


def shuffle_partitions_for(runs: int) -> int:
    """Spark SQL shuffle partitions for a store of `runs` runs.

    The shuffles here (aggregation, join) move one small row per run, so partitions only add
    tasks: one per 25 runs, at most 8 (what every store used before, and still uses from 176
    runs up). A one-run store then shuffles into one partition instead of eight."""
    return max(1, min(8, -(-runs // 25)))


def analyze(
    store: Path,
    out: Path,
    master: str = "local[*]",
    *,
    spark: SparkSession | None = None,
    console: Console | None = None,
    report: bool = True,
    tuned: bool = True,
) -> Analysis:
    """Analyse every run of `store` into `out` (see the module doc); returns the figures.

    Sized to the store (`tuned`): `shuffle_partitions_for` its runs is set on the session for
    this analysis (and restored afterwards), and a store of at most `SMALL_STORE_RUNS` runs
    starts its own Spark with `spark_session(small=True)`. `tuned=False` keeps the settings
    every store had before (8 shuffle partitions, the JVM's defaults): the benchmark's
    baseline (benchmarks/bench_analyze.py)."""
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
    n_runs = len(runs) + len(bad)
    spark = spark or spark_session(master, small=tuned and n_runs <= SMALL_STORE_RUNS)
    seconds["start"] = time.perf_counter() - t0
    previous = spark.conf.get("spark.sql.shuffle.partitions") or "200"  # Spark's default
    n_shuffle = shuffle_partitions_for(len(runs)) if tuned else 8
    spark.conf.set("spark.sql.shuffle.partitions", str(n_shuffle))
    try:
        parquet = out / "parquet"
        rows = [run_row(r) for r in runs]
        with StageProgress(spark, console) as progress:
            runs_df = _runs_frame(spark, rows) if rows else None
            t = time.perf_counter()
            per_run: list[dict[str, Any]] = []
            configs: list[dict[str, Any]] = []
            if runs_df is not None:
                progress.stage("ingest + check")
                runs_df.drop("test_json").write.mode("overwrite").parquet(str(parquet / "runs"))
                records_dir = parquet / "records"
                shutil.rmtree(records_dir, ignore_errors=True)
                records_dir.mkdir(parents=True)
                (
                    runs_df.select("run_id", "path", "test_json")
                    .mapInArrow(partial(_ingest_and_check, str(records_dir)), RESULTS_DDL)
                    .write.mode("overwrite")
                    .parquet(str(parquet / "results"))
                )
                seconds["ingest_check"] = time.perf_counter() - t
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
                class_sums = (
                    checked_df.select(
                        *CONFIG_COLUMNS, F.explode("unseen_classes").alias("class", "count")
                    )
                    .groupBy(*CONFIG_COLUMNS, "class")
                    .agg(F.sum("count").alias("count"))
                )
                contested_sums = (
                    checked_df.select(
                        *CONFIG_COLUMNS, F.explode("contested_classes").alias("class", "count")
                    )
                    .groupBy(*CONFIG_COLUMNS, "class")
                    .agg(F.sum("count").alias("count"))
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
                        console.print(
                            f"[yellow]skipping malformed run {r['run_id']}:[/] {r['error']}"
                        )
                        malformed.append(
                            {"run_id": r["run_id"], "path": r["path"], "reason": r["error"] or ""}
                        )
                configs = summarize(
                    [r.asDict() for r in config_sums.collect()],
                    [r.asDict() for r in type_sums.collect()],
                    per_run,
                    unseen_classes=[r.asDict() for r in class_sums.collect()],
                    contested_classes=[r.asDict() for r in contested_sums.collect()],
                )
                joined.unpersist()
                seconds["aggregate"] = time.perf_counter() - t
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
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
        from isrlab.pipeline.report import write_report

        t = time.perf_counter()
        write_report(analysis)
        seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    return analysis
