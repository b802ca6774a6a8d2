"""A truncation beside a cleaning (broker/log/cleaner.py, Kafka's LogManager.truncateTo with
abortAndPauseCleaning): the cleaner thread reads a plan of segments, the owner thread truncates
the log below them and appends other records until it rolls past them again; the segments are
the same objects, so only the abort keeps the swap from putting the truncated records back."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from isrlab.broker.log.cleaner import LogCleaner
from isrlab.broker.log.log import Log
from tests.log.compaction import cleaner_for, compact_config, keyed_batch, read_all
from tests.log.conftest import FakeClock

TP = ("orders", 0)
Opener = Callable[..., Log]


def fill(log: Log, rounds: int, keys: int, tag: str, per_batch: int = 5) -> None:
    items = [
        (f"key-{i}".encode(), f"{tag}{r}-{i}".encode()) for r in range(rounds) for i in range(keys)
    ]
    for at in range(0, len(items), per_batch):
        log.append_as_leader(keyed_batch(items[at : at + per_batch]), 0)


def truncate_and_roll_past(log: Log, offset: int) -> None:
    """What a follower does after a leader change below its old segments: truncate at
    `offset` (inside the first segment: it becomes the active one), then append the new
    leader's records, other values, until the log has rolled past that segment again."""
    first = log.segments[0]
    assert first.base_offset < offset < log.segments[1].base_offset
    log.truncate_to(offset)
    assert log.segments == [first]
    while log.segments[-1] is first:
        fill(log, rounds=1, keys=5, tag="new")


def cleaner_with_truncations(
    tmp_path: Path, log: Log, clock: FakeClock, **kw: object
) -> LogCleaner:
    cleaner = cleaner_for(tmp_path, {TP: log}, clock, **kw)
    log.on_truncate = functools.partial(cleaner.truncated, TP)  # as the LogManager wires it
    return cleaner


def test_a_truncation_while_a_cleaning_runs_drops_the_cleaning(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=40, keys=10, tag="v")
    assert len(log.segments) > 3
    cleaner = cleaner_with_truncations(tmp_path, log, clock)
    steps = cleaner.clean_once_steps()
    assert [next(steps), next(steps), next(steps)] == ["planned", "mapped", "cleaned"]
    # the cleaner thread has written the first group (the first segment alone: each is more
    # than half full) and is about to swap it in; meanwhile the owner thread truncates
    truncate_and_roll_past(log, 5)
    expected = read_all(log)
    assert [value for _, _, value, _ in expected[5:10]] == [
        b"new0-0",
        b"new0-1",
        b"new0-2",
        b"new0-3",
        b"new0-4",
    ]
    try:
        next(steps)
        raise AssertionError("the cleaning went on after the truncation")
    except StopIteration as done:
        assert done.value is None  # aborted
    assert read_all(log) == expected  # not a record of the truncated tail back
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))
    assert TP not in cleaner.checkpoints
    # the next cleaning cleans the log as it is now
    assert cleaner.clean_once() is not None
    after = {key: value for _, key, value, _ in read_all(log)}
    assert after == {key: value for _, key, value, _ in expected}


def test_a_truncation_on_the_owner_just_before_the_swap_drops_the_cleaning(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    """The thread checked for an abort and handed the swap to the owner thread, which ran a
    truncation first: the swap itself checks again."""
    log = open_log(compact_config())
    fill(log, rounds=40, keys=10, tag="v")
    expected: list[object] = []

    def owner(fn: Callable[[], object]) -> object:
        if getattr(fn, "__name__", "") == "<lambda>" and not expected:  # the first swap
            truncate_and_roll_past(log, 5)
            expected.extend(read_all(log))
        return fn()

    cleaner = cleaner_with_truncations(tmp_path, log, clock, run_on_owner=owner)
    assert cleaner.clean_once() is None
    assert expected and read_all(log) == expected
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))


def test_a_truncation_below_the_checkpoint_moves_it_back_to_the_active_segment(
    open_log: Opener, tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(compact_config())
    fill(log, rounds=40, keys=10, tag="v")
    cleaner = cleaner_with_truncations(tmp_path, log, clock)
    result = cleaner.clean_once()
    assert result is not None and cleaner.checkpoints[TP] == result.end_offset > 0
    cut = log.segments[1].base_offset + 5
    log.truncate_to(cut)
    active = log.segments[-1].base_offset
    assert active < result.end_offset
    assert cleaner.checkpoints[TP] == active
    # and on disk: a restart reads it back
    assert cleaner_for(tmp_path, {TP: log}, clock).checkpoints[TP] == active
    # a truncation inside the active segment changes nothing
    fill(log, rounds=1, keys=2, tag="w")
    log.truncate_to(log.log_end_offset - 1)
    assert cleaner.checkpoints[TP] == active


def test_a_log_of_the_log_manager_tells_its_cleaner_of_truncations(tmp_path: Path) -> None:
    from isrlab.broker.config import BrokerConfig
    from isrlab.broker.log_manager import LogManager

    config = BrokerConfig({"log.dirs": str(tmp_path / "data")})
    manager = LogManager(config)
    truncated: list[tuple[tuple[str, int], int]] = []
    manager.cleaner.truncated = lambda tp, base: truncated.append((tp, base))  # type: ignore[method-assign]
    topic = {**config.topic_defaults(), "cleanup.policy": ["compact"], "segment.bytes": 2000}
    log = manager.get_or_create(TP, topic)
    try:
        fill(log, rounds=40, keys=10, tag="v")
        log.truncate_to(7)
        log.truncate_fully_and_start_at(20)
    finally:
        manager.close()
    assert truncated == [(TP, 0), (TP, 20)]
