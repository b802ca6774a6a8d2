"""The socket server steps a request's handler in the reading task up to its first wait, and a
handler that waits goes on as a task from where it stopped (`broker.network.server._resume`):
what it awaits is passed back in as a value or an exception, a cancellation reaches it,
responses keep the request order, and a handler failing in its first step closes only its
connection at once (its answer and those after it never sent)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest

from isrlab.broker.network.codec import Request
from isrlab.broker.network.server import (
    MAX_REQUESTS_WITHOUT_YIELD,
    Connection,
    Listener,
    SocketServer,
    _Resumed,
)


def _frame(correlation_id: int) -> bytes:
    request = ApiVersionsRequest[0]()
    request.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(request.encode(header=True, framed=True))


def _answer(correlation_id: int, text: bytes) -> list[Any]:
    body = struct.pack(">i", correlation_id) + text
    return [struct.pack(">i", len(body)) + body]


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    return struct.unpack_from(">i", body)[0], body[4:]


def _serve(
    handler: Callable[[Request, Connection], Awaitable[list[Any] | None]],
    go: Callable[[int], Awaitable[None]],
) -> None:
    async def main() -> None:
        server = SocketServer([Listener("PLAINTEXT", "127.0.0.1", 0)], handler, 1 << 20)  # type: ignore[arg-type]
        await server.start()
        try:
            port = server.bound_port
            assert port is not None
            await asyncio.wait_for(go(port), 20)
        finally:
            await server.stop()

    asyncio.run(main())


def test_waiting_handlers_get_values_and_exceptions_and_answers_keep_request_order() -> None:
    started: list[int] = []

    async def handler(request: Request, conn: Connection) -> list[Any] | None:
        cid = request.correlation_id
        started.append(cid)
        kind = cid % 4
        if kind == 0:  # answered at once
            return _answer(cid, b"now")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        if kind == 1:  # waits for a value
            loop.call_later(0.002 * (cid % 5), fut.set_result, b"value")
            return _answer(cid, await fut)
        if kind == 2:  # waits for an exception
            loop.call_later(0.001, fut.set_exception, ValueError("thrown"))
            try:
                await fut
            except ValueError as e:
                return _answer(cid, b"caught " + str(e).encode())
            return _answer(cid, b"not thrown")
        await asyncio.sleep(0)  # a bare yield, twice
        await asyncio.sleep(0)
        return _answer(cid, b"yielded")

    async def go(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(_frame(cid) for cid in range(40)))
        await writer.drain()
        answers = [await _read_answer(reader) for _ in range(40)]
        writer.close()
        expected = {0: b"now", 1: b"value", 2: b"caught thrown", 3: b"yielded"}
        assert answers == [(cid, expected[cid % 4]) for cid in range(40)]

    _serve(handler, go)
    assert started == list(range(40))  # each handler began in request order


def test_a_stopping_server_cancels_a_waiting_handler() -> None:
    seen: list[str] = []

    async def handler(request: Request, conn: Connection) -> list[Any] | None:
        try:
            await asyncio.get_running_loop().create_future()  # never done
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return None

    async def go(port: int) -> None:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_frame(1))
        await writer.drain()
        for _ in range(20):
            await asyncio.sleep(0)
        writer.close()  # the handler still waits: the server's stop cancels it

    _serve(handler, go)
    assert seen == ["cancelled"]


def test_a_handler_failing_in_its_first_step_closes_only_its_connection() -> None:
    async def handler(request: Request, conn: Connection) -> list[Any] | None:
        if request.correlation_id == 666:
            raise RuntimeError("handler bug")
        return _answer(request.correlation_id, b"ok")

    async def go(port: int) -> None:
        r1, w1 = await asyncio.open_connection("127.0.0.1", port)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w1.write(_frame(5) + _frame(666) + _frame(6))
        await w1.drain()
        assert await _read_answer(r1) == (5, b"ok")
        w2.write(_frame(7))
        await w2.drain()
        assert await _read_answer(r2) == (7, b"ok")
        # the failure is not answered and the connection closes: nothing after it is sent
        assert await r1.read() == b""
        w1.close()
        w2.close()

    _serve(handler, go)


def test_a_handler_cancelled_before_its_task_first_runs_is_cancelled_at_its_wait() -> None:
    """The task that goes on with a handler may be cancelled before its first step (the
    connection closed meanwhile): the handler itself gets the cancellation at the wait it
    stopped at, as a task of its own would have."""
    seen: list[str] = []

    async def handler() -> str:
        try:
            await asyncio.sleep(0)  # a bare yield: the task holds no future to cancel
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "done"

    async def main() -> None:
        coro = handler()
        first = coro.send(None)
        task = asyncio.ensure_future(_Resumed(coro, first))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            seen.append("task cancelled")
        coro2 = handler()
        task2 = asyncio.ensure_future(_Resumed(coro2, coro2.send(None)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        task2.cancel()  # at its second wait, a future
        try:
            await task2
        except asyncio.CancelledError:
            seen.append("task2 cancelled")

    asyncio.run(main())
    assert seen == ["cancelled", "task cancelled", "cancelled", "task2 cancelled"]


def test_a_connection_with_many_buffered_requests_lets_another_in() -> None:
    """A connection whose frames are all buffered and answered at once never waits: its
    reading task lets the loop run after MAX_REQUESTS_WITHOUT_YIELD of them, so another
    connection's request is not held behind all of them."""
    order: list[int] = []

    async def handler(request: Request, conn: Connection) -> list[Any] | None:
        order.append(request.correlation_id)
        return _answer(request.correlation_id, b"ok")

    async def go(port: int) -> None:
        ra, wa = await asyncio.open_connection("127.0.0.1", port)
        rb, wb = await asyncio.open_connection("127.0.0.1", port)
        wa.write(b"".join(_frame(cid) for cid in range(200)))
        wb.write(_frame(1000))
        await wa.drain()
        await wb.drain()
        assert await _read_answer(rb) == (1000, b"ok")
        for cid in range(200):
            assert await _read_answer(ra) == (cid, b"ok")
        wa.close()
        wb.close()

    _serve(handler, go)
    assert sorted(order) == [*range(200), 1000]
    assert MAX_REQUESTS_WITHOUT_YIELD <= 32  # the bound below leaves room for a few turns
    assert order.index(1000) < 100  # not behind all of the other connection's 200


def test_a_waiting_handler_alone_answers_itself_and_keeps_the_order() -> None:
    """A handler that waits with nothing ahead of it on its connection sends its own answer
    (no responder involved); a request read while it waits goes to the responder after it, so
    its answer, ready at once, still comes second; an alone handler that fails closes its
    connection without an answer."""
    loop_futures: dict[int, asyncio.Future[bytes]] = {}
    responders: list[bool] = []

    async def handler(request: Request, conn: Connection) -> list[Any] | None:
        cid = request.correlation_id
        if cid in (1, 10):
            fut = loop_futures[cid] = asyncio.get_running_loop().create_future()
            text = await fut
            responders.append(conn.handed is not None)
            return _answer(cid, text)
        if cid == 3:
            await asyncio.sleep(0)
            raise RuntimeError("handler bug")
        if cid == 2:
            loop_futures[1].set_result(b"first")  # answered at once, after 1 is woken
        return _answer(cid, b"now")

    async def go(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_frame(10))
        await writer.drain()
        for _ in range(50):  # 10 waits alone
            await asyncio.sleep(0)
        loop_futures[10].set_result(b"alone")
        assert await _read_answer(reader) == (10, b"alone")
        writer.write(_frame(1))
        await writer.drain()
        for _ in range(50):
            await asyncio.sleep(0)
        writer.write(_frame(2))
        await writer.drain()
        assert await _read_answer(reader) == (1, b"first")
        assert await _read_answer(reader) == (2, b"now")
        writer.write(_frame(3))
        await writer.drain()
        assert await reader.read() == b""  # closed, nothing sent
        writer.close()

    _serve(handler, go)
    assert responders == [False, True]  # 10 answered alone; 1 handed to the responder by 2
