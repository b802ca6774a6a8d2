"""A small asyncio Kafka client connection, for broker-to-broker requests (replica fetchers).

`request` encodes a kafka-python request object and decodes its response with kafka-python's
schemas; `exchange` sends bytes a caller encoded and returns the response frame (the
follower's Fetch: broker/network/replica_fetch.py). One request is in flight at a time per
connection (the fetchers use one connection per leader broker for their batched fetches, and
one per partition for its other requests).
Connections are opened through a `Transport` (the broker's: sockets, or a simulated network).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from typing import Any

from kafka.protocol.api_header import ResponseClassRegistry

from isrlab.broker.network.transport import SOCKETS, Transport

_I32 = struct.Struct(">i")


class ConnectionFailed(Exception):
    pass


class KafkaConnection:
    def __init__(self, host: str, port: int, client_id: str, transport: Transport | None = None):
        self.transport: Transport = transport or SOCKETS
        self.host = host
        self.port = port
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0
        self._lock = asyncio.Lock()

    async def _connect(self, timeout: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                self.transport.connect(self.host, self.port, limit=1 << 20), timeout
            )
        except (OSError, TimeoutError) as e:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {e}") from None

    async def exchange(self, encode: Callable[[int], bytes], timeout: float) -> bytes:
        """Send the framed request ``encode(correlation_id)`` returns and read its response
        frame (without the size prefix), whose correlation id is checked."""
        async with self._lock:
            try:
                if self._writer is None:
                    await self._connect(timeout)
                # this exchange's streams: a close() from another task meanwhile ends them
                # (an OSError or an incomplete read), it does not pull them from under us
                reader, writer = self._reader, self._writer
                assert reader is not None and writer is not None
                self._correlation += 1
                writer.write(encode(self._correlation))
                await writer.drain()
                # each read within `timeout`, in this task (asyncio.wait_for would run each
                # read as a task of its own: three more loop callbacks per read)
                async with asyncio.timeout(timeout):
                    head = await reader.readexactly(4)
                (size,) = _I32.unpack(head)
                async with asyncio.timeout(timeout):
                    frame = await reader.readexactly(size)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionFailed) as e:
                self.close()
                raise ConnectionFailed(f"{self.host}:{self.port}: {e!r}") from None
            if size < 4 or _I32.unpack_from(frame)[0] != self._correlation:
                self.close()
                raise ConnectionFailed("correlation id mismatch")
            return frame

    async def request(self, request: Any, timeout: float) -> Any:
        """A kafka-python request object -> its decoded response."""

        def encode(correlation_id: int) -> bytes:
            request.with_header(correlation_id=correlation_id, client_id=self.client_id)
            data: bytes = request.encode(header=True, framed=True)
            return data

        frame = await self.exchange(encode, timeout)
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
        return cls[request.API_VERSION].decode(frame, header=True)

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None
