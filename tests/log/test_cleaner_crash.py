"""Crash safety of log cleaning: a cleaning stopped at any step (kill -9) loses no key's latest
record, and a hypothesis test of the same over random appends, deletes, rolls, cleanings,
crashes and reopens."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from isrlab.broker.log.log import Log, LogConfig
from tests.log.compaction import cleaner_for, compact_config, keyed_batch, read_all
from tests.log.conftest import FakeClock

TP = ("orders", 0)
STEPS = ("mapped", "cleaned", "swap", "deleted", "renamed")
Latest = dict[bytes, tuple[int, bytes | None]]


class SimulatedCrash(BaseException):
    """Raised at a cleaner step: nothing after it runs, as after kill -9 (no cleanup code)."""


def crash_at(step: str, occurrence: int = 1):  # type: ignore[no-untyped-def]
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == step:
            seen["n"] += 1
            if seen["n"] == occurrence:
                raise SimulatedCrash(step)

    return hook


class Model:
    """What was appended: every record by offset, and the latest record of each key."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[bytes, bytes | None]] = {}
        self.latest: Latest = {}
        self.sequences: dict[int, int] = {}

    def append(
        self,
        log: Log,
        records: list[tuple[bytes, bytes | None]],
        now_ms: int,
        producer_id: int = -1,
    ) -> None:
        sequence = self.sequences.get(producer_id, 0)
        self.sequences[producer_id] = sequence + len(records)
        batch = keyed_batch(
            records, timestamp=now_ms, producer_id=producer_id, base_sequence=sequence
        )
        first = log.append_as_leader(batch, 0).first_offset
        for i, (key, value) in enumerate(records):
            self.records[first + i] = (key, value)
            self.latest[key] = (first + i, value)

    def check(self, log: Log) -> None:
        """The log holds only appended records, at their offsets, in order; every key's latest
        value is there; a deleted key shows no older value."""
        got = read_all(log)
        offsets = [offset for offset, *_ in got]
        assert offsets == sorted(set(offsets)), "offsets must strictly increase"
        assert log.log_start_offset == 0
        assert log.log_end_offset == (max(self.records) + 1 if self.records else 0)
        by_key: dict[bytes, list[int]] = {}
        for offset, key, value, _ in got:
            assert key is not None
            assert self.records[offset] == (key, value), f"offset {offset} holds another record"
            by_key.setdefault(key, []).append(offset)
        for key, (offset, value) in self.latest.items():
            present = by_key.get(key, [])
            if value is not None:
                assert offset in present, f"latest value of {key!r} at {offset} lost"
            else:  # the tombstone, or nothing at all: never an older value
                assert present in ([], [offset]) or present[-1] == offset, (key, present)


def fill(log: Log, model: Model, rounds: int, keys: int, clock: FakeClock) -> None:
    for r in range(rounds):
        for first in range(0, keys, 4):
            records: list[tuple[bytes, bytes | None]] = [
                (f"key-{i}".encode(), None if (i + r) % 11 == 0 else f"v{r}-{i}".encode())
                for i in range(first, min(first + 4, keys))
            ]
            model.append(log, records, int(clock() * 1000))


def reopen(log: Log, config: LogConfig, clock: FakeClock) -> Log:
    log.close_without_flush()
    return Log.open(log.dir, config, clock=clock)


@pytest.mark.parametrize(
    ("step", "occurrence"),
    [(step, n) for step in STEPS for n in (1, 2) if (step, n) != ("mapped", 2)],  # one map
)
def test_a_cleaning_killed_at_any_step_loses_no_latest_value(
    tmp_path: Path, clock: FakeClock, step: str, occurrence: int
) -> None:
    config = compact_config(segment_bytes=1_000)
    log = Log.open(tmp_path / "orders-0", config, clock=clock)
    model = Model()
    fill(log, model, rounds=12, keys=12, clock=clock)
    logs = {TP: log}
    # A first cleaning leaves small segments, which the second merges into groups.
    assert cleaner_for(tmp_path, logs, clock).clean_once() is not None
    fill(log, model, rounds=6, keys=12, clock=clock)
    log.roll()
    crashing = cleaner_for(tmp_path, logs, clock, step=crash_at(step, occurrence))
    with pytest.raises(SimulatedCrash):
        crashing.clean_once()
    log = reopen(log, config, clock)
    logs[TP] = log
    left = sorted(
        p.name for p in log.dir.iterdir() if p.suffix in (".cleaned", ".swap", ".deleted")
    )
    assert left == []
    model.check(log)
    for segment in log.segments:
        segment.sanity_check()
    # The next cleaning (from the last checkpoint) finishes the work.
    assert cleaner_for(tmp_path, logs, clock).clean_once() is not None
    model.check(log)
    keys_below_active = [
        key for offset, key, *_ in read_all(log) if offset < log.active_segment.base_offset
    ]
    assert len(keys_below_active) == len(set(keys_below_active))
    log.close()


def test_the_swap_is_completed_on_open_even_if_the_old_segments_are_still_there(
    tmp_path: Path, clock: FakeClock
) -> None:
    config = compact_config()
    log = Log.open(tmp_path / "orders-0", config, clock=clock)
    model = Model()
    fill(log, model, rounds=10, keys=8, clock=clock)
    logs = {TP: log}
    with pytest.raises(SimulatedCrash):
        cleaner_for(tmp_path, logs, clock, step=crash_at("swap")).clean_once()
    swaps = list(log.dir.glob("*.log.swap"))
    assert len(swaps) == 1
    base = swaps[0].name.split(".")[0]
    assert (log.dir / f"{base}.log").exists()  # the old segment of the same base
    log = reopen(log, config, clock)
    model.check(log)
    assert not list(log.dir.glob("*.swap"))
    assert read_all(log)[0][0] > 0  # the swapped-in segment dropped superseded records
    log.close()


appends = st.tuples(
    st.just("append"),
    st.lists(st.tuples(st.integers(0, 7), st.booleans()), min_size=1, max_size=6),
    st.sampled_from([-1, -1, 5, 6]),  # no producer id, or an idempotent producer's
)
ops = st.lists(
    st.one_of(
        appends,
        appends,
        appends,
        st.tuples(st.just("roll"), st.none()),
        st.tuples(st.just("clean"), st.none()),
        st.tuples(st.just("crash-cleaning"), st.sampled_from(STEPS)),
        st.tuples(st.just("clean"), st.none()),
        st.tuples(st.just("advance"), st.integers(1, 3_000)),
        st.tuples(st.just("reopen"), st.none()),
        st.tuples(st.just("crash"), st.none()),
    ),
    min_size=5,
    max_size=60,
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops)
@example(  # a crash with the old segments gone and only the .swap left
    [("append", [(i % 8, i % 5 == 0)], -1) for i in range(30)] + [("crash-cleaning", "deleted")]
)
def test_any_history_of_appends_cleanings_and_crashes_keeps_every_latest_value(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[object, ...]]
) -> None:
    directory = tmp_path_factory.mktemp("hyp")
    clock = FakeClock()
    config = compact_config(segment_bytes=400, delete_retention_ms=2_000)
    log = Log.open(directory / "orders-0", config, clock=clock)
    logs = {TP: log}
    model = Model()
    counter = 0
    try:
        for op, arg, *more in operations:
            if op == "append":
                assert isinstance(arg, list)
                records: list[tuple[bytes, bytes | None]] = []
                for key, tombstone in arg:
                    counter += 1
                    records.append((f"k{key}".encode(), None if tombstone else b"v%d" % counter))
                producer_id = more[0]
                assert isinstance(producer_id, int)
                model.append(log, records, int(clock() * 1000), producer_id)
            elif op == "roll":
                log.roll()
            elif op == "clean":
                cleaner_for(directory, logs, clock).clean_once()
            elif op == "crash-cleaning":
                assert isinstance(arg, str)
                try:
                    cleaner_for(directory, logs, clock, step=crash_at(arg)).clean_once()
                except SimulatedCrash:
                    log = logs[TP] = reopen(log, config, clock)
            elif op == "advance":
                assert isinstance(arg, int)
                clock.advance_ms(arg)
            elif op == "reopen":
                log.close()
                log = logs[TP] = Log.open(log.dir, config, clock=clock)
            elif op == "crash":
                log = logs[TP] = reopen(log, config, clock)
            model.check(log)
    finally:
        log.close_without_flush()
