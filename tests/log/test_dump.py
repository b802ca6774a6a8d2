import io
from collections.abc import Callable

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
