"""The in-process clock skew: a real interpreter started with the shim follows the offset file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import isrlab.nemeses.clockshim as shim

PROBE = """
import sys, time, threading
sys.path.insert(0, {src!r})
import clockshim  # what isrlab_clockshim.pth does at interpreter start (a top-level module on nodes)
t0, m0 = time.time(), time.monotonic()
time.sleep(0.05)                      # libfaketime breaks exactly these two
threading.Event().wait(0.05)
print(t0, time.time_ns() / 1e9, time.clock_gettime(time.CLOCK_REALTIME), m0)
open({flag!r}, "w").close()
deadline = time.monotonic() + 10
while time.monotonic() < deadline and open({offset!r}).read().strip() != "-30":
    time.sleep(0.01)
time.sleep(0.1)
print(time.time())
"""


def test_a_process_with_the_shim_sees_the_offset_and_follows_changes(tmp_path: Path) -> None:
    offset = tmp_path / "offset"
    flag = tmp_path / "started"
    offset.write_text("+3600\n")
    src = str(Path(shim.__file__).resolve().parent)
    env = {**os.environ, shim.ENV: str(offset)}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE.format(src=src, flag=str(flag), offset=str(offset))],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    offset.write_text("-30\n")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    first, second = out.splitlines()
    t0, t_ns, t_clk, mono = (float(x) for x in first.split())
    now = time.time()
    assert (
        abs(t0 - now - 3600) < 20 and abs(t_ns - now - 3600) < 20 and abs(t_clk - now - 3600) < 20
    )
    assert abs(mono - time.monotonic()) < 20  # monotonic clocks are never skewed
    assert abs(float(second) - time.time() + 30) < 20


def test_a_bad_or_missing_file_keeps_the_last_good_offset(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    off = shim._Offset(str(path))
    assert off.get() == 0.0
    path.write_text("+2.5")
    off.next_check = 0
    assert off.get() == 2.5
    path.write_text("garbage")
    off.next_check = 0
    assert off.get() == 2.5
    path.write_text("")
    off.next_check = 0
    assert off.get() == 2.5
    path.unlink()
    off.next_check = 0
    assert off.get() == 2.5
