"""The synced-length journal (broker/log/durable.py) and the power loss applied from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from isrlab.broker.log import durable
from isrlab.broker.log.durable import JOURNAL_NAME, JournalError, apply_power_loss
from isrlab.broker.log.log import Log, LogConfig
from tests.log.batches import make_batch


@pytest.fixture
def root(journaled_dir: Path) -> Path:
    return journaled_dir  # (tests/broker/conftest.py)


def records(root: Path) -> list[list[object]]:
    return [json.loads(line) for line in (root / JOURNAL_NAME).read_text().splitlines() if line]


def write(path: Path, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)


def test_fsync_is_recorded_after_it_succeeds_only(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = root / "a"
    write(path, b"12345")
    real_fsync = os.fsync
    target = os.stat(path).st_ino

    def failing(fd: int) -> None:
        if os.fstat(fd).st_ino == target:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        durable.fsync_file(path)
    assert not any(r[0] == "S" and r[1] == "a" for r in records(root))
    monkeypatch.setattr(os, "fsync", real_fsync)
    durable.fsync_file(path)
    assert ["S", "a", 5] in records(root)
    # a power loss now keeps the 5 synced bytes, not what was written after
    write(path, b"6789", "ab")
    report = apply_power_loss(root)
    assert path.read_bytes() == b"12345"
    assert report.truncated == [("a", 9, 5)]


def journal_fsyncs(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the fsyncs of the journal file itself from now on."""
    real_fsync = os.fsync
    journal = os.stat(root / JOURNAL_NAME).st_ino
    seen: list[int] = []

    def counting(fd: int) -> None:
        real_fsync(fd)
        if os.fstat(fd).st_ino == journal:
            seen.append(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return seen


def test_each_record_is_synced_before_its_call_returns(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(root / "a", b"12345")
    write(root / "b", b"678")
    synced = journal_fsyncs(root, monkeypatch)
    durable.fsync_file(root / "a")
    assert len(synced) == 1
    durable.fsync_file(root / "b")
    assert len(synced) == 2


def test_a_batch_syncs_its_records_once_before_it_ends(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("s.log", "s.index", "s.timeindex"):
        write(root / name, b"x" * 7)
    synced = journal_fsyncs(root, monkeypatch)
    with durable.batched():
        for name in ("s.log", "s.index", "s.timeindex"):
            durable.fsync_file(root / name)
            # written at once, after its own fsync, in order; not yet synced
            assert records(root)[-1] == ["S", name, 7]
        with durable.batched():  # a nested block joins the outer one
            durable.write_atomically(root / "cp", b"1")
        assert synced == []
    assert len(synced) == 1
    # a block that raises still syncs what it wrote
    write(root / "c", b"1")
    with pytest.raises(RuntimeError), durable.batched():
        durable.fsync_file(root / "c")
        raise RuntimeError("the caller failed after the fsync")
    assert len(synced) == 2 and ["S", "c", 1] in records(root)
    # outside a batch, each record is synced on its own again
    durable.fsync_file(root / "s.log")
    write(root / "s.log", b"y", "ab")
    durable.fsync_file(root / "s.log")
    assert len(synced) == 3


def test_a_segment_flush_syncs_the_journal_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = Log.open(root / "t-0", LogConfig())
    lg.append_as_leader(make_batch(3, tag=0), 0)
    synced = journal_fsyncs(root, monkeypatch)
    before = len(records(root))
    lg.flush()
    # the .log and its indexes recorded, under one fsync of the journal
    assert len(records(root)) - before >= 2 and len(synced) == 1
    lg.close()


def test_a_rename_carries_the_synced_length_to_the_new_name(root: Path) -> None:
    write(root / "x.tmp", b"abc")
    durable.fsync_file(root / "x.tmp")
    durable.replace(root / "x.tmp", root / "x")
    durable.fsync_dir(root)
    write(root / "x", b"def", "ab")  # never synced
    apply_power_loss(root)
    assert (root / "x").read_bytes() == b"abc"
    assert not (root / "x.tmp").exists()


def test_a_deleted_and_recreated_file_is_not_cut_to_the_old_length(root: Path) -> None:
    write(root / "f", b"old-synced")
    durable.fsync_file(root / "f")
    durable.unlink(root / "f")
    write(root / "f", b"new content, never synced")
    report = apply_power_loss(root)
    # its entry and data never reached disk: gone (not the first 10 bytes of the new file)
    assert not (root / "f").exists()
    assert report.deleted == ["f"]


def test_a_truncation_bounds_the_synced_length(root: Path) -> None:
    write(root / "seg", b"0123456789")
    durable.fsync_file(root / "seg")
    os.truncate(root / "seg", 4)
    durable.truncated(root / "seg", 4)
    write(root / "seg", b"abcdef", "ab")  # rewritten past 4, never synced
    apply_power_loss(root)
    assert (root / "seg").read_bytes() == b"0123"


def test_power_loss_deletes_entries_never_synced_and_empties_unsynced_data(root: Path) -> None:
    part = root / "t-0"
    part.mkdir()
    write(part / "synced.log", b"durable")
    durable.fsync_file(part / "synced.log")  # its entry, and t-0's, are on disk with it
    write(part / "synced.log", b"+tail", "ab")
    write(part / "unsynced.log", b"page cache only")
    other = root / "u-0"  # a partition directory whose entry never reached disk
    other.mkdir()
    write(other / "x.log", b"lost")
    write(root / "marker", b"")
    write(root / "notes", b"written, never fsynced")
    durable.fsync_dir(root)  # entries of the log dir: t-0, u-0, marker, notes
    write(root / "late", b"created after the directory fsync")
    report = apply_power_loss(root)
    assert (part / "synced.log").read_bytes() == b"durable"
    assert not (part / "unsynced.log").exists()
    # u-0's entry was synced (the log dir's fsync) but nothing under it
    assert other.is_dir() and not (other / "x.log").exists()
    assert (root / "marker").exists() and (root / "notes").read_bytes() == b""
    assert not (root / "late").exists()
    assert sorted(report.deleted) == ["late", "t-0/unsynced.log", "u-0/x.log"]
    assert report.emptied == ["marker", "notes"]
    # what is left is now the disk: a second power loss changes nothing
    again = apply_power_loss(root)
    assert (again.truncated, again.emptied, again.deleted) == ([], [], [])


def test_a_directory_whose_entry_never_reached_disk_goes_whole(root: Path) -> None:
    (root / "t-1").mkdir()
    write(root / "t-1" / "a", b"x")
    report = apply_power_loss(root)
    assert not (root / "t-1").exists()
    assert report.deleted == ["t-1"]


def test_start_up_compacts_the_journal(root: Path) -> None:
    for i in range(5):
        write(root / "cp.tmp", str(i).encode() * 4)
        durable.fsync_file(root / "cp.tmp")
        durable.replace(root / "cp.tmp", root / "cp")
        durable.fsync_dir(root)
    write(root / "gone", b"abc")
    durable.fsync_file(root / "gone")
    os.unlink(root / "gone")  # behind the journal's back: compaction drops it
    write(root / "big", b"0123456789")
    durable.fsync_file(root / "big")
    os.truncate(root / "big", 3)  # idem: the synced length is clipped to the file
    assert len(records(root)) > 10
    with open(root / JOURNAL_NAME, "a") as f:
        f.write('["S","torn",')  # a crash mid-append
    durable.attach(root)
    assert sorted(map(tuple, records(root))) == [("S", "big", 3), ("S", "cp", 4)]
    assert apply_power_loss(root).deleted == []
    assert (root / "cp").read_bytes() == b"4444"


def test_first_start_takes_what_is_on_disk_as_the_baseline(tmp_path: Path) -> None:
    d = tmp_path / "old"
    (d / "t-0").mkdir(parents=True)
    write(d / "t-0" / "00.log", b"from before")
    durable.attach(d)
    try:
        write(d / "t-0" / "00.log", b" and after", "ab")
        apply_power_loss(d)
        assert (d / "t-0" / "00.log").read_bytes() == b"from before"
    finally:
        durable.detach(d)


def test_bookkeeping_off_removes_the_journal_and_refuses_a_power_loss(tmp_path: Path) -> None:
    d = tmp_path / "off"
    durable.attach(d)
    assert (d / JOURNAL_NAME).exists()
    durable.attach(d, enabled=False)
    assert not (d / JOURNAL_NAME).exists()
    write(d / "f", b"x")
    durable.fsync_file(d / "f")
    assert not (d / JOURNAL_NAME).exists()
    with pytest.raises(JournalError, match=r"isrlab\.power\.journal\.enable"):
        apply_power_loss(d)
    cli = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "power-loss", "--log-dirs", str(d)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2
    assert "isrlab.power.journal.enable" in cli.stderr and "Traceback" not in cli.stderr


def test_a_log_loses_what_was_appended_after_its_last_flush(root: Path) -> None:
    part = root / "t-0"
    lg = Log.open(part, LogConfig())
    lg.append_as_leader(make_batch(3, tag=0), 0)
    lg.flush()
    flushed = lg.log_end_offset
    lg.append_as_leader(make_batch(3, tag=1), 0)
    assert lg.log_end_offset == 6
    lg.close_without_flush()  # kill -9
    report = apply_power_loss(root)
    assert report.truncated, report
    reopened = Log.open(part, LogConfig())
    try:
        assert reopened.log_end_offset == flushed == 3
    finally:
        reopened.close()
