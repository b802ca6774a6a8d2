"""The broker's clocks and randomness, behind one seam.

Every read of the wall clock (`time()`, `now_ms()`), of the monotonic clock (`monotonic()`,
`monotonic_ms()`), every blocking `sleep()` and every random identifier (`uuid4()`) the broker
takes goes through this module. By default they are the `time` and `uuid` modules' own. A
deterministic simulation (`harness.sim.cluster`) installs another `Clock` with `use(clock)`:
the virtual time of its event loop and a seeded random generator, so one seed gives one run.

The clock in force is a context variable, not a module global: `use()` sets it in the current
`contextvars` context, and what runs in that context (the tasks it creates, the callbacks it
schedules, `asyncio.to_thread`'s functions) sees it, while every other context (another
simulated broker, a test in the same process, a thread started without a copied context) keeps
its own. So each simulated broker can have its own clock (skewed, later), and nothing needs
restoring when a simulation ends.

The event loop's own clock (`loop.time()`, asyncio's timeouts and sleeps) needs no seam: a
simulation runs the broker on a loop whose clock is virtual. Work the broker would hand to a
thread of its own that waits in real time (the log cleaner's threads) asks `worker_threads()`
first: a clock whose time moves only when its event loop waits (a simulation's) says no, and
that work runs as a task on the loop instead.
"""

from __future__ import annotations

import contextvars
import time as _time
import uuid as _uuid
from typing import Protocol


class Clock(Protocol):
    """What the broker asks of a clock."""

    #: whether the broker may run work on threads of its own that wait in real time (False:
    #: time moves only when the event loop waits; such work runs as tasks on the loop)
    worker_threads: bool

    def time(self) -> float:
        """Seconds since the epoch (the wall clock)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds`."""
        ...

    def uuid4(self) -> _uuid.UUID:
        """A random (version 4) UUID."""
        ...


class SystemClock:
    """The operating system's clocks and randomness (the default)."""

    worker_threads = True

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        _time.sleep(seconds)

    def uuid4(self) -> _uuid.UUID:
        return _uuid.uuid4()


SYSTEM = SystemClock()

_current: contextvars.ContextVar[Clock] = contextvars.ContextVar("isrlab_clock", default=SYSTEM)


def use(clock: Clock) -> contextvars.Token[Clock]:
    """Make `clock` the clock of the current context (and of what it starts from now on);
    the token undoes it (`reset`)."""
    return _current.set(clock)


def reset(token: contextvars.Token[Clock]) -> None:
    _current.reset(token)


def current() -> Clock:
    return _current.get()


def time() -> float:
    return _current.get().time()


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(_current.get().time() * 1000)


def monotonic() -> float:
    return _current.get().monotonic()


def monotonic_ms() -> int:
    return int(_current.get().monotonic() * 1000)


def sleep(seconds: float) -> None:
    _current.get().sleep(seconds)


def uuid4() -> _uuid.UUID:
    return _current.get().uuid4()


def worker_threads() -> bool:
    """Whether the broker may run work on threads of its own that wait in real time (see the
    module docstring)."""
    return _current.get().worker_threads


__all__ = [
    "SYSTEM",
    "Clock",
    "SystemClock",
    "current",
    "monotonic",
    "monotonic_ms",
    "now_ms",
    "reset",
    "sleep",
    "time",
    "use",
    "uuid4",
    "worker_threads",
]
