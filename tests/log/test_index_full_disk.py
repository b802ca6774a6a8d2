"""An index on a full disk: a KafkaStorageError naming the file, never a SIGBUS.

The preallocated index file is sparse; storing into a page without disk blocks on a full disk
faults (SIGBUS) and kills the process. The writes run in a child process so that the old
behaviour fails this test instead of killing pytest. The disk is a small tmpfs (root only).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tmpfs import mounted_tmpfs

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from isrlab.broker.log.errors import KafkaStorageError
    from isrlab.broker.log.offset_index import OffsetIndex
    from isrlab.broker.log.time_index import TimeIndex

    disk = Path(sys.argv[1])
    indexes = [
        OffsetIndex(disk / "00000000000000000000.index", 0, 1 << 20),
        TimeIndex(disk / "00000000000000000000.timeindex", 0, 1 << 20),
    ]
    for i in range(100):  # the first page has blocks before the disk fills
        indexes[0].append(i, i * 10)
        indexes[1].maybe_append(1000 + i, i)
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\\0" * 4096)
        except OSError:
            pass
    for index in indexes:
        try:
            for i in range(100, 20000):  # far past the first page
                if isinstance(index, OffsetIndex):
                    index.append(i, i * 10)
                else:
                    index.maybe_append(1000 + i, i)
        except KafkaStorageError as e:
            print(type(index).__name__, index.entries, e)
        else:
            print(type(index).__name__, index.entries, "no error")
    (disk / "filler").unlink()
    # with room again the index takes entries where it stopped
    indexes[0].append(10**6, 10**7)
    print("after", indexes[0].entries, indexes[0].last_entry)
    """
)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", "1m") as mnt:
        yield mnt


def test_index_writes_on_a_full_disk_raise_kafka_storage_error(tiny_disk: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_disk)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, f"child died ({r.returncode}):\n{r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    offset_line, time_line, after = lines
    name, entries, message = offset_line.split(" ", 2)
    assert name == "OffsetIndex" and "cannot write index" in message and "No space" in message
    assert str(tiny_disk / "00000000000000000000.index") in message
    assert int(entries) == 4096 // 8  # the entries of the page that has its blocks
    name, entries, message = time_line.split(" ", 2)
    assert name == "TimeIndex" and "cannot write index" in message
    assert after.startswith("after ") and "(1000000, 10000000)" in after
