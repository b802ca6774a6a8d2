"""Generators: what each worker thread does next, as composable values (Jepsen's idea).

A generator is asked for an operation by one thread at a time and told about every
invoke and completion. The protocol (`Generator`):

- `op(ctx) -> dict | Pending | None`: the next op for the thread `ctx.thread` (its current
  logical process is `ctx.process`). A dict is an invocation to perform now: `f` and
  `value` (the interpreter adds `process`, `type` and `time`; keys starting with `_` are
  hints for the client and are never written to the history). `Pending(at)` means
  "nothing for you yet, ask again at `at` ns (or soon, when `at` is None)", and by default
  promises nothing: any invoke or completion meanwhile may change the answer, so the
  interpreter asks again after each. `Pending(at, firm=True)` promises the same answer
  until `at` whatever happens, and that asking meanwhile changes nothing (see `Pending`).
  `None` means this generator has nothing more for that thread, ever.
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

Workloads build on these, one module each under `harness/workloads/` (Jepsen's one
namespace per workload): `harness/workloads/queue/generator.py` is the Kafka queue
workload's generators and test phases, next to its client.
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
    """Nothing to do yet; ask again at `at` (ns since test start) or soon when None.

    `firm` (with `at` only): a promise that until `at` this thread's answer stays this
    Pending (no op and no None), whatever happens meanwhile (other threads' ops, any
    completion), and that asking it again before `at` changes nothing (no state, no draw
    from `ctx.rng`); an interpreter need not ask the thread again before `at`
    (harness/sim/interpreter.py does not). Without it, any event may change the answer.
    `stagger`/`delay`/`rate` and `sleep` give firm Pendings; combinators pass the promise
    on only where it still holds (`limit`, `mix`, `until_ok` drop it: another thread's op
    or a completion can change their answer)."""

    at: int | None = None
    firm: bool = False


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
    p = a if a.at <= b.at else b
    firm = a.firm and b.firm  # (firm only while both are)
    return p if p.firm == firm else Pending(p.at, firm)


def _loose(r: Result) -> Result:
    """`r` without a firm promise (see `Pending`)."""
    return Pending(r.at) if isinstance(r, Pending) and r.firm else r


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
        return Pending(self._until, firm=True) if ctx.time < self._until else None


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
                return _loose(r)  # (asked again, another generator may be chosen)
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
        return _loose(r)  # (other threads' ops can use the limit up: None before `at`)

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
            if r.at is None:
                return PENDING
            return Pending(self.deadline, r.firm)
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
        self._pending = PENDING  # (the Pending of `_next`, made once per `_next`)

    def op(self, ctx: Context) -> Result:
        if self._next is None:
            self._next = ctx.time
        if ctx.time < self._next:
            # firm: `_next` only moves when an op is given, which is not before `_next`
            if self._pending.at != self._next:
                self._pending = Pending(self._next, firm=True)
            return self._pending
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
        return _loose(r)  # (a completion ok can end it before `at`)

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
