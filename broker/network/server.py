"""The asyncio socket server: frames in, handler calls, responses out (Kafka's SocketServer).

One task per connection reads size-prefixed frames and starts their handlers in arrival order;
responses go out strictly in request order, which clients rely on. Unlike Kafka, which mutes a
channel while one of its requests is in flight, up to MAX_INFLIGHT_PER_CONNECTION requests are
handled concurrently, so acks=all produces waiting for the same replication round complete together. Anything wrong with a frame (too large, truncated, undecodable, an unknown API) is
logged and the connection is closed; other connections are unaffected and nothing reaches the log.
An unsupported ApiVersions version is answered with UNSUPPORTED_VERSION and the version table (so a
newer client can downgrade), as Kafka does.

Memory for requests is bounded over all connections by `queued.max.request.bytes`
(`RequestMemoryPool`): a frame's declared size is reserved before its bytes are read, the bytes
are then read as they arrive (never allocated up front from the declared size), and the
reservation is given back once the request's handler has taken it (run up to its first wait, its
append done), as Kafka releases a request's buffer when the API layer returns. A frame that does
not fit waits, and its connection is not read meanwhile: asyncio stops reading the socket once
`STREAM_BUFFER_LIMIT` bytes are buffered, so TCP pushes back on the client. Partial frames thus
cost at most the budget plus that small buffer per connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from collections.abc import Callable, Coroutine
from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse

from isrlab.broker.network.codec import (
    FileRegion,
    FrameError,
    Request,
    UnsupportedVersion,
    api_versions_table,
    decode_request,
    encode_response,
)

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
UNSUPPORTED_VERSION = 35
# Requests read ahead on one connection while earlier ones are still being handled.
MAX_INFLIGHT_PER_CONNECTION = 64
# asyncio's per-connection read buffer: reading pauses at twice this much unread data.
STREAM_BUFFER_LIMIT = 256 << 10

# A handler returns the parts of an encoded response, or None when no response is due (acks=0).
Handler = Callable[[Request, "Connection"], Coroutine[Any, Any, list[bytes | FileRegion] | None]]


class Connection:
    """State of one client connection, visible to handlers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.closed = False

    async def send(self, parts: list[bytes | FileRegion]) -> None:
        loop = asyncio.get_running_loop()
        transport = self.writer.transport
        for part in parts:
            if isinstance(part, FileRegion):
                await self.writer.drain()
                if transport.is_closing():
                    raise ConnectionResetError(f"connection {self.peer} closed by the peer")
                # A fresh open file description: sendfile moves the file position, which must
                # not disturb the log's own handle (works even if the segment was just deleted).
                with open(f"/proc/self/fd/{part.file.fileno()}", "rb", buffering=0) as f:
                    try:
                        await loop.sendfile(transport, f, part.position, part.size)
                    except RuntimeError as e:
                        # asyncio refuses a transport that began closing during the send
                        if not transport.is_closing():
                            raise
                        raise ConnectionResetError(f"connection {self.peer}: {e}") from None
            else:
                self.writer.write(part)
        await self.writer.drain()


class RequestMemoryPool:
    """Kafka's `queued.max.request.bytes`: bytes of request frames in flight over all
    connections. `reserve` waits until the bytes fit (None: no bound, Kafka's -1)."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.available = capacity if capacity is not None else 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def reserve(self, size: int) -> None:
        if self.capacity is None:
            return
        while self.available < size:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
        self.available -= size

    def release(self, size: int) -> None:
        if self.capacity is None:
            return
        self.available += size
        # every waiter looks again: a smaller frame may fit where a larger one does not
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


async def read_frame(reader: asyncio.StreamReader, size: int) -> bytes | bytearray:
    """`size` bytes, read as they arrive: memory follows what the peer actually sent, not what
    it declared. IncompleteReadError if the connection ends first."""
    chunk = await reader.read(size)
    if len(chunk) == size:
        return chunk
    frame = bytearray(chunk)
    while len(frame) < size:
        chunk = await reader.read(size - len(frame))
        if not chunk:
            raise asyncio.IncompleteReadError(bytes(frame), size)
        frame += chunk
    return frame


class SocketServer:
    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        max_request_bytes: int,
        queued_max_request_bytes: int | None = None,
    ):
        self.host = host
        self.port = port
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.memory = RequestMemoryPool(queued_max_request_bytes)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.bound_port: int | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True, limit=STREAM_BUFFER_LIMIT
        )
        sock = self._server.sockets[0]
        self.bound_port = sock.getsockname()[1]
        log.info("listening on %s:%s", self.host, self.bound_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = Connection(reader, writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._loop(conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection %s: unexpected error; closing it", conn.peer)
        finally:
            conn.closed = True
            self._connections.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _loop(self, conn: Connection) -> None:
        """Read frames and start their handlers in arrival order; a responder task sends the
        responses in the same order. Handlers run concurrently (pipelining), so an acks=all
        produce waiting for replication does not hold back the requests behind it; each handler
        does its appends before its first await, so appends still happen in request order."""
        pending: asyncio.Queue[asyncio.Task[list[bytes | FileRegion] | None] | None] = (
            asyncio.Queue(maxsize=MAX_INFLIGHT_PER_CONNECTION)
        )
        responder = asyncio.create_task(self._respond(conn, pending))
        try:
            await self._read_requests(conn, pending)
        finally:
            await pending.put(None)  # close after the responses already due have been sent
            try:
                await responder
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                while not pending.empty():
                    t = pending.get_nowait()
                    if t is not None:
                        t.cancel()

    async def _respond(
        self,
        conn: Connection,
        pending: asyncio.Queue[asyncio.Task[list[bytes | FileRegion] | None] | None],
    ) -> None:
        while True:
            task = await pending.get()
            if task is None:
                return
            parts = await task
            if parts is not None:
                await conn.send(parts)

    async def _read_requests(
        self,
        conn: Connection,
        pending: asyncio.Queue[asyncio.Task[list[bytes | FileRegion] | None] | None],
    ) -> None:
        reader = conn.reader
        while True:
            try:
                head = await reader.readexactly(4)
            except asyncio.IncompleteReadError as e:
                if e.partial:
                    log.warning("connection %s: truncated frame size; closing", conn.peer)
                return
            (size,) = _SIZE.unpack(head)
            if size < 0 or size > self.max_request_bytes:
                log.warning(
                    "connection %s: frame of %d bytes exceeds socket.request.max.bytes=%d; closing",
                    conn.peer,
                    size,
                    self.max_request_bytes,
                )
                return
            await self.memory.reserve(size)
            try:
                if not await self._read_one(conn, size, pending):
                    return
            finally:
                self.memory.release(size)

    async def _read_one(
        self,
        conn: Connection,
        size: int,
        pending: asyncio.Queue[asyncio.Task[list[bytes | FileRegion] | None] | None],
    ) -> bool:
        """Read, decode and start one request of `size` bytes; False: close the connection."""
        try:
            frame = await read_frame(conn.reader, size)
        except asyncio.IncompleteReadError:
            log.warning(
                "connection %s: truncated frame (wanted %d bytes); closing", conn.peer, size
            )
            return False
        try:
            request = decode_request(memoryview(frame))
        except UnsupportedVersion as e:
            if e.api_key == 18:
                await pending.put(_done(_api_versions_unsupported(e.correlation_id)))
                return True
            log.warning("connection %s: %s; closing", conn.peer, e)
            return False
        except FrameError as e:
            log.warning("connection %s: %s; closing", conn.peer, e)
            return False
        del frame
        await pending.put(asyncio.create_task(self.handler(request, conn)))
        # Let the new handler run up to its first await (its append) before reading on.
        await asyncio.sleep(0)
        return True


def _done(parts: list[bytes | FileRegion]) -> asyncio.Task[list[bytes | FileRegion] | None]:
    async def value() -> list[bytes | FileRegion] | None:
        return parts

    return asyncio.create_task(value())


def _api_versions_unsupported(correlation_id: int) -> list[bytes | FileRegion]:
    cls = ApiVersionsResponse[0]
    resp = cls(
        error_code=UNSUPPORTED_VERSION,
        api_keys=[
            cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in api_versions_table()
        ],
    )
    return encode_response(resp, 0, correlation_id)
