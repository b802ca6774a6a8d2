"""Starting Spark for the pipeline, and watching its stages.

`spark_session(master)` starts (or reuses) a SparkSession. The embedded default is
``local[*]``: Spark in this process's JVM, started by the command itself; any other
master (``spark://host:7077``, ``yarn``...) runs the same job on a cluster. Before the
JVM is launched, `check_java()` turns a missing or too old Java into a `SparkUnavailable`
with the fix, instead of a py4j traceback. Python workers run this interpreter
(PYSPARK_PYTHON), so they import the same checkers the driver does.

`StageProgress` polls Spark's status tracker from a daemon thread and shows each
running stage's completed/total tasks with rich.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SMALL_STORE_JAVA_OPTIONS",
    "SparkUnavailable",
    "StageProgress",
    "check_java",
    "spark_session",
]


class SparkUnavailable(Exception):
    """Spark cannot start here; the message says why and what to do."""


def check_java() -> str:
    """The `java -version` banner; raises SparkUnavailable when Java 17+ is not usable."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailable(
            "Java was not found (Spark needs a Java 17 or 21 runtime): install one, e.g. "
            "`apt-get install openjdk-17-jre-headless`, or set JAVA_HOME"
        )
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkUnavailable(f"{java} -version failed: {e}; check the Java install") from None
    banner = (proc.stderr or proc.stdout).strip()
    m = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    if proc.returncode != 0 or not m:
        raise SparkUnavailable(f"{java} does not run: {banner[:200]}")
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    if major < 17:
        raise SparkUnavailable(
            f"{java} is Java {major}; Spark 4 needs Java 17 or newer (set JAVA_HOME to one)"
        )
    return banner.splitlines()[0]


#: JVM options of an embedded (local) Spark started for a small store: the C1 compiler only
#: and the serial collector. Such a run is over before C2 pays for itself, and the JVM's own
#: start-up and first queries are most of its time; large stores keep the JVM's defaults.
SMALL_STORE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_session(
    master: str = "local[*]", app_name: str = "isrlab-analyze", *, small: bool = False
) -> SparkSession:
    """A SparkSession on `master`; reuses the active one (tests share one per session).

    `small` (a store of few runs, local masters only): start the JVM for a short job
    (`SMALL_STORE_JAVA_OPTIONS`) and run Spark SQL without whole-stage code generation, whose
    compilation costs more than it saves on one row per run."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(
            "pyspark is not installed: pip install 'isrlab[spark]' (pyspark, pyarrow, pandas)"
        ) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master.startswith("local"):
        check_java()
    # Workers must run this interpreter, which has isrlab and pyarrow installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.session.timeZone", "UTC")
        # One Python worker per core, kept between tasks: start-up is costly here.
        .config("spark.python.worker.reuse", "true")
    )
    if master.startswith("local"):
        builder = builder.config("spark.ui.enabled", "false").config(
            "spark.driver.memory", os.environ.get("ISRLAB_SPARK_DRIVER_MEMORY", "4g")
        )
        if small:
            builder = builder.config(
                "spark.driver.extraJavaOptions", SMALL_STORE_JAVA_OPTIONS
            ).config("spark.sql.codegen.wholeStage", "false")
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # py4j / JVM launch errors have many types
        raise SparkUnavailable(f"Spark did not start on {master}: {e}") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class StageProgress:
    """Context manager: a live line per running Spark stage (tasks done / total)."""

    def __init__(self, spark: SparkSession, console: Console | None = None, every: float = 0.5):
        self.spark = spark
        self.every = every
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress: Progress | None = None
        self._tasks: dict[int, Any] = {}
        self.label = "spark"

    def stage(self, label: str) -> None:
        """Name what the following Spark jobs do (shown next to their stage ids)."""
        self.label = label
        if not self.enabled:
            self.console.print(f"[dim]{label}...[/]")

    def _poll(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        assert self._progress is not None
        while not self._stop.wait(self.every):
            try:
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is None:
                        continue
                    task = self._tasks.get(sid)
                    if task is None:
                        task = self._tasks[sid] = self._progress.add_task(
                            f"{self.label} (stage {sid})", total=info.numTasks
                        )
                    self._progress.update(task, completed=info.numCompletedTasks)
                for sid, task in list(self._tasks.items()):
                    info = tracker.getStageInfo(sid)
                    if info is not None and sid not in tracker.getActiveStageIds():
                        self._progress.update(task, completed=info.numTasks)
            except Exception:
                # The JVM is going away (shutdown or error): progress is best effort.
                return

    def __enter__(self) -> StageProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._progress is not None:
            self._progress.stop()
