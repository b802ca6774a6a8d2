"""The Kafka queue workload's generators and test phases (Jepsen's queue workload).

`QueueWorkload` builds the Kafka test's generators: send/poll (or txn) ops with increasing
values per key, an assign (or subscribe) when a process starts and occasional reassignments
(some of them steered towards keys with sent-but-unread offsets, Jepsen's poll-unseen; each
a subscribe with the test's subscribe share), commits of subscribed processes, optional client
crashes, and the final drain in which every thread crashes its client, assigns every key
from the beginning and polls until it has read up to the highest offset any ok op
acknowledged or read. `queue_test(...)` wires the phases: workload + nemesis under the time
limit, heal, recovery sleep, final drain under the final time limit.

The ops' micro-ops are written and read through `checkers.queue.codec`, the codec the
checker reads them with; `client.py` next to this module performs them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Protocol

from isrlab.checkers.queue import codec
from isrlab.harness.generator import (
    NS,
    Base,
    Context,
    Generator,
    Op,
    Result,
    any_of,
    clients,
    each_thread,
    fn,
    nemesis,
    once,
    phases,
    rate,
    repeat,
    sleep,
    stagger,
    time_limit,
)
from isrlab.harness.workloads.queue.options import QueueOptions, subscribe_share

__all__ = ["DrainSource", "FinalPolls", "QueueWorkload", "Tracking", "Workload", "queue_test"]


class DrainSource(Protocol):
    """What a thread's final drain (`FinalPolls`) reads of its workload."""

    keys: list[str]
    max_offsets: dict[str, int]
    final_restart_ns: int
    final_poll_ms: int


class Tracked(Protocol):
    """A workload that follows every completion of its main phase (`Tracking`)."""

    def _track(self, ctx: Context, event: Op) -> None: ...


class Workload(Protocol):
    """What `queue_test` runs: the main phase's generator and the final drain's."""

    def generator(self) -> Generator: ...

    def final_generator(self) -> Generator: ...

    def close(self) -> None:
        """Release what the workload holds beyond its clients; called once after the run,
        whatever its end."""
        ...


def _max_offsets(event: Op, polls: bool = True, sends: bool = True) -> dict[str, int]:
    """Key -> highest offset an (ok or info) completion sent or polled."""
    out: dict[str, int] = {}
    if event.get("f") not in codec.DATA_FS:
        return out
    for _, what, k, off, _ in codec.entries_in(event.get("value")):
        if (sends if what == "send" else polls) and off is not None and off > out.get(k, -1):
            out[k] = off
    return out


def _read_something(event: Op) -> bool:
    """Whether a completion's polls read any record."""
    return event.get("f") in codec.DATA_FS and any(True for _ in codec.reads_in(event["value"]))


class QueueWorkload:
    """The Kafka queue workload's generators and the state they share.

    Test keys used: `keys` (list of "topic/partition"), `txn`, `concurrency`, how processes
    take keys (`subscribe`, `sub_p` or the `sub_via` knob: `options.subscribe_share`),
    `commit_p` (commit ops of subscribed processes), and the workload's knobs (`options.QueueOptions`, their defaults and meaning): `max_txn_length`,
    `send_p`, `assign_p`, `assign_keys`, `sub_via`, `crash_clients`, `crash_client_interval`,
    `poll_ms`, `final_poll_ms`, `final_restart_s`. A bad knob value raises `ConfigError` (a
    ValueError).
    """

    def __init__(self, test: Mapping[str, Any]) -> None:
        keys = list(test.get("keys") or [])
        if not keys:
            raise ValueError("the queue workload needs test['keys'], e.g. ['t0/0', 't1/0']")
        self.keys: list[str] = keys
        self.txn = bool(test.get("txn", False))
        knobs = QueueOptions.from_test(test)
        self.max_txn_length = knobs.max_txn_length or (4 if self.txn else 1)
        self.send_p = knobs.send_p
        self.assign_p = knobs.assign_p
        self.assign_keys = knobs.assign_keys or max(1, (len(keys) + 1) // 2)
        self.sub_via = list(knobs.sub_via or QueueOptions.sub_via)  # none given: the default
        # The chance that a (re)assignment subscribes (--subscribe 1, --sub-p, or sub_via).
        self.sub_share = subscribe_share(test)
        self.commit_p = float(test.get("commit_p") or 0.0)
        self.crash_clients = knobs.crash_clients
        self.crash_interval = knobs.crash_client_interval
        self.concurrency = int(test.get("concurrency", 20))
        self.poll_ms = knobs.poll_ms
        self.final_poll_ms = knobs.final_poll_ms
        self.final_restart_ns = int(knobs.final_restart_s * NS)
        # Next value to send per key: unique, increasing.
        self.next_value: dict[str, int] = dict.fromkeys(keys, 0)
        # Highest offset any ok op acked or read, per key (Jepsen's track-key-offsets).
        self.max_offsets: dict[str, int] = {}
        # Sent-but-not-yet-polled (poll-unseen): key -> highest ok-sent / ok-polled offset.
        self.sent: dict[str, int] = {}
        self.polled: dict[str, int] = {}
        self._assigned_processes: set[int | str] = set()
        # Processes whose last ok (re)assignment was a subscribe: the ones that may commit,
        # once they have read something since their last (re)assignment or rebalance.
        self._subscribed: set[int | str] = set()
        self._unread: set[int | str] = set()

    # -- ops ---------------------------------------------------------------------------

    def _send_mop(self, rng: random.Random) -> list[Any]:
        k = rng.choice(self.keys)
        v = self.next_value[k]
        self.next_value[k] = v + 1
        return codec.send(k, v)

    def assign_op(self, rng: random.Random) -> Op:
        n = min(len(self.keys), self.assign_keys)
        ks = rng.sample(self.keys, rng.randint(1, n))
        if self.sent and rng.random() < 1 / 3:
            # Steer a third of the reassignments towards keys with unread offsets.
            ks = list(dict.fromkeys(ks + sorted(self.sent)))
        if self.sub_share in (0.0, 1.0):
            f = "subscribe" if self.sub_share else "assign"
        else:
            f = "subscribe" if rng.random() < self.sub_share else "assign"
        return {"f": f, "value": sorted(ks)}

    @staticmethod
    def commit_op() -> Op:
        """A commit: the client fills in the offsets (the next offset to read of every key
        the process has polled and still owns), which the invoke cannot know."""
        return {"f": "commit", "value": [codec.commit({})]}

    def txn_op(self, rng: random.Random) -> Op:
        n = rng.randint(1, self.max_txn_length)
        mops = [
            self._send_mop(rng) if rng.random() < self.send_p else codec.poll() for _ in range(n)
        ]
        kinds = {m[0] for m in mops}
        if self.txn:
            f = "txn"
        elif kinds == {"send"}:
            f = "send"
        elif kinds == {"poll"}:
            f = "poll"
        else:
            # Outside transactions an op is all sends or one poll (Jepsen's tag-rw).
            mops = [m for m in mops if m[0] == codec.SEND] or [codec.poll()]
            f = mops[0][0]
        if f == "poll":
            mops = [codec.poll()]
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
        if (
            self.commit_p
            and ctx.process in self._subscribed
            and ctx.process not in self._unread
            and ctx.rng.random() < self.commit_p
        ):
            return self.commit_op()
        return self.txn_op(ctx.rng)

    # -- tracking ----------------------------------------------------------------------

    def _track(self, ctx: Context, event: Op) -> None:
        f, t = event.get("f"), event.get("type")
        if t == "info":
            self._subscribed.discard(ctx.process)  # a process is never used after an info
        elif t == "ok" and f in codec.ASSIGN_FS:
            if f == "subscribe":
                self._subscribed.add(ctx.process)
            else:
                self._subscribed.discard(ctx.process)
        if t in ("ok", "info", "fail") and ctx.process in self._subscribed:
            if f in codec.ASSIGN_FS:
                self._unread.add(ctx.process)
            elif t == "ok" and _read_something(event):
                self._unread.discard(ctx.process)  # (reads after the op's rebalance, if any)
            elif event.get("rebalance"):
                # what it read before is not what it owns now: nothing to commit yet
                self._unread.add(ctx.process)
        if t != "ok":
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
        main: Generator = Tracking(self, fn(self._main_op))
        if self.crash_clients:
            crashes = stagger(self.crash_interval / max(1, self.concurrency), repeat(_CRASH))
            main = any_of(crashes, main)
        return clients(main)

    def final_generator(self) -> Generator:
        """The drain: every thread crashes its client, assigns all keys from the beginning
        and polls until it has read every offset known at the start of the drain."""
        return clients(each_thread(lambda: FinalPolls(self)))

    def close(self) -> None:
        """Nothing outlives the queue workload's clients."""


_CRASH: Op = {"f": "crash", "value": None}


class Tracking:
    """`gen`'s ops; every event goes to the workload's `_track` before `gen` sees it."""

    def __init__(self, workload: Tracked, gen: Generator) -> None:
        self._w = workload
        self._gen = gen

    def op(self, ctx: Context) -> Result:
        return self._gen.op(ctx)

    def update(self, ctx: Context, event: Op) -> None:
        self._w._track(ctx, event)
        self._gen.update(ctx, event)


class FinalPolls(Base):
    """One thread's drain (Jepsen's final-polls)."""

    def __init__(self, workload: DrainSource) -> None:
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
        return {"f": "poll", "value": [codec.poll()], "_poll_ms": self._w.final_poll_ms}

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
    workload: Workload,
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
