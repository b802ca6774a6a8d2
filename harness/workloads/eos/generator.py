"""The eos workload's generators: consume-transform-produce under faults.

Threads have roles (`EosWorkload.role`): the first ``copiers`` threads copy (`client.EosCopier`),
the next ``readers`` poll the output keys, the rest produce the input.

- a producer sends 1 to 4 values (``max_txn_length``, default 4) to random input keys per op
  (``send`` ops); values are unique over the whole test, not only per key, so that a value
  read in an output names the one input record it copies;
- a copier subscribes to the input keys' topics (the test's ``group``) when its process
  starts (again after a failed subscribe), then runs copy ops (``txn``, invoke value
  ``[["poll"]]``: what it will copy is known only at completion). About every
  ``copier_kill_interval`` seconds one copy op carries the hint ``_kill`` (the copier is
  killed after its sends, before its commit); with ``crash_clients`` each copier thread
  also crashes between ops about every ``crash_client_interval`` seconds (Jepsen's crash);
- a reader assigns the output keys when its process starts, then polls (``poll`` ops) at
  the test's isolation level: a read_committed reader sees only committed copies while the
  copiers run;
- the final drain (`FinalPolls`, as the queue workload's) crashes every thread's client and
  reads every key, input and output, from the beginning at read_committed (the client
  factory gives drain processes read_committed clients: `draining` is set when the drain
  asks for its first op), until it has read up to the highest offset any ok op acknowledged
  or read.

`queue_test` (the queue workload's phases) runs it: main phase + nemesis under the time
limit, heal, recovery, final drain.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from isrlab.checkers.queue import codec
from isrlab.harness.generator import (
    NS,
    Context,
    Generator,
    Op,
    Result,
    clients,
    each_thread,
    fn,
)
from isrlab.harness.workloads.eos.options import EosOptions
from isrlab.harness.workloads.queue.generator import FinalPolls, Tracking

__all__ = ["ROLES", "EosWorkload"]

ROLES = ("copier", "reader", "producer")


def _max_offsets(event: Op) -> dict[str, int]:
    out: dict[str, int] = {}
    if event.get("f") not in codec.DATA_FS:
        return out
    for _, _what, k, off, _ in codec.entries_in(event.get("value")):
        if off is not None and off > out.get(k, -1):
            out[k] = off
    return out


class EosWorkload:
    """The eos workload's generators and the state they share (see the module docstring).

    Test keys used: ``eos`` ({input, output}: harness.testconfig fills it in), ``keys``,
    ``concurrency``, and the knobs (`options.EosOptions`): ``copiers``, ``readers``,
    ``copier_kill_interval``, ``crash_clients``, ``crash_client_interval``,
    ``max_txn_length``, ``poll_ms``, ``final_poll_ms``, ``final_restart_s``.
    """

    def __init__(self, test: Mapping[str, Any]) -> None:
        eos = test.get("eos") or {}
        self.inputs: list[str] = [str(k) for k in eos.get("input") or ()]
        self.outputs: list[str] = [str(k) for k in eos.get("output") or ()]
        if not self.inputs or len(self.inputs) != len(self.outputs):
            raise ValueError(
                "the eos workload needs test['eos'] = {input: [keys], output: [keys]} of the "
                "same length (harness.testconfig fills it in)"
            )
        self.keys: list[str] = list(test.get("keys") or [*self.inputs, *self.outputs])
        knobs = EosOptions.from_test(test)
        self.concurrency = int(test.get("concurrency", 20))
        self.copiers = knobs.copiers
        self.readers = knobs.readers
        if self.copiers + self.readers >= self.concurrency:
            raise ValueError(
                f"the eos workload needs more than copiers + readers "
                f"({self.copiers} + {self.readers}) threads, not {self.concurrency}"
            )
        self.max_sends = knobs.max_txn_length or 4
        self.poll_ms = knobs.poll_ms
        self.final_poll_ms = knobs.final_poll_ms
        self.final_restart_ns = int(knobs.final_restart_s * NS)
        self.kill_ns = int(knobs.copier_kill_interval * NS) if knobs.copier_kill_interval else None
        self.crash_ns = int(knobs.crash_client_interval * NS) if knobs.crash_clients else None
        self.next_value = 0
        # Highest offset any ok op acked or read, per key: the drain's targets.
        self.max_offsets: dict[str, int] = {}
        # Processes whose subscribe (copiers) or assign (readers) completed ok.
        self._joined: set[int | str] = set()
        self._next_kill: int | None = None
        self._kill_out: int | str | None = None  # the process carrying the pending kill
        self._next_crash: dict[int | str, int] = {}
        self.kills = 0  # copier kills that happened
        self.zombie_fates: dict[str, int] = {}  # (knob copier_zombies) set by `close`
        # Set when the final drain asks for its first op: new clients read committed.
        self.draining = False

    def role(self, thread: int) -> str:
        """``copier``, ``reader`` or ``producer``: thread i's role in the main phase."""
        if thread < self.copiers:
            return "copier"
        if thread < self.copiers + self.readers:
            return "reader"
        return "producer"

    # -- ops ---------------------------------------------------------------------------

    def _send_op(self, rng: random.Random) -> Op:
        mops = []
        for _ in range(rng.randint(1, self.max_sends)):
            mops.append(codec.send(rng.choice(self.inputs), self.next_value))
            self.next_value += 1
        return {"f": "send", "value": mops}

    def _after(self, rng: random.Random, now: int, interval: int) -> int:
        return now + int(interval * rng.uniform(0.5, 1.5))

    def _copier_op(self, ctx: Context) -> Op:
        thread = ctx.thread
        if self.crash_ns is not None:
            due = self._next_crash.setdefault(thread, self._after(ctx.rng, ctx.time, self.crash_ns))
            if ctx.time >= due:
                self._next_crash[thread] = self._after(ctx.rng, ctx.time, self.crash_ns)
                return {"f": "crash", "value": None}
        op: Op = {"f": "txn", "value": [codec.poll()], "_poll_ms": self.poll_ms}
        if self.kill_ns is not None:
            if self._next_kill is None:
                self._next_kill = self._after(ctx.rng, ctx.time, self.kill_ns)
            if self._kill_out is None and ctx.time >= self._next_kill:
                self._kill_out = ctx.process
                op["_kill"] = True
        return op

    def _main_op(self, ctx: Context) -> Result:
        assert isinstance(ctx.thread, int)
        role = self.role(ctx.thread)
        if role == "producer":
            return self._send_op(ctx.rng)
        if ctx.process not in self._joined:
            if role == "copier":
                return {"f": "subscribe", "value": sorted(self.inputs)}
            return {"f": "assign", "value": sorted(self.outputs)}
        if role == "reader":
            return {"f": "poll", "value": [codec.poll()], "_poll_ms": self.poll_ms}
        return self._copier_op(ctx)

    # -- tracking ----------------------------------------------------------------------

    def _track(self, ctx: Context, event: Op) -> None:
        t, f, p = event.get("type"), event.get("f"), event.get("process")
        if t == "invoke":
            return
        if f in codec.ASSIGN_FS and t == "ok":
            self._joined.add(p)  # type: ignore[arg-type]
        if p == self._kill_out and f == "txn":
            self._kill_out = None
            error = event.get("error")
            if error == "killed" or (isinstance(error, list) and "killed" in error):
                self.kills += 1
                self._next_kill = self._after(ctx.rng, ctx.time, self.kill_ns or 0)
        if t != "ok":
            return
        for k, off in _max_offsets(event).items():
            if off > self.max_offsets.get(k, -1):
                self.max_offsets[k] = off

    # -- generators --------------------------------------------------------------------

    def generator(self) -> Generator:
        """The main phase for client threads: unbounded (wrap in `time_limit`)."""
        return clients(Tracking(self, fn(self._main_op)))

    def final_generator(self) -> Generator:
        """The drain: every thread crashes its client, assigns every key (input and
        output) from the beginning on a read_committed client and polls until it has read
        every offset known at the start of the drain."""
        return clients(_Draining(self, each_thread(lambda: FinalPolls(self))))

    def close(self) -> None:
        """Drop the zombie copiers (knob `copier_zombies`) still held, those of abandoned
        threads included; `zombie_fates` then tells how the run's zombies ended."""
        from isrlab.harness.workloads.eos.client import drop_zombies

        self.zombie_fates = drop_zombies()


class _Draining:
    """The drain's generator; marks the workload as draining when first asked."""

    def __init__(self, workload: EosWorkload, gen: Generator) -> None:
        self._w = workload
        self._gen = gen

    def op(self, ctx: Context) -> Result:
        self._w.draining = True
        return self._gen.op(ctx)

    def update(self, ctx: Context, event: Op) -> None:
        self._gen.update(ctx, event)
