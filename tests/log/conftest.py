from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from isrlab.broker.log.log import Log, LogConfig


class FakeClock:
    """Seconds since the epoch, moved by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., Log]]:
    """Open logs under tmp_path/orders-0 with a small test config; closes them afterwards."""
    opened: list[Log] = []

    def opener(config: LogConfig | None = None, name: str = "orders-0", **kwargs: object) -> Log:
        cfg = config or LogConfig(
            segment_bytes=2_000, index_interval_bytes=200, file_delete_delay_ms=0
        )
        log = Log.open(tmp_path / name, cfg, clock=clock, **kwargs)  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield opener
    for log in opened:
        log.close_without_flush()
