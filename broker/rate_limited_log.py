"""Log lines that would repeat once per request, at most once per key and interval.

A broker on a full disk rejects every produce with KAFKA_STORAGE_ERROR; one line per rejected
batch buries the log (tens of thousands of lines in seconds) and costs more than the request.
`RateLimitedLog` lets the first line for a key (say, a partition and an error) through, drops
the repeats for `interval_s`, and the next line that gets through says how many were dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

from isrlab.broker import clock as broker_clock

DEFAULT_INTERVAL_S = 10.0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = broker_clock.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def log(self, level: int, key: Hashable, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless a line for ``key`` went out less than ``interval_s`` ago;
        returns whether it was logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._suppressed.pop(key, 0)
        if dropped and last is not None:
            msg += " (%d more like this in the last %.0f s)"
            args = (*args, dropped, now - last)
        self.logger.log(level, msg, *args)
        return True

    def error(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.ERROR, key, msg, *args)

    def warning(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: Hashable, msg: str, *args: Any) -> bool:
        return self.log(logging.INFO, key, msg, *args)
