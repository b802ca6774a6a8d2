"""Log cleaner throughput on a 1M-record compacted topic, next to a plain copy of the same segments.

A partition log (``cleanup.policy=compact``, ``--segment-mb`` 16 MiB segments) gets ``--records`` records cycling
over ``--keys`` keys (``--value-size``-byte values, batches of 100). Then, in one run:

- baseline: the segments the cleaner will rewrite (every one but the active segment) are copied
  file by file (``shutil.copyfile``: read + write, no parsing), and the copies fsynced, as the
  cleaner fsyncs its output;
- the cleaner (``LogCleaner.clean_once``): offset map over the dirty section, rewrite, index
  rebuild, fsync and swap, the whole cleaning.

Both read the same files from the page cache, each round from its own copy of the log.
Throughput is the bytes of those segments over the median elapsed time of ``--rounds`` runs; the cleaner's figure also covers its map pass (it reads them twice), as
Kafka's "cleaned ... MB/s" does. The record scan is ``broker/log/_cleaner_scan.pyx`` when built
(``make build``), else (or with ``--python``) the Python twin in ``cleaner_records.py``; the
run says which.

    python benchmarks/bench_cleaner.py [--records 1000000] [--keys 10000] [--value-size 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from isrlab.broker.log import cleaner_records  # noqa: E402
from isrlab.broker.log.cleaner import CleanerConfig, LogCleaner  # noqa: E402
from isrlab.broker.log.log import Log, LogConfig  # noqa: E402
from tests.log.compaction import fill_keyed, read_all  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-size", type=int, default=50)
    parser.add_argument("--segment-mb", type=int, default=16, help="segment.bytes in MiB")
    parser.add_argument("--rounds", type=int, default=5, help="median over this many runs")
    parser.add_argument(
        "--python", action="store_true", help="use the Python record scan even if C is built"
    )
    parser.add_argument("--check", action="store_true", help="also read the log back and check it")
    args = parser.parse_args()
    if min(args.records, args.keys, args.segment_mb, args.rounds) < 1 or args.value_size < 0:
        parser.error(
            "--records, --keys, --segment-mb and --rounds must be at least 1, --value-size >= 0"
        )

    if args.python:
        cleaner_records.OffsetMap = cleaner_records.PyOffsetMap
        cleaner_records.map_batches = cleaner_records.py_map_batches
        cleaner_records.map_records = cleaner_records.py_map_records
        cleaner_records.filter_batches = cleaner_records.py_filter_batches
        cleaner_records.filter_records = cleaner_records.py_filter_records
        cleaner_records.NATIVE = False

    with tempfile.TemporaryDirectory(prefix="bench-cleaner-") as tmp:
        base = Path(tmp)
        config = LogConfig(
            segment_bytes=args.segment_mb * 1024 * 1024,
            cleanup_policy=("compact",),
        )  # file.delete.delay.ms as in Kafka: the old segments go a minute later, not timed
        log = Log.open(base / "compacted-0", config)
        t0 = time.perf_counter()
        latest = fill_keyed(log, args.records, args.keys, value_size=args.value_size)
        fill_s = time.perf_counter() - t0
        segments = log.segments[:-1]
        size = sum(segment.size for segment in segments)
        print(
            f"log: {args.records:,} records over {args.keys:,} keys, {log.size_in_bytes / 1e6:.1f} MB "
            f"in {len(log.segments)} segments (filled in {fill_s:.1f} s); "
            f"{len(segments)} segments ({size / 1e6:.1f} MB) to clean"
        )

        log.close()
        # Every round works on its own copy of the log (made untimed): a log is cleaned once.
        # The machine is shared, so each figure is the median over the rounds.
        copy_times: list[float] = []
        clean_times: list[float] = []
        results = []
        for i in range(args.rounds):
            directory = base / f"round{i}" / "compacted-0"
            shutil.copytree(log.dir, directory)
            target_dir = base / f"round{i}" / "copies"
            target_dir.mkdir()
            t0 = time.perf_counter()
            for segment in segments:
                target = target_dir / segment.log_file.name
                shutil.copyfile(directory / segment.log_file.name, target)
                fd = os.open(target, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            copy_times.append(time.perf_counter() - t0)

            copy_log = Log.open(directory, config)
            logs = {("compacted", 0): copy_log}
            cleaner = LogCleaner(directory.parent, CleanerConfig(), logs=lambda logs=logs: logs)
            t0 = time.perf_counter()
            result = cleaner.clean_once()
            clean_times.append(time.perf_counter() - t0)
            assert result is not None
            results.append(result.stats)
            if args.check and i == 0:
                records = read_all(copy_log)
                got = {key: (offset, value) for offset, key, value, _ in records}
                assert got == latest, "a key's latest value is missing after cleaning"
                print(f"checked: {len(records):,} records read back, the latest of every key")
            copy_log.close()

        copy_s = statistics.median(copy_times)
        clean_s = statistics.median(clean_times)
        stats = results[0]
        copy_rate = size / 1e6 / copy_s
        clean_rate = size / 1e6 / clean_s
        scan = "Cython (_cleaner_scan)" if cleaner_records.NATIVE else "Python (cleaner_records)"
        print(f"record scan: {scan}; median of {args.rounds} rounds")
        print(f"plain copy:  {size / 1e6:8.1f} MB in {copy_s:6.3f} s = {copy_rate:8.1f} MB/s")
        print(
            f"cleaner:     {size / 1e6:8.1f} MB in {clean_s:6.3f} s = {clean_rate:8.1f} MB/s "
            f"({stats.records_read:,} records read, {stats.records_kept:,} kept, "
            f"{stats.bytes_written / 1e6:.2f} MB written)"
        )
        print(
            "rounds (copy / clean s): "
            + ", ".join(f"{c:.3f}/{k:.3f}" for c, k in zip(copy_times, clean_times, strict=True))
        )
        print(f"ratio cleaner / copy (medians): {clean_rate / copy_rate:.3f} (target >= 0.3)")
        best = min(copy_times) / min(clean_times)
        print(
            f"ratio cleaner / copy (best rounds): {best:.3f} "
            f"(copy {size / 1e6 / min(copy_times):.1f} MB/s, "
            f"cleaner {size / 1e6 / min(clean_times):.1f} MB/s)"
        )
        print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
