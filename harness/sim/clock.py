"""An asyncio event loop on virtual time: timers fire in virtual time, nothing sleeps.

`VirtualTimeLoop` is asyncio's own selector loop with two changes:

- `time()` is a virtual clock (seconds from `start`, default 0.0). When nothing is ready to run,
  asyncio would ask the selector to wait until the next timer; this loop moves the clock forward
  by that timeout instead, so the next timer is due at once. `asyncio.sleep(3600)` returns in
  microseconds of wall time, one hour later on the loop's clock. With nothing ready and no
  timer, nothing can ever happen (no other thread may wake the loop): the loop raises
  `Stalled`, which ends `run_until_complete` instead of hanging. The opposite, callbacks
  that keep the loop busy at one virtual instant for ever (a retry loop that never waits, a
  wait shorter than the clock resolution: the loop runs a timer due within it without moving
  its clock), would hang the run as surely: after `stuck_limit` iterations (1,000,000) without
  the clock moving, the loop raises `TimeStuck` ("virtual time stuck at T: ..."), which ends
  `run_until_complete` too. The loop runs its own
  iteration (asyncio's `_run_once`, same order of steps) over a heap of (due time, scheduling
  order, handle) tuples; the real selector (which still owns the self-pipe) is polled, without
  waiting, only while a real file descriptor is registered, a signal handler is set or
  another thread wrote to the self-pipe (`call_soon_threadsafe`), not on every iteration.
- `run_in_executor` (and so `asyncio.to_thread`) runs the function on the loop's thread, in the
  loop iteration after the call, instead of in a thread pool: a thread's timing would decide
  the order of events. The function takes no virtual time; a blocking call blocks for real.

The order in which callbacks run depends only on their due times and the order they were
scheduled (timers due at the same time fire in the order they were set, which asyncio's heap
alone does not promise), so one program on this loop gives the same trace on every run.

Processes. Several simulated programs (brokers) share the loop; `Process` is one of them: code
started with `process.run(fn)` runs in the process's `contextvars` context, and everything it
schedules from there on (tasks, their steps, callbacks, timers, `to_thread` calls) carries that
context and so belongs to the process. `loop.kill(process)` is kill -9: the process's pending
callbacks and timers are cancelled, whatever it would schedule later is dropped, and its tasks
are frozen where they stand (kept, never resumed, never cancelled: no `finally` or `except`
of the dead program runs, as none runs in a killed process). Whatever else the process held
(sockets, a ZooKeeper session) is the harness's to end as the kernel would (see
`harness.sim.cluster`). `Process.bury()` closes the frozen coroutines once the simulation is
over. Callbacks scheduled in a context that names no process (the harness's, the simulated
network's and ensemble's own) belong to no process.

`loop.pause(process)` is SIGSTOP: the process keeps everything, runs nothing. A callback of
its (a task's step, a timer come due, a future's done callback) that the loop reaches while it
is paused is held instead of run, in the order the loop reached it; `loop.resume(process)`
(SIGCONT) puts the held callbacks back in the ready queue in that order, so they run in the
next iteration, before anything scheduled after the resume. Nothing is dropped and virtual
time goes on: the process finds, as after a SIGSTOP, that its timers are overdue. What is
delivered to it meanwhile (the simulated network runs in its own context) waits in its
buffers. A paused process can be killed: what it held is cancelled with the rest.

The process a callback belongs to is found once, when it is scheduled (the owner of its
context), and kept on its handle.

Events. `loop.after_event`, if set, is called after every callback the loop runs (a task's
step, a timer, a network delivery) with its handle: an invariant checker runs there, and what
it raises stops `run_until_complete` at that event. `loop.iterations` counts the iterations.

Why not `looptime` (MIT, maintained, works on 3.11 here): it is built for fast tests next to
real I/O and threads, not for reproducible runs. While a thread-pool future is pending it
moves the clock in steps paced by real time (`to_thread(time.sleep, 0.05)` moved its clock by
0.04 s on one run and 0.05 s on the next), with nothing scheduled it waits in real time (or
forever) instead of reporting the stall, and every jump of the clock costs 42 extra loop
iterations. What a simulation needs is the few lines below.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import logging
import selectors
import sys
import weakref
from asyncio import base_events, format_helpers
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

# asyncio's constants for its own iteration (base_events), kept so that this loop's clock
# jumps and timer heap clean-ups happen as asyncio's would
_base_events: Any = base_events
_MAXIMUM_SELECT_TIMEOUT: float = _base_events.MAXIMUM_SELECT_TIMEOUT
_MIN_SCHEDULED: int = _base_events._MIN_SCHEDULED_TIMER_HANDLES
_CANCELLED_FRACTION: float = _base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION


class Stalled(RuntimeError):
    """Nothing is ready, no timer is scheduled: no event can ever happen again."""


class TimeStuck(RuntimeError):
    """The loop ran `stuck_limit` iterations without its clock moving: a busy loop at one
    virtual instant, which would never end."""


#: iterations at one virtual instant after which the loop raises TimeStuck (far more than
#: the callbacks of one instant of a run, a few seconds of wall time of a busy loop)
STUCK_LIMIT = 1_000_000


class _VirtualSelector(selectors.BaseSelector):
    """The loop's real selector (it still owns the self-pipe), polled without waiting; a wait
    becomes a jump of the virtual clock. It tells the loop whether anything besides the
    loop's own self-pipe is registered (only then does each iteration poll it)."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop):
        self._real = real
        self._loop = loop

    def _count(self) -> None:
        loop = self._loop
        loop._real_fds = len(self._real.get_map()) > getattr(loop, "_internal_fds", 0)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events, data)
        self._count()
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._real.unregister(fileobj)
        self._count()
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stalled(
                f"at virtual time {self._loop.time():.6f}: nothing ready and no timer scheduled"
            )
        self._loop._advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)


class Process:
    """One simulated program on the loop (see the module docstring): `run(fn, *args)` runs
    `fn` in its context; what that schedules belongs to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        #: stopped (SIGSTOP) by `VirtualTimeLoop.pause`: its callbacks are held, not run
        self.paused = False
        #: the callbacks the loop reached while the process was paused, in that order
        self.held: list[asyncio.Handle] = []
        self.context = contextvars.Context()
        self.context.run(_current_process.set, self)
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        #: the tasks that were pending when the process was killed, kept so that nothing
        #: collects (and so closes) them while the simulation runs
        self.frozen: list[asyncio.Task[Any]] = []

    def __repr__(self) -> str:
        state = "" if self.alive else " killed"
        return f"<Process {self.name}{state}{' paused' if self.paused and self.alive else ''}>"

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return self.context.run(fn, *args)

    def bury(self) -> None:
        """Close the coroutines of the tasks frozen at the kill (the simulation is over: their
        `finally` blocks may run now; what they raise or schedule is dropped). They run in the
        process's context, so what they schedule is the dead process's and is dropped (a task
        they create is frozen, and closed here in turn), not the harness's to run."""
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)  # what the dead program would log is not output
        try:
            while self.frozen:
                frozen, self.frozen = self.frozen, []
                for task in frozen:
                    coro = task.get_coro()
                    try:
                        if hasattr(coro, "close"):
                            self.context.run(coro.close)
                    except BaseException as e:  # a dead program's cleanup: nothing to report
                        if isinstance(e, KeyboardInterrupt):
                            raise
        finally:
            logging.disable(previous)


_current_process: contextvars.ContextVar[Process | None] = contextvars.ContextVar(
    "sim_process", default=None
)


def current_process() -> Process | None:
    """The process whose code is running (None: the harness's own)."""
    return _current_process.get()


def owner(context: contextvars.Context | None) -> Process | None:
    """The process a callback scheduled in `context` belongs to (None: the current one's
    context, as asyncio takes it)."""
    if context is None:
        return _current_process.get()
    return context.get(_current_process)


class _EventHandle(asyncio.Handle):
    """A callback whose run is an event (`VirtualTimeLoop.after_event`), held while its
    process (`_process`, the owner of its context) is paused; run by `VirtualTimeLoop`."""

    __slots__ = ("_process",)
    _process: Process | None

    def __init__(
        self,
        callback: Any,
        args: Any,
        loop: Any,
        context: Any = None,
        process: Process | None = None,
    ) -> None:
        # asyncio's `Handle.__init__` (without its per-handle `get_debug()` call), plus the
        # process the handle belongs to, found once when it is scheduled
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._process = process
        tb: Any = format_helpers.extract_stack(sys._getframe(1)) if loop._debug else None
        self._source_traceback = tb


class _OrderedTimerHandle(asyncio.TimerHandle):
    """A timer; the loop keeps it in its heap as (due time, scheduling order, handle), so
    timers due at the same time fire in the order they were set. Its run is an event, held
    while its process is paused."""

    __slots__ = ("_process",)
    _process: Process | None

    def __init__(
        self,
        when: float,
        callback: Any,
        args: Any,
        loop: Any,
        context: Any = None,
        process: Process | None = None,
    ) -> None:
        # as `_EventHandle.__init__` (written out: a call fewer per timer set)
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._process = process
        tb: Any = format_helpers.extract_stack(sys._getframe(1)) if loop._debug else None
        self._source_traceback = tb
        self._when = when
        self._scheduled = False


#: a handle without its `__init__` run (`_call_soon` and `call_at` set its fields)
_new_handle: Any = object.__new__


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual and jumps to the next timer when idle.

    It runs its own iteration (`_run_once`): its timer heap holds (due time, scheduling
    order, handle) tuples, compared in C; the real selector is polled only while something
    real is registered on it (a file descriptor besides the loop's own self-pipe) or after a
    write to the self-pipe (`call_soon_threadsafe`) or with a signal handler set; each
    handle's process is found when it is scheduled, not on every run."""

    def __init__(self, start: float = 0.0) -> None:
        real = selectors.DefaultSelector()
        # assigned before the base class registers its self-pipe through it
        self._now = float(start)
        self._timer_seq = itertools.count()
        #: something besides the self-pipe is registered on the real selector
        self._real_fds = False
        #: the self-pipe was written to (a wake-up from another thread): poll it
        self._self_pipe_written = False
        #: called after every callback the loop runs, with its handle (see the module docstring)
        self.after_event: Callable[[asyncio.Handle], None] | None = None
        #: tasks of killed processes: never to run again (nor to be cancelled)
        self.frozen: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        #: loop iterations run (for benchmarks)
        self.iterations = 0
        #: iterations at one virtual instant after which TimeStuck is raised
        self.stuck_limit = STUCK_LIMIT
        self._instant = float(start)  # the clock at the start of the last iteration...
        self._instant_since = 0  # ... and the iteration in which it last moved
        super().__init__(_VirtualSelector(real, self))
        self._real_selector = real

    def time(self) -> float:
        return self._now

    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def _write_to_self(self) -> None:
        self._self_pipe_written = True
        super()._write_to_self()  # type: ignore[misc]

    # ----- one iteration -----------------------------------------------------------------

    def _run_once(self) -> None:
        """One iteration, as asyncio's `_run_once` orders it: drop cancelled timers, poll
        for I/O (only if something real is registered), jump the clock to the next timer if
        nothing is ready (Stalled if there is none), move the due timers to the ready queue,
        run what was ready at the start of the run-through (each run an event)."""
        self.iterations += 1
        if self._now != self._instant:
            self._instant, self._instant_since = self._now, self.iterations
        elif self.iterations - self._instant_since > self.stuck_limit:
            self._instant_since = self.iterations  # the same allowance again for a shutdown
            raise TimeStuck(self._stuck_message())
        base: Any = self
        scheduled: list[tuple[float, int, Any]] = base._scheduled
        n = len(scheduled)
        if n > _MIN_SCHEDULED and base._timer_cancelled_count / n > _CANCELLED_FRACTION:
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            base._scheduled = scheduled = kept
            base._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                base._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False

        ready = base._ready
        idle = not ready and not base._stopping
        if self._real_fds or self._self_pipe_written or base._signal_handlers:
            self._self_pipe_written = False
            events = self._real_selector.select(0)
            if events:
                idle = False
                base._process_events(events)
        if idle:
            if not scheduled:
                raise Stalled(
                    f"at virtual time {self._now:.6f}: nothing ready and no timer scheduled"
                )
            # the wait asyncio would ask of the selector, taken as a jump of the clock (the
            # same arithmetic as a select timeout, so the same virtual times)
            timeout = min(max(0, scheduled[0][0] - self._now), _MAXIMUM_SELECT_TIMEOUT)
            if timeout > 0:
                self._now += timeout

        end_time = self._now + base._clock_resolution
        while scheduled and scheduled[0][0] < end_time:
            handle = heapq.heappop(scheduled)[2]
            handle._scheduled = False
            ready.append(handle)

        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if handle._cancelled:
                continue
            try:
                process = handle._process
            except AttributeError:  # asyncio's own (a real fd's reader): no process, no event
                handle._run()
                continue
            if process is not None and process.paused:
                process.held.append(handle)
                continue
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._callback_raised(handle, exc)
            hook = self.after_event
            if hook is not None:
                hook(handle)
        handle = None  # no cycle through an exception's traceback

    def _stuck_message(self) -> str:
        base: Any = self
        ready = [repr(h) for h in list(base._ready)[:5]]
        more = len(base._ready) - len(ready)
        return (
            f"virtual time stuck at {self._now:.6f}: {self.stuck_limit} loop iterations without "
            f"the clock moving (a busy loop at one virtual instant); ready: "
            + (", ".join(ready) or "nothing")
            + (f" and {more} more" if more > 0 else "")
        )

    def _callback_raised(self, handle: Any, exc: BaseException) -> None:
        """What asyncio's `Handle._run` does with an exception a callback raised."""
        cb = format_helpers._format_callback_source(handle._callback, handle._args)
        context = {"message": f"Exception in callback {cb}", "exception": exc, "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    # ----- scheduling ----------------------------------------------------------------------

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        """asyncio's call_soon (see `_call_soon`)."""
        base: Any = self
        if base._closed:
            raise RuntimeError("Event loop is closed")
        if base._debug:
            return super().call_soon(callback, *args, context=context)
        return self._call_soon(callback, args, context)

    def _call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], args: Any, context: Any
    ) -> asyncio.Handle:
        """asyncio's `_call_soon` (behind call_soon and call_soon_threadsafe), with a killed
        process's callbacks dropped and every run an event."""
        base: Any = self
        process = _current_process.get() if context is None else context.get(_current_process)
        # `_EventHandle(callback, args, self, context, process)`, written out (a call fewer
        # per callback scheduled)
        handle: Any = _new_handle(_EventHandle)
        handle._context = contextvars.copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._process = process
        handle._source_traceback = (
            format_helpers.extract_stack(sys._getframe(0)) if base._debug else None
        )
        if process is not None and not process.alive:
            handle._cancelled = True
            return handle  # type: ignore[no-any-return]
        base._ready.append(handle)
        return handle  # type: ignore[no-any-return]

    def call_later(  # type: ignore[override]
        self, delay: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        """asyncio's call_at, with timers due at the same time kept in scheduling order."""
        base: Any = self  # asyncio's private helpers, as BaseEventLoop.call_at uses them
        if base._closed:
            raise RuntimeError("Event loop is closed")
        if base._debug:
            base._check_thread()
            base._check_callback(callback, "call_at")
        process = _current_process.get() if context is None else context.get(_current_process)
        # `_OrderedTimerHandle(when, callback, args, self, context, process)`, written out (a
        # call fewer per timer set)
        timer: Any = _new_handle(_OrderedTimerHandle)
        timer._context = contextvars.copy_context() if context is None else context
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._process = process
        timer._source_traceback = (
            format_helpers.extract_stack(sys._getframe(0)) if base._debug else None
        )
        timer._when = when
        timer._scheduled = False
        seq = next(self._timer_seq)
        if process is not None and not process.alive:
            timer._cancelled = True  # a killed process schedules nothing
            return timer  # type: ignore[no-any-return]
        heapq.heappush(base._scheduled, (when, seq, timer))
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, _T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        """asyncio's create_task; the task is counted among its process's."""
        task = super().create_task(coro, name=name, context=context)
        process = owner(context)
        if process is not None:
            process.tasks.add(task)
            if not process.alive:  # never to run: kept with the frozen ones
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                process.frozen.append(task)
                self.frozen.add(task)
        return task

    def kill(self, process: Process) -> None:
        """kill -9 of `process` (see the module docstring): its pending callbacks and timers
        cancelled, nothing it schedules from now on runs, its tasks frozen."""
        if not process.alive:
            return
        process.alive = False
        base: Any = self
        timers = [entry[2] for entry in base._scheduled]
        for handle in list(base._ready) + timers + process.held:
            if getattr(handle, "_process", None) is process:
                handle.cancel()
        process.held.clear()
        for task in list(process.tasks):
            if not task.done():
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                process.frozen.append(task)
                self.frozen.add(task)

    def pause(self, process: Process) -> None:
        """SIGSTOP of `process` (see the module docstring): from now on, each of its callbacks
        the loop reaches is held, not run."""
        if process.alive:
            process.paused = True

    def resume(self, process: Process) -> None:
        """SIGCONT of `process`: its held callbacks go back to the ready queue, in the order
        they were held (a cancelled one is skipped when the loop reaches it)."""
        if not process.paused:
            return
        process.paused = False
        held, process.held = process.held, []
        if process.alive:
            base: Any = self
            base._ready.extend(held)

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., _T], *args: Any
    ) -> asyncio.Future[_T]:
        """Run `func(*args)` on this thread in the next iteration (no pool, whatever executor
        is named); the future holds its result or exception."""
        base: Any = self
        base._check_closed()
        fut: asyncio.Future[_T] = self.create_future()

        def run() -> None:
            if fut.cancelled():
                return
            try:
                result = func(*args)
            except BaseException as e:  # what the thread would have raised into the future
                if isinstance(e, KeyboardInterrupt | SystemExit):
                    raise
                fut.set_exception(e)
            else:
                fut.set_result(result)

        self.call_soon(run)
        return fut


def run(main: Any, start: float = 0.0) -> Any:
    """`asyncio.run` on a fresh `VirtualTimeLoop`: run the coroutine, then close the loop."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    frozen = getattr(loop, "frozen", ())
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done() and t not in frozen]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


__all__ = [
    "STUCK_LIMIT",
    "Process",
    "Stalled",
    "TimeStuck",
    "VirtualTimeLoop",
    "current_process",
    "owner",
    "run",
]
