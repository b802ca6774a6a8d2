"""Runs that must end: a busy loop at one virtual instant is reported, not waited for; the
simulated consumer's poll takes virtual time when it returns nothing; what a killed broker's
cleanup schedules at the end of a run does not run; a write on a socket the kernel closed is
dropped as asyncio drops it (not "Cannot call write() after write_eof()")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from isrlab.broker.network.client import ConnectionFailed, KafkaConnection
from isrlab.harness.sim import clock
from isrlab.harness.sim.cli import SeedJob, run_seed
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.network import SimNetwork

TEST: dict[str, Any] = {"seed": 1, "acks": "1", "keys": ["t0/0"], "request_timeout_ms": 2000}


def loop_with(limit: int) -> clock.VirtualTimeLoop:
    loop = clock.VirtualTimeLoop()
    loop.stuck_limit = limit
    return loop


def run_on(loop: clock.VirtualTimeLoop, coro: Any) -> Any:
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        clock._cancel_all(loop)
        asyncio.set_event_loop(None)
        loop.close()


# ----- the loop's detector --------------------------------------------------------------------


def test_a_busy_loop_at_one_virtual_instant_raises_time_stuck() -> None:
    async def spin() -> None:
        await asyncio.sleep(2.5)
        while True:  # never waits: the clock can never move again
            await asyncio.sleep(0)

    loop = loop_with(10_000)
    with pytest.raises(clock.TimeStuck, match=r"virtual time stuck at 2\.500000: 10000 loop"):
        run_on(loop, spin())
    assert 10_000 < loop.iterations < 10_100


def test_many_iterations_are_fine_while_the_clock_moves() -> None:
    async def busy() -> float:
        for _ in range(30_000):
            await asyncio.sleep(0.001)
        return asyncio.get_running_loop().time()

    assert run_on(loop_with(10_000), busy()) == pytest.approx(30.0)


def test_a_stuck_seed_is_reported_crashed_by_isrlab_sim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck(job: Any, run_dir: Path, report: bool) -> dict[str, Any]:
        async def spin() -> None:
            while True:
                await asyncio.sleep(0)

        run_on(loop_with(1_000), spin())
        raise AssertionError("not reached")

    monkeypatch.setattr("isrlab.harness.sim.cli._simulate", stuck)
    job = SeedJob(seed=7, overrides={}, run_dir=str(tmp_path / "seed-7"))
    r = run_seed(job)
    assert r.status == "crashed"
    assert "TimeStuck: virtual time stuck at 0.000000" in r.detail
    assert "TimeStuck" in (tmp_path / "seed-7" / "error.txt").read_text()


# ----- the simulated consumer's poll ----------------------------------------------------------


def client_on(net: SimNetwork, test: dict[str, Any] | None = None) -> SimQueueClient:
    return SimQueueClient(test or TEST, net.host("client0"), ["n1", "n2"], process=0)


def test_a_poll_with_nothing_assigned_blocks_for_its_timeout() -> None:
    # the final drain polls again as soon as a poll completes: a poll that returned at once
    # (the client replaced, nothing assigned) spun at one virtual instant for ever
    async def body() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        c = await client_on(SimNetwork(loop, seed=1)).open()
        t0 = loop.time()
        done = await c.invoke({"process": 0, "f": "poll", "value": [["poll"]], "_poll_ms": 1000})
        return done, loop.time() - t0

    done, took = clock.run(body())
    assert done["type"] == "ok" and done["value"] == [["poll", {}]]
    assert took == pytest.approx(1.0)


def test_a_poll_whose_deadline_is_ulps_away_ends_while_the_loop_is_busy() -> None:
    # seed 9 of acks=1 under partition+kill+pause (20 s, interval 3) hung at 58.2487 s: four
    # polls were a few ulps before their deadline; each waited (deadline - now), the loop ran
    # that timer early (due within its clock resolution) without moving its clock while the
    # other polls kept it busy, and every poll asked again at the same instant for ever
    loop = loop_with(50_000)
    finished: list[bool] = []

    async def neighbour() -> None:
        while not finished:
            await asyncio.sleep(0)

    async def body() -> dict[str, Any]:
        net = SimNetwork(asyncio.get_running_loop(), seed=1)
        for host in ("n1", "n2"):
            net.host(host)  # no broker listens there: a connect is refused after a latency
        c = await client_on(net).open()
        await c.invoke({"process": 0, "f": "assign", "value": ["t0/0"]})
        task = asyncio.get_running_loop().create_task(neighbour())
        try:
            return await c._poll(3e-14, {})
        finally:
            finished.append(True)
            await task

    assert run_on(loop, body()) == {}


# ----- what a dead broker left ----------------------------------------------------------------


def test_what_a_killed_process_schedules_when_buried_does_not_run() -> None:
    # a replica fetcher frozen at a kill re-spawns itself in its `finally`; closed at the end
    # of the run, that new task ran as the harness's and wrote on the dead broker's socket
    ran: list[str] = []

    async def respawned() -> None:
        ran.append("respawned")

    async def fetcher() -> None:
        try:
            await asyncio.sleep(100)
        finally:
            ran.append("finally")
            asyncio.get_running_loop().create_task(respawned())
            asyncio.get_running_loop().call_soon(ran.append, "callback")

    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        broker = clock.Process("broker1.1")
        broker.run(loop.create_task, fetcher())
        await asyncio.sleep(1)
        loop.kill(broker)
        broker.bury()
        await asyncio.sleep(1)

    clock.run(main())
    assert ran == ["finally"]


def test_a_write_on_a_socket_the_kernel_closed_is_dropped_and_the_exchange_fails() -> None:
    # asyncio's selector transport raises "Cannot call write() after write_eof()" only after
    # the application's own write_eof(); after a close it drops the bytes. The simulated one
    # raised after any close (the kernel's at a crash among them)
    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop, seed=1)
        listener = await net.host("n2").listen("", 9092)
        conn = KafkaConnection("n2", 9092, "replica-1", net.host("n1"))
        got: list[Any] = []
        kept: list[Any] = []  # the server's streams stay open (no FIN from n2)

        async def serve() -> None:
            reader, writer = await (await listener.accept()).streams(1 << 16)
            kept.append(writer)
            head = await reader.readexactly(4)
            frame = await reader.readexactly(int.from_bytes(head, "big"))
            writer.write(len(frame[:4]).to_bytes(4, "big") + frame[4:8])  # its correlation id

        server = loop.create_task(serve())
        frame = await conn.exchange(lambda c: b"\0\0\0\x08" + b"\0\0\0\0" + c.to_bytes(4, "big"), 5)
        got.append(frame)
        await server
        net.crash_host("n1")  # the kernel closes the connection's socket on n1
        t0 = loop.time()
        with pytest.raises(ConnectionFailed):
            await conn.exchange(lambda c: b"\0\0\0\x04" + c.to_bytes(4, "big"), 2)
        got.append(loop.time() - t0)
        # the application's own write_eof still makes a later write an error, as in asyncio
        _reader, writer = await net.host("n1").connect("n2", 9092)
        writer.write_eof()
        with pytest.raises(RuntimeError, match="after write_eof"):
            writer.write(b"x")
        writer.close()
        return got

    frame, took = clock.run(body())
    assert frame == b"\0\0\0\x01"
    assert took == pytest.approx(2.0)  # no answer can come: the exchange's timeout
