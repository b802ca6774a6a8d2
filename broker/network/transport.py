"""Where the broker's bytes go: the one seam between the broker and a network.

The socket server listens and accepts through a `Transport`, and every broker-to-broker
connection (replica fetchers, transaction markers, verification) is opened through the same
object, so a broker can run on another network by being handed another transport. Two exist:

- `SocketTransport` (the default): the operating system's TCP sockets, exactly what the server
  and the client did before the seam (a listening socket with SO_REUSEADDR and a backlog,
  `sock_accept`, asyncio streams on the accepted socket with TCP_NODELAY,
  `asyncio.open_connection`).
- `harness.sim.network`'s host transports: a simulated network on virtual time (issue 18).

Everything above the seam is the same on both: connection limits, idle and request-read
timeouts, request memory and pipelining live in `server.py` and only see asyncio streams.
An accepted connection is handed over before its streams are built (`Accepted`), so a
connection refused by `max.connections.per.ip` is closed without building them, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol

# Kafka's socket.listen.backlog.size default: connections waiting to be accepted.
LISTEN_BACKLOG = 50

Address = tuple[str, int]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Accepted(Protocol):
    """A connection taken from a listener's queue, its streams not built yet."""

    @property
    def peer(self) -> Address: ...

    def close(self) -> None:
        """Close it without serving it."""

    async def streams(self, limit: int) -> Streams:
        """Its reader and writer (`limit`: the reader's buffer limit); OSError if it is gone."""
        ...


class Listening(Protocol):
    """A bound, listening endpoint."""

    @property
    def port(self) -> int:
        """The port it is bound to (the one chosen when 0 was asked for)."""
        ...

    async def accept(self) -> Accepted:
        """The next connection; OSError for a failure worth retrying (out of descriptors)."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    async def listen(self, host: str, port: int, backlog: int = LISTEN_BACKLOG) -> Listening:
        """Bind `host:port` ("" every interface, port 0 any free one) and listen; OSError
        (with its errno) if the address cannot be resolved or bound."""
        ...

    async def connect(self, host: str, port: int, limit: int) -> Streams:
        """A connection to `host:port`; OSError (ConnectionRefusedError, TimeoutError, ...)
        if none can be made. Callers bound the wait themselves."""
        ...


class _SocketAccepted:
    __slots__ = ("_sock", "peer")

    def __init__(self, sock: socket.socket, peer: Address):
        self._sock = sock
        self.peer = peer

    def close(self) -> None:
        self._sock.close()

    async def streams(self, limit: int) -> Streams:
        try:
            reader, writer = await asyncio.open_connection(sock=self._sock, limit=limit)
        except OSError:
            self._sock.close()
            raise
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer


class _SocketListening:
    __slots__ = ("_sock", "port")

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.port: int = sock.getsockname()[1]

    async def accept(self) -> Accepted:
        client, address = await asyncio.get_running_loop().sock_accept(self._sock)
        return _SocketAccepted(client, (address[0], address[1]))

    def close(self) -> None:
        self._sock.close()


class SocketTransport:
    """The operating system's TCP sockets (the default)."""

    async def listen(self, host: str, port: int, backlog: int = LISTEN_BACKLOG) -> Listening:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as e:
            raise OSError(e.errno, f"cannot resolve {host!r}: {e}") from None
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(backlog)
        except OSError as e:
            sock.close()
            raise OSError(
                e.errno, f"cannot bind {host or '0.0.0.0'}:{port}: {e.strerror}"
            ) from None
        sock.setblocking(False)
        return _SocketListening(sock)

    async def connect(self, host: str, port: int, limit: int) -> Streams:
        return await asyncio.open_connection(host, port, limit=limit)


#: The transport of a broker that is given none.
SOCKETS = SocketTransport()
