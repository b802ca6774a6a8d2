"""The interpreter on the simulator: `harness/interpreter.py`'s semantics as asyncio tasks on
the virtual-time loop (`harness/sim/clock.py`), writing the same history.

`SimInterpreter(generator, history, client_factory, concurrency, nemesis=None, seed=0,
hang_timeout=None, run_timeout=None)`, then `await interp.run()`:

- one task per client thread 0..concurrency-1. Thread t starts as process t; it asks the
  generator for an op (`Context` time: the history writer's clock, which a simulated run
  builds on the loop's virtual time), records the invoke, performs it with its client
  (`await client.invoke(op)`) and records the completion. After an `info` completion, or
  when the client reports itself `broken`, the client is closed and the thread continues as
  process `process + concurrency` with a new client, opened lazily before its next op;
- a client that cannot be opened (`await client.open()` raises) turns the op into a `fail`
  with error ["client-open", message]; an exception escaping a client turns it into an
  `info` with error ["client-crash", message] and a new process;
- `hang_timeout` (virtual seconds): a client call (open or invoke) that takes longer is
  cancelled; its op is completed as `info` ["hung", ...] and the thread goes on as a new
  process (the threaded interpreter abandons the OS thread; a task can be cancelled);
- `run_timeout` (virtual seconds from `run()`): when it passes, every open op is completed as
  `info` ["run-timeout", ...] (the nemesis's too), every task is cancelled and `run()`
  returns with `stats()["timed_out"]`;
- one nemesis task when a nemesis is given: it performs the generator's ops for the thread
  "nemesis" with `await nemesis.invoke(op) -> completion` (the op f "heal-all" with
  `await nemesis.heal_all()` when the nemesis has it), recording both as `info` ops of
  process "nemesis"; active faults are tracked from the f names as in the threaded one.

What is shared with the threaded interpreter is imported from it (the invoke and completion
shapes, the nemesis ops, fault tracking); what differs is only how waiting is done. Nothing
here uses threads or real time: generator calls and history writes happen in the loop's one
thread between awaits (no lock needed: an op the generator gives is recorded as invoked in
the same callback that asked for it), and tasks are created in thread order, so one seed
gives one history.

Waiting. A thread the generator answers `Pending(at)` is asked again at `at` (at most
`_IDLE_WAIT` later when `at` is None or further: the threaded interpreter's poll), or, since
`at` is a promise only as long as nothing else happens, after the next completion (or a
thread's end, or `stop()`): any event may change the generator's answer (an `until_ok` done,
a barrier passed). As in the threaded interpreter, every thread then waiting is asked again,
in the order they last asked; but a thread whose answer was a firm `Pending(at,
firm=True)` (`harness.generator.Pending`: until `at` the same answer whatever happens, and
asking changes nothing; `stagger`/`rate` and `sleep` give them) is not asked before `at`:
it sleeps on exactly as if it had been asked and told the same (its deadline set again from
now, last in the asleep order), so the run is the same, with about half of the generator's
asks (at 200 ops/s and 10 threads, 19 asks per op without). The asking is done by the
interpreter itself, in one callback per completion and in the thread's timer, not by waking
each thread's task: a thread whose answer is still `Pending` stays asleep (its timer set
again from now, as a new wait would be); only a thread given an op (its invoke recorded
then and there) or told it is done is woken. Threads whose deadlines fall on the same
virtual instant (all those told the same `at`) share one timer, which asks them in the order
they went to sleep: one event, not one per thread (at 200 ops/s and 10 threads, 15,000
events fewer in a 20-s run).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from isrlab.harness.generator import Context, Generator, Pending
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import (
    check_arguments,
    client_crashed,
    completion_of,
    crash_without_client,
    invoke_of,
    nemesis_completion_of,
    nemesis_invoke_of,
    open_failed,
    track_faults,
)

__all__ = ["AsyncClient", "AsyncNemesis", "SimInterpreter"]

log = logging.getLogger(__name__)

Op = dict[str, Any]

# How long an idle thread waits (virtual seconds) when the generator says "pending, ask
# again soon" and nothing completes meanwhile (the threaded interpreter's _IDLE_WAIT).
_IDLE_WAIT = 0.05

# what `_take` gives when the run is over before the op could be recorded
_STOP = object()


class AsyncClient(Protocol):
    broken: bool

    async def open(self) -> Any: ...

    async def invoke(self, op: Op) -> Op: ...

    async def close(self) -> None: ...


class AsyncNemesis(Protocol):
    async def invoke(self, op: Op) -> Op: ...


@dataclass(eq=False)
class _Worker:
    thread: int | str
    process: int | str
    exhausted: bool = False
    # Set when run() gave up on the run: nothing more is recorded for this worker.
    abandoned: bool = False
    open_invoke: Op | None = None
    # While asleep after a Pending: what wakes its task (a taken op, None, or an error) and
    # its deadline (the loop time of the timer it shares with the threads due then).
    wake: asyncio.Future[Any] | None = None
    due: float | None = None
    # the `at` of its last answer if that was a firm Pending (`harness.generator.Pending`):
    # until then, asking again would give the same answer and change nothing
    firm_at: int | None = None


class SimInterpreter:
    def __init__(
        self,
        generator: Generator,
        history: HistoryWriter,
        client_factory: Callable[[int, int], AsyncClient],
        concurrency: int,
        nemesis: AsyncNemesis | None = None,
        seed: int = 0,
        hang_timeout: float | None = None,
        run_timeout: float | None = None,
    ) -> None:
        """client_factory(process, thread) returns an unopened client; hang_timeout and
        run_timeout are virtual seconds, None for no bound (see the module doc)."""
        check_arguments(concurrency, hang_timeout, run_timeout)
        self.generator = generator
        self.history = history
        self.client_factory = client_factory
        self.concurrency = concurrency
        self.nemesis = nemesis
        self.hang_timeout = hang_timeout
        self.run_timeout = run_timeout
        self.rng = random.Random(seed)
        self.threads: list[int | str] = list(range(concurrency))
        if nemesis is not None:
            self.threads.append("nemesis")
        self._loop: asyncio.AbstractEventLoop | None = None
        # the threads asleep after a Pending, in the order they last asked (a dict as an
        # ordered set)
        self._asleep: dict[_Worker, None] = {}
        # deadline -> its timer and the threads due then, in the order they went to sleep
        self._due: dict[float, tuple[asyncio.TimerHandle, dict[_Worker, None]]] = {}
        self._wake_scheduled = False
        #: how many times the generator was asked for an op
        self.queries = 0
        self._stop = False
        self._closed = False
        self._finished = False
        self._workers: dict[int | str, _Worker] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.active_faults: set[str] = set()
        self.errors: list[str] = []
        self.abandoned: list[str] = []
        self.timed_out = False
        self._started_ns: int | None = None

    # ----- public -------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        """Run until every thread is done, `stop()`, or the run timeout; the final stats."""
        self._loop = asyncio.get_running_loop()
        self._started_ns = self.history.now()
        tasks: list[asyncio.Task[None]] = []
        for t in self.threads:
            w = _Worker(thread=t, process=t)
            self._workers[t] = w
            tasks.append(asyncio.create_task(self._guard(w), name=f"sim-worker-{t}"))
        try:
            _done, pending = await asyncio.wait(tasks, timeout=self.run_timeout)
            if pending:
                self._give_up()
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self._closed = True
            self._finished = True
        return self.stats()

    def stop(self) -> None:
        """Ask every thread to stop after its current op."""
        self._stop = True
        if self._loop is not None:
            self._wake_soon()

    def stats(self) -> dict[str, Any]:
        now = self.history.now()
        return {
            "invoked": self.counts["invoke"],
            "ok": self.counts["ok"],
            "fail": self.counts["fail"],
            "info": self.counts["info"],
            "active_faults": sorted(self.active_faults),
            "elapsed_s": (now - (now if self._started_ns is None else self._started_ns)) / 1e9,
            "finished": self._finished,
            "errors": list(self.errors),
            "abandoned": list(self.abandoned),
            "timed_out": self.timed_out,
            "generator_queries": self.queries,
            "loop_iterations": getattr(self._loop, "iterations", None),
        }

    # ----- internals ----------------------------------------------------------------------

    def _give_up(self) -> None:
        self._stop = True
        self.timed_out = True
        error = ["run-timeout", f"the run did not end within {self.run_timeout:.0f} s"]
        busy = []
        for w in self._workers.values():
            if w.open_invoke is not None:
                busy.append(str(w.thread))
                self._complete_abandoned(w, error)
            w.abandoned = True
        msg = (
            f"run timeout: {self.run_timeout:.0f} virtual s passed; open ops completed as "
            f"info: {', '.join(busy) or 'none'}"
        )
        log.warning("%s", msg)
        self.abandoned.append(msg)

    def _complete_abandoned(self, w: _Worker, error: list[str]) -> None:
        inv = w.open_invoke
        if inv is None:
            return
        self._record(
            w,
            {
                "process": w.process,
                "type": "info",
                "f": inv["f"],
                "value": inv.get("value"),
                "error": error,
            },
        )

    async def _guard(self, w: _Worker) -> None:
        try:
            if w.thread == "nemesis":
                await self._nemesis_loop(w)
            else:
                await self._worker_loop(w)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in a generator: stop the whole run, say why
            log.exception("thread %s died", w.thread)
            if not w.abandoned:
                self.errors.append(f"thread {w.thread}: {e!r}")
            self.stop()

    def _context(self, time: int, w: _Worker, process: int | str) -> Context:
        return Context(time, w.thread, process, self.threads, self.rng)

    # ----- asking the generator, sleeping ---------------------------------------------------

    def _ask(self, w: _Worker) -> tuple[bool, Any]:
        """Ask the generator once for the worker's thread: (True, what `_take` made of the
        op, or None when the thread is done) or (False, the virtual seconds to sleep)."""
        ctx = self._context(self.history.now(), w, w.process)
        self.queries += 1
        r = self.generator.op(ctx)
        if r is None:
            w.exhausted = True
            self._wake_soon()  # threads waiting on a barrier may proceed
            return True, None
        if isinstance(r, Pending):
            w.firm_at = r.at if r.firm else None
            return False, _wait(r.at, ctx.time)
        return True, self._take(w, r)

    def _take(self, w: _Worker, r: Op) -> Any:
        """Record the invoke of the generator's op `r` (in the same callback that asked for it):
        the nemesis's op, or a client's (invoke, hints); _STOP when the run is over."""
        if w.thread == "nemesis":
            op = nemesis_invoke_of(r)
            return op if self._record(w, op, invoke=True) is not None else _STOP
        invoke, hints = invoke_of(r, w.process)
        self._record(w, invoke, invoke=True)
        return invoke, hints

    async def _next(self, w: _Worker) -> Any:
        """The worker's next op, its invoke recorded (see `_take`), or None when its thread
        is done (or the run stopped)."""
        while not self._stop and not w.abandoned:
            given, value = self._ask(w)
            if given:
                return value
            loop = asyncio.get_running_loop()
            w.wake = loop.create_future()
            self._sleep(w, value)
            try:
                return await w.wake
            finally:
                self._unschedule(w)
                w.wake = None
                self._asleep.pop(w, None)
        return None

    def _sleep(self, w: _Worker, seconds: float) -> None:
        """(Re)set the worker's deadline `seconds` from now; it goes last in the asleep order
        (and last among the threads due at the same instant)."""
        self._unschedule(w)
        loop = self._loop
        assert loop is not None
        when = loop.time() + seconds
        group = self._due.get(when)
        if group is None:
            group = self._due[when] = (loop.call_at(when, self._ask_due, when), {})
        group[1][w] = None
        w.due = when
        self._asleep.pop(w, None)
        self._asleep[w] = None

    def _unschedule(self, w: _Worker) -> None:
        """Take the worker out of its deadline's timer (cancelled when no thread is left)."""
        when, w.due = w.due, None
        if when is None:
            return
        group = self._due.get(when)
        if group is not None:
            group[1].pop(w, None)
            if not group[1]:
                group[0].cancel()
                del self._due[when]

    def _ask_due(self, when: float) -> None:
        """A deadline came: ask its threads again, in the order they went to sleep."""
        group = self._due.pop(when, None)
        if group is None:
            return
        for w in list(group[1]):
            if w.due == when:
                w.due = None
                self._ask_again(w)

    def _ask_again(self, w: _Worker) -> None:
        """Ask the generator again for an asleep worker (its deadline came, or an event
        happened): still Pending, it sleeps on; otherwise its task is woken with the op."""
        wake = w.wake
        if wake is None or wake.done():
            return
        if self._stop or w.abandoned:
            wake.set_result(None)
            return
        at = w.firm_at
        if at is not None:
            now = self.history.now()
            if now < at:
                # a firm Pending until `at`: the generator would give the same answer, so
                # it is not asked; the worker sleeps on as if it had been (same deadline)
                # (`_wait(at, now)`, written out: `at` is ahead)
                seconds = (at - now) / 1e9
                self._sleep(w, _IDLE_WAIT if seconds >= _IDLE_WAIT else seconds)
                return
        try:
            given, value = self._ask(w)
        except Exception as e:  # a bug in a generator: the worker's task reports it
            wake.set_exception(e)
            return
        if given:
            wake.set_result(value)
        else:
            self._sleep(w, value)

    def _wake_soon(self) -> None:
        """After a completion (or a thread's end, or stop): every asleep thread is asked again
        in the next loop iteration, in the order they last asked."""
        if not self._wake_scheduled and self._loop is not None:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_all)

    def _wake_all(self) -> None:
        self._wake_scheduled = False
        for w in list(self._asleep):
            self._ask_again(w)

    def _record(self, w: _Worker, op: Op, *, invoke: bool = False) -> Op | None:
        """Write an op and feed it to the generator (None: nothing written, the run is over)."""
        if self._closed:
            return None
        stamped = self.history.write(op)
        self.generator.update(self._context(stamped["time"], w, op["process"]), stamped)
        w.open_invoke = stamped if invoke else None
        if w.thread != "nemesis":
            self.counts["invoke" if invoke else op["type"]] += 1
        if not invoke:
            self._wake_soon()
        return stamped

    async def _bounded(self, call: Any) -> Any:
        """Await a client call under the hang bound (TimeoutError past it)."""
        if self.hang_timeout is None:
            return await call
        # (asyncio.timeout in the worker's task would save a task per op, but it changes the
        # order of events: at bdadb58, which did that, `isrlab sim --seed 7` finds
        # hw-regression-realtime in the safe configuration, docs/benchmarks.md's simulator
        # section, 2026-11-29)
        return await asyncio.wait_for(call, self.hang_timeout)

    async def _worker_loop(self, w: _Worker) -> None:
        client: AsyncClient | None = None
        try:
            while True:
                taken = await self._next(w)
                if taken is None:
                    return
                invoke, hints = taken
                completion, client = await self._perform(w, client, invoke, hints)
                if w.abandoned or self._record(w, completion) is None:
                    return
                if completion["type"] == "info" or (client is not None and client.broken):
                    if client is not None:
                        await _close_quietly(client)
                    client = None
                    assert isinstance(w.process, int)
                    w.process += self.concurrency
        finally:
            if client is not None:
                await _close_quietly(client)

    async def _perform(
        self, w: _Worker, client: AsyncClient | None, invoke: Op, hints: Op
    ) -> tuple[Op, AsyncClient | None]:
        f = invoke["f"]
        process, thread = w.process, w.thread
        assert isinstance(process, int) and isinstance(thread, int)
        base = {"process": process, "f": f, "value": invoke["value"]}
        try:
            if client is None and f != "crash":
                client = self.client_factory(process, thread)
                try:
                    await self._bounded(client.open())
                except TimeoutError:
                    raise
                except Exception as e:
                    await _close_quietly(client)
                    return open_failed(base, e), None
            if client is None:
                return crash_without_client(base), None
            try:
                done = await self._bounded(client.invoke({**invoke, **hints}))
            except TimeoutError:
                raise
            except Exception as e:
                log.warning("process %s: client raised on %s: %r", process, f, e)
                return client_crashed(base, e), client
        except TimeoutError:
            msg = f"process {process} hung in {f} for {self.hang_timeout:.0f} virtual s"
            log.warning("%s", msg)
            self.abandoned.append(msg)
            error = ["hung", f"no completion after {self.hang_timeout:.0f} s"]
            return {**base, "type": "info", "error": error}, client
        return completion_of(done, process, f), client

    async def _nemesis_loop(self, w: _Worker) -> None:
        nem = self.nemesis
        assert nem is not None
        while True:
            op = await self._next(w)
            if op is None or op is _STOP:
                return
            f = str(op["f"])
            try:
                heal_all = getattr(nem, "heal_all", None)
                if f == "heal-all" and callable(heal_all):
                    done: Op = {**op, "value": await heal_all()}
                else:
                    done = dict(await nem.invoke(dict(op)))
            except Exception as e:
                log.exception("nemesis %s failed", f)
                done = {**op, "error": ["nemesis-crash", repr(e)]}
            if w.abandoned:
                return
            track_faults(self.active_faults, f)
            self._record(w, nemesis_completion_of(done, f))


def _wait(at: int | None, now: int) -> float:
    """How long a thread answered `Pending(at)` at `now` (ns) sleeps: until `at`, at most
    `_IDLE_WAIT`."""
    if at is None:
        return _IDLE_WAIT
    return min(_IDLE_WAIT, max(0.0, (at - now) / 1e9))


async def _close_quietly(client: AsyncClient) -> None:
    try:
        await client.close()
    except Exception as e:
        log.debug("closing client: %r", e)
