"""An asyncio event loop on virtual time: timers fire in virtual time, nothing sleeps.

`VirtualTimeLoop` is asyncio's own selector loop with two changes:

- `time()` is a virtual clock (seconds from `start`, default 0.0). When nothing is ready to run,
  asyncio asks the selector to wait until the next timer; this loop polls the selector without
  waiting and moves the clock forward by that timeout instead, so the next timer is due at once.
  `asyncio.sleep(3600)` returns in microseconds of wall time, one hour later on the loop's clock.
  With nothing ready and no timer, nothing can ever happen (no other thread may wake the loop):
  `select` raises `Stalled`, which ends `run_until_complete` instead of hanging.
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

Events. `loop.after_event`, if set, is called after every callback the loop runs (a task's
step, a timer, a network delivery) with its handle: an invariant checker runs there, and what
it raises stops `run_until_complete` at that event.

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
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class Stalled(RuntimeError):
    """Nothing is ready, no timer is scheduled: no event can ever happen again."""


class _VirtualSelector(selectors.BaseSelector):
    """The loop's real selector (it still owns the self-pipe), polled without waiting; a wait
    becomes a jump of the virtual clock."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop):
        self._real = real
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

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
        `finally` blocks may run now; what they raise or schedule is dropped)."""
        frozen, self.frozen = self.frozen, []
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)  # what the dead program would log is not output
        try:
            for task in frozen:
                coro = task.get_coro()
                try:
                    if hasattr(coro, "close"):
                        coro.close()
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


def _held(handle: asyncio.Handle) -> bool:
    """Hold `handle` (not run it) if its process is paused; whether it was held."""
    process = owner(handle._context)  # type: ignore[attr-defined]
    if process is not None and process.paused:
        process.held.append(handle)
        return True
    return False


class _EventHandle(asyncio.Handle):
    """A callback whose run is an event (`VirtualTimeLoop.after_event`), held while its
    process is paused."""

    __slots__ = ()

    def _run(self) -> None:
        if _held(self):
            return
        super()._run()
        hook = self._loop.after_event  # type: ignore[attr-defined]
        if hook is not None:
            hook(self)


class _OrderedTimerHandle(asyncio.TimerHandle):
    """A timer ordered by (due time, scheduling order); its run is an event, held while its
    process is paused."""

    __slots__ = ("_seq",)
    _seq: int

    def _run(self) -> None:
        if _held(self):
            return
        super()._run()
        hook = self._loop.after_event  # type: ignore[attr-defined]
        if hook is not None:
            hook(self)

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _OrderedTimerHandle):
            return (self.when(), self._seq) < (other.when(), other._seq)
        return (
            self.when() < other.when() if isinstance(other, asyncio.TimerHandle) else NotImplemented
        )


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual and jumps to the next timer when idle."""

    def __init__(self, start: float = 0.0) -> None:
        real = selectors.DefaultSelector()
        # assigned before the base class registers its self-pipe through it
        self._now = float(start)
        self._timer_seq = itertools.count()
        #: called after every callback the loop runs, with its handle (see the module docstring)
        self.after_event: Callable[[asyncio.Handle], None] | None = None
        #: tasks of killed processes: never to run again (nor to be cancelled)
        self.frozen: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        super().__init__(_VirtualSelector(real, self))

    def time(self) -> float:
        return self._now

    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        """asyncio's call_at, with timers due at the same time kept in scheduling order."""
        base: Any = self  # asyncio's private helpers, as BaseEventLoop.call_at uses them
        base._check_closed()
        if base._debug:
            base._check_thread()
            base._check_callback(callback, "call_at")
        timer: Any = _OrderedTimerHandle(when, callback, args, self, context)
        timer._seq = next(self._timer_seq)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        process = owner(context)
        if process is not None and not process.alive:
            timer._cancelled = True  # a killed process schedules nothing
            return timer
        heapq.heappush(base._scheduled, timer)
        timer._scheduled = True
        return timer

    def _call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], args: Any, context: Any
    ) -> asyncio.Handle:
        """asyncio's `_call_soon` (behind call_soon and call_soon_threadsafe), with a killed
        process's callbacks dropped and every run an event."""
        handle: Any = _EventHandle(callback, args, self, context)
        if handle._source_traceback:
            del handle._source_traceback[-1]
        process = owner(context)
        if process is not None and not process.alive:
            handle._cancelled = True
            return handle  # type: ignore[no-any-return]
        base: Any = self
        base._ready.append(handle)
        return handle  # type: ignore[no-any-return]

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
        for handle in list(base._ready) + list(base._scheduled) + process.held:
            if owner(handle._context) is process:
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


__all__ = ["Process", "Stalled", "VirtualTimeLoop", "current_process", "owner", "run"]
