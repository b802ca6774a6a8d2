"""Per-process wall-clock skew for a Python daemon, driven by an offset file.

This is what libfaketime does for C programs, done inside CPython, because libfaketime 0.9.10
(Debian 12) breaks CPython 3.11 under ``LD_PRELOAD``: with ``FAKETIME_DONT_FAKE_MONOTONIC=1``
``time.sleep`` fails with EINVAL (its ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` is
mistranslated), and without it ``threading.Event.wait`` hangs. Embedded nodes share one kernel
clock, so ``date -s`` is not an option there either.

When the environment has ``ISRLAB_CLOCK_OFFSET_FILE``, importing this module (done at interpreter
start by ``isrlab_clockshim.pth``, which ``harness.db`` installs with this file as
``isrlab_clockshim.py`` into the broker's venv) replaces ``time.time``, ``time.time_ns``,
``time.clock_gettime`` and ``time.clock_gettime_ns`` (for CLOCK_REALTIME) with versions that add
the offset in the file: seconds as text, ``"+12.5"``, ``"-3"``, ``"+0"``. The file is re-read
when its mtime changes, checked at most every ``CHECK_INTERVAL_S``. Monotonic clocks are left
alone, as ``date -s`` leaves them. ``datetime.now()`` reads the C clock directly and is not
skewed; ``logging`` timestamps and everything using ``time.time`` are.

The module must import nothing outside the standard library: it runs before site-packages.
"""

from __future__ import annotations

import os
import time

ENV = "ISRLAB_CLOCK_OFFSET_FILE"
CHECK_INTERVAL_S = 0.02

_real_time = time.time
_real_time_ns = time.time_ns
_real_clock_gettime = time.clock_gettime
_real_clock_gettime_ns = time.clock_gettime_ns
_monotonic = time.monotonic


class _Offset:
    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds = 0.0
        self.mtime_ns = -1
        self.next_check = 0.0

    def get(self) -> float:
        now = _monotonic()
        if now >= self.next_check:
            self.next_check = now + CHECK_INTERVAL_S
            try:
                st = os.stat(self.path)
                if st.st_mtime_ns != self.mtime_ns:
                    with open(self.path) as f:
                        text = f.read().strip()
                    if text:  # empty: caught mid-write; read it again at the next check
                        self.seconds = float(text)
                        self.mtime_ns = st.st_mtime_ns
            except (OSError, ValueError):
                pass  # keep the last good offset: a half-written file must not jolt the clock
        return self.seconds


def install(path: str) -> _Offset:
    """Patch the ``time`` module's wall clocks to follow the offset in ``path``."""
    offset = _Offset(path)

    def skewed_time() -> float:
        return _real_time() + offset.get()

    def skewed_time_ns() -> int:
        return _real_time_ns() + int(offset.get() * 1e9)

    def skewed_clock_gettime(clk_id: int) -> float:
        t = _real_clock_gettime(clk_id)
        return t + offset.get() if clk_id == time.CLOCK_REALTIME else t

    def skewed_clock_gettime_ns(clk_id: int) -> int:
        t = _real_clock_gettime_ns(clk_id)
        return t + int(offset.get() * 1e9) if clk_id == time.CLOCK_REALTIME else t

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    time.clock_gettime = skewed_clock_gettime
    time.clock_gettime_ns = skewed_clock_gettime_ns
    return offset


if os.environ.get(ENV):
    install(os.environ[ENV])
