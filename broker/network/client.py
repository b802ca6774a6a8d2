"""A small asyncio Kafka client connection, for broker-to-broker requests (replica fetchers).

Requests are encoded and responses decoded by kafka-python's schemas, like the server side.
One request is in flight at a time per connection (the fetchers use one connection per
partition they follow, so a long-polling fetch never delays another partition).
Connections are opened through a `Transport` (the broker's: sockets, or a simulated network).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

from kafka.protocol.api_header import ResponseClassRegistry

from isrlab.broker.network.transport import SOCKETS, Transport


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

    async def request(self, request: Any, timeout: float) -> Any:
        async with self._lock:
            try:
                if self._writer is None:
                    await self._connect(timeout)
                assert self._reader is not None and self._writer is not None
                self._correlation += 1
                request.with_header(correlation_id=self._correlation, client_id=self.client_id)
                data = request.encode(header=True, framed=True)
                self._writer.write(data)
                await self._writer.drain()
                head = await asyncio.wait_for(self._reader.readexactly(4), timeout)
                (size,) = struct.unpack(">i", head)
                frame = await asyncio.wait_for(self._reader.readexactly(size), timeout)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionFailed) as e:
                self.close()
                raise ConnectionFailed(f"{self.host}:{self.port}: {e!r}") from None
            cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
            response = cls[request.API_VERSION].decode(frame, header=True)
            if response.header.correlation_id != self._correlation:
                self.close()
                raise ConnectionFailed("correlation id mismatch")
            return response

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None
