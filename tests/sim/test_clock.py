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


def _count_real_polls(loop: VirtualTimeLoop) -> list[float]:
    """Record every poll of the loop's real selector (its timeouts)."""
    polls: list[float] = []
    real: Any = loop._real_selector  # type: ignore[attr-defined]
    select = real.select

    def counting(timeout: float | None = None) -> Any:
        polls.append(timeout)  # type: ignore[arg-type]
        return select(timeout)

    real.select = counting
    return polls


def test_the_real_selector_is_polled_only_while_a_real_fd_is_registered() -> None:
    """Nothing real registered (the self-pipe aside): no poll at all, however many iterations.
    A real socket registered: polled (without waiting) every iteration, its data read, and
    virtual time still jumps; unregistered: no poll again."""
    import socket

    loop = VirtualTimeLoop()
    polls = _count_real_polls(loop)
    try:

        async def main() -> list[tuple[bytes, float]]:
            got: list[tuple[bytes, float]] = []
            for _ in range(50):
                await asyncio.sleep(0.1)
            assert polls == [] and loop.iterations >= 50  # type: ignore[attr-defined]
            a, b = socket.socketpair()
            a.setblocking(False)
            arrived = asyncio.Event()

            def readable() -> None:
                got.append((a.recv(100), loop.time()))
                arrived.set()

            loop.add_reader(a.fileno(), readable)
            b.send(b"hello")
            await arrived.wait()
            await asyncio.sleep(3600)  # a jump with a real fd registered
            loop.remove_reader(a.fileno())
            a.close()
            b.close()
            n = len(polls)
            await asyncio.sleep(1)
            assert len(polls) == n
            return got

        got = loop.run_until_complete(main())
        assert [g[0] for g in got] == [b"hello"] and got[0][1] == pytest.approx(5.0)
        assert polls and set(polls) == {0}  # never a real wait
        assert loop.time() == pytest.approx(3606.0)
    finally:
        loop.close()


def test_a_wake_up_from_another_thread_is_read_from_the_self_pipe() -> None:
    """call_soon_threadsafe runs the callback and the self-pipe's byte is read (one poll)."""
    import threading

    loop = VirtualTimeLoop()
    polls = _count_real_polls(loop)
    ran: list[float] = []
    try:

        async def main() -> None:
            t = threading.Thread(target=loop.call_soon_threadsafe, args=(ran.append, 1.0))
            t.start()
            t.join()  # (blocks the loop: the callback is queued when it returns)
            await asyncio.sleep(2)

        loop.run_until_complete(main())
        assert ran == [1.0] and polls == [0]
        with pytest.raises(BlockingIOError):  # its byte was read
            loop._ssock.recv(10)  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_timers_keep_their_order_through_a_heap_clean_up_and_jumps_past_a_day() -> None:
    """Most timers cancelled (the heap is rebuilt without them, as asyncio does); the rest
    fire in (due time, scheduling order); a timer three days away fires at exactly its time."""
    fired: list[tuple[int, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        handles = [
            loop.call_later((i % 7) * 0.5, lambda i=i: fired.append((i, loop.time())))
            for i in range(300)
        ]
        for i, h in enumerate(handles):
            if i % 3:
                h.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(10)
        await asyncio.sleep(3 * 86400 + 0.25)

    assert run(main()) is None
    expected = sorted(
        ((i, (i % 7) * 0.5) for i in range(300) if i % 3 == 0), key=lambda e: (e[1], e[0])
    )
    assert fired == expected


def test_a_callback_scheduled_with_a_process_context_belongs_to_it() -> None:
    """The owner is the process of the context the callback is scheduled with (explicit or
    current), found when it is scheduled: held while paused, dropped once killed."""
    ran: list[str] = []

    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        a = Process("a")
        loop.pause(a)
        loop.call_soon(ran.append, "explicit", context=a.context.copy())
        loop.call_later(0.5, ran.append, "timer", context=a.context.copy())
        loop.call_soon(ran.append, "harness")
        await asyncio.sleep(1)
        assert ran == ["harness"] and len(a.held) == 2
        loop.resume(a)
        await asyncio.sleep(0)
        assert ran == ["harness", "explicit", "timer"]
        loop.kill(a)
        loop.call_soon(ran.append, "after kill", context=a.context.copy())
        a.run(loop.call_later, 0.1, ran.append, "after kill")
        await asyncio.sleep(1)

    run(main())
    assert ran == ["harness", "explicit", "timer"]


def test_a_jump_to_the_next_timer_is_one_iteration() -> None:
    async def main() -> int:
        loop: Any = asyncio.get_running_loop()
        before = loop.iterations
        await asyncio.sleep(3600)
        return loop.iterations - before  # type: ignore[no-any-return]

    # the sleep's timer set; the jump, where the timer fires and wakes the task; its step
    assert run(main()) == 2
