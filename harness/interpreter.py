"""The interpreter: runs a generator with worker threads and a nemesis, writing the history.

`Interpreter(generator, history, client_factory, concurrency, nemesis=None, seed=0)`:

- one worker thread per client thread 0..concurrency-1. Thread t starts as process t;
  it asks the generator for an op, records the invoke, performs it with its client and
  records the completion. After an `info` completion, or when the client reports itself
  `broken`, the thread closes the client and continues as process `process + concurrency`
  with a new client (opened lazily before its next op), so a process runs one op at a
  time and is never reused after an info (docs/history-format.md);
- a client that cannot be opened turns the op into a `fail` with error
  ["client-open", message] (nothing was sent); an exception escaping a client turns it
  into an `info` with error ["client-crash", message] and a new process;
- one nemesis thread when a nemesis is given: it performs the generator's ops for the
  thread "nemesis" by calling `nemesis.invoke(op) -> completion`, recording both as
  `info` ops of process "nemesis". The op f "heal-all" calls `nemesis.heal_all()` when
  the nemesis has it. Active faults are tracked from f names: start-X opens X, stop-X
  closes it, heal-all closes all;
- generator calls and history writes happen under one lock, so the history order is the
  order the generator saw; the client calls themselves run in parallel
  (confluent-kafka releases the GIL while it waits);
- `stats()` gives live counters for a progress display: invoked, ok, fail, info,
  ops/s over the last second, active faults, elapsed seconds, finished flag.

`run()` blocks until every thread is done (the generator returned None for it) or
`stop()` was called (each thread then finishes its current op and stops); it closes
every client and returns the final stats.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, Protocol

from isrlab.harness.generator import Context, Generator, Pending
from isrlab.harness.history import HistoryWriter

__all__ = ["Client", "Interpreter", "NemesisLike"]

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


class Interpreter:
    def __init__(
        self,
        generator: Generator,
        history: HistoryWriter,
        client_factory: Callable[[int, int], Client],
        concurrency: int,
        nemesis: NemesisLike | None = None,
        seed: int = 0,
    ) -> None:
        """client_factory(process, thread) returns an unopened client for that process."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.generator = generator
        self.history = history
        self.client_factory = client_factory
        self.concurrency = concurrency
        self.nemesis = nemesis
        self.rng = random.Random(seed)
        self.threads: list[int | str] = list(range(concurrency))
        if nemesis is not None:
            self.threads.append("nemesis")
        # Re-entrant: recording an invoke happens inside the generator call's critical section.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._done = threading.Event()
        self.counts: collections.Counter[str] = collections.Counter()
        self.active_faults: set[str] = set()
        self._recent: collections.deque[int] = collections.deque()
        self._started_ns: int | None = None
        self.errors: list[str] = []

    # ----- public -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._started_ns = self.history.now()
        workers = [
            threading.Thread(target=self._guard, args=(t,), name=f"isrlab-worker-{t}", daemon=True)
            for t in self.threads
        ]
        for w in workers:
            w.start()
        try:
            for w in workers:
                while w.is_alive():
                    w.join(0.2)
        except BaseException:
            # Ctrl-C: let the threads finish their op so the history stays well formed.
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            for w in workers:
                w.join()
            raise
        finally:
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
            }

    # ----- internals ----------------------------------------------------------------------

    def _guard(self, thread: int | str) -> None:
        try:
            if thread == "nemesis":
                self._nemesis_loop()
            else:
                assert isinstance(thread, int)
                self._worker_loop(thread)
        except Exception as e:  # a bug in a generator: stop the whole run, say why
            log.exception("thread %s died", thread)
            with self._lock:
                self.errors.append(f"thread {thread}: {e!r}")
            self.stop()

    def _next(self, thread: int | str, process: int | str) -> Op | None:
        """The next op for the thread (invoke already recorded), or None when done."""
        with self._cond:
            while not self._stop.is_set():
                ctx = Context(self.history.now(), thread, process, self.threads, self.rng)
                r = self.generator.op(ctx)
                if r is None:
                    # This thread is done; others waiting on a barrier may now proceed.
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

    def _record(self, thread: int | str, process: int | str, op: Op, *, invoke: bool = False) -> Op:
        """Write an op to the history and feed it to the generator (caller holds no lock)."""
        with self._cond:
            stamped = self.history.write(op)
            ctx = Context(stamped["time"], thread, process, self.threads, self.rng)
            self.generator.update(ctx, stamped)
            if process == "nemesis":
                return stamped
            self.counts["invoke" if invoke else op["type"]] += 1
            if not invoke:
                self._recent.append(stamped["time"])
                self._cond.notify_all()
            return stamped

    def _worker_loop(self, thread: int) -> None:
        process = thread
        client: Client | None = None
        try:
            while True:
                op = self._next_invoke(thread, process)
                if op is None:
                    return
                invoke, hints = op
                completion, client = self._perform(thread, process, client, invoke, hints)
                self._record(thread, process, completion)
                if completion["type"] == "info" or (client is not None and client.broken):
                    if client is not None:
                        _close_quietly(client)
                    client = None
                    process += self.concurrency
        finally:
            if client is not None:
                _close_quietly(client)

    def _next_invoke(self, thread: int, process: int) -> tuple[Op, Op] | None:
        with self._cond:
            r = self._next(thread, process)
            if r is None:
                return None
            invoke: Op = {"process": process, "type": "invoke"}
            hints: Op = {}
            for k, v in r.items():
                if k.startswith("_"):
                    hints[k] = v
                elif k not in ("process", "type", "index", "time"):
                    invoke[k] = v
            invoke.setdefault("value", None)
            # Record while still holding the lock: the generator's order is the file's.
            self._record(thread, process, invoke, invoke=True)
            return invoke, hints

    def _perform(
        self, thread: int, process: int, client: Client | None, invoke: Op, hints: Op
    ) -> tuple[Op, Client | None]:
        f = invoke["f"]
        base = {"process": process, "f": f, "value": invoke["value"]}
        if client is None and f != "crash":
            client = self.client_factory(process, thread)
            try:
                client.open()
            except Exception as e:
                _close_quietly(client)
                return {**base, "type": "fail", "error": ["client-open", str(e)]}, None
        if client is None:  # crash with no open client: nothing to tear down
            return {**base, "type": "info", "value": None}, None
        try:
            done = client.invoke({**invoke, **hints})
        except Exception as e:
            log.warning("process %s: client raised on %s: %r", process, f, e)
            return {**base, "type": "info", "error": ["client-crash", repr(e)]}, client
        done = {
            k: v for k, v in done.items() if k not in ("index", "time") and not k.startswith("_")
        }
        done["process"] = process
        done["f"] = f
        if done.get("type") not in ("ok", "fail", "info"):
            done["type"] = "info"
            done["error"] = ["bad-completion-type", str(done.get("type"))]
        return done, client

    def _nemesis_loop(self) -> None:
        nem = self.nemesis
        assert nem is not None
        while True:
            r = self._next("nemesis", "nemesis")
            if r is None:
                return
            op = {k: v for k, v in r.items() if not k.startswith("_")}
            op.setdefault("value", None)
            op.update(process="nemesis", type="info")
            self._record("nemesis", "nemesis", op, invoke=True)
            f = str(op["f"])
            try:
                heal_all = getattr(nem, "heal_all", None)
                if f == "heal-all" and callable(heal_all):
                    done: Op = {**op, "value": heal_all()}
                else:
                    done = dict(nem.invoke(dict(op)))
            except Exception as e:
                log.exception("nemesis %s failed", f)
                done = {**op, "error": ["nemesis-crash", repr(e)]}
            done = {k: v for k, v in done.items() if k not in ("index", "time")}
            done.update(process="nemesis", type="info", f=f)
            with self._lock:
                if f == "heal-all":
                    self.active_faults.clear()
                elif f.startswith("start-"):
                    self.active_faults.add(f[len("start-") :])
                elif f.startswith("stop-"):
                    self.active_faults.discard(f[len("stop-") :])
            self._record("nemesis", "nemesis", done)


def _close_quietly(client: Client) -> None:
    try:
        client.close()
    except Exception as e:
        log.debug("closing client: %r", e)
