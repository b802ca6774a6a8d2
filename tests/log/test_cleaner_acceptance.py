"""Issue 13's compaction acceptance: a topic of many records over fewer keys compacts to one
record per key plus the active segment, and a consumer from offset 0 gets the latest value of
every key. The 1M-record / 10k-key version is slow; the normal suite runs 20k / 500."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from isrlab.broker.config import BrokerConfig
from isrlab.broker.log.cleaner import (
    BYTES_PER_MAP_ENTRY,
    MAP_LOAD_FACTOR,
    CleanerConfig,
    LogCleaner,
)
from isrlab.broker.log.log import Log
from isrlab.broker.log_manager import LogManager
from tests.log.compaction import compact_config, fast_keyed_batch, fill_keyed, read_all
from tests.log.conftest import FakeClock

TP = ("compacted", 0)


def compacts_to_one_record_per_key(
    tmp_path: Path, clock: FakeClock, records: int, keys: int, segment_bytes: int, **cleaner: int
) -> None:
    log = Log.open(
        tmp_path / "compacted-0", compact_config(segment_bytes=segment_bytes), clock=clock
    )
    latest = fill_keyed(log, records, keys)
    before = log.size_in_bytes
    config = CleanerConfig(**cleaner)  # type: ignore[arg-type]
    cleaner = LogCleaner(tmp_path, config, logs=lambda: {TP: log}, clock=clock)
    passes = 0
    while cleaner.clean_once() is not None:
        passes += 1
    assert passes >= 1
    active = log.active_segment.base_offset
    got = read_all(log)
    below = [key for offset, key, _, _ in got if offset < active]
    assert len(below) == len(set(below)), "more than one record of a key below the active segment"
    assert set(below) | {key for offset, key, _, _ in got if offset >= active} == set(latest)
    assert len(got) - len(below) == log.log_end_offset - active  # the active segment as it was
    consumed = {key: (offset, value) for offset, key, value, _ in got}  # from offset 0, in order
    assert consumed == latest
    assert log.log_start_offset == 0 and log.log_end_offset == records
    assert log.size_in_bytes < before / 5
    log.close()
    return passes


def test_20k_records_over_500_keys_compact_to_one_record_per_key(
    tmp_path: Path, clock: FakeClock
) -> None:
    compacts_to_one_record_per_key(tmp_path, clock, 20_000, 500, segment_bytes=100_000)


def test_a_small_offset_map_cleans_over_several_passes(tmp_path: Path, clock: FakeClock) -> None:
    # Room for ~600 keys: a dirty section of 20k offsets is mapped a segment run at a time.
    entries = 600
    passes = compacts_to_one_record_per_key(
        tmp_path,
        clock,
        20_000,
        500,
        segment_bytes=30_000,
        dedupe_buffer_size=int(entries * BYTES_PER_MAP_ENTRY / MAP_LOAD_FACTOR),
    )
    assert passes > 1


@pytest.mark.slow
def test_1m_records_over_10k_keys_compact_to_one_record_per_key(
    tmp_path: Path, clock: FakeClock
) -> None:
    compacts_to_one_record_per_key(tmp_path, clock, 1_000_000, 10_000, segment_bytes=16 << 20)


def test_the_broker_cleaner_thread_compacts_a_log_that_keeps_taking_appends(
    tmp_path: Path,
) -> None:
    """LogManager's cleaner thread (planning and swaps on the event loop) while the loop keeps
    appending, as __consumer_offsets gets offset commits: nothing latest is ever lost."""
    config = BrokerConfig(
        {
            "log.dirs": str(tmp_path / "logs"),
            "log.cleaner.backoff.ms": "10",
            "log.retention.check.interval.ms": "100000",
        }
    )
    topic_config = {
        **config.topic_defaults(),
        "cleanup.policy": ["compact"],
        "segment.bytes": 20_000,
        "min.cleanable.dirty.ratio": 0.2,
    }

    async def run() -> tuple[Log, dict[bytes, tuple[int, bytes]], int]:
        manager = LogManager(config)
        log = manager.get_or_create(TP, topic_config)
        manager.start_schedulers()
        latest: dict[bytes, tuple[int, bytes]] = {}
        n = 0
        cleanings = 0
        try:
            for _ in range(400):
                batch = [(b"group-%d" % (i % 50), b"offset-%d" % (n + i)) for i in range(20)]
                first = log.append_as_leader(fast_keyed_batch(batch), 0).first_offset
                for i, (key, value) in enumerate(batch):
                    latest[key] = (first + i, value)
                n += 20
                await asyncio.sleep(0.001)
                got = {key: (offset, value) for offset, key, value, _ in read_all(log)}
                assert got == latest
                cleanings = len(manager.cleaner.last_results)
        finally:
            await manager.stop_schedulers()
            assert not manager.cleaner.alive
            manager.close()
        return log, latest, cleanings

    log, latest, cleanings = asyncio.run(run())
    assert cleanings > 0
    reopened = Log.open(log.dir, log.config)
    assert {key: (o, v) for o, key, v, _ in read_all(reopened)} == latest
    assert len(read_all(reopened)) < 8_000
    reopened.close()
