"""A power loss says what it cut: before apply_power_loss cuts back or deletes a partition's
segment, the records it loses go to the log dir's truncation journal (kind power-loss), so the
reconciliation of unseen writes (checkers/unseen.py) classes them as truncated on that node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.log import durable
from isrlab.broker.log.durable import apply_power_loss
from isrlab.broker.log.inventory import TRUNCATION_JOURNAL, replica_records, stored_records
from isrlab.broker.log.log import Log, LogConfig
from isrlab.checkers.unseen import classify, load_replicas


@pytest.fixture
def root(journaled_dir: Path) -> Path:
    return journaled_dir  # (tests/broker/conftest.py)


def batch(values: list[int], epoch_tag: int = 0) -> bytes:
    """One batch whose values are decimal integers, as the harness writes them."""
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for v in values:
        assert b.append(1_000 + v, b"k", str(v).encode()) is not None
    b.close()
    return bytes(b.buffer())


def journal(root: Path) -> list[dict[str, Any]]:
    path = root / TRUNCATION_JOURNAL
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def values(part: Path) -> set[str]:
    return {r.value.decode() for r in stored_records(part) if r.value is not None}


def test_the_records_a_power_loss_cuts_are_journaled_and_classed_truncated(
    root: Path, tmp_path: Path
) -> None:
    part = root / "t-0"
    lg = Log.open(part, LogConfig(segment_bytes=400))
    for i in range(3):
        lg.append_as_leader(batch([3 * i, 3 * i + 1, 3 * i + 2]), 0)
    lg.flush()
    for i in range(3, 12):  # past the flush: a tail of the active segment, then new segments
        lg.append_as_leader(batch([3 * i, 3 * i + 1, 3 * i + 2]), 0)
    assert len(list(part.glob("*.log"))) > 2
    before = values(part)
    lg.close_without_flush()  # kill -9
    report = apply_power_loss(root)
    assert report.truncated or report.deleted or report.emptied
    after = values(part)
    lost = before - after
    assert lost and {str(v) for v in range(9)} <= after
    entries = journal(root)
    assert entries and {e["kind"] for e in entries} == {"power-loss"}
    assert all((e["topic"], e["partition"]) == ("t", 0) for e in entries)
    cut = [r for e in entries for r in e["records"]]
    assert sorted(str(r[3]) for r in cut) == sorted(lost)  # each lost record once, no other
    # the cut starts where what the log kept ends (a roll flushed the segments before it)
    assert min(e["to_offset"] for e in entries) == len(after)

    # what the harness collects from the node, and the classifier's verdict
    run = tmp_path / "run"
    (run / "n1").mkdir(parents=True)
    rows = [json.dumps(r) for r in replica_records(root)]
    (run / "n1" / "replica-records.jsonl").write_text("\n".join(rows) + "\n")
    shutil.copy(root / TRUNCATION_JOURNAL, run / "n1" / "truncations.jsonl")
    ops: list[dict[str, Any]] = [
        {"type": "ok", "process": 0, "f": "send", "value": [["send", "t/0", [v, v]]]}
        for v in range(36)
    ]
    ops.append(
        {
            "type": "ok",
            "process": 1,
            "f": "poll",
            "value": [["poll", {"t/0": [[v, v] for v in range(len(after))]}]],
        }
    )
    unseen = classify(ops, load_replicas(run))
    assert sorted(str(w["value"]) for w in unseen) == sorted(lost)
    for w in unseen:
        assert w["class"] == "truncated", w
        assert {(t["node"], t["kind"]) for t in w["truncations"]} == {("n1", "power-loss")}


def test_a_partition_directory_that_never_reached_disk_journals_all_its_records(
    root: Path,
) -> None:
    part = root / "u-3"
    part.mkdir()
    data = batch([1, 2, 3, 4, 5])
    (part / "00000000000000000000.log").write_bytes(data)
    (part / "00000000000000000000.index").write_bytes(b"")
    # an earlier line of the journal, never fsynced: the observer's notes survive the loss
    (root / TRUNCATION_JOURNAL).write_text('{"kind":"truncate","records":[]}\n')
    report = apply_power_loss(root)
    assert report.deleted == ["u-3"] and not part.exists()
    earlier, entry = journal(root)
    assert earlier["kind"] == "truncate"
    assert entry["kind"] == "power-loss" and (entry["topic"], entry["partition"]) == ("u", 3)
    assert [r[3] for r in entry["records"]] == ["1", "2", "3", "4", "5"]
    assert (entry["to_offset"], entry["log_end_offset"]) == (0, 5)
    assert entry["bytes"] == [len(data), 0]


def test_files_other_than_segments_are_cut_without_a_journal_entry(root: Path) -> None:
    part = root / "t-0"
    part.mkdir()
    (part / "00000000000000000000.index").write_bytes(b"\0" * 16)
    (part / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (part / "00000000000000000000.log.deleted").write_bytes(batch([7]))
    apply_power_loss(root)
    assert journal(root) == []


def test_turning_the_bookkeeping_off_keeps_the_truncation_journal(tmp_path: Path) -> None:
    d = tmp_path / "off"
    durable.attach(d)
    (d / TRUNCATION_JOURNAL).write_text('{"kind":"truncate","records":[]}\n')
    durable.attach(d, enabled=False)
    assert not (d / durable.JOURNAL_NAME).exists()
    assert (d / TRUNCATION_JOURNAL).read_text() == '{"kind":"truncate","records":[]}\n'
