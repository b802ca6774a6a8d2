"""The virtual-time loop: timers in virtual-time order, no real sleeping, the same trace twice."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from isrlab.harness.sim.clock import Process, Stalled, VirtualTimeLoop, run


def test_timers_fire_in_virtual_time_order() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for name, delay in [("c", 3.0), ("a", 1.0), ("d", 3.0), ("b", 2.5)]:
            loop.call_later(delay, lambda n=name: fired.append((n, loop.time())))
        await asyncio.sleep(10)

    run(main())
    # equal due times keep their scheduling order
    assert fired == [("a", 1.0), ("b", 2.5), ("c", 3.0), ("d", 3.0)]


def test_an_hour_of_sleep_takes_no_wall_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        await asyncio.wait_for(asyncio.sleep(7200), timeout=10_000)
        return loop.time() - t0

    w0 = time.monotonic()
    assert run(main()) == 3600 + 7200
    assert time.monotonic() - w0 < 600  # a loop that slept for real would take three hours


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=30)
        return loop.time()

    assert run(main(), start=100.0) == 130.0


def test_to_thread_runs_on_the_loop_thread_in_no_virtual_time() -> None:
    import threading

    async def main() -> tuple[str, float, str]:
        loop = asyncio.get_running_loop()
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)
        return name, loop.time(), threading.current_thread().name

    name, now, main_name = run(main())
    assert name == main_name and now == 0.0


def test_a_stall_is_reported_not_waited_for() -> None:
    async def main() -> None:
        await asyncio.sleep(5)
        await asyncio.Event().wait()  # nothing will ever set it

    with pytest.raises(Stalled, match=r"5\.000000"):
        run(main())


def _trace(seed: int) -> bytes:
    """Interleaved tasks with seeded delays: each step and its virtual time."""
    rng = random.Random(seed)
    lines: list[str] = []

    async def worker(name: str, queue: asyncio.Queue[str]) -> None:
        loop = asyncio.get_running_loop()
        for i in range(20):
            await asyncio.sleep(rng.choice([0, 0.001, 0.5, 1, rng.random() * 3]))
            if rng.random() < 0.3:
                queue.put_nowait(f"{name}:{i}")
            lines.append(f"{loop.time()!r} {name} step {i}")

    async def consumer(queue: asyncio.Queue[str]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            lines.append(f"{loop.time()!r} consumer got {item}")

    async def main() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        c = asyncio.create_task(consumer(queue))
        await asyncio.gather(*(worker(n, queue) for n in "pqrst"))
        await asyncio.sleep(0)
        c.cancel()

    run(main())
    return "\n".join(lines).encode()


def test_a_seeded_run_gives_a_byte_identical_trace() -> None:
    first = _trace(7)
    assert len(first.splitlines()) > 100
    assert _trace(7) == first
    assert _trace(8) != first


def test_loop_is_usable_directly() -> None:
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(asyncio.sleep(1.5))
        assert loop.time() == 1.5
    finally:
        loop.close()


def test_a_paused_process_runs_nothing_and_catches_up_on_resume() -> None:
    """SIGSTOP / SIGCONT: a paused process's steps, timers and wake-ups are held, not dropped;
    on resume they run in the order the loop reached them, before what comes after; another
    process and the harness carry on meanwhile; data sent to it waits in its queue."""
    ran: list[str] = []

    async def ticker(name: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1)
            ran.append(f"{name} tick {loop.time():g}")

    async def reader(queue: asyncio.Queue[str]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            ran.append(f"a got {item} at {loop.time():g}")

    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        a, b = Process("a"), Process("b")
        queue: asyncio.Queue[str] = asyncio.Queue()
        a.run(loop.create_task, ticker("a"))
        a.run(loop.create_task, reader(queue))
        b.run(loop.create_task, ticker("b"))
        a.run(loop.call_later, 2.5, ran.append, "a timer")
        await asyncio.sleep(1.5)
        loop.pause(a)
        assert a.paused and repr(a) == "<Process a paused>"
        queue.put_nowait("x")  # delivered while it is stopped: waits
        await asyncio.sleep(2)
        ran.append(f"harness at {loop.time():g}, {len(a.held)} held")
        loop.resume(a)
        await asyncio.sleep(0.7)
        loop.kill(a)
        loop.kill(b)
        await asyncio.sleep(1)
        a.bury()
        b.bury()

    run(main())
    assert ran == [
        "a tick 1",
        "b tick 1",
        "b tick 2",
        "b tick 3",
        # what a's loop reached while stopped: the reader's wake-up (x arrived at 1.5), its
        # ticker's timer due at 2 and its own timer due at 2.5, all held; nothing of a ran
        "harness at 3.5, 3 held",
        # in that order on resume (the ticker's timer wakes its task, which runs after)
        "a got x at 3.5",
        "a timer",
        "a tick 3.5",
        "b tick 4",
        # a's next tick (4.5) is after its kill at 4.2
    ]


def test_a_paused_process_can_be_killed_and_its_held_callbacks_never_run() -> None:
    ran: list[str] = []

    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        a = Process("a")
        a.run(loop.call_later, 1, ran.append, "a timer")
        a.run(loop.call_soon, ran.append, "a soon")
        loop.pause(a)
        await asyncio.sleep(2)
        assert len(a.held) == 2
        loop.kill(a)
        assert a.held == []
        loop.resume(a)  # nothing to resume: dead
        await asyncio.sleep(2)

    run(main())
    assert ran == []
