"""How the simulated interpreter (harness/sim/interpreter.py) waits: a thread answered
`Pending(at)` sleeps until `at` (at most the threaded interpreter's 50 ms poll later) or until
a completion, which may change the generator's answer; it is then asked again by the
interpreter itself, and asleep threads are asked in the order they last asked. Every ask is
checked against those rules (all in virtual time)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from isrlab.harness.generator import (
    NS,
    Base,
    Context,
    Pending,
    Result,
    clients,
    delay,
    limit,
    repeat,
    time_limit,
)
from isrlab.harness.history import HistoryWriter
from isrlab.harness.sim import clock
from isrlab.harness.sim.interpreter import SimInterpreter

Op = dict[str, Any]
MS = 1_000_000


class _Client:
    """Every op takes `seconds` of virtual time and succeeds."""

    broken = False

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def open(self) -> None:
        return None

    async def invoke(self, op: Op) -> Op:
        await asyncio.sleep(self.seconds)
        return {**op, "type": "ok"}

    async def close(self) -> None:
        return None


class _Asks(Base):
    """Records every ask (thread, virtual ns) and passes it to `gen`."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        self.asks: list[tuple[int | str, int]] = []

    def op(self, ctx: Context) -> Result:
        self.asks.append((ctx.thread, ctx.time))
        return self.gen.op(ctx)  # type: ignore[no-any-return]

    def update(self, ctx: Context, event: Op) -> None:
        self.gen.update(ctx, event)


def _run(tmp_path: Path, gen: Any, concurrency: int, op_seconds: float) -> tuple[list[Op], Any]:
    import orjson

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        history = HistoryWriter(tmp_path / "h.jsonl", clock=lambda: round(loop.time() * 1e9))
        interp = SimInterpreter(gen, history, lambda p, t: _Client(op_seconds), concurrency)
        stats = await interp.run()
        history.close(fsync=False)
        return stats

    stats = clock.run(main())
    ops = [orjson.loads(line) for line in (tmp_path / "h.jsonl").read_bytes().splitlines()]
    return ops, stats


class _Gated(Base):
    """Thread 0: one op "a". Thread 1: Pending 10 s away until "a" completed ok (an update
    changes its answer long before its `at`), then one op "b"."""

    def __init__(self) -> None:
        self.given: set[str] = set()
        self.open = False

    def op(self, ctx: Context) -> Result:
        f = "a" if ctx.thread == 0 else "b"
        if f in self.given:
            return None
        if f == "b" and not self.open:
            return Pending(10 * NS)
        self.given.add(f)
        return {"f": f, "value": None}

    def update(self, ctx: Context, event: Op) -> None:
        if event["type"] == "ok" and event["f"] == "a":
            self.open = True


def test_a_completion_that_changes_the_answer_wakes_a_pending_thread_at_once(
    tmp_path: Path,
) -> None:
    gen = _Asks(_Gated())
    ops, stats = _run(tmp_path, gen, 2, 0.010)
    assert [(o["process"], o["type"], o["f"], o["time"]) for o in ops] == [
        (0, "invoke", "a", 0),
        (0, "ok", "a", 10 * MS),
        (1, "invoke", "b", 10 * MS),  # asked right after the completion, not at 10 s
        (1, "ok", "b", 20 * MS),
    ]
    # thread 1 slept from its first ask (its 50 ms poll not yet due) until the completion
    assert gen.asks == [(0, 0), (1, 0), (0, 10 * MS), (1, 10 * MS), (1, 20 * MS)]
    assert stats["generator_queries"] == len(gen.asks)


def test_pending_threads_sleep_until_their_time_and_take_ops_in_the_order_they_asked(
    tmp_path: Path,
) -> None:
    """Ops every 5 ms taking 1 ms each, three threads: each op is invoked at its time by the
    thread that asked longest ago (round robin), and a thread is asked only at its deadline
    or after a completion."""
    gen = _Asks(clients(limit(9, delay(0.005, repeat({"f": "w", "value": None})))))
    ops, stats = _run(tmp_path, gen, 3, 0.001)
    invokes = [(o["process"], o["time"]) for o in ops if o["type"] == "invoke"]
    assert invokes == [(i % 3, i * 5 * MS) for i in range(9)]
    completions = {o["time"] for o in ops if o["type"] != "invoke"}
    due = {i * 5 * MS for i in range(10)}
    # every ask was at an op's due time or at a completion; none in between (no polling)
    assert {t for _, t in gen.asks} <= due | completions
    # at each op's due time the three threads (after the ninth op, the limit answers None)
    assert sum(1 for _, t in gen.asks if t in due) == 3 * 9
    # after each completion: the completing thread, then every asleep thread (itself too:
    # all are asked again after a completion); after the last one, only the completing thread
    assert sum(1 for _, t in gen.asks if t in completions) == 4 * 8 + 1
    assert gen.asks[:7] == [(0, 0), (1, 0), (2, 0), (0, MS), (1, MS), (2, MS), (0, MS)]
    assert stats["generator_queries"] == len(gen.asks) and stats["invoked"] == 9


def test_threads_told_a_firm_pending_are_not_asked_again_after_a_completion(
    tmp_path: Path,
) -> None:
    """The same ops as above without `limit` (which drops the firm promise): `delay`'s
    Pending is firm (the same answer until its time, whatever happens), so after a
    completion only the completing thread asks; the asleep ones are asked at their time only,
    and the ops still go round robin at their times."""
    gen = _Asks(clients(time_limit(0.045, delay(0.005, repeat({"f": "w", "value": None})))))
    ops, stats = _run(tmp_path, gen, 3, 0.001)
    invokes = [(o["process"], o["time"]) for o in ops if o["type"] == "invoke"]
    assert invokes == [(i % 3, i * 5 * MS) for i in range(9)]
    completions = [(o["process"], o["time"]) for o in ops if o["type"] != "invoke"]
    due = {i * 5 * MS for i in range(10)}
    assert {t for _, t in gen.asks} <= due | {t for _, t in completions}
    # at each due time the three threads (at 45 ms the time limit ends them)
    assert sum(1 for _, t in gen.asks if t in due) == 3 * 10
    # after each completion the completing thread only (it asks for its next op)
    assert [a for a in gen.asks if a[1] not in due] == completions
    assert stats["generator_queries"] == len(gen.asks) and stats["invoked"] == 9
