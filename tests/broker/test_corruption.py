"""Issue 17 on a live broker: damage where no recovery looks (below a segment's checked tail,
after a clean stop) and in the files derived from the log. The broker never serves a corrupt
batch nor skips records because of a damaged index entry; a read that meets a corrupt batch
takes the log dir offline (the broker halts with one line) and the next start refuses the
partition with one line; damaged checkpoint, leader-epoch, time index and producer state files
are logged and recovered from. Each test fills a partition once (10 batches of 100 records,
an idempotent producer, segments of 3 batches: 0-299, 300-599, 600-899, 900-999) and stops the
broker cleanly: the clean stop writes a producer snapshot at the log end, so a restart reads no
old batch until a fetch does."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from isrlab.broker.log.record_batch import check_crc, iter_batches
from tests.broker.conftest import BrokerProcess, free_port
from tests.broker.rawclient import RawClient, build_batch, fetch_request
from tests.broker.test_bad_input import create, end_offset, fetch_all, produce_req
from tests.broker.test_durability import TOPIC, produce_acked, stop_cleanly, value
from tests.log.batches import decode_values

pytestmark = pytest.mark.integration

OVERRIDES = {
    "log.index.interval.bytes": "1024",
    "log.segment.bytes": "8000",
    "log.level": "INFO",
}
PID = 4000


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log dir with offsets 0..999, stopped cleanly (copied by each test)."""
    root = tmp_path_factory.mktemp("filled")
    broker = BrokerProcess(root / "logs", free_port(), OVERRIDES)
    broker.start()
    try:
        create(broker.port, TOPIC)
        for b in range(10):
            batch = build_batch(
                [value(b * 100 + i) for i in range(100)],
                producer_id=PID,
                producer_epoch=0,
                base_sequence=b * 100,
            )
            c = RawClient(broker.port)
            resp = c.call(produce_req(TOPIC, batch, acks=-1))
            c.close()
            assert resp.responses[0].partition_responses[0].error_code == 0
        stop_cleanly(broker)
    finally:
        broker.stop()
    return root / "logs"


@pytest.fixture
def on_copy(filled: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker (not started) on a copy of the filled log dir; stopped after the test
    whatever happened in it."""
    logs = tmp_path / "logs"
    shutil.copytree(filled, logs)
    broker = BrokerProcess(logs, free_port(), OVERRIDES)
    yield broker
    broker.stop()


def part(broker: BrokerProcess) -> Path:
    return broker.log_dir / f"{TOPIC}-0"


def batches(path: Path) -> list[tuple[int, int, int]]:
    return [(h.position, h.size, h.base_offset) for h in iter_batches(path.read_bytes())]


def flip(path: Path, position: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def exit_status(broker: BrokerProcess, timeout: float = 20) -> int:
    assert broker.proc is not None
    status = broker.proc.wait(timeout)
    broker.proc = None
    return status


def all_crcs_good(data: bytes) -> bool:
    for header in iter_batches(data):
        check_crc(data, header)
    return True


def test_a_corrupt_batch_below_the_checked_tail_is_never_served(on_copy: BrokerProcess):
    broker = on_copy
    segment = part(broker) / f"{0:020d}.log"
    position, size, base = batches(segment)[1]  # offsets 100..199, far below the tail
    assert base == 100
    flip(segment, position + size // 2)  # a byte of a record: the batch's CRC fails
    broker.start()
    # Kafka's leader would send this batch as stored; this broker checks it on the way out
    served: list[bytes] = []
    try:
        for offset in (0, 150):
            c = RawClient(broker.port)
            try:
                resp = c.call(fetch_request(TOPIC, offset=offset, max_bytes=1 << 20))
                served.append(bytes(resp.responses[0].partitions[0].records or b""))
            finally:
                c.close()
    except (OSError, ConnectionError, EOFError):
        pass  # the broker halted under the fetch
    assert all(all_crcs_good(data) for data in served)
    assert exit_status(broker) == 1
    log = broker.log_text()
    assert (
        f"Shutdown broker because all log dirs in {broker.log_dir} have failed: corrupt record "
        f"batch in {segment} at byte offset {position}" in log
    )
    assert "Traceback" not in log
    # the next start finds it (the recovery point was put back) and refuses with one line
    before = len(broker.log_text())
    with pytest.raises(RuntimeError, match="broker exited"):
        broker.start()
    assert exit_status(broker) == 2
    line = broker.log_text()[before:].strip().splitlines()[-1]
    assert line.startswith("isrlab-broker: cannot start: corrupt record batch in ")
    assert f"{segment} at byte offset {position}" in line and "valid batch follows" in line


def test_a_damaged_offset_index_entry_never_makes_a_fetch_skip_records(on_copy: BrokerProcess):
    broker = on_copy
    index = part(broker) / f"{0:020d}.index"
    entries = index.read_bytes()
    assert len(entries) >= 16  # the first entry is not the last (the start checks that one)
    flip(index, 6)  # the first entry's position: it points inside a batch now
    broker.start()
    wrong = []
    for offset in range(0, 300, 7):
        c = RawClient(broker.port)
        resp = c.call(fetch_request(TOPIC, offset=offset, max_bytes=1))
        c.close()
        first = next(iter_batches(bytes(resp.responses[0].partitions[0].records or b"")))
        if not first.base_offset <= offset <= first.last_offset:
            wrong.append((offset, first.base_offset))
    assert wrong == []
    assert f"Found a corrupted index file {index}" in broker.log_text()
    assert [o for o, _ in decode_values(fetch_all(broker.port, TOPIC))] == list(range(1000))
    broker.stop()


def cut_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


# file (relative to the log dir) -> the log line naming it when it is cut in half
DERIVED = {
    "recovery-point-offset-checkpoint": "ignoring unreadable checkpoint",
    "log-start-offset-checkpoint": "ignoring unreadable checkpoint",
    f"{TOPIC}-0/{1000:020d}.snapshot": "Deleting corrupt producer state snapshot",
    f"{TOPIC}-0/{0:020d}.timeindex": "Rebuilding index files for segment",
}
# Kafka's KafkaStorageException while loading: the log dir goes offline
OFFLINE = ["replication-offset-checkpoint", f"{TOPIC}-0/leader-epoch-checkpoint"]


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_a_cut_derived_file_is_logged_and_recovered(on_copy: BrokerProcess, name: str):
    broker = on_copy
    path = broker.log_dir / name
    if not path.exists():
        path.write_text("0\n1\ndurable 0 1000\n")  # the checkpoint a longer run would have
    cut_half(path)
    broker.start()
    deadline = time.monotonic() + 10
    while DERIVED[name] not in broker.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert DERIVED[name] in broker.log_text() and str(path) in broker.log_text()
    assert end_offset(broker.port, TOPIC) == 1000
    assert decode_values(fetch_all(broker.port, TOPIC)) == [(i, value(i)) for i in range(1000)]
    assert produce_acked(broker.port, [b"after"]) == 1000
    broker.stop()


@pytest.mark.parametrize("name", OFFLINE)
def test_a_cut_leader_epoch_or_high_watermark_file_takes_the_log_dir_offline(
    on_copy: BrokerProcess, name: str
):
    broker = on_copy
    path = broker.log_dir / name
    if not path.exists():
        path.write_text("0\n1\ndurable 0 1000\n")  # the checkpoint a longer run would have
    cut_half(path)
    with pytest.raises(RuntimeError, match="broker exited"):
        broker.start()
    assert exit_status(broker) == 2
    line = broker.log_text().strip().splitlines()[-1]
    assert line.startswith(
        "isrlab-broker: cannot start: the log dir goes offline, as in Kafka: malformed "
        f"checkpoint file {path}, line "
    )
    assert "delete the file" in line and "Traceback" not in broker.log_text()
    path.unlink()  # what the line says to do: the broker starts and serves everything
    broker.start()
    assert decode_values(fetch_all(broker.port, TOPIC)) == [(i, value(i)) for i in range(1000)]
    broker.stop()
