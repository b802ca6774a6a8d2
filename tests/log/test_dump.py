import io
from collections.abc import Callable
from pathlib import Path

from isrlab.broker.log.dump import dump_files
from isrlab.broker.log.log import Log, LogConfig
from tests.log.batches import make_batch

Opener = Callable[..., Log]
BATCH = len(make_batch(3))


def test_dump_log_index_and_timeindex(open_log: Opener) -> None:
    log = open_log(LogConfig(index_interval_bytes=BATCH, file_delete_delay_ms=0))
    for i in range(4):
        log.append_as_leader(make_batch(3, timestamp=5_000 + 10 * i, tag=i), 7)
    entries = log.segments[0].offset_index.entries_list()
    time_entries = log.segments[0].time_index.entries_list()
    log.close()
    directory = log.dir
    out = io.StringIO()
    dump_files(
        [
            directory / "00000000000000000000.log",
            directory / "00000000000000000000.index",
            directory / "00000000000000000000.timeindex",
        ],
        print_records=True,
        out=out,
    )
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("00000000000000000000.log")
    assert lines[1] == "Log starting offset: 0"
    batch_lines = [line for line in lines if line.startswith("baseOffset:")]
    assert len(batch_lines) == 4
    assert batch_lines[1].startswith("baseOffset: 3 lastOffset: 5 count: 3 ")
    assert "partitionLeaderEpoch: 7" in batch_lines[1]
    assert (
        f"position: {BATCH} CreateTime: 5012 size: {BATCH} magic: 2 compresscodec: none crc: "
        in batch_lines[1]
    )
    assert batch_lines[1].endswith("isvalid: true")
    record_lines = [line for line in lines if line.startswith("| offset:")]
    assert len(record_lines) == 12
    assert record_lines[4].startswith("| offset: 4 CreateTime: 5011 keySize: 2 valueSize: 10")
    assert "payload: 1:1:vvvvvv" in record_lines[4]
    assert [f"offset: {o} position: {p}" for o, p in entries] == [
        line for line in lines if line.startswith("offset:")
    ]
    assert time_entries
    final = (5_032, 11)  # close() adds the segment's largest timestamp as the last entry
    assert [f"timestamp: {t} offset: {o}" for t, o in [*time_entries, final]] == [
        line for line in lines if line.startswith("timestamp:")
    ]


def test_dump_reports_corrupt_and_torn_batches(open_log: Opener) -> None:
    log = open_log()
    log.append_as_leader(make_batch(3), 0)
    log.append_as_leader(make_batch(3), 0)
    log.close()
    path = log.dir / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data) + make_batch(2)[:30])
    out = io.StringIO()
    dump_files([path, log.dir / "leader-epoch-checkpoint", log.dir / "notes.txt"], out=out)
    text = out.getvalue()
    assert "isvalid: true" in text and "isvalid: false" in text
    assert "Found 30 invalid bytes at the end of 00000000000000000000.log" in text
    assert "0\n1\n0 0\n" in text
    assert "Ignoring unknown file" in text


def test_dump_markers_and_txnindex_like_kafka_dump_log(open_log: Opener) -> None:
    from tests.log.txn_helpers import Writer

    w = Writer(open_log(LogConfig(file_delete_delay_ms=0)))
    w.data(7, 2)  # 0-1
    w.data(8)  # 2
    w.marker(7, commit=False, coordinator_epoch=3)  # 3
    w.marker(8, commit=True, coordinator_epoch=4)  # 4
    w.log.close()
    out = io.StringIO()
    dump_files(
        [w.log.dir / "00000000000000000000.log", w.log.dir / "00000000000000000000.txnindex"],
        print_records=True,
        out=out,
    )
    lines = out.getvalue().splitlines()
    batches = [line for line in lines if line.startswith("baseOffset:")]
    assert "isTransactional: true isControl: true" in batches[2]
    assert "baseSequence: -1 lastSequence: -1 producerId: 7 producerEpoch: 0" in batches[2]
    records = [line for line in lines if line.startswith("| offset:")]
    assert records[3] == (
        "| offset: 3 CreateTime: 1000 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: ABORT coordinatorEpoch: 3"
    )
    assert records[4].endswith("endTxnMarker: COMMIT coordinatorEpoch: 4")
    assert "version: 0 producerId: 7 firstOffset: 0 lastOffset: 3 lastStableOffset: 2" in lines


def test_dump_transaction_log_decoder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from isrlab.broker.cli import app
    from isrlab.broker.coordinator.group.records import build_batch
    from isrlab.broker.coordinator.transaction.records import (
        TxnLogValue,
        TxnState,
        encode_key,
        encode_value,
    )

    value = TxnLogValue(5, 1, 60_000, TxnState.ONGOING, (("t", 0),), 1_000, 900)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(build_batch([(encode_key("tx-1"), encode_value(value))], 1_000))
    result = CliRunner().invoke(
        app, ["dump-log", "--transaction-log-decoder", "--files", str(path)]
    )
    assert result.exit_code == 0, result.output
    (record,) = [line for line in result.output.splitlines() if line.startswith("| offset:")]
    assert "key: transaction_metadata::transactionalId=tx-1 payload: producerId:5," in record
    both = CliRunner().invoke(
        app, ["dump-log", "--transaction-log-decoder", "--offsets-decoder", "--files", str(path)]
    )
    assert both.exit_code == 2
