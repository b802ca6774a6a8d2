"""spark-submit entry point: the same analysis job, with the master spark-submit chose.

    spark-submit --master spark://host:7077 \\
        --conf spark.pyspark.python=/opt/isrlab/.venv/bin/python \\
        "$(python -c 'import isrlab.pipeline.submit as m; print(m.__file__)')" STORE --out DIR

Unlike `isrlab analyze --master`, this takes the SparkSession spark-submit configured
(master, executors, memory) instead of building one. Exit codes as `isrlab analyze`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="isrlab.pipeline.submit", description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path, help="store of run directories (shared filesystem)")
    ap.add_argument("--out", type=Path, help="report directory (default: STORE/analysis)")
    args = ap.parse_args(argv)
    err = Console(stderr=True)
    from pyspark.sql import SparkSession

    from isrlab.pipeline.analyze import analyze
    from isrlab.pipeline.spark import SparkUnavailable
    from isrlab.pipeline.store import StoreError

    spark = SparkSession.builder.appName("isrlab-analyze").getOrCreate()
    try:
        analysis = analyze(args.store, args.out or args.store / "analysis", spark=spark)
    except (StoreError, SparkUnavailable) as e:
        err.print(f"error: {e}", highlight=False, markup=False)
        return 2
    finally:
        spark.stop()
    print(f"{analysis.checked} runs checked; report: {analysis.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
