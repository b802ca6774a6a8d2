"""broker.log.inventory: what a replica holds (replica-records) and what it truncated away (the
truncation journal), the raw material of the reconciliation of unseen writes (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from isrlab.broker.log.inventory import (
    TRUNCATION_JOURNAL,
    record_truncation,
    replica_records,
    stored_records,
)
from isrlab.broker.log.log import Log, LogConfig
from tests.log.batches import make_batch

CONFIG = LogConfig(segment_bytes=250, retention_ms=-1, file_delete_delay_ms=0)


def filled(tmp_path: Path) -> Log:
    log = Log.open(tmp_path / "t-0", CONFIG)
    for epoch, tag in ((0, 1), (0, 2), (3, 3), (3, 4)):
        log.append_as_leader(make_batch(3, tag=tag, producer_id=7), epoch)
    return log


def test_stored_records_of_every_segment_with_epochs_and_producer(tmp_path: Path) -> None:
    log = filled(tmp_path)
    assert len(log.segments) > 1
    got = stored_records(log.dir)
    assert [r.offset for r in got] == list(range(12))
    assert [r.leader_epoch for r in got] == [0] * 6 + [3] * 6
    assert {r.producer_id for r in got} == {7}
    assert got[4].value is not None and got[4].value.startswith(b"2:1:")
    assert [r.offset for r in stored_records(log.dir, from_offset=5)] == list(range(5, 12))


def test_a_corrupt_batch_is_counted_never_returned(tmp_path: Path) -> None:
    log = filled(tmp_path)
    log.close()
    first = sorted((tmp_path / "t-0").glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the last batch of the first segment
    first.write_bytes(bytes(data))
    rows = list(replica_records(tmp_path))
    offsets = [r["offset"] for r in rows if "offset" in r]
    assert len(offsets) == 9 and rows[-1] == {"topic": "t", "partition": 0, "corrupt_batches": 1}


def test_the_journal_keeps_the_records_a_truncation_cut(tmp_path: Path) -> None:
    log = filled(tmp_path)
    record_truncation(log.dir, "t", 0, log.log_end_offset, 7, 5, "truncate")
    log.truncate_to(7)
    [entry] = [
        json.loads(line) for line in (tmp_path / TRUNCATION_JOURNAL).read_text().splitlines()
    ]
    assert (entry["log_end_offset"], entry["to_offset"], entry["leader_epoch"]) == (12, 7, 5)
    # offset 7 is inside the batch 6..8: the log keeps whole batches, so 6 is cut too
    assert [r[0] for r in entry["records"]] == [6, 7, 8, 9, 10, 11]
    assert entry["records"][0][1:3] == [3, 7] and entry["records"][0][3].startswith("3:0:")
    assert [r.offset for r in stored_records(log.dir)] == list(range(6))


def test_replica_records_command_prints_json_lines(tmp_path: Path) -> None:
    filled(tmp_path).close()
    Log.open(tmp_path / "other-0", CONFIG).close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "isrlab.broker",
            "replica-records",
            "--log-dir",
            str(tmp_path),
            "--topics",
            "t",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in rows] == list(range(12))
    assert rows[0]["topic"] == "t" and rows[0]["leader_epoch"] == 0
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "isrlab.broker",
            "replica-records",
            "--log-dir",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not a directory" in bad.stderr
