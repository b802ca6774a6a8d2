import os
from collections.abc import Callable
from pathlib import Path

import pytest

from isrlab.broker.log.log import CLEAN_SHUTDOWN_FILE, Log, LogConfig
from isrlab.broker.log.record_batch import HEADER_SIZE
from isrlab.broker.log.recovery import LogDirFailure
from tests.log.batches import decode_values, make_batch

Opener = Callable[..., Log]
BATCH = len(make_batch(3))
CONFIG = LogConfig(segment_bytes=4 * BATCH, index_interval_bytes=BATCH, file_delete_delay_ms=0)


def fill(log: Log, batches: int, epoch: int = 0) -> None:
    for i in range(batches):
        log.append_as_leader(make_batch(3, tag=i), epoch)


def crash(log: Log) -> None:
    """Leave the files as a kill -9 would: no flush, no trim, no clean-shutdown marker."""
    log.close_without_flush()


def offsets(log: Log) -> list[int]:
    return [o for o, _ in decode_values(log.read(log.log_start_offset, 10**7).read_bytes())]


def test_torn_tail_is_truncated_and_appends_continue(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 6)  # segments 0 (4 batches) and 12 (2 batches)
    crash(log)
    active = log.dir / "00000000000000000012.log"
    os.truncate(active, active.stat().st_size - 7)  # cut the last batch mid-way
    again = open_log(CONFIG)
    assert again.log_end_offset == 15
    assert offsets(again) == list(range(15))
    assert again.recovery_point == 15
    assert again.append_as_leader(make_batch(3), 0).first_offset == 15
    assert offsets(again) == list(range(18))


def test_torn_header_is_truncated(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 2)
    crash(log)
    with open(log.dir / "00000000000000000000.log", "ab") as out:
        out.write(make_batch(3)[: HEADER_SIZE - 20])
    again = open_log(CONFIG)
    assert again.log_end_offset == 6
    assert (again.dir / "00000000000000000000.log").stat().st_size == 2 * BATCH


def test_corrupt_middle_batch_refuses_the_log_instead_of_dropping_later_records(
    open_log: Opener,
) -> None:
    log = open_log(CONFIG)
    fill(log, 10)  # segments 0, 12, 24
    crash(log)
    middle = log.dir / "00000000000000000012.log"
    data = bytearray(middle.read_bytes())
    data[BATCH + BATCH // 2] ^= 0xFF  # inside the second batch of segment 12 (offsets 15..17)
    middle.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in log.dir.glob("*.log")}
    # Kafka would truncate at offset 15 and delete segment 24: 12 intact records lost.
    with pytest.raises(
        LogDirFailure, match=r"00000000000000000012.log at byte offset \d+ .*valid batch follows"
    ):
        open_log(CONFIG)
    assert {p.name: p.read_bytes() for p in log.dir.glob("*.log")} == before


def test_torn_last_batch_of_a_segment_with_later_records_refuses(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 6)  # segments 0 (offsets 0..11) and 12
    crash(log)
    os.truncate(log.dir / "00000000000000000000.log", 4 * BATCH - 5)
    with pytest.raises(LogDirFailure, match=r"offsets 9\.\.11 would go missing"):
        open_log(CONFIG)


def test_garbage_after_the_records_of_a_rolled_segment_is_cut_off(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 6)
    log.close()
    with open(log.dir / "00000000000000000000.log", "ab") as out:
        out.write(b"\x5a" * 37)
    again = open_log(CONFIG)
    assert (again.dir / "00000000000000000000.log").stat().st_size == 4 * BATCH
    assert offsets(again) == list(range(18))


def test_recovery_point_limits_the_scan(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 10)
    crash(log)
    first = log.dir / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[BATCH // 2] ^= 0xFF  # corrupt payload in the flushed first segment: not rescanned
    first.write_bytes(bytes(data))
    again = open_log(CONFIG, recovery_point=24)
    assert again.log_end_offset == 30
    crash(again)
    with pytest.raises(LogDirFailure, match=r"00000000000000000000\.log at byte offset 0 "):
        open_log(CONFIG, recovery_point=0)  # now the scan finds it, with records behind it


def test_clean_shutdown_marker_skips_the_scan_below_the_tail(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 3)
    log.close()
    path = log.dir / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[BATCH + BATCH // 2] ^= 0xFF  # a flipped payload byte only a CRC scan would notice
    path.write_bytes(bytes(data))
    trusted = open_log(CONFIG)
    assert not (trusted.dir / CLEAN_SHUTDOWN_FILE).exists()
    assert trusted.log_end_offset == 9  # below the last index entry: trusted, no CRC scan
    crash(trusted)
    with pytest.raises(LogDirFailure, match="valid batch follows it"):
        open_log(CONFIG)


def test_missing_index_is_rebuilt(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 6)
    expected = log.segments[0].offset_index.entries_list()
    assert expected
    log.close()
    (log.dir / "00000000000000000000.index").unlink()
    (log.dir / "00000000000000000000.timeindex").unlink()
    again = open_log(CONFIG)
    assert again.segments[0].offset_index.entries_list() == expected
    assert again.segments[0].max_timestamp_so_far == 1_002
    assert offsets(again) == list(range(18))


def test_garbage_index_is_rebuilt(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 6)
    expected = log.segments[0].offset_index.entries_list()
    log.close()
    (log.dir / "00000000000000000000.index").write_bytes(b"\xff" * 13)
    (log.dir / "00000000000000000000.timeindex").write_bytes(b"\x00" * 24)
    again = open_log(CONFIG)
    assert again.segments[0].offset_index.entries_list() == expected
    assert again.read(7, 10).size == BATCH


def test_preallocated_active_index_after_crash_is_rebuilt(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 4)
    expected = log.segments[0].offset_index.entries_list()
    assert expected
    crash(log)
    index = log.dir / "00000000000000000000.index"
    assert index.stat().st_size == CONFIG.segment_index_bytes  # still preallocated
    again = open_log(CONFIG)
    assert again.segments[0].offset_index.entries_list() == expected
    assert offsets(again) == list(range(12))


def test_stray_files_are_removed(open_log: Opener, tmp_path: Path) -> None:
    log = open_log(CONFIG)
    fill(log, 1)
    log.close()
    for name in [
        "00000000000000000007.log.deleted",
        "00000000000000000009.log.swap",
        "00000000000000000003.index.cleaned",
        "00000000000000000050.index",
    ]:
        (log.dir / name).write_bytes(b"junk")
    again = open_log(CONFIG)
    names = sorted(p.name for p in again.dir.iterdir())
    assert names == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "leader-epoch-checkpoint",
    ]


def test_log_start_past_the_surviving_data_starts_empty_there(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 2, epoch=1)
    crash(log)
    os.truncate(log.dir / "00000000000000000000.log", BATCH)
    again = open_log(CONFIG, log_start_offset=6)
    assert (again.log_start_offset, again.log_end_offset) == (6, 6)
    assert again.append_as_leader(make_batch(1), 2).first_offset == 6


def test_epoch_cache_is_trimmed_to_the_recovered_log(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 2, epoch=1)
    fill(log, 2, epoch=2)
    crash(log)
    os.truncate(log.dir / "00000000000000000000.log", 2 * BATCH + 10)
    again = open_log(CONFIG)
    assert again.log_end_offset == 6
    assert again.leader_epoch_cache.epoch_entries() == [(1, 0)]


def test_garbage_epoch_checkpoint_takes_the_log_dir_offline_a_deleted_one_is_rebuilt(
    open_log: Opener,
) -> None:
    log = open_log(CONFIG)
    fill(log, 2, epoch=1)
    fill(log, 3, epoch=4)
    log.close()
    path = log.dir / "leader-epoch-checkpoint"
    path.write_text("0\n7\ngarbage\n")
    # Kafka: KafkaStorageException while loading, the log dir goes offline
    with pytest.raises(
        LogDirFailure, match=f"offline, as in Kafka: malformed checkpoint file {path}"
    ):
        open_log(CONFIG)
    assert path.read_text() == "0\n7\ngarbage\n"  # nothing changed on disk
    path.unlink()  # what the line says to do
    again = open_log(CONFIG)
    assert again.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 6)]
    assert (again.dir / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n4 6\n"


def test_failed_open_releases_its_files(open_log: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    from isrlab.broker.log import log as log_module

    log = open_log(CONFIG)
    fill(log, 6)
    log.close()
    closed: list[int] = []
    original = log_module.LogSegment.close_handlers

    def spy(self: log_module.LogSegment) -> None:
        closed.append(self.base_offset)
        original(self)

    def boom(*_args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(log_module.LogSegment, "close_handlers", spy)
    monkeypatch.setattr(log_module, "_load_or_rebuild_epoch_cache", boom)
    with pytest.raises(OSError, match="disk gone"):
        Log.open(log.dir, CONFIG)
    assert closed == [0, 12]


def test_damaged_batch_length_with_a_batch_behind_it_refuses(open_log: Opener) -> None:
    log = open_log(CONFIG)
    fill(log, 2)  # no index entry yet: the whole segment is its tail
    log.close()
    path = log.dir / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[8] ^= 0x40  # batchLength of the first batch: the next one can no longer be walked to
    path.write_bytes(bytes(data))
    with pytest.raises(LogDirFailure, match=f"valid batch follows it at byte offset {BATCH}"):
        open_log(CONFIG)


def test_index_entry_at_the_end_of_the_log_is_rebuilt(
    open_log: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(CONFIG)
    fill(log, 3)  # one index entry, at the third batch
    log.close()
    index = log.dir / "00000000000000000000.index"
    entries = index.read_bytes()
    assert len(entries) == 8
    index.write_bytes(entries[:4] + (3 * BATCH).to_bytes(4, "big"))  # position = end of file
    again = open_log(CONFIG)
    assert again.segments[0].offset_index.entries_list() == [(8, 2 * BATCH)]
    assert "points at the end of the log" in caplog.text
