"""Issue 12 on a live broker: files damaged after a clean stop (torn last batch, garbage after
the last batch, a flipped byte), then a restart. The broker recovers what it may cut off,
refuses with one line what it must not, never reuses an offset of a record still on disk, and
says in its log what it did."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from isrlab.broker.log.record_batch import iter_batches
from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient, build_batch
from tests.broker.test_bad_input import create, end_offset, fetch_all, produce_req
from tests.log.batches import decode_values

pytestmark = pytest.mark.integration

TOPIC = "durable"
BATCHES = 10
PER_BATCH = 100
# Offset index entries every 4096 bytes: each batch is ~1.7 KB, so the last entry points at
# the ninth batch and the tail past it holds the last two batches.
OVERRIDES = {"log.index.interval.bytes": "4096", "log.level": "INFO"}


RETRIABLE = {5, 6, 19}  # LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS


def produce_acked(port: int, values: list[bytes]) -> int:
    """Produce one batch with acks=all, retrying while the partition comes up (as clients
    do); returns its base offset (asserts it was acknowledged)."""
    deadline = time.monotonic() + 15
    while True:
        c = RawClient(port)
        try:
            resp = c.call(produce_req(TOPIC, build_batch(values), acks=-1))
        finally:
            c.close()
        part = resp.responses[0].partition_responses[0]
        if part.error_code in RETRIABLE and time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        assert part.error_code == 0, part
        return int(part.base_offset)


def value(i: int) -> bytes:
    return f"record-{i:05d}-".encode().ljust(16, b"x")


def fill(broker: BrokerProcess) -> None:
    create(broker.port, TOPIC)
    for b in range(BATCHES):
        first = b * PER_BATCH
        assert produce_acked(broker.port, [value(first + i) for i in range(PER_BATCH)]) == first


def stop_cleanly(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(30) == 0, broker.log_text()[-3000:]
    broker.proc = None


def segment_file(broker: BrokerProcess) -> Path:
    return broker.log_dir / f"{TOPIC}-0" / "00000000000000000000.log"


def filled_and_stopped(broker_factory) -> tuple[BrokerProcess, Path]:
    """A broker with the topic filled (offsets 0..999), stopped cleanly; and its segment file."""
    broker = broker_factory(OVERRIDES)
    fill(broker)
    stop_cleanly(broker)
    return broker, segment_file(broker)


def batch_positions(path: Path) -> list[tuple[int, int]]:
    """(position, size) of every batch in a segment file."""
    return [(h.position, h.size) for h in iter_batches(path.read_bytes())]


def restart(broker: BrokerProcess) -> str:
    """Start again; returns what this run logged so far."""
    before = len(broker.log_text())
    broker.start()
    return broker.log_text()[before:]


def consumed(port: int) -> list[tuple[int, bytes]]:
    return decode_values(fetch_all(port, TOPIC))


def test_torn_last_batch_after_a_clean_stop_keeps_offsets_and_new_records(
    broker_factory,
) -> None:
    broker, path = filled_and_stopped(broker_factory)
    position, size = batch_positions(path)[-1]
    os.truncate(path, position + size // 2)  # cut the last batch (offsets 900..999) mid-way

    log = restart(broker)
    assert "Found invalid messages in log segment" in log and "truncating" in log
    assert end_offset(broker.port, TOPIC) == 900  # not 0: the 900 whole records stay visible
    assert [o for o, _ in consumed(broker.port)] == list(range(900))
    new = [f"new-{i}".encode() for i in range(50)]
    assert produce_acked(broker.port, new) == 900  # no offset of a record on disk is reused
    stop_cleanly(broker)  # SIGTERM exits (it used to hang on a CorruptIndexError)

    restart(broker)
    records = consumed(broker.port)
    assert [o for o, _ in records] == list(range(950))
    assert [v for _, v in records[900:]] == new


@pytest.mark.parametrize("garbage", [os.urandom(37), b"\x00" * 4096], ids=["random37", "zeros4096"])
def test_garbage_after_the_last_batch_is_cut_off_at_start(broker_factory, garbage: bytes) -> None:
    broker, path = filled_and_stopped(broker_factory)
    clean_size = path.stat().st_size
    with open(path, "ab") as out:
        out.write(garbage)

    log = restart(broker)  # used to fail: InvalidRecordError from the producer-state reload
    assert f"truncating {len(garbage)} bytes" in log
    assert path.stat().st_size == clean_size
    assert end_offset(broker.port, TOPIC) == 1000
    assert produce_acked(broker.port, [b"after"]) == 1000
    assert [o for o, _ in consumed(broker.port)] == list(range(1001))


def test_flipped_byte_in_a_tail_batch_with_records_behind_it_refuses_to_start(
    broker_factory,
) -> None:
    broker, path = filled_and_stopped(broker_factory)
    position, size = batch_positions(path)[-2]  # offsets 800..899, batch 900..999 behind it
    data = bytearray(path.read_bytes())
    data[position + size // 2] ^= 0x01
    path.write_bytes(bytes(data))

    before = len(broker.log_text())
    with pytest.raises(RuntimeError, match="broker exited"):
        broker.start()
    assert broker.proc is not None and broker.proc.wait(10) == 2
    out = broker.log_text()[before:]
    assert "Traceback" not in out
    line = out.strip().splitlines()[-1]
    assert line.startswith("isrlab-broker: ")
    assert f"{path} at byte offset {position}" in line and "valid batch follows" in line
    assert path.read_bytes() == bytes(data)  # nothing was truncated
    broker.proc = None


def test_flipped_byte_in_the_last_batch_is_never_served(broker_factory) -> None:
    broker, path = filled_and_stopped(broker_factory)
    position, size = batch_positions(path)[-1]
    data = bytearray(path.read_bytes())
    data[position + size // 2] ^= 0x01
    path.write_bytes(bytes(data))

    log = restart(broker)
    assert f"Found invalid messages in log segment {path} at byte offset {position}" in log
    assert "CRC" in log
    # The destroyed batch is cut off, so no consumer or follower is handed it; the records
    # before it are all there.
    assert end_offset(broker.port, TOPIC) == 900
    records = consumed(broker.port)
    assert records == [(i, value(i)) for i in range(900)]


def test_recovery_after_kill_is_logged(broker_factory) -> None:
    """Point 8: an unclean stop's recovery says which segment it rescanned and what it cut."""
    broker = broker_factory(OVERRIDES)
    fill(broker)
    broker.kill9()
    path = segment_file(broker)
    with open(path, "ab") as out:
        out.write(build_batch([b"torn"])[:40])  # a write the crash cut short

    log = restart(broker)
    assert (
        f"INFO [broker 0] isrlab.broker.log.log: Recovering unflushed segment 0 in {path.parent}"
        in log
    )
    assert (
        f"WARNING [broker 0] isrlab.broker.log.segment: Found invalid messages in log segment "
        f"{path} at byte offset " in log
    )
    assert "truncating 40 bytes" in log
    assert produce_acked(broker.port, [b"next"]) == 1000


def test_damaged_index_after_a_clean_stop_is_rebuilt_and_logged(broker_factory) -> None:
    broker, path = filled_and_stopped(broker_factory)
    index = path.with_suffix(".index")
    entries = index.read_bytes()
    index.write_bytes(entries + b"\x00" * 4096)

    log = restart(broker)
    assert f"Rebuilding index files for segment {segment_file(broker)}: " in log
    assert [o for o, _ in consumed(broker.port)] == list(range(1000))
    stop_cleanly(broker)
    assert index.read_bytes() == entries
