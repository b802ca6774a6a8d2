"""Torn power loss (`apply_power_loss(torn_seed=)`, `isrlab-broker power-loss --torn-seed`):
a disk that wrote back part of the page cache before the power went. Synced bytes are always
kept; a file keeps none, all or a prefix of its unsynced tail, the last page of it possibly
zeros; a partition's segments keep a prefix in time. The broker's recovery must make a log of
whatever such a disk holds, and the truncation journal must name exactly the records lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.log import durable
from isrlab.broker.log.durable import PAGE_BYTES, apply_power_loss
from isrlab.broker.log.inventory import TRUNCATION_JOURNAL, stored_records
from isrlab.broker.log.log import Log, LogConfig


@pytest.fixture
def root(journaled_dir: Path) -> Path:
    return journaled_dir  # (tests/broker/conftest.py)


def batch(values: list[int]) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for v in values:
        assert b.append(1_000 + v, b"k", str(v).encode() * 20) is not None
    b.close()
    return bytes(b.buffer())


def journal(root: Path) -> list[dict[str, object]]:
    path = root / TRUNCATION_JOURNAL
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def written_log(root: Path, flushed_batches: int, more_batches: int) -> list[str]:
    """A partition log over several small segments: the first batches flushed, the rest in
    the page cache only; then kill -9. Returns every value appended, in offset order."""
    lg = Log.open(root / "t-0", LogConfig(segment_bytes=800))
    appended: list[str] = []
    for i in range(flushed_batches + more_batches):
        values = [3 * i, 3 * i + 1, 3 * i + 2]
        lg.append_as_leader(batch(values), 0)
        appended += [str(v) * 20 for v in values]
        if i == flushed_batches - 1:
            lg.flush()
    lg.close_without_flush()
    return appended


#: the records of the segments before the active one, which each roll fsyncs
ROLLED = 48


def torn_and_recovered(root: Path, seed: int) -> tuple[int, list[tuple[str, int, int]]]:
    """A torn power loss of `written_log`'s log, then the broker's unclean recovery: the log
    end offset it recovers, and the report's torn files. Checks what must hold on every seed."""
    appended = written_log(root, flushed_batches=4, more_batches=14)
    assert len(list((root / "t-0").glob("*.log"))) > 3
    report = apply_power_loss(root, torn_seed=seed)
    assert report.torn_seed == seed
    reopened = Log.open(root / "t-0", LogConfig(segment_bytes=800))  # the unclean recovery
    try:
        end = reopened.log_end_offset
    finally:
        reopened.close()
    kept = [r.value.decode() for r in stored_records(root / "t-0") if r.value is not None]
    assert kept == appended[:end], "the recovered log is a prefix of what was appended"
    assert end >= ROLLED, "the synced segments survive"
    lost = [str(r[3]) for e in journal(root) for r in e["records"]]  # type: ignore[attr-defined]
    assert sorted(lost) == sorted(appended[end:]), "each lost record journaled once, no other"
    return end, report.torn


@pytest.mark.parametrize("seed", range(40))
def test_recovery_keeps_a_prefix_and_the_journal_names_exactly_what_was_lost(
    root: Path, seed: int
) -> None:
    torn_and_recovered(root, seed)


def test_the_seeds_keep_none_some_or_all_of_the_active_segment(tmp_path: Path) -> None:
    ends, zeroed_logs = set(), 0
    for seed in range(40):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        durable.attach(d)
        try:
            end, torn = torn_and_recovered(d, seed)
        finally:
            durable.detach(d)
        ends.add(end)
        zeroed_logs += any(path.endswith(".log") and zeros for path, _, zeros in torn)
    assert ROLLED in ends and 54 in ends and len(ends) >= 3, sorted(ends)
    assert zeroed_logs, "some seeds end the active segment with a page of zeros"


def test_seeds_tear_differently_and_a_seed_tears_the_same_way_twice(tmp_path: Path) -> None:
    def run(seed: int, name: str) -> tuple[tuple[int, bytes], ...]:
        d = tmp_path / name
        d.mkdir()
        durable.attach(d)
        written_log(d, flushed_batches=2, more_batches=16)
        durable.detach(d)
        report = apply_power_loss(d, torn_seed=seed)
        files = sorted((d / "t-0").glob("*.log"))
        assert report.summary().count("torn (seed") == 1
        return tuple((f.stat().st_size, f.read_bytes()) for f in files)

    assert run(7, "a") == run(7, "b")
    shapes = {run(s, f"s{s}") for s in range(12)}
    assert len(shapes) > 4, "the seed decides how much of the tail survives"


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(
        st.tuples(st.integers(0, 3 * PAGE_BYTES), st.integers(0, 3 * PAGE_BYTES)),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**32),
)
def test_synced_bytes_are_kept_and_the_rest_is_a_prefix_ending_in_zeros_at_most(
    tmp_path_factory: pytest.TempPathFactory, files: list[tuple[int, int]], seed: int
) -> None:
    d = tmp_path_factory.mktemp("raw")
    durable.attach(d)
    contents = {}
    for i, (synced, extra) in enumerate(files):
        path = d / f"f{i}"
        data = os.urandom(synced + extra).replace(b"\0", b"\1")  # zeros only where torn
        path.write_bytes(data[:synced])
        durable.fsync_file(path)
        with open(path, "ab") as f:
            f.write(data[synced:])
        contents[path] = (synced, data)
    durable.detach(d)
    apply_power_loss(d, torn_seed=seed)
    for path, (synced, data) in contents.items():
        now = path.read_bytes()
        assert synced <= len(now) <= len(data)
        assert now[:synced] == data[:synced], "synced bytes are never lost"
        tail = now[synced:]
        zeros = len(tail) - len(tail.rstrip(b"\0"))
        assert tail[: len(tail) - zeros] == data[synced : len(now) - zeros]
        assert zeros <= PAGE_BYTES, "at most the last page reads as zeros"


def test_a_partitions_segments_after_one_cut_short_keep_only_their_synced_bytes(
    tmp_path: Path,
) -> None:
    # (The broker fsyncs a segment when it rolls, so only its active segment has an unsynced
    # tail; a file system writing back in order never keeps a later segment's tail past a
    # hole in an earlier one, so the model does not either.)
    seen = set()
    for seed in range(40):
        d = tmp_path / f"s{seed}"
        part = d / "t-0"
        part.mkdir(parents=True)
        durable.attach(d)
        first, second = part / f"{0:020d}.log", part / f"{9:020d}.log"
        for f in (first, second):
            f.write_bytes(b"")
            durable.fsync_file(f)
            f.write_bytes(b"x" * 3000)
        durable.detach(d)
        apply_power_loss(d, torn_seed=seed)
        a, b = first.stat().st_size, second.stat().st_size
        if a < 3000 or first.read_bytes().endswith(b"\0"):
            assert b == 0, (seed, a, b)
        seen.add((a == 3000, b > 0))
    assert seen == {(True, True), (True, False), (False, False)}


def test_without_a_seed_every_file_is_cut_to_its_synced_length(root: Path) -> None:
    appended = written_log(root, flushed_batches=4, more_batches=14)
    report = apply_power_loss(root)
    assert not report.torn and report.torn_seed is None
    reopened = Log.open(root / "t-0", LogConfig(segment_bytes=800))
    try:  # the active segment's entry never reached disk: it is gone, the rolled ones stay
        assert reopened.log_end_offset == ROLLED
    finally:
        reopened.close()
    assert len(appended) == 54


def test_the_command_takes_a_torn_seed(root: Path) -> None:
    written_log(root, flushed_batches=2, more_batches=10)
    durable.detach(root)
    command = ["power-loss", "--log-dirs", str(root), "--torn-seed", "3"]
    out = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", *command],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "torn (seed 3)" in out
