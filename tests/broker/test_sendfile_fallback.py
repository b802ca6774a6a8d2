"""File regions (zero-copy fetch answers) over a transport without the sendfile system call.

asyncio's sendfile fallback lends the transport to a protocol of its own during the send; a
send that ends with the transport's buffer above its high-water mark leaves the transport
marked paused and the stream's protocol not, and the next region's send failed with an
AssertionError in StreamReaderProtocol.resume_writing (the simulator's sockets hit it on
fetches of more than zero.copy.threshold.bytes). The broker copies the regions itself on such
transports (`broker.network.server._native_sendfile`). Here a real socket is put in asyncio's
fallback mode, with small buffers and a slow reader so that its buffer fills.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from isrlab.broker.network.codec import FileRegion
from isrlab.broker.network.server import Connection, _native_sendfile


def test_file_regions_over_a_transport_without_native_sendfile(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    head = b"x" * (1 << 18)
    path = tmp_path / "segment.log"
    path.write_bytes(data)

    async def main() -> tuple[bytes, bool, bool]:
        a, b = socket.socketpair()
        for s in (a, b):  # small kernel buffers: the transport's own buffer fills
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader, writer = await asyncio.open_connection(sock=a)
        native = _native_sendfile(writer.transport)
        fallback = asyncio.constants._SendfileMode.FALLBACK  # type: ignore[attr-defined]
        writer.transport._sendfile_compatible = fallback  # type: ignore[attr-defined]
        writer.transport.set_write_buffer_limits(high=8192, low=0)  # type: ignore[attr-defined]
        peer_r, peer_w = await asyncio.open_connection(sock=b)
        conn = Connection(reader, writer)
        got = bytearray()
        want = 2 * (len(head) + len(data))

        async def slow_reader() -> None:
            while len(got) < want:
                chunk = await peer_r.read(65536)
                if not chunk:
                    return
                got.extend(chunk)
                await asyncio.sleep(0.0005)

        task = asyncio.create_task(slow_reader())
        with open(path, "rb") as f:
            for _ in range(2):  # two answers, each bytes then a region of the file
                await conn.send([head, FileRegion(f, 0, len(data))])
        await asyncio.wait_for(task, 60)
        writer.close()
        peer_w.close()
        return bytes(got), native, _native_sendfile(writer.transport)

    got, native, now = asyncio.run(main())
    assert native and not now  # a plain socket sends natively; the test's transport does not
    assert got == (head + data) * 2
