"""The broker process under storage and resource faults (issue 12, points 4, 5, 7, 9).

Each test runs `python -m isrlab.broker start` as users do. Full disks are real: a small tmpfs
mounted for the test (root only; skipped with the reason otherwise) and filled to ENOSPC.

- SIGTERM always ends the process, with a log line for what could not be written; what was
  acknowledged is recovered on the next start.
- A restart on a still-full disk starts, serves reads and refuses writes with
  KAFKA_STORAGE_ERROR; no `.tmp` checkpoint is left behind; rejected batches are logged
  rate-limited.
- Partial request frames are bounded by `queued.max.request.bytes` across all connections.
- ListOffsets with an unsupported special timestamp gets UNSUPPORTED_VERSION, not a traceback.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.record.memory_records import MemoryRecords

from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient, build_batch, list_offsets_request
from tests.broker.test_bad_input import create, fetch_all, produce
from tests.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.integration

# With an index entry per batch the index pages get their disk blocks before the disk fills, so
# the full disk hits the log, the checkpoints and the snapshots; with the default sparse indexes
# the first entry of a stop or of a recovery needs a new block too (KafkaStorageError, never the
# SIGBUS of a store into an unbacked page of the mapping). Both are tested.
INDEX_EVERY_BATCH = {"log.index.interval.bytes": "1"}
DEFAULT_INDEXES: dict[str, str] = {}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "8m") as mnt:
        yield mnt


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; deleting it frees the space again."""
    path = disk / "filler"
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        while True:  # the last few blocks
            try:
                f.write(b"\0" * 512)
            except OSError:
                break
    return path


def values(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        out.extend(bytes(r.value) for r in batch)
    return out


def tmp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tmp"))


def produce_acked(port: int, topic: str, n: int) -> list[bytes]:
    acked = []
    for i in range(n):
        v = f"acked-{i}".encode()
        assert produce(port, topic, build_batch([v])).error_code == 0
        acked.append(v)
    return acked


def acked_then_full(
    disk: Path, broker_factory, overrides: dict[str, str], n: int
) -> tuple[BrokerProcess, list[bytes], Path]:
    """A broker logging to ``disk`` with ``n`` records acknowledged on topic "t", then the disk
    filled: the broker, what was acknowledged, and the filler (deleting it frees the space)."""
    b = broker_factory(overrides, log_dir=disk / "logs")
    create(b.port, "t")
    acked = produce_acked(b.port, "t", n)
    return b, acked, fill(disk)


def wait_exit(b: BrokerProcess, timeout: float) -> int | None:
    assert b.proc is not None
    try:
        return b.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def restart(b: BrokerProcess) -> None:
    b.proc = None
    b.start()


# ----- point 4: a stop always ends -------------------------------------------------------------


@pytest.mark.parametrize(
    "indexes", [INDEX_EVERY_BATCH, DEFAULT_INDEXES], ids=["index-every-batch", "default-indexes"]
)
def test_sigterm_on_a_full_disk_ends_the_process_and_acked_data_survives(
    small_disk: Path, broker_factory, indexes: dict[str, str]
) -> None:
    b, acked, filler = acked_then_full(small_disk, broker_factory, indexes, 30)

    b.proc.send_signal(signal.SIGTERM)
    rc = wait_exit(b, 30)
    text = b.log_text()
    assert rc is not None, "the broker is still running 30 s after SIGTERM:\n" + text[-2000:]
    assert rc != 0, "a shutdown that could not write everything says so in its exit status"
    assert "Task exception was never retrieved" not in text
    assert "Traceback" not in text and "Fatal Python error" not in text
    # one line names what could not be written
    assert "could not" in text and "recovery-point-offset-checkpoint" in text, text[-3000:]
    assert tmp_files(small_disk) == []

    filler.unlink()
    restart(b)
    assert values(fetch_all(b.port, "t")) == acked


def test_a_stop_that_hangs_is_bounded_by_shutdown_timeout(tmp_path: Path, broker_factory) -> None:
    """A final checkpoint write that never returns (a FIFO stands in for a hung disk) must not
    keep the process alive past shutdown.timeout.ms; the next start still has every acked
    record."""
    b = broker_factory({"shutdown.timeout.ms": "2000"}, log_dir=tmp_path / "logs")
    create(b.port, "t")
    acked = produce_acked(b.port, "t", 10)
    os.mkfifo(b.log_dir / "recovery-point-offset-checkpoint.tmp")

    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    rc = wait_exit(b, 30)
    text = b.log_text()
    assert rc is not None, "the broker is still running 30 s after SIGTERM:\n" + text[-2000:]
    assert rc != 0
    assert time.monotonic() - t0 < 25
    assert "shutdown.timeout.ms=2000" in text, text[-2000:]

    (b.log_dir / "recovery-point-offset-checkpoint.tmp").unlink()
    restart(b)
    assert values(fetch_all(b.port, "t")) == acked


# ----- point 5: a full disk at start-up ------------------------------------------------------


def test_restart_on_a_full_disk_serves_reads_and_refuses_writes(
    small_disk: Path, broker_factory
) -> None:
    b, acked, filler = acked_then_full(small_disk, broker_factory, INDEX_EVERY_BATCH, 30)
    b.kill9()

    b.start()  # a full disk is no reason not to serve what is already stored
    assert values(fetch_all(b.port, "t")) == acked
    codes = []
    for i in range(300):  # the first ones may fit what recovery gave back (trimmed indexes)
        v = f"late-{i}-".encode() + b"x" * 200
        codes.append(produce(b.port, "t", build_batch([v])).error_code)
        if codes[-1] == 0:
            acked.append(v)
    assert set(codes) <= {0, 56} and codes[-50:] == [56] * 50, codes  # KAFKA_STORAGE_ERROR
    assert values(fetch_all(b.port, "t")) == acked
    text = b.log_text()
    assert "Traceback" not in text, text[-3000:]
    assert tmp_files(small_disk) == []

    filler.unlink()  # space again: writes resume without a restart
    assert produce(b.port, "t", build_batch([b"after"])).error_code == 0
    assert values(fetch_all(b.port, "t")) == [*acked, b"after"]


def test_restart_on_a_full_disk_with_default_indexes_serves_or_refuses_in_one_line(
    small_disk: Path, broker_factory
) -> None:
    """Recovery may need a new index block: then the start is refused with one line (the log
    cannot be loaded), never a crash; with room again every acked record is back."""
    b, acked, filler = acked_then_full(small_disk, broker_factory, DEFAULT_INDEXES, 30)
    b.kill9()

    before = len(b.log_text())
    try:
        b.start()
    except RuntimeError:
        assert b.proc is not None and b.proc.wait(10) == 2
        out = b.log_text()[before:]
        assert out.strip().splitlines()[-1].startswith("isrlab-broker: cannot start: "), out
        b.proc = None
    else:
        assert values(fetch_all(b.port, "t")) == acked
        b.kill9()
        out = b.log_text()[before:]
    assert "Traceback" not in out and "Fatal Python error" not in out, out[-3000:]
    assert tmp_files(small_disk) == []

    filler.unlink()
    b.start()
    assert values(fetch_all(b.port, "t")) == acked


def test_rejected_batches_on_a_full_disk_are_logged_rate_limited(
    small_disk: Path, broker_factory
) -> None:
    b, _, _ = acked_then_full(small_disk, broker_factory, INDEX_EVERY_BATCH, 3)
    before = len(b.log_text().splitlines())
    c = RawClient(b.port)
    from tests.broker.test_bad_input import produce_req

    codes = []
    for _ in range(300):  # the first few may still fit the log's last page
        resp = c.call(produce_req("t", build_batch([b"x" * 200])))
        codes.append(resp.responses[0].partition_responses[0].error_code)
    assert codes[-250:] == [56] * 250, codes
    c.close()
    lines = b.log_text().splitlines()[before:]
    about = [line for line in lines if "t-0" in line]
    assert 1 <= len(about) <= 4, "\n".join(about[:20])


# ----- point 7: memory held by partial frames ------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_partial_frames_are_bounded_by_queued_max_request_bytes(broker_factory) -> None:
    frame = 16 << 20
    b = broker_factory({"socket.request.max.bytes": str(frame)})
    assert b.proc is not None
    rss0 = rss_bytes(b.proc.pid)
    sent_each = 12 << 20
    socks = []
    threads = []

    def dribble(s: socket.socket) -> None:
        with_size = struct.pack(">i", frame) + b"\1" * sent_each
        try:
            s.sendall(with_size)
        except OSError:
            pass  # timed out against a broker that stopped reading: that is the point

    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", b.port))
            s.settimeout(4)
            socks.append(s)
            t = threading.Thread(target=dribble, args=(s,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(10)
        time.sleep(0.5)
        grown = rss_bytes(b.proc.pid) - rss0
        # old: every connection buffers what it was sent (20 x 12 MiB = 240 MiB)
        assert grown < frame + (48 << 20), f"RSS grew by {grown >> 20} MiB"
    finally:
        for s in socks:
            s.close()
    # the budget is given back: the broker serves a request that needs it
    c = RawClient(b.port)
    assert c.call(ApiVersionsRequest[0]()).error_code == 0
    c.close()


def test_a_frame_waits_for_budget_instead_of_being_read(broker_factory) -> None:
    """While another connection's partial frame holds the whole budget, a second frame is not
    read (backpressure); it is served as soon as the budget is released."""
    budget = 1 << 20
    b = broker_factory(
        {"socket.request.max.bytes": str(budget), "queued.max.request.bytes": str(budget)}
    )
    hog = socket.create_connection(("127.0.0.1", b.port))
    hog.sendall(struct.pack(">i", budget) + b"\1" * 1000)  # holds the budget, never completes
    time.sleep(0.3)
    c = RawClient(b.port, timeout=10)
    c.send_frame(c.encode(ApiVersionsRequest[0]()))
    c.sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        c.sock.recv(1)
    hog.close()
    c.sock.settimeout(10)
    frame = c.recv_frame()
    assert len(frame) > 8
    c.close()


def test_queued_max_request_bytes_default_bound_and_validation() -> None:
    from isrlab.broker.config import BrokerConfig, ConfigError

    assert BrokerConfig().queued_max_request_bytes == 104857600  # socket.request.max.bytes
    cfg = BrokerConfig({"socket.request.max.bytes": "1000"})
    assert cfg.queued_max_request_bytes == 1000
    assert BrokerConfig({"queued.max.request.bytes": "-1"}).queued_max_request_bytes is None
    with pytest.raises(ConfigError, match=r"smaller than socket\.request\.max\.bytes"):
        BrokerConfig({"socket.request.max.bytes": "1000", "queued.max.request.bytes": "999"})


# ----- point 9: unsupported ListOffsets timestamps --------------------------------------------


@pytest.mark.parametrize("timestamp", [-3, -4, -7, -(2**63)])
def test_unsupported_list_offsets_timestamp_gets_unsupported_version(broker, timestamp) -> None:
    create(broker.port, "lo")
    req = list_offsets_request("lo", {0: timestamp, 1: -1})
    c = RawClient(broker.port)
    resp = c.call(req)
    parts = {p.partition_index: p for p in resp.topics[0].partitions}
    assert parts[0].error_code == 35  # UNSUPPORTED_VERSION, as Kafka answers
    assert parts[0].offset == -1
    assert parts[1].error_code == 3  # the other partition is judged on its own
    # the connection is still served
    assert c.call(ApiVersionsRequest[0]()).error_code == 0
    c.close()
    text = broker.log_text()
    assert "unexpected error" not in text and "Traceback" not in text
