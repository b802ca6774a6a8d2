"""The asyncio socket server: frames in, handler calls, responses out (Kafka's SocketServer).

One task per connection reads size-prefixed frames and starts their handlers in arrival order;
responses go out strictly in request order, which clients rely on: a responder task sends them
from a queue, except that a request answered at once while nothing else of its connection is in
flight is answered by the reading task itself, and a handler that waits (a long poll, an
acks=all produce) with nothing ahead of it sends its own answer when done (a request read
meanwhile first hands it to the responder, which waits for it before sending the next answer).
Unlike Kafka, which mutes a
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

Connections are limited as Kafka limits them (`ConnectionLimits`): past `max.connections` (or a
listener's own `listener.name.<l>.max.connections`) the listening sockets are not accepted from
until a connection closes (clients wait in the listen backlog, Kafka's blocking accept); past `max.connections.per.ip` (or its override for the address)
a new connection is closed at once; a connection with nothing sent or received and no request in
hand for `connections.max.idle.ms` is closed; and a request frame whose first byte arrived must be
complete within `request.read.timeout.ms` (isrlab's own key; time spent waiting for request memory
does not count), so a client trickling bytes cannot hold a connection and its memory forever.
These clocks are the event loop's (`loop.time()`, the monotonic clock on asyncio's own loops, the
virtual one in a simulation).

Sockets are reached only through a `Transport` (`transport.py`): the operating system's TCP by
default, a simulated network when one is given.
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import contextlib
import logging
import os
import struct
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
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
from isrlab.broker.network.transport import (
    LISTEN_BACKLOG,
    SOCKETS,
    Accepted,
    Listening,
    Transport,
)

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
UNSUPPORTED_VERSION = 35
# Requests read ahead on one connection while earlier ones are still being handled.
MAX_INFLIGHT_PER_CONNECTION = 64
# asyncio's per-connection read buffer: reading pauses at twice this much unread data.
STREAM_BUFFER_LIMIT = 256 << 10
# Requests one connection's reading task handles before it lets the loop run other work: frames
# already buffered are read without a wait, and handlers answered at once do not wait either.
MAX_REQUESTS_WITHOUT_YIELD = 16

INT_MAX = 2147483647


@dataclass
class ConnectionLimits:
    """Kafka's connection settings (see the module docstring); Kafka's defaults."""

    max_connections: int = INT_MAX
    max_connections_per_ip: int = INT_MAX
    per_ip_overrides: dict[str, int] = field(default_factory=dict)  # IP address -> limit
    per_listener: dict[str, int] = field(default_factory=dict)  # listener name -> limit
    idle_ms: int = 600000
    read_timeout_ms: int = 30000

    def per_ip_limit(self, ip: str) -> int:
        return self.per_ip_overrides.get(ip, self.max_connections_per_ip)


# A handler returns the parts of an encoded response, or None when no response is due (acks=0).
Handler = Callable[[Request, "Connection"], Coroutine[Any, Any, list[bytes | FileRegion] | None]]


class Connection:
    """State of one client connection, visible to handlers."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: str = ""
    ):
        self.reader = reader
        self.writer = writer
        self.listener = listener  # the name of the listener it connected to
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.ip: str = peer[0] if peer else "?"
        self.closed = False
        self.frame_started: float | None = None  # first byte of a frame not complete yet
        self.frame_paused = False  # that frame waits for request memory (not the client)
        self.inflight = 0  # requests read whose response is not sent yet
        #: the task of a waiting handler that answers itself (`_alone`): it had nothing ahead
        #: of it; handed to the responder, ahead of the next answer queued, if one comes
        self.alone: asyncio.Future[Any] | None = None
        #: `alone` once handed to the responder: it sends nothing more for it
        self.handed: asyncio.Future[Any] | None = None
        self._loop = asyncio.get_running_loop()
        self.last_activity = self._loop.time()  # last frame read or response sent

    async def send(self, parts: list[bytes | FileRegion]) -> None:
        loop = self._loop
        transport = self.writer.transport
        for part in parts:
            if isinstance(part, FileRegion):
                await self.writer.drain()
                if transport.is_closing():
                    raise ConnectionResetError(f"connection {self.peer} closed by the peer")
                if not _native_sendfile(transport):
                    await self._copy_region(part)
                    continue
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
        self.last_activity = loop.time()

    async def _copy_region(self, part: FileRegion) -> None:
        """`part` read and written in blocks, each written once the transport has room (the
        StreamWriter's own flow control): for a transport without the sendfile system call."""
        fd = part.file.fileno()
        position, end = part.position, part.position + part.size
        while position < end:
            block = os.pread(fd, min(_COPY_BLOCK, end - position), position)
            if not block:  # the answer's size is already written: it cannot be completed
                raise ConnectionResetError(
                    f"connection {self.peer}: the file ended inside a region being sent"
                )
            self.writer.write(block)
            position += len(block)
            await self.writer.drain()


#: the block size of `Connection._copy_region`
_COPY_BLOCK = 256 * 1024


def _native_sendfile(transport: asyncio.BaseTransport) -> bool:
    """Whether asyncio sends a file over `transport` with the sendfile system call (a plain
    TCP socket's). Any other (TLS, the simulator's sockets) goes through asyncio's fallback,
    which lends the transport to a protocol of its own for the send and can leave the
    StreamWriter's flow control out of step with the transport: a send that ends with the
    transport's buffer above its high-water mark leaves it marked paused and the stream's
    protocol not, and the next file region's send fails with an AssertionError in
    StreamReaderProtocol.resume_writing (tests/broker/test_sendfile_fallback.py). Those
    transports get the file copied by `Connection._copy_region` instead."""
    mode = getattr(transport, "_sendfile_compatible", None)
    return getattr(mode, "name", "") == "TRY_NATIVE"


class RequestMemoryPool:
    """Kafka's `queued.max.request.bytes`: bytes of request frames in flight over all
    connections. `reserve` waits until the bytes fit (None: no bound, Kafka's -1)."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.available = capacity if capacity is not None else 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def fits(self, size: int) -> bool:
        return self.capacity is None or (self.available >= size and not self._waiters)

    def take(self, size: int) -> None:
        """Reserve `size` bytes that `fits`."""
        if self.capacity is not None:
            self.available -= size

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


@dataclass(frozen=True)
class Listener:
    name: str
    host: str  # "" binds every interface
    port: int  # 0: any free port (see SocketServer.bound_ports)


class SocketServer:
    """Serves every listener; they share the request memory and the connection limits.
    Connections on the inter-broker listener are let in past max.connections when there are
    several listeners, and the least recently active connection of another listener is closed
    to make room (Kafka's protected listener)."""

    def __init__(
        self,
        listeners: list[Listener],
        handler: Handler,
        max_request_bytes: int,
        queued_max_request_bytes: int | None = None,
        limits: ConnectionLimits | None = None,
        inter_broker_listener: str | None = None,
        transport: Transport | None = None,
    ):
        self.listeners = listeners
        self.protected = inter_broker_listener if len(listeners) > 1 else None
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.memory = RequestMemoryPool(queued_max_request_bytes)
        self.limits = limits or ConnectionLimits()
        self.transport: Transport = transport or SOCKETS
        self._listening: list[Listening] = []
        self._background: list[asyncio.Task[None]] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._open: set[Connection] = set()
        self._count = 0  # accepted connections not closed yet
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._per_listener: collections.Counter[str] = collections.Counter()
        self._slot_waiters: list[asyncio.Future[None]] = []
        self.bound_ports: dict[str, int] = {}  # listener name -> the port it is bound to

    @property
    def bound_port(self) -> int | None:
        """The first listener's port."""
        return self.bound_ports.get(self.listeners[0].name)

    async def start(self) -> None:
        """Bind every listener (an error on one closes those already bound)."""
        try:
            for listener in self.listeners:
                try:
                    listening = await self.transport.listen(
                        listener.host, listener.port, LISTEN_BACKLOG
                    )
                except OSError as e:
                    raise OSError(e.errno, f"listener {listener.name}: {e.strerror}") from None
                self._listening.append(listening)
                self.bound_ports[listener.name] = listening.port
        except OSError:
            for listening in self._listening:
                listening.close()
            self._listening = []
            raise
        self._background = [
            asyncio.create_task(self._accept_loop(listening, listener.name))
            for listening, listener in zip(self._listening, self.listeners, strict=True)
        ]
        self._background.append(asyncio.create_task(self._watch_connections()))
        for listener in self.listeners:
            log.info(
                "listening on %s://%s:%s",
                listener.name,
                listener.host or "0.0.0.0",
                self.bound_ports[listener.name],
            )

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for listening in self._listening:
            listening.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ----- accepting, connection limits -----------------------------------------------------

    async def _accept_loop(self, listening: Listening, listener: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client = await listening.accept()
            except OSError as e:  # e.g. out of file descriptors: try again shortly
                log.warning("accepting a connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            ip = client.peer[0]
            limit = self.limits.per_ip_limit(ip)
            if self._per_ip[ip] >= limit:
                log.warning(
                    "rejected connection from %s: it already has %d connections "
                    "(max.connections.per.ip%s=%d)",
                    ip,
                    self._per_ip[ip],
                    ".overrides" if ip in self.limits.per_ip_overrides else "",
                    limit,
                )
                client.close()
                continue
            # Kafka's ConnectionQuotas.inc: the accepted connection waits for a slot (of its
            # listener, listener.name.<l>.max.connections, and of the broker, max.connections,
            # which the inter-broker listener may pass) and this listener accepts nothing else
            # meanwhile (the rest wait in the backlog).
            while not self._slot_free(listener):
                waiter = loop.create_future()
                self._slot_waiters.append(waiter)
                try:
                    await waiter
                except asyncio.CancelledError:
                    client.close()
                    raise
            if listener == self.protected and self._count >= self.limits.max_connections:
                self._close_least_recent(other_than=listener)
            self._count += 1
            self._per_ip[ip] += 1
            self._per_listener[listener] += 1
            task = asyncio.create_task(self._serve_socket(client, ip, listener))
            self._connections.add(task)

    def _slot_free(self, listener: str) -> bool:
        if self._per_listener[listener] >= self.limits.per_listener.get(listener, INT_MAX):
            return False
        return listener == self.protected or self._count < self.limits.max_connections

    def _close_least_recent(self, other_than: str) -> None:
        others = [c for c in self._open if c.listener != other_than and not c.closed]
        if others:
            victim = min(others, key=lambda c: c.last_activity)
            log.info(
                "max.connections=%d reached: closing %s (listener %s) for a connection on the "
                "inter-broker listener %s",
                self.limits.max_connections,
                victim.peer,
                victim.listener,
                other_than,
            )
            victim.closed = True
            victim.writer.close()

    def _release_slot(self, ip: str, listener: str) -> None:
        self._count -= 1
        self._per_listener[listener] -= 1
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
        waiters, self._slot_waiters = self._slot_waiters, []
        for waiter in waiters:  # each looks again
            if not waiter.done():
                waiter.set_result(None)

    async def _watch_connections(self) -> None:
        """Close connections idle for connections.max.idle.ms (nothing read or sent, no
        request in hand, no frame begun) and those whose frame has not completed within
        request.read.timeout.ms of its first byte (time waiting for request memory aside)."""
        idle = self.limits.idle_ms / 1000
        read_timeout = self.limits.read_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(idle / 4, read_timeout / 4, 1.0))
            now = asyncio.get_running_loop().time()
            for conn in list(self._open):
                if conn.closed:
                    continue
                started = conn.frame_started
                if started is not None:
                    if conn.frame_paused or now - started < read_timeout:
                        continue
                    log.warning(
                        "connection %s: request not complete after "
                        "request.read.timeout.ms=%d; closing",
                        conn.peer,
                        self.limits.read_timeout_ms,
                    )
                elif conn.inflight or now - conn.last_activity < idle:
                    continue
                else:
                    log.info(
                        "connection %s: idle for more than connections.max.idle.ms=%d; closing",
                        conn.peer,
                        self.limits.idle_ms,
                    )
                conn.closed = True
                conn.writer.close()

    async def _serve_socket(self, client: Accepted, ip: str, listener: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            try:
                reader, writer = await client.streams(STREAM_BUFFER_LIMIT)
            except OSError:
                client.close()
                return
            await self._serve(reader, writer, listener)
        finally:
            self._connections.discard(task)
            self._release_slot(ip, listener)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: str
    ) -> None:
        conn = Connection(reader, writer, listener)
        self._open.add(conn)
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
            self._open.discard(conn)
            with contextlib.suppress(Exception):
                writer.close()

    async def _loop(self, conn: Connection) -> None:
        """Read frames and start their handlers in arrival order; a responder task sends the
        responses in the same order. Handlers run concurrently (pipelining), so an acks=all
        produce waiting for replication does not hold back the requests behind it; each handler
        does its appends before its first await, so appends still happen in request order."""
        pending: asyncio.Queue[asyncio.Future[list[bytes | FileRegion] | None] | None] = (
            asyncio.Queue(maxsize=MAX_INFLIGHT_PER_CONNECTION)
        )
        responder = asyncio.create_task(self._respond(conn, pending))
        try:
            await self._read_requests(conn, pending)
        finally:
            await _hand_over(conn, pending)  # a handler answering itself goes first
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
        pending: asyncio.Queue[asyncio.Future[list[bytes | FileRegion] | None] | None],
    ) -> None:
        while True:
            task = await pending.get()
            if task is None:
                return
            try:
                answers_itself = task is conn.handed
                if answers_itself:  # (`_alone`): wait until it did
                    conn.handed = None
                    await task
                else:
                    await _answer(conn, task)
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception:
                _handler_failed(conn)
                raise

    async def _read_requests(
        self,
        conn: Connection,
        pending: asyncio.Queue[asyncio.Future[list[bytes | FileRegion] | None] | None],
    ) -> None:
        handled = 0
        while True:
            handled += 1
            if handled == MAX_REQUESTS_WITHOUT_YIELD:
                # other connections' turn: this one's frames may all have been buffered
                handled = 0
                await asyncio.sleep(0)
            frame = await self._read_frame(conn)
            if frame is None:
                return
            try:
                if not await self._dispatch(conn, frame, pending):
                    return
            finally:
                self.memory.release(len(frame))

    async def _read_frame(self, conn: Connection) -> bytes | bytearray | None:
        """The next request frame, its size reserved in the request memory pool (the caller
        releases it); None: close the connection (end of stream or a bad frame). A frame
        begun but slow to complete is closed by `_watch_connections`."""
        reader = conn.reader
        head = await reader.read(4)  # as soon as anything arrives: the frame has begun
        if not head:
            return None
        clock = conn._loop.time
        conn.frame_started = conn.last_activity = clock()
        try:
            if len(head) < 4:
                try:
                    head += await reader.readexactly(4 - len(head))
                except asyncio.IncompleteReadError:
                    log.warning("connection %s: truncated frame size; closing", conn.peer)
                    return None
            (size,) = _SIZE.unpack(head)
            if size < 0 or size > self.max_request_bytes:
                log.warning(
                    "connection %s: frame of %d bytes exceeds socket.request.max.bytes=%d; closing",
                    conn.peer,
                    size,
                    self.max_request_bytes,
                )
                return None
            if not self.memory.fits(size):
                # waiting for request memory is the broker's doing: the read clock stops
                conn.frame_paused = True
                waited_from = clock()
                await self.memory.reserve(size)
                conn.frame_started += clock() - waited_from
                conn.frame_paused = False
            else:
                self.memory.take(size)
            try:
                frame = await read_frame(reader, size)
            except BaseException as e:
                self.memory.release(size)  # the frame was not read: give its memory back
                if isinstance(e, asyncio.IncompleteReadError):
                    log.warning(
                        "connection %s: truncated frame (wanted %d bytes); closing",
                        conn.peer,
                        size,
                    )
                    return None
                raise
        finally:
            conn.frame_started = None
        conn.last_activity = clock()
        return frame

    async def _dispatch(
        self,
        conn: Connection,
        frame: bytes | bytearray,
        pending: asyncio.Queue[asyncio.Future[list[bytes | FileRegion] | None] | None],
    ) -> bool:
        """Decode one request and start its handler; False: close the connection.

        The handler's coroutine is stepped here, in the reading task, up to its first wait
        (its append done), as a task's first step would run it: one answered at once costs no
        task and no loop iteration; one that waits goes on as a task from where it stopped
        (`_Resumed`)."""
        try:
            request = decode_request(memoryview(frame))
        except UnsupportedVersion as e:
            if e.api_key == 18:
                conn.inflight += 1
                await _hand_over(conn, pending)
                await pending.put(_done(conn, _api_versions_unsupported(e.correlation_id)))
                return True
            log.warning("connection %s: %s; closing", conn.peer, e)
            return False
        except FrameError as e:
            log.warning("connection %s: %s; closing", conn.peer, e)
            return False
        request.listener = conn.listener
        conn.inflight += 1
        coro = self.handler(request, conn)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            parts = stop.value
            if conn.inflight == 1:
                # Answered at once with nothing ahead of it on this connection (the responder
                # is idle and its queue empty): sent from here, without the responder's hand-off.
                try:
                    if parts is not None:
                        await conn.send(parts)
                finally:
                    conn.inflight -= 1
                    conn.last_activity = conn._loop.time()
                return True
            await _hand_over(conn, pending)
            await pending.put(_done(conn, parts))
            return True
        except Exception as e:  # the handler failed in its first step: the responder raises it
            fut: asyncio.Future[list[bytes | FileRegion] | None] = conn._loop.create_future()
            fut.set_exception(e)
            await _hand_over(conn, pending)
            await pending.put(fut)
            return True
        if conn.inflight == 1:
            # It waits with nothing ahead of it on this connection: it sends its own answer
            # when done, without the responder's two hand-offs (unless a request comes meanwhile:
            # `_hand_over`, then the responder waits for it before the next answer).
            # (`_alone` is stepped here to its wait, the handler's, so that a cancellation
            # before the task's first step reaches the handler, as with `_Resumed`)
            alone = _alone(conn, _Resumed(coro, yielded))
            conn.alone = asyncio.ensure_future(_Resumed(alone, alone.send(None)))
            return True
        await _hand_over(conn, pending)
        await pending.put(asyncio.ensure_future(_Resumed(coro, yielded)))
        return True


async def _answer(conn: Connection, task: asyncio.Future[list[bytes | FileRegion] | None]) -> None:
    """Send a handler's response (None: none to send), then count the request done."""
    try:
        parts = await task
        if parts is not None:
            await conn.send(parts)
    finally:
        conn.inflight -= 1
        conn.last_activity = conn._loop.time()


async def _alone(conn: Connection, rest: _Resumed) -> None:
    """A waiting handler's rest (its task's first step yields what it waits on), then its
    answer sent, as the responder would: a handler's failure closes the connection; the
    exception is the responder's to raise once `_hand_over` gave it this task."""
    try:
        parts = await rest
        if parts is not None:
            await conn.send(parts)
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception:
        _handler_failed(conn)
        raise
    finally:
        conn.inflight -= 1
        conn.last_activity = conn._loop.time()
    if conn.alone is asyncio.current_task():
        conn.alone = None  # answered, and nothing came meanwhile: nothing for the responder


def _handler_failed(conn: Connection) -> None:
    """A handler failed: its answer and those after it are never sent, and the connection
    closes now (its reading task then ends and logs the error)."""
    conn.closed = True
    conn.writer.close()


async def _hand_over(
    conn: Connection,
    pending: asyncio.Queue[asyncio.Future[list[bytes | FileRegion] | None] | None],
) -> None:
    """Before anything else goes to the responder: a handler answering itself (`_alone`)
    goes first, so the answers keep the request order (and its failure is raised there)."""
    alone = conn.alone
    if alone is not None:
        conn.alone = None
        conn.handed = alone
        await pending.put(alone)


def _done(
    conn: Connection, parts: list[bytes | FileRegion] | None
) -> asyncio.Future[list[bytes | FileRegion] | None]:
    fut: asyncio.Future[list[bytes | FileRegion] | None] = conn._loop.create_future()
    fut.set_result(parts)
    return fut


_STARTED = object()


class _Resumed(collections.abc.Coroutine[Any, Any, Any]):
    """The rest of a coroutine whose first step ran already and returned ``first`` (what it
    waits on), for a task to run: the task's first step yields ``first`` again, and every
    later value or exception (a cancellation, even one before that first step) goes on to
    the coroutine itself."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def send(self, value: Any) -> Any:
        first = self._first
        if first is not _STARTED:
            self._first = _STARTED
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first = _STARTED
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._first = _STARTED
        self._coro.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __await__(self) -> Generator[Any, Any, Any]:
        """Awaited by `_alone`, which hands the values and exceptions on to it."""
        return self  # type: ignore[return-value]


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
