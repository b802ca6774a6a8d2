"""RateLimitedLog: one line per key and interval, and the count of what was dropped."""

from __future__ import annotations

import logging

import pytest

from isrlab.broker.rate_limited_log import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("t.rate"), interval_s=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t.rate"):
        assert limited.error("t-0", "append to %s failed", "t-0")
        for _ in range(999):
            clock.now += 0.001
            assert not limited.error("t-0", "append to %s failed", "t-0")
        assert limited.error("t-1", "append to %s failed", "t-1")  # keys are independent
        clock.now = 110.5
        assert limited.error("t-0", "append to %s failed", "t-0")
        clock.now = 130.0
        assert limited.error("t-0", "append to %s failed", "t-0")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "append to t-0 failed",
        "append to t-1 failed",
        "append to t-0 failed (999 more like this in the last 10 s)",
        "append to t-0 failed",
    ]
