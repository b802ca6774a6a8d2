"""Generators: what each worker thread does next, as composable values (Jepsen's idea).

A generator is asked for an operation by one thread at a time and told about every
invoke and completion. The protocol (`Generator`):

- `op(ctx) -> dict | Pending | None`: the next op for the thread `ctx.thread` (its current
  logical process is `ctx.process`). A dict is an invocation to perform now: `f` and
  `value` (the interpreter adds `process`, `type` and `time`; keys starting with `_` are
  hints for the client and are never written to the history). `Pending(at)` means
  "nothing for you yet, ask again at `at` ns (or soon, when `at` is None)". `None` means
  this generator has nothing more for that thread, ever.
- `update(ctx, event)`: every invoke and completion the interpreter records, with
  `ctx.thread` the thread that performed it.

Generators are small mutable objects; the interpreter serialises all calls to one tree
under a lock, so they need no locking of their own. Randomness comes only from
`ctx.rng`, which the interpreter seeds from the test's seed, so a generator tree driven by
the same sequence of calls and events produces the same ops.

Threads are ints 0..concurrency-1 for clients and the string "nemesis" for the nemesis.

Combinators (Jepsen's names where one exists): `once`, `repeat`, `fn`, `seq`, `mix`,
`any_of`, `limit`, `time_limit`, `stagger`, `rate`, `delay`, `sleep`, `phases`,
`clients`, `nemesis`, `each_thread`, `each_process`, `until_ok`, `gen_map`, `gen_filter`.

The queue workload (`QueueWorkload`) builds the Kafka test's generators: send/poll (or
txn) ops with increasing values per key, an assign when a process starts and occasional
reassignments (some of them steered towards keys with sent-but-unread offsets, Jepsen's
poll-unseen), optional client crashes, and the final drain in which every thread crashes
its client, assigns every key from the beginning and polls until it has read up to the
highest offset any ok op acknowledged or read. `queue_test(...)` wires the phases:
workload + nemesis under the time limit, heal, recovery sleep, final drain under the
final time limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "PENDING",
    "Context",
    "Generator",
    "Pending",
    "QueueWorkload",
    "any_of",
    "clients",
    "delay",
    "each_process",
    "each_thread",
    "fn",
    "gen_filter",
    "gen_map",
    "lift",
    "limit",
    "mix",
    "nemesis",
    "once",
    "phases",
    "queue_test",
    "rate",
    "repeat",
    "seq",
    "sleep",
    "stagger",
    "time_limit",
    "until_ok",
]

Thread = int | str
Op = dict[str, Any]
NS = 1_000_000_000


@dataclass(frozen=True)
class Pending:
    """Nothing to do yet; ask again at `at` (ns since test start) or soon when None."""

    at: int | None = None


PENDING = Pending()

Result = Op | Pending | None


@dataclass
class Context:
    """What a generator knows when asked: the time and who is asking."""

    time: int
    thread: Thread
    process: int | str
    threads: Sequence[Thread]
    rng: random.Random = field(default_factory=random.Random)


@runtime_checkable
class Generator(Protocol):
    def op(self, ctx: Context) -> Result: ...

    def update(self, ctx: Context, event: Op) -> None: ...


class Base:
    """Default `update` that ignores events, for leaf generators."""

    def op(self, ctx: Context) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, ctx: Context, event: Op) -> None:
        return None


def lift(x: Any) -> Generator:
    """A generator from a value: a dict is emitted once, a callable is `fn`, a list `seq`."""
    if isinstance(x, Generator) and not isinstance(x, dict):
        return x
    if isinstance(x, Mapping):
        return _Once(dict(x))
    if callable(x):
        return _Fn(x)
    if isinstance(x, list | tuple):
        return _Seq([lift(g) for g in x])
    raise TypeError(f"cannot make a generator from {x!r}")


def _earliest(a: Pending | None, b: Pending) -> Pending:
    if a is None:
        return b
    if a.at is None or b.at is None:
        return PENDING
    return a if a.at <= b.at else b


# ----- leaves ----------------------------------------------------------------------------


class _Once(Base):
    def __init__(self, op: Op) -> None:
        self._op: Op | None = op

    def op(self, ctx: Context) -> Result:
        op, self._op = self._op, None
        return dict(op) if op is not None else None


def once(op: Mapping[str, Any]) -> Generator:
    """Emit `op` once (to whichever thread asks first)."""
    return _Once(dict(op))


class _Repeat(Base):
    def __init__(self, op: Op) -> None:
        self._op = op

    def op(self, ctx: Context) -> Result:
        return dict(self._op)

    def __repr__(self) -> str:
        return f"repeat({self._op!r})"


def repeat(op: Mapping[str, Any]) -> Generator:
    """Emit copies of `op` forever (bound it with `limit` or `time_limit`)."""
    return _Repeat(dict(op))


class _Fn(Base):
    def __init__(self, f: Callable[[Context], Result]) -> None:
        self._f = f

    def op(self, ctx: Context) -> Result:
        return self._f(ctx)


def fn(f: Callable[[Context], Result]) -> Generator:
    """Call `f(ctx)` for every op: it returns an op dict, a `Pending` or None (done)."""
    return _Fn(f)


class _Sleep(Base):
    def __init__(self, seconds: float) -> None:
        self._ns = int(seconds * NS)
        self._until: int | None = None

    def op(self, ctx: Context) -> Result:
        if self._until is None:
            self._until = ctx.time + self._ns
        return Pending(self._until) if ctx.time < self._until else None


def sleep(seconds: float) -> Generator:
    """No ops; finishes `seconds` after it is first asked (a phase of waiting)."""
    return _Sleep(seconds)


# ----- combinators -----------------------------------------------------------------------


class _Seq:
    def __init__(self, gens: list[Generator]) -> None:
        self._gens = gens
        self._i = 0

    def op(self, ctx: Context) -> Result:
        while self._i < len(self._gens):
            r = self._gens[self._i].op(ctx)
            if r is not None:
                return r
            self._i += 1
        return None

    def update(self, ctx: Context, event: Op) -> None:
        if self._i < len(self._gens):
            self._gens[self._i].update(ctx, event)


def seq(*gens: Any) -> Generator:
    """Each generator in turn until it is exhausted (no waiting between them)."""
    return _Seq([lift(g) for g in gens])


class _Mix:
    def __init__(self, gens: list[Generator], weights: list[float] | None) -> None:
        self._gens = gens
        self._weights = weights or [1.0] * len(gens)

    def op(self, ctx: Context) -> Result:
        while self._gens:
            i = ctx.rng.choices(range(len(self._gens)), self._weights)[0]
            r = self._gens[i].op(ctx)
            if r is not None:
                return r
            del self._gens[i]
            del self._weights[i]
        return None

    def update(self, ctx: Context, event: Op) -> None:
        for g in self._gens:
            g.update(ctx, event)


def mix(gens: Iterable[Any], weights: Iterable[float] | None = None) -> Generator:
    """Each op from a randomly chosen generator (optionally weighted); exhausted ones drop out."""
    gs = [lift(g) for g in gens]
    ws = list(weights) if weights is not None else None
    if ws is not None and len(ws) != len(gs):
        raise ValueError("mix: one weight per generator")
    return _Mix(gs, ws)


class _Any:
    def __init__(self, gens: list[Generator]) -> None:
        self._gens = gens

    def op(self, ctx: Context) -> Result:
        pending: Pending | None = None
        for g in self._gens:
            r = g.op(ctx)
            if r is None:
                continue
            if isinstance(r, Pending):
                pending = _earliest(pending, r)
                continue
            return r
        return pending

    def update(self, ctx: Context, event: Op) -> None:
        for g in self._gens:
            g.update(ctx, event)


def any_of(*gens: Any) -> Generator:
    """The first of the generators (in order) that has an op now; done when all are."""
    return _Any([lift(g) for g in gens if g is not None])


class _Limit:
    def __init__(self, n: int, gen: Generator) -> None:
        self._left = n
        self._gen = gen

    def op(self, ctx: Context) -> Result:
        if self._left <= 0:
            return None
        r = self._gen.op(ctx)
        if isinstance(r, dict):
            self._left -= 1
        return r

    def update(self, ctx: Context, event: Op) -> None:
        self._gen.update(ctx, event)


def limit(n: int, gen: Any) -> Generator:
    """At most `n` ops from `gen` in total."""
    return _Limit(n, lift(gen))


class _TimeLimit:
    def __init__(self, seconds: float, gen: Generator) -> None:
        self._ns = int(seconds * NS)
        self._gen = gen
        self.deadline: int | None = None

    def op(self, ctx: Context) -> Result:
        if self.deadline is None:
            self.deadline = ctx.time + self._ns
        if ctx.time >= self.deadline:
            return None
        r = self._gen.op(ctx)
        if isinstance(r, Pending) and (r.at is None or r.at > self.deadline):
            # Wake up at the deadline at the latest, to report the end.
            return Pending(self.deadline if r.at is not None else None)
        return r

    def update(self, ctx: Context, event: Op) -> None:
        self._gen.update(ctx, event)


def time_limit(seconds: float, gen: Any) -> Generator:
    """Ops from `gen` until `seconds` after it is first asked."""
    return _TimeLimit(seconds, lift(gen))


class _Stagger:
    def __init__(self, dt_ns: int, gen: Generator, jitter: bool) -> None:
        self._dt = dt_ns
        self._gen = gen
        self._jitter = jitter
        self._next: int | None = None

    def op(self, ctx: Context) -> Result:
        if self._next is None:
            self._next = ctx.time
        if ctx.time < self._next:
            return Pending(self._next)
        r = self._gen.op(ctx)
        if isinstance(r, dict):
            step = int(ctx.rng.random() * 2 * self._dt) if self._jitter else self._dt
            # Schedule from the plan, not from now, so the mean rate holds even when
            # threads ask late; but never build up a burst of more than one interval.
            self._next = max(self._next + step, ctx.time - self._dt)
        return r

    def update(self, ctx: Context, event: Op) -> None:
        self._gen.update(ctx, event)


def stagger(dt: float, gen: Any) -> Generator:
    """Ops from `gen` at uniformly random intervals in [0, 2*dt) seconds, over all threads."""
    return _Stagger(int(dt * NS), lift(gen), jitter=True)


def delay(dt: float, gen: Any) -> Generator:
    """Ops from `gen` exactly `dt` seconds apart, over all threads."""
    return _Stagger(int(dt * NS), lift(gen), jitter=False)


def rate(ops_per_second: float, gen: Any) -> Generator:
    """About `ops_per_second` ops in total (0 or less: unlimited), staggered randomly."""
    if ops_per_second <= 0:
        return lift(gen)
    return stagger(1.0 / ops_per_second, gen)


class _Phases:
    """Each generator runs to exhaustion on every thread before the next one starts."""

    def __init__(self, gens: list[Generator]) -> None:
        self._gens = gens
        self._i = 0
        self._done: set[Thread] = set()

    @property
    def phase(self) -> int:
        return self._i

    def op(self, ctx: Context) -> Result:
        while self._i < len(self._gens):
            if ctx.thread not in self._done:
                r = self._gens[self._i].op(ctx)
                if r is not None:
                    return r
                self._done.add(ctx.thread)
            if not self._done.issuperset(ctx.threads):
                # A thread that got None is idle: the others may still have ops in flight.
                return PENDING
            self._i += 1
            self._done = set()
        return None

    def update(self, ctx: Context, event: Op) -> None:
        if self._i < len(self._gens):
            self._gens[self._i].update(ctx, event)


def phases(*gens: Any) -> Generator:
    """Run generators one after another with a barrier: phase i+1 starts once every thread
    has finished phase i (and so has no op of it in flight)."""
    return _Phases([lift(g) for g in gens if g is not None])


class _OnThreads:
    def __init__(self, pred: Callable[[Thread], bool], gen: Generator) -> None:
        self._pred = pred
        self._gen = gen

    def op(self, ctx: Context) -> Result:
        return self._gen.op(ctx) if self._pred(ctx.thread) else None

    def update(self, ctx: Context, event: Op) -> None:
        if self._pred(ctx.thread):
            self._gen.update(ctx, event)


def clients(gen: Any) -> Generator:
    """Only client threads (ints) get ops from `gen`; the nemesis sees it as exhausted."""
    return _OnThreads(lambda t: isinstance(t, int), lift(gen))


def nemesis(gen: Any) -> Generator:
    """Only the nemesis thread gets ops from `gen`."""
    return _OnThreads(lambda t: t == "nemesis", lift(gen))


class _EachThread:
    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._per: dict[Thread, Generator] = {}

    def _for(self, thread: Thread) -> Generator:
        g = self._per.get(thread)
        if g is None:
            g = self._per[thread] = lift(self._factory())
        return g

    def op(self, ctx: Context) -> Result:
        return self._for(ctx.thread).op(ctx)

    def update(self, ctx: Context, event: Op) -> None:
        self._for(ctx.thread).update(ctx, event)


def each_thread(factory: Callable[[], Any]) -> Generator:
    """A separate copy of the generator `factory()` makes for every thread."""
    return _EachThread(factory)


class _EachProcess:
    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._per: dict[int | str, Generator] = {}

    def _for(self, process: int | str) -> Generator:
        g = self._per.get(process)
        if g is None:
            g = self._per[process] = lift(self._factory())
        return g

    def op(self, ctx: Context) -> Result:
        return self._for(ctx.process).op(ctx)

    def update(self, ctx: Context, event: Op) -> None:
        self._for(event.get("process", ctx.process)).update(ctx, event)


def each_process(factory: Callable[[], Any]) -> Generator:
    """A separate copy of `factory()` for every process: a thread that becomes a new
    process (after an info) starts over with a fresh copy."""
    return _EachProcess(factory)


class _UntilOk:
    def __init__(self, gen: Generator) -> None:
        self._gen = gen
        self._mine: set[int | str] = set()
        self._ok = False

    def op(self, ctx: Context) -> Result:
        if self._ok:
            return None
        r = self._gen.op(ctx)
        if isinstance(r, dict):
            self._mine.add(ctx.process)
        return r

    def update(self, ctx: Context, event: Op) -> None:
        if event.get("type") == "ok" and event.get("process") in self._mine:
            self._ok = True
        if event.get("type") != "invoke":
            self._mine.discard(event.get("process"))  # type: ignore[arg-type]
        self._gen.update(ctx, event)


def until_ok(gen: Any) -> Generator:
    """Ops from `gen` until one of them completes ok."""
    return _UntilOk(lift(gen))


class _Map:
    def __init__(self, f: Callable[[Op], Op | None], gen: Generator, keep: bool) -> None:
        self._f = f
        self._gen = gen
        self._keep = keep

    def op(self, ctx: Context) -> Result:
        while True:
            r = self._gen.op(ctx)
            if not isinstance(r, dict):
                return r
            if self._keep:
                return self._f(r)
            if self._f(r):
                return r

    def update(self, ctx: Context, event: Op) -> None:
        self._gen.update(ctx, event)


def gen_map(f: Callable[[Op], Op], gen: Any) -> Generator:
    """Ops of `gen` transformed by `f`."""
    return _Map(f, lift(gen), keep=True)


def gen_filter(pred: Callable[[Op], Any], gen: Any) -> Generator:
    """Only the ops of `gen` for which `pred` is true."""
    return _Map(pred, lift(gen), keep=False)  # type: ignore[arg-type]


# ----- the queue workload ----------------------------------------------------------------


def _max_offsets(event: Op, polls: bool = True, sends: bool = True) -> dict[str, int]:
    """Key -> highest offset an (ok or info) completion sent or polled."""
    out: dict[str, int] = {}
    value = event.get("value")
    if event.get("f") not in ("send", "poll", "txn") or not isinstance(value, list):
        return out
    for mop in value:
        if not isinstance(mop, list) or not mop:
            continue
        if mop[0] == "poll" and polls and len(mop) > 1 and isinstance(mop[1], dict):
            for k, pairs in mop[1].items():
                for pair in pairs:
                    if pair[0] is not None and pair[0] > out.get(k, -1):
                        out[k] = pair[0]
        elif mop[0] == "send" and sends and len(mop) > 2 and isinstance(mop[2], list):
            off = mop[2][0]
            if off is not None and off > out.get(mop[1], -1):
                out[mop[1]] = off
    return out


class QueueWorkload:
    """The Kafka queue workload's generators and the state they share.

    Test keys used: `keys` (list of "topic/partition"), `txn`, `max_txn_length` (micro-ops
    per op; default 4 with txn, else 1 as in Jepsen), `send_p` (share of sends among
    send/poll micro-ops, 0.5), `assign_p` (chance an op is replaced by a reassignment,
    1/64), `assign_keys` (how many keys a process is assigned, default about half),
    `sub_via` (["assign"]; with "subscribe" too, reassignments pick one at random),
    `crash_clients` and `crash_client_interval` (s, 30), `concurrency`, `poll_ms` (20),
    `final_poll_ms` (1000), `final_restart_s` (10: a drain that reads nothing for that
    long crashes its client and starts over).
    """

    def __init__(self, test: Mapping[str, Any]) -> None:
        keys = list(test.get("keys") or [])
        if not keys:
            raise ValueError("the queue workload needs test['keys'], e.g. ['t0/0', 't1/0']")
        self.keys: list[str] = keys
        self.txn = bool(test.get("txn", False))
        self.max_txn_length = int(test.get("max_txn_length") or (4 if self.txn else 1))
        self.send_p = float(test.get("send_p", 0.5))
        self.assign_p = float(test.get("assign_p", 1 / 64))
        self.assign_keys = int(test.get("assign_keys") or max(1, (len(keys) + 1) // 2))
        self.sub_via = [str(f) for f in (test.get("sub_via") or ["assign"])]
        if not set(self.sub_via) <= {"assign", "subscribe"}:
            raise ValueError(f"sub_via must list 'assign' and/or 'subscribe', not {self.sub_via}")
        self.crash_clients = bool(test.get("crash_clients", False))
        self.crash_interval = float(test.get("crash_client_interval", 30))
        self.concurrency = int(test.get("concurrency", 20))
        self.poll_ms = int(test.get("poll_ms", 20))
        self.final_poll_ms = int(test.get("final_poll_ms", 1000))
        self.final_restart_ns = int(float(test.get("final_restart_s", 10)) * NS)
        # Next value to send per key: unique, increasing.
        self.next_value: dict[str, int] = dict.fromkeys(keys, 0)
        # Highest offset any ok op acked or read, per key (Jepsen's track-key-offsets).
        self.max_offsets: dict[str, int] = {}
        # Sent-but-not-yet-polled (poll-unseen): key -> highest ok-sent / ok-polled offset.
        self.sent: dict[str, int] = {}
        self.polled: dict[str, int] = {}
        self._assigned_processes: set[int | str] = set()

    # -- ops ---------------------------------------------------------------------------

    def _send_mop(self, rng: random.Random) -> list[Any]:
        k = rng.choice(self.keys)
        v = self.next_value[k]
        self.next_value[k] = v + 1
        return ["send", k, v]

    def assign_op(self, rng: random.Random) -> Op:
        n = min(len(self.keys), self.assign_keys)
        ks = rng.sample(self.keys, rng.randint(1, n))
        if self.sent and rng.random() < 1 / 3:
            # Steer a third of the reassignments towards keys with unread offsets.
            ks = list(dict.fromkeys(ks + sorted(self.sent)))
        f = self.sub_via[0] if len(self.sub_via) == 1 else rng.choice(self.sub_via)
        return {"f": f, "value": sorted(ks)}

    def txn_op(self, rng: random.Random) -> Op:
        n = rng.randint(1, self.max_txn_length)
        mops = [self._send_mop(rng) if rng.random() < self.send_p else ["poll"] for _ in range(n)]
        kinds = {m[0] for m in mops}
        if self.txn:
            f = "txn"
        elif kinds == {"send"}:
            f = "send"
        elif kinds == {"poll"}:
            f = "poll"
        else:
            # Outside transactions an op is all sends or one poll (Jepsen's tag-rw).
            mops = [m for m in mops if m[0] == "send"] or [["poll"]]
            f = mops[0][0]
        if f == "poll":
            mops = [["poll"]]
        op: Op = {"f": f, "value": mops}
        if f in ("poll", "txn"):
            op["_poll_ms"] = self.poll_ms
        return op

    def _main_op(self, ctx: Context) -> Result:
        if ctx.process not in self._assigned_processes:
            # A fresh process has a fresh consumer with nothing assigned.
            self._assigned_processes.add(ctx.process)
            return self.assign_op(ctx.rng)
        if ctx.rng.random() < self.assign_p:
            return self.assign_op(ctx.rng)
        return self.txn_op(ctx.rng)

    # -- tracking ----------------------------------------------------------------------

    def _track(self, ctx: Context, event: Op) -> None:
        if event.get("type") != "ok":
            return
        for k, off in _max_offsets(event).items():
            if off > self.max_offsets.get(k, -1):
                self.max_offsets[k] = off
        for k, off in _max_offsets(event, polls=False).items():
            self.sent[k] = max(self.sent.get(k, -1), off)
        for k, off in _max_offsets(event, sends=False).items():
            self.polled[k] = max(self.polled.get(k, -1), off)
        for k in [k for k, off in self.sent.items() if self.polled.get(k, -1) >= off]:
            del self.sent[k]
            self.polled.pop(k, None)

    # -- generators --------------------------------------------------------------------

    def generator(self) -> Generator:
        """The main phase for client threads: unbounded (wrap in `time_limit`)."""
        main: Generator = _Tracking(self, fn(self._main_op))
        if self.crash_clients:
            crashes = stagger(self.crash_interval / max(1, self.concurrency), repeat(_CRASH))
            main = any_of(crashes, main)
        return clients(main)

    def final_generator(self) -> Generator:
        """The drain: every thread crashes its client, assigns all keys from the beginning
        and polls until it has read every offset known at the start of the drain."""
        return clients(each_thread(lambda: _FinalPolls(self)))


_CRASH: Op = {"f": "crash", "value": None}


class _Tracking:
    def __init__(self, workload: QueueWorkload, gen: Generator) -> None:
        self._w = workload
        self._gen = gen

    def op(self, ctx: Context) -> Result:
        return self._gen.op(ctx)

    def update(self, ctx: Context, event: Op) -> None:
        self._w._track(ctx, event)
        self._gen.update(ctx, event)


class _FinalPolls(Base):
    """One thread's drain (Jepsen's final-polls)."""

    def __init__(self, workload: QueueWorkload) -> None:
        self._w = workload
        self._targets: dict[str, int] | None = None
        self._stage = "crash"
        self._progress_at = 0

    def op(self, ctx: Context) -> Result:
        if self._targets is None:
            self._targets = dict(self._w.max_offsets)
            self._progress_at = ctx.time
        if not self._targets:
            return None
        if self._stage == "poll" and ctx.time - self._progress_at > self._w.final_restart_ns:
            # Polls that read nothing for a while: start over with a fresh client, in case
            # this one is stuck on stale metadata (Jepsen repeats its drain every 10 s).
            self._stage = "crash"
            self._progress_at = ctx.time
        if self._stage == "crash":
            self._stage = "assign"
            return dict(_CRASH)
        if self._stage == "assign":
            self._stage = "poll"
            return {"f": "assign", "value": sorted(self._w.keys), "_seek": "beginning"}
        return {"f": "poll", "value": [["poll"]], "_poll_ms": self._w.final_poll_ms}

    def update(self, ctx: Context, event: Op) -> None:
        if self._targets is None:
            return
        t = event.get("type")
        if t in ("info", "fail") and event.get("f") == "assign":
            self._stage = "assign"  # try the assignment again
        elif t == "info" and event.get("f") == "poll":
            self._stage = "assign"  # a new process: it has to assign again
        if t != "ok" or event.get("f") != "poll":
            return
        for k, off in _max_offsets(event).items():
            self._progress_at = ctx.time
            if off >= self._targets.get(k, off + 1):
                del self._targets[k]


def queue_test(
    workload: QueueWorkload,
    test: Mapping[str, Any],
    nemesis_gen: Any = None,
    heal: Mapping[str, Any] | None = None,
) -> Generator:
    """The whole test as phases (Jepsen's shape).

    1. workload (rate-limited by test['rate'] unless 0) with `nemesis_gen` on the nemesis
       thread, for test['time_limit'] seconds;
    2. the heal op on the nemesis (default {"f": "heal-all"}), when there is a nemesis;
    3. sleep test['recovery_time'] seconds;
    4. the final drain, bounded by test['final_time_limit'] seconds.
    """
    main = rate(float(test.get("rate") or 0), workload.generator())
    if nemesis_gen is not None:
        main = any_of(main, nemesis(nemesis_gen))
    heal_op = dict(heal or {"f": "heal-all", "value": None})
    return phases(
        time_limit(float(test.get("time_limit", 60)), main),
        nemesis(once(heal_op)) if nemesis_gen is not None else None,
        sleep(float(test.get("recovery_time", 0))),
        time_limit(float(test.get("final_time_limit", 30)), workload.final_generator()),
    )
