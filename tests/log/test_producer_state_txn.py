"""Producer state of transactions (Kafka's ProducerStateManager / ProducerAppendInfo): ongoing and
unreplicated transactions, the first unstable offset, marker checks, snapshots, replay."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from isrlab.broker.log.control import build_control_batch
from isrlab.broker.log.log import AppendOrigin, Log, LogConfig
from isrlab.broker.log.producer_state import (
    INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE,
    TRANSACTION_COORDINATOR_FENCED,
    ProducerStateError,
    ProducerStateManager,
    ProducerView,
    batch_marker,
)
from isrlab.broker.log.record_batch import parse_header
from tests.log.txn_helpers import Writer, txn_batch

Opener = Callable[..., Log]


def test_ongoing_then_unreplicated_until_the_hw_passes_the_marker(open_log: Opener) -> None:
    w = Writer(open_log())
    s = w.state
    assert s.first_unstable_offset() is None
    w.data(1, 2)  # 0-1
    w.data(2)  # 2
    assert s.first_unstable_offset() == 0
    assert s.has_ongoing_txn(1, 0) and not s.has_ongoing_txn(1, 1) and not s.has_ongoing_txn(3, 0)
    w.marker(1, commit=True)  # 3
    assert not s.has_ongoing_txn(1, 0)
    assert s.first_unstable_offset() == 0  # committed, but the marker is not replicated yet
    s.on_high_watermark_updated(3)
    assert s.first_unstable_offset() == 0  # the HW is at the marker, not past it
    s.on_high_watermark_updated(4)
    assert s.first_unstable_offset() == 2  # producer 2's transaction still open
    w.marker(2, commit=False)  # 4
    s.on_high_watermark_updated(5)
    assert s.first_unstable_offset() is None
    assert s.active_producers() == [
        ProducerView(1, 0, 1, 1_001, 0, -1),  # its batch's max timestamp
        ProducerView(2, 0, 0, 1_000, 0, -1),
    ]


def test_a_marker_without_data_completes_nothing(open_log: Opener) -> None:
    w = Writer(open_log())
    w.marker(5, commit=False)
    assert w.state.first_unstable_offset() is None and w.entries() == []
    assert w.state.producers[5].coordinator_epoch == 0


def test_marker_and_data_checks() -> None:
    s = ProducerStateManager(Path("/nonexistent"))

    data = parse_header(txn_batch(7, 3, 0))
    s.update(data)
    non_txn = parse_header(txn_batch(7, 3, 1, transactional=False))
    with pytest.raises(ProducerStateError) as e:
        s.check(non_txn)
    assert e.value.code == INVALID_TXN_STATE
    old_marker = build_control_batch(7, 2, True, 0, 1)
    with pytest.raises(ProducerStateError) as e:
        s.check(
            parse_header(old_marker),
            AppendOrigin.COORDINATOR,
            batch_marker(old_marker, parse_header(old_marker)),
        )
    assert e.value.code == INVALID_PRODUCER_EPOCH
    marker = build_control_batch(7, 3, False, 4, 1)
    mh = parse_header(marker)
    s.check(mh, AppendOrigin.COORDINATOR, batch_marker(marker, mh))
    completed = s.update(mh, batch_marker(marker, mh))
    assert completed is not None and completed.is_aborted and completed.first_offset == 0
    stale = build_control_batch(7, 3, True, 3, 1)
    with pytest.raises(ProducerStateError) as e:
        s.check(
            parse_header(stale), AppendOrigin.COORDINATOR, batch_marker(stale, parse_header(stale))
        )
    assert e.value.code == TRANSACTION_COORDINATOR_FENCED
    # without epoch fencing (the historic switch) an older epoch passes
    s.epoch_fencing = False
    s.check(parse_header(txn_batch(7, 1, 9)))


def test_snapshot_round_trip_keeps_transactions(open_log: Opener) -> None:
    w = Writer(open_log())
    w.data(1, 2)
    w.marker(1, commit=False, coordinator_epoch=6)
    w.data(2)  # 3: open
    path = w.state.take_snapshot()
    assert path is not None
    body = json.loads(path.read_bytes())
    assert body["version"] == 2
    loaded = ProducerStateManager(w.log.dir)
    assert loaded.load_latest_snapshot(0, w.log.log_end_offset) == 4
    assert loaded.producers[1].coordinator_epoch == 6
    assert loaded.producers[2].current_txn_first_offset == 3
    assert loaded.first_unstable_offset() == 3
    assert loaded.active_producers() == w.state.active_producers()


def test_version_1_snapshots_are_still_read(tmp_path: Path) -> None:
    body = {
        "version": 1,
        "offset": 5,
        "producers": [{"pid": 4, "epoch": 2, "ts": 9, "batches": [[0, 4, 0, 4, 9]]}],
    }
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["crc"] = crc32c.crc32c(raw)
    (tmp_path / f"{5:020d}.snapshot").write_text(json.dumps(body))
    s = ProducerStateManager(tmp_path)
    assert s.load_latest_snapshot(0, 10) == 5
    assert s.active_producers() == [ProducerView(4, 2, 4, 9, -1, -1)]
    assert s.first_unstable_offset() is None


def test_replay_after_truncation_reopens_and_recloses(open_log: Opener) -> None:
    w = Writer(open_log(LogConfig(segment_bytes=300, index_interval_bytes=100)))
    w.data(1)  # 0
    w.data(2, 3)  # 1-3
    w.state.take_snapshot()  # at 4: both open
    abort = w.marker(1, commit=False)  # 4
    w.data(3)  # 5
    commit = w.marker(2, commit=True)  # 6
    w.state.on_high_watermark_updated(w.log.log_end_offset)
    assert w.state.first_unstable_offset() == 5
    w.log.truncate_to(commit)
    w.state.load(w.log)
    # producer 2 open again (1); producer 1's abort (0) completed by the replay, unreplicated
    assert w.state.first_unstable_offset() == 0
    w.state.on_high_watermark_updated(abort + 1)
    assert w.state.first_unstable_offset() == 1
    assert w.entries() == [(1, 0, abort, 1)]
    w.log.truncate_to(abort)
    w.state.load(w.log)
    assert w.state.first_unstable_offset() == 0 and w.entries() == []
    assert w.state.has_ongoing_txn(1, 0) and w.state.has_ongoing_txn(2, 0)


def test_replay_from_scratch_equals_live_state(open_log: Opener) -> None:
    w = Writer(open_log(LogConfig(segment_bytes=300, index_interval_bytes=100)))
    for round_ in range(4):
        w.data(1, tag=str(round_))
        w.data(2)
        w.marker(1, commit=round_ % 2 == 0, coordinator_epoch=round_)
    replayed = ProducerStateManager(w.log.dir / "none")
    replayed.load(w.log)
    for s in (replayed, w.state):
        s.on_high_watermark_updated(w.log.log_end_offset)
    assert replayed.active_producers() == w.state.active_producers()
    assert replayed.first_unstable_offset() == w.state.first_unstable_offset() == 1
