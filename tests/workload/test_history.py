"""HistoryWriter: dense index, ordered time, thread safety, durability under kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from isrlab.checkers.history import load_history
from isrlab.harness.history import HistoryWriter, repair_history


def test_stamps_dense_index_and_time(history_path: Path) -> None:
    with HistoryWriter(history_path) as h:
        a = h.write({"process": 0, "type": "invoke", "f": "poll", "value": [["poll"]]})
        b = h.write({"process": 0, "type": "ok", "f": "poll", "value": [["poll", {}]]})
    assert (a["index"], b["index"]) == (0, 1)
    assert 0 <= a["time"] <= b["time"]
    ops = load_history(history_path)
    assert ops == [a, b]
    # index and time come first on every line, as the spec lists them
    first = history_path.read_bytes().split(b"\n")[0]
    assert first.startswith(b'{"index":0,"time":')


def test_does_not_touch_callers_dict(history_path: Path) -> None:
    op = {"process": 0, "type": "invoke", "f": "crash", "value": None}
    with HistoryWriter(history_path) as h:
        h.write(op)
    assert op == {"process": 0, "type": "invoke", "f": "crash", "value": None}


def test_refuses_existing_file_and_closed_writer(history_path: Path) -> None:
    h = HistoryWriter(history_path)
    with pytest.raises(FileExistsError):
        HistoryWriter(history_path)
    h.close()
    h.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        h.write({"process": 0, "type": "invoke", "f": "x", "value": None})


def test_concurrent_writers_keep_order(history_path: Path) -> None:
    h = HistoryWriter(history_path)
    n_threads, per = 8, 1500

    def work(p: int) -> None:
        for i in range(per):
            h.write({"process": p, "type": "invoke", "f": "send", "value": [["send", "k", i]]})
            h.write({"process": p, "type": "ok", "f": "send", "value": [["send", "k", [i, i]]]})

    ts = [threading.Thread(target=work, args=(p,)) for p in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    h.close()
    ops = load_history(history_path)  # validates dense index, monotonic time, pairing
    assert len(ops) == n_threads * per * 2 == h.count
    assert [o["index"] for o in ops] == list(range(len(ops)))
    times = [o["time"] for o in ops]
    assert times == sorted(times)


_CHILD = """
import sys
from isrlab.harness.history import HistoryWriter, repair_history
h = HistoryWriter(sys.argv[1])
big = list(range(3000))  # lines of ~15 kB, so a torn write would show
i = 0
while True:
    h.write({"process": 0, "type": "invoke", "f": "send", "value": [["send", "k", i]], "pad": big})
    h.write({"process": 0, "type": "ok", "f": "send", "value": [["send", "k", [i, i]]], "pad": big})
    i += 1
    if i == 50:
        print("ready", flush=True)
"""


def test_kill_9_mid_write_leaves_only_complete_lines(history_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(history_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready"
    time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    data = history_path.read_bytes()
    # Every newline-terminated line is whole; only the line being written when the kill
    # landed may be torn (a ~15 kB write can stop between pages), and it has no newline.
    *lines, tail = data.split(b"\n")
    assert len(lines) >= 100
    for i, line in enumerate(lines):
        op = orjson.loads(line)
        assert op["index"] == i
    assert repair_history(history_path) == len(tail)
    assert history_path.read_bytes() == data[: len(data) - len(tail)]
    # The prefix is a valid history (maybe ending on an open invoke: that counts as info).
    assert len(load_history(history_path)) == len(lines)


def test_repair_cuts_only_a_torn_tail(tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b'{"a":1}\n{"b":2}\n')
    assert repair_history(whole) == 0 and whole.read_bytes() == b'{"a":1}\n{"b":2}\n'
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"a":1}\n' + b'{"b":[' + b"1," * 70000)
    assert repair_history(torn) == 6 + 2 * 70000
    assert torn.read_bytes() == b'{"a":1}\n'
    only = tmp_path / "only.jsonl"
    only.write_bytes(b'{"a":')
    assert repair_history(only) == 5 and only.read_bytes() == b""
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert repair_history(empty) == 0
