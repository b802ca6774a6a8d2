"""Random appends, truncations, rolls, retention and reopens (clean, crashed, torn) against a model.

The model is a list of the batches the log should hold, each as the exact bytes it should
serve (stamped with its offset and leader epoch), plus the log start offset and the leader
epoch entries. After every step every read must return exactly the model's batches.

A follower log (other segment sizes) copies the leader with ``append_as_follower`` and is
truncated wherever the leader is; it must always hold a byte-identical prefix of the
leader, and in both logs the epoch cache must agree with the epochs stamped in the batches.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from isrlab.broker.log.errors import UnexpectedAppendOffsetError
from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.log.record_batch import iter_batches, parse_header, stamp
from tests.log.batches import make_batch

CONFIG = LogConfig(
    segment_bytes=1_500,
    index_interval_bytes=120,
    segment_index_bytes=40,  # 5 offset entries / 3 time entries: full-index rolls happen too
    retention_ms=-1,
    file_delete_delay_ms=0,
)
FOLLOWER_CONFIG = LogConfig(
    segment_bytes=3_500, index_interval_bytes=300, retention_ms=-1, file_delete_delay_ms=0
)


@dataclass
class ModelBatch:
    base_offset: int
    last_offset: int
    epoch: int
    data: bytes


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: the machine runs thousands of fsyncs, so keep them cheap.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.root = Path(tempfile.mkdtemp(prefix="logmodel-", dir=shm))
        self.dir = self.root / "model-topic-0"
        self.log = Log.open(self.dir, CONFIG)
        self.follower_dir = self.root / "model-topic-1"
        self.follower = Log.open(self.follower_dir, FOLLOWER_CONFIG)
        self.batches: list[ModelBatch] = []
        self.log_start = 0
        self.next_offset = 0
        self.epoch = 0
        self.epochs: list[tuple[int, int]] = []
        self.tag = 0

    def teardown(self) -> None:
        self.log.close_without_flush()
        self.follower.close_without_flush()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------

    def _expected_read(
        self, start: int, max_bytes: int, max_offset: int | None, min_one: bool
    ) -> bytes:
        out: list[bytes] = []
        total = 0
        for batch in self.batches:
            if batch.last_offset < start:
                continue
            if max_offset is not None and batch.last_offset >= max_offset:
                break
            if total + len(batch.data) > max_bytes and not (min_one and not out):
                break
            out.append(batch.data)
            total += len(batch.data)
        return b"".join(out)

    def _drop_from(self, offset: int) -> None:
        """Model truncate_to(offset): drop batches with last offset >= offset."""
        self.batches = [b for b in self.batches if b.last_offset < offset]
        self.next_offset = (
            self.batches[-1].last_offset + 1 if self.batches else min(offset, self.next_offset)
        )
        if not self.batches:
            # An emptied log keeps the base offset of the segment that held the cut.
            self.next_offset = self.log.log_end_offset
        self.epochs = [e for e in self.epochs if e[1] < self.next_offset]
        self.log_start = min(self.log_start, self.next_offset)

    # -- rules -------------------------------------------------------------------------------

    @rule(
        shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 60)), min_size=1, max_size=3),
        bump_epoch=st.booleans(),
    )
    def append(self, shapes: list[tuple[int, int]], bump_epoch: bool) -> None:
        if bump_epoch:
            self.epoch += 1
        raw = []
        for count, value_size in shapes:
            self.tag += 1
            raw.append(
                make_batch(count, timestamp=1_000 + self.tag, value_size=value_size, tag=self.tag)
            )
        info = self.log.append_as_leader(b"".join(raw), self.epoch)
        assert info.first_offset == self.next_offset
        if not self.epochs or self.epoch > self.epochs[-1][0]:
            # A new epoch supersedes entries starting at the same offset (Kafka's assign).
            self.epochs = [e for e in self.epochs if e[1] < self.next_offset]
            self.epochs.append((self.epoch, self.next_offset))
        for data in raw:
            stamped = bytearray(data)
            stamp(stamped, 0, self.next_offset, self.epoch)
            header = parse_header(stamped)
            self.batches.append(
                ModelBatch(self.next_offset, header.last_offset, self.epoch, bytes(stamped))
            )
            self.next_offset = header.last_offset + 1
        assert info.last_offset == self.next_offset - 1

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start, self.next_offset + 2))
        self.log.truncate_to(target)
        self.follower.truncate_to(target)
        if target < self.next_offset:
            self._drop_from(target)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(data=st.data())
    def advance_log_start_and_retain(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start, self.next_offset))
        self.log.maybe_increment_log_start_offset(target)
        if target > self.log_start:
            self.log_start = target
            self._epochs_from_start(target)
        self.log.delete_old_segments()
        # Segments wholly below the start go; the batch holding the start must stay.
        self.batches = [
            b for b in self.batches if b.last_offset >= self.log.segments[0].base_offset
        ]

    def _epochs_from_start(self, start: int) -> None:
        below = [e for e in self.epochs if e[1] <= start]
        if below:
            self.epochs = [(below[-1][0], start)] + [e for e in self.epochs if e[1] > start]

    def _reopen(self) -> None:
        # Like Kafka's LogLoader: the epoch cache is cut to the log end, then to the log start.
        self.epochs = [e for e in self.epochs if e[1] < self.next_offset]
        self._epochs_from_start(self.log_start)
        self.log = Log.open(
            self.dir,
            CONFIG,
            recovery_point=self._recovery_point,
            log_start_offset=self.log_start,
        )

    @rule()
    def clean_reopen(self) -> None:
        self._recovery_point = self.log.recovery_point
        self.log.close()
        self._reopen()

    @rule()
    def crash_and_reopen(self) -> None:
        self._recovery_point = self.log.recovery_point
        self.log.close_without_flush()
        self._reopen()

    @precondition(
        lambda self: bool(self.batches) and self.batches[-1].base_offset >= self.log.recovery_point
    )
    @rule(cut=st.integers(1, 10_000))
    def crash_with_torn_tail(self, cut: int) -> None:
        """A power loss tore the last, unflushed batch."""
        last = self.batches[-1]
        active = self.log.active_segment.log_file
        if self.log.active_segment.size == 0:
            return
        self._recovery_point = self.log.recovery_point
        self.log.close_without_flush()
        cut = 1 + cut % len(last.data)
        os.truncate(active, active.stat().st_size - cut)
        self.batches.pop()
        self.next_offset = last.base_offset
        self.epochs = [e for e in self.epochs if e[1] < self.next_offset]
        if self.log_start > self.next_offset:
            # The checkpointed log start is past what survived: the log restarts empty there.
            self.batches, self.epochs, self.next_offset = [], [], self.log_start
        self._reopen()
        self.follower.truncate_to(self.log.log_end_offset)

    @rule(max_bytes=st.integers(1, 3_000))
    def replicate(self, max_bytes: int) -> None:
        fetch_offset = self.follower.log_end_offset
        if fetch_offset < self.log.log_start_offset:
            # OffsetOutOfRange below the leader's log start: the follower restarts there.
            self.follower.truncate_fully_and_start_at(self.log.log_start_offset)
            fetch_offset = self.log.log_start_offset
        fetched = self.log.read(fetch_offset, max_bytes).read_bytes()
        try:
            info = self.follower.append_as_follower(fetched)
        except UnexpectedAppendOffsetError as exc:
            # The leader's log start is inside a batch: start at that batch (Kafka's Partition).
            assert self.follower.log_end_offset == self.follower.log_start_offset
            assert exc.first_offset < fetch_offset <= exc.last_offset
            self.follower.truncate_fully_and_start_at(exc.first_offset)
            info = self.follower.append_as_follower(fetched)
        assert info.valid_bytes == len(fetched)
        self.follower.maybe_increment_log_start_offset(
            min(self.log.log_start_offset, self.follower.log_end_offset)
        )

    @rule()
    def follower_crash_and_reopen(self) -> None:
        recovery_point, log_start = self.follower.recovery_point, self.follower.log_start_offset
        self.follower.close_without_flush()
        self.follower = Log.open(
            self.follower_dir,
            FOLLOWER_CONFIG,
            recovery_point=recovery_point,
            log_start_offset=log_start,
        )

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def offsets_match(self) -> None:
        assert self.log.log_end_offset == self.next_offset
        assert self.log.log_start_offset == self.log_start
        assert self.log.leader_epoch_cache.epoch_entries() == self.epochs

    @invariant()
    def full_read_matches(self) -> None:
        got = self.log.read(self.log_start, 10**7).read_bytes()
        assert got == self._expected_read(self.log_start, 10**7, None, True)

    @invariant()
    def follower_is_a_prefix_of_the_leader(self) -> None:
        follower_end = self.follower.log_end_offset
        assert follower_end <= self.log.log_end_offset
        start = max(self.follower.log_start_offset, self.log.log_start_offset)
        if start < follower_end:
            mine = self.follower.read(start, 10**7).read_bytes()
            assert mine == self.log.read(start, 10**7, max_offset=follower_end).read_bytes()

    @invariant()
    def epoch_caches_agree_with_batches(self) -> None:
        for log in (self.log, self.follower):
            data = log.read(log.log_start_offset, 10**7).read_bytes()
            for header in iter_batches(data):
                if header.base_offset >= log.log_start_offset:
                    assert (
                        log.leader_epoch_cache.epoch_for_offset(header.base_offset)
                        == header.partition_leader_epoch
                    )

    @rule(data=st.data())
    def partial_read_matches(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.log_start, self.next_offset))
        max_bytes = data.draw(st.integers(0, 1_500))
        max_offset = data.draw(st.none() | st.integers(self.log_start, self.next_offset + 1))
        min_one = data.draw(st.booleans())
        got = self.log.read(start, max_bytes, max_offset=max_offset, min_one_message=min_one)
        assert got.read_bytes() == self._expected_read(start, max_bytes, max_offset, min_one)


LogMachine.TestCase.settings = settings(
    max_examples=40,
    report_multiple_bugs=False,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogMachine.TestCase


@pytest.mark.slow
def test_log_model_long_run() -> None:
    """The same machine with many more and longer runs (make soak)."""
    run_state_machine_as_test(
        LogMachine,
        settings=settings(
            max_examples=1_500,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        ),
    )
