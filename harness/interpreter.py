"""The interpreter: runs a generator with worker threads and a nemesis, writing the history.

`Interpreter(generator, history, client_factory, concurrency, nemesis=None, seed=0,
hang_timeout=None, run_timeout=None)`:

- one worker thread per client thread 0..concurrency-1. Thread t starts as process t;
  it asks the generator for an op, records the invoke, performs it with its client and
  records the completion. After an `info` completion, or when the client reports itself
  `broken`, the thread closes the client and continues as process `process + concurrency`
  with a new client (opened lazily before its next op), so a process runs one op at a
  time and is never reused after an info (docs/history-format.md);
- a client that cannot be opened turns the op into a `fail` with error
  ["client-open", message] (nothing was sent); an exception escaping a client turns it
  into an `info` with error ["client-crash", message] and a new process;
- a client call that never returns (librdkafka can block without end in close, destroy,
  commit or rebalance paths) cannot hold the run: with `hang_timeout` (seconds), a worker
  busy in one call of its client (open, invoke or close) for longer than that is
  abandoned. Its open op, if any, is completed as `info` with error
  ["hung", "no completion after N s"]; the OS thread is left behind (a daemon, never
  joined again; whatever it returns later is dropped, never written) and a fresh OS thread
  carries the logical thread on as process `process + concurrency`, as after a crash.
  `stats()["abandoned"]` lists one line per abandoned worker for the progress display;
- with `run_timeout` (seconds from `run()`), the whole run is bounded: when it passes,
  the interpreter stops every thread, completes every open op as `info` with error
  ["run-timeout", ...] (a nemesis op gets its `info` completion with that error too),
  abandons the threads still busy and returns (`stats()["timed_out"]`). The checker then
  runs on what was recorded. `bounds(...)` computes both limits from a test's timings;
- one nemesis thread when a nemesis is given: it performs the generator's ops for the
  thread "nemesis" by calling `nemesis.invoke(op) -> completion`, recording both as
  `info` ops of process "nemesis". The op f "heal-all" calls `nemesis.heal_all()` when
  the nemesis has it. Active faults are tracked from f names: start-X opens X, stop-X
  closes it, heal-all closes all. Nemesis ops have no per-op bound (restarting a node can
  take long); `run_timeout` bounds them;
- generator calls and history writes happen under one lock, so the history order is the
  order the generator saw; the client calls themselves run in parallel
  (confluent-kafka releases the GIL while it waits). After `run()` returns nothing is
  written any more, so the caller may close the history even when abandoned threads
  are still blocked;
- `stats()` gives live counters for a progress display: invoked, ok, fail, info,
  ops/s over the last second, active faults, elapsed seconds, finished flag, abandoned
  workers, timed_out.

`run()` blocks until every thread is done (the generator returned None for it) or
`stop()` was called (each thread then finishes its current op and stops; the hang bound
still applies), or `run_timeout` passed; it closes every client it still owns and returns
the final stats. It never waits for an abandoned thread.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from isrlab.harness.generator import Context, Generator, Pending
from isrlab.harness.history import HistoryWriter

__all__ = [
    "Client",
    "Interpreter",
    "NemesisLike",
    "bounds",
    "client_crashed",
    "completion_of",
    "crash_without_client",
    "invoke_of",
    "nemesis_completion_of",
    "nemesis_invoke_of",
    "open_failed",
    "track_faults",
]

log = logging.getLogger(__name__)

Op = dict[str, Any]


class Client(Protocol):
    broken: bool

    def open(self) -> Any: ...

    def invoke(self, op: Op) -> Op: ...

    def close(self) -> None: ...


class NemesisLike(Protocol):
    def invoke(self, op: Op) -> Op: ...


# How long an idle thread sleeps when the generator says "pending, ask again soon".
_IDLE_WAIT = 0.05
# How often run() looks for hung workers and the run's deadline.
_WATCH_INTERVAL = 0.1
# A gap between two looks longer than this means run()'s thread itself was not scheduled.
_STALL_S = 0.5
# The hang grace: at least this much on top of a client's own time budget per call.
_MIN_HANG_GRACE_S = 10.0
# The run's grace on top of its phases: the heal op (restarting killed nodes) and the
# barriers between phases (a nemesis op in flight at the time limit).
_RUN_GRACE_S = 120.0


def bounds(
    op_timeout_s: float, time_limit_s: float, recovery_s: float, final_time_limit_s: float
) -> tuple[float, float]:
    """(hang_timeout, run_timeout) in seconds for a test whose clients give up on an op's
    requests after `op_timeout_s` (the queue workload's op_timeout_ms).

    A client call may legitimately last two op timeouts (a transaction's body runs until
    its deadline, then abort_transaction may wait one more), so a call is hung after that
    plus a grace of max(10 s, op timeout). The run ends at the latest after its phases
    (time limit, recovery, final time limit), one hang bound for each of the two phase
    ends at which an op may still be in flight, and 120 s for the heal and the barriers.
    """
    op_timeout_s = max(0.0, op_timeout_s)
    hang = 2 * op_timeout_s + max(_MIN_HANG_GRACE_S, op_timeout_s)
    run = time_limit_s + recovery_s + final_time_limit_s + 2 * hang + _RUN_GRACE_S
    return hang, run


@dataclass(eq=False)
class _Worker:
    """One OS thread carrying a logical thread; the fields are guarded by the lock, except
    `busy`, which the worker sets and clears without it (one atomic store of a tuple), so
    that waiting for the interpreter's lock after a client call returned never counts as
    being stuck in that call. The lock-held check of `abandoned` when the worker records
    its completion decides which of the two (the worker or run()) completes the op."""

    thread: int | str
    process: int | str
    os_thread: threading.Thread | None = None
    # Set by run(): this OS thread no longer speaks for its logical thread.
    abandoned: bool = False
    # The generator has nothing more for this thread (only the last close remains).
    exhausted: bool = False
    # The client call the thread is in ("open", "invoke", "close", "nemesis") and since
    # when (time.monotonic()); None between calls.
    busy: tuple[str, float] | None = None
    # The invoke recorded and not yet completed.
    open_invoke: Op | None = None


class Interpreter:
    def __init__(
        self,
        generator: Generator,
        history: HistoryWriter,
        client_factory: Callable[[int, int], Client],
        concurrency: int,
        nemesis: NemesisLike | None = None,
        seed: int = 0,
        hang_timeout: float | None = None,
        run_timeout: float | None = None,
    ) -> None:
        """client_factory(process, thread) returns an unopened client for that process.
        hang_timeout / run_timeout: seconds, None for no bound (see the module doc)."""
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
        # Re-entrant: recording an invoke happens inside the generator call's critical section.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._done = threading.Event()
        # After run() returns: nothing more is written to the history or told the generator.
        self._closed = False
        self._workers: dict[int | str, _Worker] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.active_faults: set[str] = set()
        self._recent: collections.deque[int] = collections.deque()
        self._started_ns: int | None = None
        self.errors: list[str] = []
        self.abandoned: list[str] = []
        self.timed_out = False
        self._last_watch: float | None = None

    # ----- public -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._started_ns = self.history.now()
        started = time.monotonic()
        deadline = None if self.run_timeout is None else started + self.run_timeout
        with self._lock:
            for t in self.threads:
                self._spawn(_Worker(thread=t, process=t))
        try:
            self._wait(deadline)
        except BaseException:
            # Ctrl-C: let the threads finish their op so the history stays well formed (a
            # hung one is still abandoned after the hang bound).
            self.stop()
            self._wait(deadline)
            raise
        finally:
            with self._lock:
                self._closed = True
            self._done.set()
        return self.stats()

    def stop(self) -> None:
        """Ask every thread to stop after its current op."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        now = self.history.now()
        with self._lock:
            while self._recent and self._recent[0] < now - 1_000_000_000:
                self._recent.popleft()
            return {
                "invoked": self.counts["invoke"],
                "ok": self.counts["ok"],
                "fail": self.counts["fail"],
                "info": self.counts["info"],
                "ops_per_s": len(self._recent),
                "active_faults": sorted(self.active_faults),
                "elapsed_s": (now - (self._started_ns or now)) / 1e9,
                "finished": self._done.is_set(),
                "errors": list(self.errors),
                "abandoned": list(self.abandoned),
                "timed_out": self.timed_out,
            }

    # ----- supervision --------------------------------------------------------------------

    def _spawn(self, w: _Worker) -> None:
        """Start an OS thread for `w` and make it its logical thread's worker (lock held)."""
        w.os_thread = threading.Thread(
            target=self._guard,
            args=(w,),
            name=f"isrlab-worker-{w.thread}-p{w.process}",
            daemon=True,
        )
        self._workers[w.thread] = w
        w.os_thread.start()

    def _wait(self, deadline: float | None) -> None:
        """Wait for every current worker, abandoning hung ones, until `deadline`."""
        while True:
            with self._lock:
                live = [
                    w
                    for w in self._workers.values()
                    if not w.abandoned and w.os_thread is not None and w.os_thread.is_alive()
                ]
            if not live:
                return
            if deadline is not None and time.monotonic() >= deadline:
                self._give_up()
                return
            self._watch()
            assert live[0].os_thread is not None
            live[0].os_thread.join(_WATCH_INTERVAL)

    def _watch(self) -> None:
        """Abandon the client workers stuck in one client call beyond the hang bound."""
        if self.hang_timeout is None:
            return
        now = time.monotonic()
        last, self._last_watch = self._last_watch, now
        if last is not None and now - last > _STALL_S:
            # This thread was not scheduled for a while (a loaded machine, a stopped
            # process): neither were the workers, so judge nobody before they had a chance.
            return
        with self._cond:
            for w in list(self._workers.values()):
                busy = w.busy
                if w.thread == "nemesis" or busy is None or w.abandoned:
                    continue
                what, since = busy
                secs = now - since
                if secs < self.hang_timeout:
                    continue
                self._abandon(w, ["hung", f"no completion after {secs:.0f} s"])
                msg = f"worker {w.thread}: process {w.process} hung in {what} for {secs:.0f} s"
                if w.exhausted or self._stop.is_set():
                    msg += ": abandoned (its thread is done or the run is stopping)"
                    nxt = None
                else:
                    assert isinstance(w.process, int)
                    nxt = _Worker(thread=w.thread, process=w.process + self.concurrency)
                    msg += f": abandoned, the thread goes on as process {nxt.process}"
                log.warning("%s", msg)
                self.abandoned.append(msg)
                if nxt is not None:
                    self._spawn(nxt)
            self._cond.notify_all()

    def _give_up(self) -> None:
        """The run's deadline passed: complete every open op as info, abandon every thread."""
        with self._cond:
            self._stop.set()
            self.timed_out = True
            error = ["run-timeout", f"the run did not end within {self.run_timeout:.0f} s"]
            busy = []
            for w in list(self._workers.values()):
                if w.os_thread is not None and w.os_thread.is_alive() and not w.abandoned:
                    b = w.busy
                    busy.append(f"{w.thread} ({b[0] if b else 'between ops'})")
                    self._abandon(w, error)
            msg = (
                f"run timeout: {self.run_timeout:.0f} s passed; open ops completed as info, "
                f"threads left behind: {', '.join(busy) or 'none'}"
            )
            log.warning("%s", msg)
            self.abandoned.append(msg)
            self._cond.notify_all()

    def _abandon(self, w: _Worker, error: list[str]) -> None:
        """Complete `w`'s open op (if any) as info and cut `w` off (lock held)."""
        inv = w.open_invoke
        if inv is not None:
            done: Op = {
                "process": w.process,
                "type": "info",
                "f": inv["f"],
                "value": inv.get("value"),
                "error": error,
            }
            self._record(w, done)
        w.open_invoke = None
        w.abandoned = True

    @staticmethod
    def _set_busy(w: _Worker, what: str | None) -> None:
        """Enter (`what`) or leave (None) a client call; lock-free (see `_Worker`)."""
        w.busy = None if what is None else (what, time.monotonic())

    # ----- internals ----------------------------------------------------------------------

    def _guard(self, w: _Worker) -> None:
        try:
            if w.thread == "nemesis":
                self._nemesis_loop(w)
            else:
                self._worker_loop(w)
        except Exception as e:  # a bug in a generator: stop the whole run, say why
            log.exception("thread %s died", w.thread)
            with self._lock:
                if not w.abandoned:
                    self.errors.append(f"thread {w.thread}: {e!r}")
            self.stop()

    def _next(self, w: _Worker) -> Op | None:
        """The next op for the worker's thread (invoke already recorded), or None when done
        (also when the worker was abandoned)."""
        with self._cond:
            while not self._stop.is_set() and not w.abandoned:
                ctx = Context(self.history.now(), w.thread, w.process, self.threads, self.rng)
                r = self.generator.op(ctx)
                if r is None:
                    # This thread is done; others waiting on a barrier may now proceed.
                    w.exhausted = True
                    self._cond.notify_all()
                    return None
                if isinstance(r, Pending):
                    wait = _IDLE_WAIT
                    if r.at is not None:
                        wait = min(wait, max(0.0, (r.at - ctx.time) / 1e9))
                    self._cond.wait(wait)
                    continue
                return r
            return None

    def _record(self, w: _Worker, op: Op, *, invoke: bool = False) -> Op | None:
        """Write an op to the history and feed it to the generator; None (nothing written)
        when `w` was abandoned or the run is over."""
        with self._cond:
            if w.abandoned or self._closed:
                log.info("dropped %s of abandoned thread %s: %s", op["type"], w.thread, op)
                return None
            stamped = self.history.write(op)
            ctx = Context(stamped["time"], w.thread, op["process"], self.threads, self.rng)
            self.generator.update(ctx, stamped)
            w.open_invoke = stamped if invoke else None
            if w.thread == "nemesis":
                return stamped
            self.counts["invoke" if invoke else op["type"]] += 1
            if not invoke:
                self._recent.append(stamped["time"])
                self._cond.notify_all()
            return stamped

    def _worker_loop(self, w: _Worker) -> None:
        client: Client | None = None
        try:
            while True:
                op = self._next_invoke(w)
                if op is None:
                    return
                invoke, hints = op
                completion, client = self._perform(w, client, invoke, hints)
                self._set_busy(w, None)
                if self._record(w, completion) is None:
                    return  # abandoned meanwhile: its info is written, this is dropped
                if completion["type"] == "info" or (client is not None and client.broken):
                    if client is not None:
                        self._set_busy(w, "close")
                        _close_quietly(client)
                        self._set_busy(w, None)
                    client = None
                    with self._lock:
                        if w.abandoned:
                            return
                        assert isinstance(w.process, int)
                        w.process += self.concurrency
        finally:
            if client is not None:
                self._set_busy(w, "close")
                _close_quietly(client)
                self._set_busy(w, None)

    def _next_invoke(self, w: _Worker) -> tuple[Op, Op] | None:
        with self._cond:
            r = self._next(w)
            if r is None:
                return None
            invoke, hints = invoke_of(r, w.process)
            # Record while still holding the lock: the generator's order is the file's.
            self._record(w, invoke, invoke=True)
            # The op's client calls start now, for the hang bound.
            self._set_busy(w, "open")
            return invoke, hints

    def _perform(
        self, w: _Worker, client: Client | None, invoke: Op, hints: Op
    ) -> tuple[Op, Client | None]:
        f = invoke["f"]
        process, thread = w.process, w.thread
        assert isinstance(process, int) and isinstance(thread, int)
        base = {"process": process, "f": f, "value": invoke["value"]}
        if client is None and f != "crash":
            client = self.client_factory(process, thread)
            try:
                client.open()
            except Exception as e:
                _close_quietly(client)
                return open_failed(base, e), None
        if client is None:  # crash with no open client: nothing to tear down
            return crash_without_client(base), None
        self._set_busy(w, "invoke")
        try:
            done = client.invoke({**invoke, **hints})
        except Exception as e:
            log.warning("process %s: client raised on %s: %r", process, f, e)
            return client_crashed(base, e), client
        return completion_of(done, process, f), client

    def _nemesis_loop(self, w: _Worker) -> None:
        nem = self.nemesis
        assert nem is not None
        while True:
            r = self._next(w)
            if r is None:
                return
            op = nemesis_invoke_of(r)
            if self._record(w, op, invoke=True) is None:
                return
            f = str(op["f"])
            self._set_busy(w, "nemesis")
            try:
                heal_all = getattr(nem, "heal_all", None)
                if f == "heal-all" and callable(heal_all):
                    done: Op = {**op, "value": heal_all()}
                else:
                    done = dict(nem.invoke(dict(op)))
            except Exception as e:
                log.exception("nemesis %s failed", f)
                done = {**op, "error": ["nemesis-crash", repr(e)]}
            done = nemesis_completion_of(done, f)
            self._set_busy(w, None)
            with self._lock:
                if w.abandoned:
                    return
                track_faults(self.active_faults, f)
                self._record(w, done)


# ----- pure pieces, shared with the simulator's asyncio interpreter (harness/sim/interpreter.py)


def check_arguments(
    concurrency: int, hang_timeout: float | None, run_timeout: float | None
) -> None:
    """Both interpreters' (this one's and harness/sim/interpreter.py's) argument checks: at
    least one thread, bounds positive (None: no bound)."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    for name, v in (("hang_timeout", hang_timeout), ("run_timeout", run_timeout)):
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be a positive number of seconds, not {v!r}")


def invoke_of(r: Op, process: int | str) -> tuple[Op, Op]:
    """The invoke to record for the generator's op `r` performed by `process`, and the op's
    hints (its keys starting with "_": for the client, never written)."""
    invoke: Op = {"process": process, "type": "invoke"}
    hints: Op = {}
    for k, v in r.items():
        if k.startswith("_"):
            hints[k] = v
        elif k not in ("process", "type", "index", "time"):
            invoke[k] = v
    invoke.setdefault("value", None)
    return invoke, hints


def open_failed(base: Op, e: BaseException) -> Op:
    """The completion of an op whose client could not be opened: nothing was sent."""
    return {**base, "type": "fail", "error": ["client-open", str(e)]}


def crash_without_client(base: Op) -> Op:
    """A crash op of a process with no open client: nothing to tear down."""
    return {**base, "type": "info", "value": None}


def client_crashed(base: Op, e: BaseException) -> Op:
    """The completion of an op whose client raised: unknown, and the process ends."""
    return {**base, "type": "info", "error": ["client-crash", repr(e)]}


def completion_of(done: Op, process: int | str, f: Any) -> Op:
    """A client's completion as recorded: hints, index and time dropped, process and f the
    invoke's, a type other than ok/fail/info turned into info ["bad-completion-type", ...]."""
    out = {k: v for k, v in done.items() if k not in ("index", "time") and not k.startswith("_")}
    out["process"] = process
    out["f"] = f
    if out.get("type") not in ("ok", "fail", "info"):
        out["type"] = "info"
        out["error"] = ["bad-completion-type", str(out.get("type"))]
    return out


def nemesis_invoke_of(r: Op) -> Op:
    """The nemesis op to record (and hand to the nemesis) for the generator's op `r`."""
    op = {k: v for k, v in r.items() if not k.startswith("_")}
    op.setdefault("value", None)
    op.update(process="nemesis", type="info")
    return op


def nemesis_completion_of(done: Op, f: str) -> Op:
    """A nemesis's completion as recorded: an info op of process "nemesis" with the op's f."""
    out = {k: v for k, v in done.items() if k not in ("index", "time")}
    out.update(process="nemesis", type="info", f=f)
    return out


def track_faults(active: set[str], f: str) -> None:
    """Active faults from a nemesis op's f: start-X opens X, stop-X closes it, heal-all all."""
    if f == "heal-all":
        active.clear()
    elif f.startswith("start-"):
        active.add(f[len("start-") :])
    elif f.startswith("stop-"):
        active.discard(f[len("stop-") :])


def _close_quietly(client: Client) -> None:
    try:
        client.close()
    except Exception as e:
        log.debug("closing client: %r", e)
