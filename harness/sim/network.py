"""A simulated network on virtual time: hosts, listening ports, TCP-like byte streams, faults.

`SimNetwork` connects named hosts. `net.host("n1")` is that host's view of the network, a
`broker.network.transport.Transport` (`listen(host, port)`, `connect(host, port)`), so a
broker (`KafkaServer(config, transport=net.host("n1"))`) or a client runs on it unchanged: what
they get are asyncio's own `StreamReader`/`StreamWriter` over a simulated transport, with
asyncio's flow control (a reader that buffers too much pauses its transport, and the sender's
`drain()` waits while its bytes are not taken). Every delay is a timer of the loop, so on a
`clock.VirtualTimeLoop` a run takes no wall time and one seed gives one run.

What TCP promises is kept: the bytes of one direction of a connection arrive in order and
unduplicated or not at all. Every write is cut into segments of at most `mss` bytes; each
segment draws its latency from the seed (uniform in `latency`, plus any `delay` on that link)
but never overtakes the one before it on the same stream, so streams are reordered only
against each other.

Connecting is TCP's handshake: the SYN takes a latency to arrive; a host with no listener on
the port answers with a reset (ConnectionRefusedError); a SYN (or its SYN-ACK) that a
partition swallows, or that finds the listen backlog full, is sent again as Linux does
(tcp_syn_retries=6: after 1, 3, 7, 15, 31 and 63 s) and the connect fails with ETIMEDOUT
after `syn_timeout` (127 s), as a SYN into a black-hole route does. The server's side of a
connection joins its listener's accept queue when the client's ACK arrives.

Faults, all in the nemeses' vocabulary:

- `partition(grudge)`: a grudge is `nemeses.partition`'s map `{node: [nodes it cannot
  reach]}`, and `partition_shape(shape, nodes)` draws one with that module's own `grudge()`
  (isolate-one, halves, majorities-ring, bridge, ...). A segment from A to B whose arrival finds
  B in A's grudge is dropped, and its connection is then a black hole in both directions for
  good (TCP cannot deliver the bytes after a hole, and these never come): nothing more arrives
  on it, and a side that sent into it gets ETIMEDOUT `retransmit_timeout` later (Linux's
  tcp_retries2=15: 924.6 s), the other side only hears from its own timeouts. A connection
  with nothing to send during a partition survives it, as a real one does. `heal()` ends it.
- `cut_port(host, port, sources, both_ways=, syn_only=)`: an iptables rule's shape (the
  ``late-produce`` and ``lagging-failover --lagging-how cut`` nemeses'): TCP from the hosts
  `sources` names to `host`:`port` dropped at its arrival (with `both_ways` also the answers
  on those connections; with `syn_only` only SYNs, so open connections carry on), until
  `uncut_port`; `heal()` leaves it. Unlike a partition it does not black-hole a connection:
  a dropped data segment (or FIN, or the handshake's ACK) is held as the sender's kernel
  holds an unacknowledged one, and the sender retransmits on Linux's backoff (RTO 0.2 s
  doubling to 120 s: 0.2, 0.6, 1.4, 3.0, 6.2, 12.6, 25.4 ... s after the first drop); the
  first retransmission that finds no rule delivers every held segment, and whatever the
  stream sent after it, in order, a latency later (a late request). A segment delivered while
  the way back is cut gets no ACK, so its sender retransmits too. A connection still cut when
  the retransmissions run out (`retransmit_timeout`, 924.6 s) is given up by its sender:
  ETIMEDOUT, its held bytes lost, and what reaches that side later is answered with a reset.
  A reset is never held (lost at the rule, or it ends the connection at once).
- `delay(grudge, seconds)`: extra latency on those links (`clear_delays()`).
- `reset(a, b)`: connections between hosts a and b (or all of a's, or all) are reset: both
  sides see ECONNRESET, bytes in flight are lost.
- `netem(host, behaviour)`: a netem qdisc on `host`'s egress (the ``packet`` nemesis's
  ``tc qdisc replace dev <if> root netem ...``; `clear_netem(host=None)` deletes it), the
  behaviour parsed by the real nemesis's `netem_args` (`harness.sim.netem`). Every segment,
  FIN, reset, handshake ACK, SYN and SYN-ACK leaving `host` goes through it as
  ceil(n / 1448) packets (at least one), each drawn from the seed: delayed by delay +- jitter
  (normal, clipped at 0), or sent at once if reordered, or lost (corrupted counts as lost: the
  checksum fails at the receiver); a duplicate changes nothing (TCP discards it). TCP hides
  the rest: a lost packet is retransmitted one round trip later when three later packets of
  its segment got through (fast retransmit), otherwise when its RTO runs out (RTO_MIN + the
  round trip, doubling at each further loss of that packet up to RTO_MAX), each
  retransmission going through the qdisc in force then (lost again, or through, or, the
  qdisc cleared, through at the base latency). The round trip is the segment's base latency
  twice plus the qdisc's delay plus the peer host's qdisc delay (the ACK's way; ACKs are not
  themselves lost). The segment arrives when its last packet has, never before the one
  before it on its stream: the program sees latency and head-of-line blocking, never a gap.
  A packet still lost when its next retransmission would come `retransmit_timeout` (924.6
  s, tcp_retries2) after its segment's first send ends the connection as at a port cut:
  ETIMEDOUT on that side, what it had not got through lost; so 100% loss is a black hole.
  A lost SYN, SYN-ACK or refusing reset is retried on the SYN schedule; a lost reset is
  not retransmitted. No congestion window, no bandwidth, no queue at the interface. With no
  qdisc on the sending host (and none of its stream's segments still waiting for a
  retransmission) a segment costs what it did without netem: no draw from the seed.

The rest of TCP's ends that the broker can meet: a side that closes with bytes it has not
read sends a reset instead of a FIN (Linux), bytes arriving at a closed side are answered
with a reset, closing a listener resets the connections waiting in its accept queue.
`abort()` resets. `on_event` (a callable, optional) is told every connect, segment, drop and
reset as one line of text with the virtual time: a trace to compare runs by (with
`trace_data=False`, every one but the data segments delivered, each with its length and
CRC32: the most frequent lines, which a run's trace.txt leaves out).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import errno
import random
import socket
import zlib
from asyncio.constants import _SendfileMode
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from isrlab.broker.network.transport import LISTEN_BACKLOG, Address, Streams
from isrlab.harness.sim.netem import PACKET, Netem
from isrlab.nemeses.partition import Grudge, grudge

# Linux's defaults: SYN retransmissions (tcp_syn_retries=6) and the time a connection keeps
# retransmitting unacknowledged data before it gives up (tcp_retries2=15).
SYN_RETRIES = (1.0, 3.0, 7.0, 15.0, 31.0, 63.0)
SYN_TIMEOUT = 127.0
RETRANSMIT_TIMEOUT = 924.6
# Linux's retransmission backoff (the RTO of a LAN connection is its floor, TCP_RTO_MIN, and
# doubles at each retransmission up to TCP_RTO_MAX): retransmissions 0.2, 0.6, 1.4, 3.0, 6.2,
# 12.6, 25.4, 51.0, 102.2, 204.6, 324.6 ... 804.6 s after the first send, given up at 924.6 s
RTO_MIN = 0.2
RTO_MAX = 120.0
EPHEMERAL_PORTS = (32768, 60999)

_T = TypeVar("_T")

# segment kinds
_ACK, _DATA, _FIN, _RST = "ack", "data", "fin", "rst"


def retransmissions(timeout: float = RETRANSMIT_TIMEOUT) -> tuple[float, ...]:
    """When Linux retransmits an unacknowledged segment, in seconds after it was first sent,
    until it gives the connection up at `timeout`."""
    out, at, rto = [], 0.0, RTO_MIN
    while round(at + rto, 6) < timeout:
        at = round(at + rto, 6)
        out.append(at)
        rto = min(2 * rto, RTO_MAX)
    return tuple(out)


def _reset_error() -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


class PortCut:
    """An iptables rule on host `host` (`SimNetwork.cut_port`): TCP from the hosts `sources`
    names (a set of host names, or a predicate on a host's name) to its port `port` dropped
    (INPUT ``-s SRC --dport PORT -j DROP``); with `both_ways` also the answers on those
    connections (OUTPUT ``-d SRC --sport PORT -j DROP``); with `syn_only` only the SYNs of new
    connections (``--syn``). `label` names the sources in the trace."""

    __slots__ = ("both_ways", "host", "label", "port", "sources", "syn_only")

    def __init__(
        self,
        host: str,
        port: int,
        sources: Collection[str] | Callable[[str], bool],
        *,
        both_ways: bool = False,
        syn_only: bool = False,
        label: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        if callable(sources):
            self.sources: Callable[[str], bool] = sources
            self.label = label or "<predicate>"
        else:
            names = frozenset(sources)
            self.sources = names.__contains__
            self.label = label or ",".join(sorted(names))
        self.both_ways = both_ways
        self.syn_only = syn_only

    def drops(self, src: Address, dst: Address, syn: bool = False) -> bool:
        """Whether this rule drops a segment from `src` to `dst` (`syn`: a SYN)."""
        if self.syn_only and not syn:
            return False
        if dst[1] == self.port and dst[0] == self.host and self.sources(src[0]):
            return True
        return (
            self.both_ways
            and not syn
            and src[1] == self.port
            and src[0] == self.host
            and self.sources(dst[0])
        )

    def __repr__(self) -> str:
        way = " both ways" if self.both_ways else ""
        syn = " syn" if self.syn_only else ""
        return f"<PortCut {self.label} -> {self.host}:{self.port}{way}{syn}>"


class _Segment:
    """A segment sent through a netem qdisc: when it was sent, its base latency, the round
    trip its retransmissions are timed by, its packets still to get through (`lost`), the
    arrival of the last one through (`ready`); `drop`: a reset lost (never retransmitted);
    `dead`: given up with its connection."""

    __slots__ = ("dead", "drop", "latency", "lost", "ready", "rtt", "sent")

    def __init__(self, sent: float, latency: float, rtt: float) -> None:
        self.sent = sent
        self.latency = latency
        self.rtt = rtt
        self.ready = sent + latency
        self.lost = 0
        self.drop = False
        self.dead = False


class _Connection:
    __slots__ = ("blackholed", "client", "id", "reset", "server")

    def __init__(self, cid: int) -> None:
        self.id = cid
        self.client: SimSocket
        self.server: SimSocket
        self.blackholed = False  # a segment was dropped: nothing arrives any more
        self.reset = False  # a reset arrived: both sides are gone


class SimSocket(asyncio.transports._FlowControlMixin, asyncio.Transport):
    """One side of a simulated connection, as an asyncio transport.

    Its write buffer is what it sent that the peer's reader has not taken (segments in
    flight, segments held at the peer while the peer's transport is paused because asyncio's
    reader is over its limit, bytes stuck in a black-holed connection) beyond the network's
    `socket_buffer`, the bytes the two kernels' socket buffers would hold."""

    # loop.sendfile (the broker's zero-copy fetch) reads the file and writes it here
    _sendfile_compatible = _SendfileMode.FALLBACK

    def __init__(
        self,
        net: SimNetwork,
        conn: _Connection,
        local: Address,
        remote: Address,
    ) -> None:
        super().__init__({"peername": remote, "sockname": local, "socket": None}, net.loop)
        self._protocol_paused = False
        self._high_water, self._low_water = 64 * 1024, 16 * 1024
        self._net = net
        self._conn = conn
        self.local = local
        self.remote = remote
        self.peer: SimSocket
        self._protocol: Any = None
        self._reading = True
        self._closing = False  # the application closed or aborted it
        self._app_closed = False  # ... fully (not only write_eof): arriving bytes are reset
        self._eof_sent = False  # a FIN went out (write_eof, or a close)
        self._write_eof_called = False  # the application called write_eof
        self._lost = False  # connection_lost is due (or done)
        self._lost_exc: BaseException | None = None
        self._out: collections.deque[tuple[str, bytes]] = collections.deque()  # in flight
        self._out_bytes = 0
        self._last_due = 0.0
        self._stuck_bytes = 0
        self._inbox: collections.deque[tuple[str, bytes]] = collections.deque()  # not taken
        self._inbox_bytes = 0
        self._rto: asyncio.TimerHandle | None = None
        # segments a port cut held back (`SimNetwork.cut_port`), delivered in order when a
        # retransmission gets through; the retransmission timer and its schedule's start
        self._held: collections.deque[tuple[str, bytes]] = collections.deque()
        self._held_bytes = 0
        self._rexmit: asyncio.TimerHandle | None = None
        self._rexmit_from = 0.0
        self._rexmit_i = 0
        # segments under a netem qdisc (`SimNetwork.netem`) whose packets are not all through
        # yet, in the order sent; what this socket sends after them waits behind them
        self._nq: collections.deque[_Segment] | None = None
        self.listener: SimListener | None = None  # server side, until accepted

    def __repr__(self) -> str:
        return f"<SimSocket c{self._conn.id} {_fmt(self.local)}->{_fmt(self.remote)}>"

    # ----- asyncio.Transport ---------------------------------------------------------------

    def get_protocol(self) -> Any:
        return self._protocol

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def is_reading(self) -> bool:
        return self._reading and not self.is_closing()

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._net.loop.call_soon(self._take_inbox, context=self._net.context)

    def get_write_buffer_size(self) -> int:
        unread = self._out_bytes + self.peer._inbox_bytes + self._stuck_bytes + self._held_bytes
        return max(0, unread - self._net.socket_buffer)

    # asyncio's write flow control (_FlowControlMixin's, written out: its helpers are private)
    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low_water, self._high_water

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high_water, self._low_water = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if not self._protocol_paused and self.get_write_buffer_size() > self._high_water:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self.get_write_buffer_size() <= self._low_water:
            self._protocol_paused = False
            self._protocol.resume_writing()

    def write(self, data: Any) -> None:
        # asyncio's _SelectorSocketTransport.write: an error only after the application's own
        # write_eof(); after a close (the application's, the kernel's at a crash) or a lost
        # connection the bytes are dropped without a word (asyncio counts them in _conn_lost),
        # and after the peer's FIN the socket still sends (half-closed; the peer resets)
        if self._write_eof_called:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self.is_closing():
            return
        data = bytes(data)  # the caller may reuse its buffer (asyncio's sendfile fallback does)
        mss = self._net.mss
        for i in range(0, len(data), mss):
            self._net._send(self, _DATA, data[i : i + mss])
        self._maybe_pause_protocol()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._eof_sent or self.is_closing():
            return
        self._eof_sent = self._write_eof_called = True
        self._net._send(self, _FIN, b"")

    def close(self) -> None:
        if self.is_closing():
            return
        self._closing = self._app_closed = True
        self._reading = False
        if self._inbox_bytes:  # Linux: closing with unread bytes sends a reset
            self._net._send(self, _RST, b"")
        elif not self._eof_sent:
            self._eof_sent = True
            self._net._send(self, _FIN, b"")
        self._lose(None)

    def abort(self) -> None:
        if self._lost:
            return
        self._closing = self._app_closed = True
        self._net._send(self, _RST, b"")
        self._lose(None)

    # ----- the network's side --------------------------------------------------------------

    def _attach(self, protocol: Any) -> None:
        self._protocol = protocol
        protocol.connection_made(self)
        if self._lost:
            self._net.loop.call_soon(
                protocol.connection_lost, self._lost_exc, context=self._net.context
            )
        elif self._inbox:
            self._net.loop.call_soon(self._take_inbox, context=self._net.context)

    def _receive(self, kind: str, data: bytes) -> None:
        net = self._net
        if kind == _RST:
            self._conn.reset = True
            self._lose(_reset_error())
            return
        if self._lost:
            if self._app_closed and kind == _DATA and not self._conn.reset:
                net._send(self, _RST, b"")  # bytes for a closed socket: reset
            return
        if kind == _ACK:
            listener = self.listener
            if listener is not None:
                listener._established(self)
            return
        self._inbox.append((kind, data))
        self._inbox_bytes += len(data)
        self._take_inbox()

    def _take_inbox(self) -> None:
        """Hand what arrived to the protocol, while it is attached and reading."""
        protocol = self._protocol
        taken = False
        while self._inbox and protocol is not None and self._reading and not self._lost:
            kind, data = self._inbox.popleft()
            self._inbox_bytes -= len(data)
            taken = True
            if kind == _DATA:
                protocol.data_received(data)
            else:  # FIN: the peer will send nothing more
                self._reading = False
                if not protocol.eof_received():
                    self.close()
        if taken:
            self.peer._wrote_less()

    def _wrote_less(self) -> None:
        if self._protocol is not None and not self._lost:
            self._maybe_resume_protocol()

    def _lose(self, exc: BaseException | None) -> None:
        """This side is gone: connection_lost(exc) is called once (if it has a protocol)."""
        if self._lost:
            return
        self._lost = True
        self._lost_exc = exc
        self._reading = False
        self._inbox.clear()
        self._inbox_bytes = 0
        if self._rto is not None:
            self._rto.cancel()
            self._rto = None
        listener = self.listener
        if listener is not None:
            listener._forget(self)
        if self._protocol is not None:
            self._net.loop.call_soon(self._protocol.connection_lost, exc, context=self._net.context)
        self._net._forget_if_done(self._conn)

    def _timed_out(self) -> None:
        self._rto = None
        self._net._event(self, "etimedout")
        self._lose(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))


class SimAccepted:
    """A connection taken from a listener's queue (`transport.Accepted`)."""

    __slots__ = ("_sock",)

    def __init__(self, sock: SimSocket) -> None:
        self._sock = sock

    @property
    def peer(self) -> Address:
        return self._sock.remote

    def close(self) -> None:
        self._sock.close()

    async def streams(self, limit: int) -> Streams:
        return _streams(self._sock, limit)


def _streams(sock: SimSocket, limit: int) -> Streams:
    loop = sock._net.loop
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    sock._attach(protocol)
    return reader, asyncio.StreamWriter(sock, protocol, reader, loop)


def _attached(sock: SimSocket, protocol: Any) -> SimSocket:
    sock._attach(protocol)
    return sock


class SimListener:
    """A listening port (`transport.Listening`): an accept queue of at most `backlog`
    connections, those still in their handshake counted."""

    def __init__(self, net: SimNetwork, address: Address, backlog: int) -> None:
        self._net = net
        self.address = address
        self.backlog = max(1, backlog)
        self._queue: collections.deque[SimSocket] = collections.deque()
        # in their handshake, in arrival order (a dict: a set's order would vary between runs)
        self._handshaking: dict[SimSocket, None] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False

    @property
    def port(self) -> int:
        return self.address[1]

    def _has_room(self) -> bool:
        return len(self._queue) + len(self._handshaking) < self.backlog

    def _established(self, sock: SimSocket) -> None:
        self._handshaking.pop(sock, None)
        if self.closed:
            sock.abort()
            return
        self._queue.append(sock)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _forget(self, sock: SimSocket) -> None:
        self._handshaking.pop(sock, None)

    async def accept(self) -> SimAccepted:
        while not self._queue:
            if self.closed:
                raise OSError(errno.EBADF, "Bad file descriptor")
            waiter = self._net.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        sock = self._queue.popleft()
        sock.listener = None
        return SimAccepted(sock)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._net._listeners.pop(self.address, None)
        while self._queue:  # the kernel resets connections nobody accepted
            self._queue.popleft().abort()
        for sock in list(self._handshaking):
            sock.abort()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


class SimHost:
    """One host's view of the network: a `broker.network.transport.Transport`."""

    def __init__(self, net: SimNetwork, name: str) -> None:
        self.net = net
        self.name = name
        self._next_port = EPHEMERAL_PORTS[0]

    def __repr__(self) -> str:
        return f"<SimHost {self.name}>"

    def _ephemeral_port(self) -> int:
        lo, hi = EPHEMERAL_PORTS
        for _ in range(hi - lo + 1):
            port = self._next_port
            self._next_port = lo if port >= hi else port + 1
            if (self.name, port) not in self.net._listeners:
                return port
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    async def listen(self, host: str, port: int, backlog: int = LISTEN_BACKLOG) -> SimListener:
        if host not in ("", "0.0.0.0", "::", self.name):
            raise OSError(
                errno.EADDRNOTAVAIL,
                f"cannot bind {host}:{port}: Cannot assign requested address (host {self.name})",
            )
        if port == 0:
            port = self._ephemeral_port()
        address = (self.name, port)
        if address in self.net._listeners:
            raise OSError(
                errno.EADDRINUSE, f"cannot bind {host or '0.0.0.0'}:{port}: Address already in use"
            )
        listener = SimListener(self.net, address, backlog)
        self.net._listeners[address] = listener
        return listener

    async def connect(self, host: str, port: int, limit: int = 1 << 16) -> Streams:
        return await self.net._connect(self, host, port, lambda sock: _streams(sock, limit))

    async def connect_protocol(self, host: str, port: int, protocol: Any) -> SimSocket:
        """`connect`, with `protocol` (an `asyncio.Protocol`) attached to the connection
        instead of asyncio's streams (`connection_made` with the transport, `data_received`
        as the bytes arrive, ...): the transport. For a client that cuts frames itself (the
        simulated Kafka client, harness/sim/client.py): no reading task to wake per answer."""
        return await self.net._connect(self, host, port, lambda sock: _attached(sock, protocol))


class SimNetwork:
    """Hosts and the links between them (see the module docstring). `latency` is the range
    of one segment's one-way latency in seconds, drawn uniformly from `seed`; `mss` the
    largest segment; `socket_buffer` what a writer may hand over, per connection and
    direction, before `drain()` waits for the reader (the kernels' send and receive buffers)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        seed: int = 0,
        *,
        latency: tuple[float, float] = (0.0002, 0.002),
        mss: int = 64 << 10,
        socket_buffer: int = 256 << 10,
        syn_timeout: float = SYN_TIMEOUT,
        retransmit_timeout: float = RETRANSMIT_TIMEOUT,
        on_event: Callable[[str], None] | None = None,
        trace_data: bool = True,
    ) -> None:
        self.loop = loop
        self.rng = random.Random(seed)
        self.latency = latency
        self.mss = mss
        self.socket_buffer = socket_buffer
        self.syn_timeout = syn_timeout
        self.retransmit_timeout = retransmit_timeout
        self.on_event = on_event
        #: whether `on_event` is told of each data segment delivered (the most frequent line;
        #: a run that keeps no such line, `harness.sim.run`'s trace.txt, turns it off)
        self.trace_data = trace_data
        self._hosts: dict[str, SimHost] = {}
        self._listeners: dict[Address, SimListener] = {}
        self._connections: dict[int, _Connection] = {}
        self._next_id = 0
        self._cut: set[tuple[str, str]] = set()
        self._port_cuts: list[PortCut] = []
        self._rexmit_at = retransmissions(retransmit_timeout)
        self._delay: dict[tuple[str, str], float] = {}
        self._netem: dict[str, Netem] = {}
        self.grudge: Grudge = {}
        self.stats: collections.Counter[str] = collections.Counter()
        # The network's own deliveries and timers belong to no host's process: a segment in
        # flight arrives, a timeout fires, whatever became of the program that sent it.
        self.context = contextvars.Context()

    def host(self, name: str) -> SimHost:
        """The host `name` (created on first use)."""
        h = self._hosts.get(name)
        if h is None:
            h = self._hosts[name] = SimHost(self, name)
        return h

    @property
    def hosts(self) -> list[str]:
        return sorted(self._hosts)

    # ----- faults ---------------------------------------------------------------------------

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self._cut

    def partition(self, g: Grudge) -> None:
        """Impose the grudge `{node: [nodes it cannot reach]}` (instead of any before)."""
        self.grudge = {a: sorted(bs) for a, bs in g.items() if bs}
        self._cut = {(a, b) for a, bs in g.items() for b in bs}
        self._note(f"partition {self.grudge}")

    def partition_shape(
        self, shape: str, nodes: Sequence[str] | None = None, leader: str | None = None
    ) -> Grudge:
        """Impose a grudge of one of `nemeses.partition`'s shapes over `nodes` (default every
        host), drawn from this network's seed; the grudge."""
        g = grudge(shape, list(nodes) if nodes is not None else self.hosts, self.rng, leader)
        self.partition(g)
        return g

    def heal(self) -> None:
        self.grudge = {}
        self._cut = set()
        self._note("heal")

    def cut_port(
        self,
        host: str,
        port: int,
        sources: Collection[str] | Callable[[str], bool],
        *,
        both_ways: bool = False,
        syn_only: bool = False,
        label: str | None = None,
    ) -> PortCut:
        """Add an iptables-shaped rule (`PortCut`): TCP from `sources` to `host`:`port`
        dropped (also its answers with `both_ways`; only new connections' SYNs with
        `syn_only`). A data segment (or FIN) it drops is held as the sender's kernel holds an
        unacknowledged one, and delivered, in order with what the stream sent after it, at
        the first retransmission after the rule is gone (Linux's backoff,
        `retransmissions`); a connection still cut when the retransmissions run out
        (`retransmit_timeout`) is given up by its sender (ETIMEDOUT; what reaches that
        side afterwards is answered with a reset). Resets are dropped, not held. `heal()`
        does not remove it: `uncut_port` does. The rule added."""
        cut = PortCut(host, port, sources, both_ways=both_ways, syn_only=syn_only, label=label)
        self._port_cuts.append(cut)
        self._note(
            f"cut-port {cut.label} -> {host}:{port}{' both-ways' * both_ways}{' syn' * syn_only}"
        )
        return cut

    def uncut_port(self, cut: PortCut | None = None) -> int:
        """Remove the rule `cut` (None: every port rule); how many were removed. Held
        segments go at their connection's next retransmission."""
        before = len(self._port_cuts)
        if cut is None:
            self._port_cuts = []
        else:
            self._port_cuts = [c for c in self._port_cuts if c is not cut]
        n = before - len(self._port_cuts)
        if n:
            what = "all" if cut is None else f"{cut.label} -> {cut.host}:{cut.port}"
            self._note(f"uncut-port {what}")
        return n

    @property
    def port_cuts(self) -> list[PortCut]:
        return list(self._port_cuts)

    def _port_dropped(self, src: Address, dst: Address, syn: bool = False) -> bool:
        return any(cut.drops(src, dst, syn) for cut in self._port_cuts)

    def delay(self, g: Grudge, seconds: float) -> None:
        """Add `seconds` to the latency of every link in the grudge-shaped map."""
        for a, bs in g.items():
            for b in bs:
                self._delay[(a, b)] = seconds
        self._note(f"delay {seconds} {dict(sorted(g.items()))}")

    def clear_delays(self) -> None:
        self._delay = {}
        self._note("clear-delays")

    def netem(self, host: str, behaviour: dict[str, Any] | Netem) -> Netem:
        """A netem qdisc on `host`'s egress (``tc qdisc replace dev <if> root netem ...``),
        instead of any before: the behaviour of `nemeses.packet` (``{"delay": "50ms",
        "loss": "20%", ...}``, parsed and checked by `harness.sim.netem.Netem.parse`:
        NemesisError for what the real nemesis refuses and for ``rate``). Every segment,
        SYN, SYN-ACK, FIN, reset and handshake ACK leaving `host` goes through it, one packet
        of `harness.sim.netem.PACKET` bytes at a time (see the module docstring). The qdisc."""
        qdisc = behaviour if isinstance(behaviour, Netem) else Netem.parse(behaviour)
        self._netem[host] = qdisc
        self._note(f"netem {host} {qdisc.behaviour}")
        return qdisc

    def clear_netem(self, host: str | None = None) -> list[str]:
        """Remove the qdisc of `host` (None: of every host); the hosts that had one. Packets
        waiting for a retransmission go through at it, now without the qdisc."""
        hosts = sorted(self._netem) if host is None else [h for h in [host] if h in self._netem]
        for h in hosts:
            del self._netem[h]
        if hosts:
            self._note(f"clear-netem {','.join(hosts)}")
        return hosts

    @property
    def qdiscs(self) -> dict[str, Netem]:
        return dict(self._netem)

    def reset(self, a: str | None = None, b: str | None = None) -> int:
        """Reset the connections between hosts `a` and `b` (every connection of `a` if `b`
        is None, every connection if both are): both sides see ECONNRESET. How many."""
        n = 0
        for conn in list(self._connections.values()):
            ends = {conn.client.local[0], conn.server.local[0]}
            if conn.reset or (conn.client._lost and conn.server._lost):
                continue
            if (a is None or a in ends) and (b is None or b in ends):
                conn.reset = True
                self._event(conn.client, "reset")
                conn.client._lose(_reset_error())
                conn.server._lose(_reset_error())
                n += 1
        return n

    def crash_host(self, name: str) -> int:
        """The process on host `name` was killed (kill -9): the kernel closes what it held,
        as Linux does at exit. Its listeners close (connections waiting in their accept queue
        are reset, a connect to them is refused from now on); each of its connections is
        closed by the kernel: a FIN after whatever it had sent, or a reset if bytes it had not
        read were waiting. Its peers see EOF or ECONNRESET; the dead side's protocol is told
        nothing it could act on (its process runs no more). How many connections."""
        for address, listener in sorted(self._listeners.items()):
            if address[0] == name:
                listener.close()
        n = 0
        for conn in list(self._connections.values()):
            server = conn.server
            if conn.client.local[0] == name and server.listener is not None:
                # still in its handshake (SYN_SENT here): the half-open connection at the
                # listener is dropped (Linux would give it up after its SYN-ACK retries)
                server.listener._forget(server)
                server.listener = None
                conn.client._lost = server._lost = True
                self._connections.pop(conn.id, None)
                n += 1
                continue
            for sock in (conn.client, conn.server):
                if sock.local[0] == name and not sock._lost:
                    sock._protocol = None
                    sock.close()
                    n += 1
        self._note(f"crash {name}: {n} connections closed")
        return n

    # ----- moving bytes ---------------------------------------------------------------------

    def _latency(self, src: str, dst: str) -> float:
        lo, hi = self.latency
        return self.rng.uniform(lo, hi) + self._delay.get((src, dst), 0.0)

    def _send(self, sock: SimSocket, kind: str, data: bytes) -> None:
        conn = sock._conn
        if conn.reset:
            return
        if conn.blackholed:
            if kind != _RST:
                self.stats["dropped"] += 1
                sock._stuck_bytes += len(data)
                self._retransmitting(sock)
            return
        if self._netem or sock._nq:
            qdisc = self._netem.get(sock.local[0])
            if qdisc is not None or sock._nq:
                self._send_netem(sock, kind, data, qdisc)
                return
        now = self.loop.time()
        due = max(now + self._latency(sock.local[0], sock.remote[0]), sock._last_due)
        sock._last_due = due
        sock._out.append((kind, data))
        sock._out_bytes += len(data)
        self.loop.call_at(due, self._arrive, sock, context=self.context)

    def _arrive(self, src: SimSocket) -> None:
        kind, data = src._out.popleft()
        src._out_bytes -= len(data)
        conn = src._conn
        dst = src.peer
        if conn.reset:
            self._forget_if_done(conn)
            return
        if conn.blackholed or not self.reachable(src.local[0], dst.local[0]):
            self.stats["dropped"] += 1
            if not conn.blackholed:
                conn.blackholed = True
                self._event(src, f"drop {kind} {len(data)}: black hole from now on")
            if kind != _RST:
                src._stuck_bytes += len(data)
                self._retransmitting(src)
            return
        if (self._port_cuts or src._held) and self._held_back(src, dst, kind, data):
            return
        self._deliver(src, dst, kind, data)
        src._wrote_less()
        self._forget_if_done(conn)

    def _deliver(self, src: SimSocket, dst: SimSocket, kind: str, data: bytes) -> None:
        self.stats["segments"] += 1
        self.stats["bytes"] += len(data)
        if self.on_event is not None:
            if kind != _DATA:
                self._event(src, kind)
            elif self.trace_data:
                self._event(src, f"{kind} {len(data)} {zlib.crc32(data):08x}")
        dst._receive(kind, data)

    # ----- netem: packets lost, retransmitted, delayed ---------------------------------------

    def _send_netem(self, sock: SimSocket, kind: str, data: bytes, qdisc: Netem | None) -> None:
        """Send a segment through `sock`'s host's qdisc (or, with none, behind the segments
        that wait for their retransmissions): each of its packets delayed, lost and
        retransmitted (`_netem_lost`); it arrives when its last packet has, not before the
        segment before it."""
        now = self.loop.time()
        src, dst = sock.local[0], sock.remote[0]
        latency = self._latency(src, dst)
        if qdisc is None:
            seg = _Segment(now, latency, 0.0)
        else:
            # the round trip that times retransmissions: this way's base latency and qdisc
            # delay, and the same back (the ACK's way, delayed by the peer's own qdisc)
            back = self._netem.get(dst)
            rtt = 2 * latency + qdisc.delay + (back.delay if back is not None else 0.0)
            seg = _Segment(now, latency, rtt)
            n = max(1, -(-len(data) // PACKET))
            fates = [qdisc.packet(self.rng, self.stats) for _ in range(n)]
            later = 0  # packets after this one that got through: the receiver's dup ACKs
            for fate in reversed(fates):
                if fate is None:
                    self.stats["netem_lost_packets"] += 1
                    if kind == _RST:  # a reset is never retransmitted
                        seg.drop = True
                    else:
                        seg.lost += 1
                        self._netem_lost(sock, seg, now, rtt + RTO_MIN, later >= 3)
                else:
                    later += 1
                    seg.ready = max(seg.ready, now + fate + latency)
        sock._out.append((kind, data))
        sock._out_bytes += len(data)
        if sock._nq is None:
            sock._nq = collections.deque()
        sock._nq.append(seg)
        if seg.lost == 0:
            self._netem_release(sock)

    def _netem_lost(
        self, sock: SimSocket, seg: _Segment, sent: float, rto: float, fast: bool
    ) -> None:
        """A packet of `seg` sent at `sent` got nowhere: the sender retransmits it one round
        trip later if three later packets of its segment got through (fast retransmit: their
        duplicate ACKs), otherwise when its RTO (`rto`) runs out; when that would fall after
        `retransmit_timeout` from the segment's first send, the connection is given up."""
        at = sent + (seg.rtt if fast else rto)
        if at - seg.sent >= self.retransmit_timeout - 1e-9:
            self.loop.call_at(
                seg.sent + self.retransmit_timeout,
                self._netem_give_up,
                sock,
                seg,
                context=self.context,
            )
            return
        next_rto = rto if fast else min(2 * rto, RTO_MAX)
        self.loop.call_at(
            at, self._netem_retransmit, sock, seg, next_rto, fast, context=self.context
        )

    def _netem_retransmit(self, sock: SimSocket, seg: _Segment, rto: float, fast: bool) -> None:
        """The retransmission of one lost packet of `seg`, through the qdisc in force now."""
        if seg.dead:
            return
        now = self.loop.time()
        self.stats["netem_fast_retransmit" if fast else "netem_retransmit"] += 1
        qdisc = self._netem.get(sock.local[0])
        fate = 0.0 if qdisc is None or sock._conn.reset else qdisc.packet(self.rng, self.stats)
        if fate is None:
            self.stats["netem_lost_packets"] += 1
            self._netem_lost(sock, seg, now, rto, False)
            return
        seg.ready = max(seg.ready, now + fate + seg.latency)
        seg.lost -= 1
        if seg.lost == 0:
            self._netem_release(sock)

    def _netem_release(self, sock: SimSocket) -> None:
        """Schedule the arrival of the segments at the head of `sock`'s netem queue whose
        packets are all through, in order, none before the one before it."""
        q = sock._nq
        while q and q[0].lost == 0:
            seg = q.popleft()
            due = max(seg.ready, sock._last_due)
            sock._last_due = due
            self.loop.call_at(due, self._arrive_netem, sock, seg, context=self.context)

    def _arrive_netem(self, sock: SimSocket, seg: _Segment) -> None:
        if not seg.drop:
            self._arrive(sock)
            return
        kind, data = sock._out.popleft()  # a reset the qdisc lost
        sock._out_bytes -= len(data)
        self.stats["dropped"] += 1
        self._event(sock, f"drop {kind} at netem")
        self._forget_if_done(sock._conn)

    def _netem_give_up(self, sock: SimSocket, seg: _Segment) -> None:
        """A packet of `seg` was lost at every retransmission until `retransmit_timeout`:
        the kernel drops the connection (ETIMEDOUT), the segments not through are lost, and
        what reaches this side later is answered with a reset (as `_give_up`)."""
        if seg.dead:
            return
        q = sock._nq or collections.deque()
        for s in q:
            s.dead = True
            _, data = sock._out.pop()
            sock._out_bytes -= len(data)
        q.clear()
        self._drop_held(sock)
        if sock._conn.reset:
            self._forget_if_done(sock._conn)
            return
        self._etimedout(sock, "netem")

    def _netem_syn(self, host: str) -> float | None:
        """A SYN, SYN-ACK or connect's reset leaving `host`: the delay its qdisc adds, or
        None if lost (the connect's SYN retries cover it)."""
        qdisc = self._netem.get(host)
        if qdisc is None:
            return 0.0
        fate = qdisc.packet(self.rng, self.stats)
        if fate is None:
            self.stats["netem_lost_packets"] += 1
        return fate

    # ----- port cuts: held segments, retransmission, giving up ------------------------------

    def _held_back(self, src: SimSocket, dst: SimSocket, kind: str, data: bytes) -> bool:
        """A segment from `src` reached `dst`'s host while port rules exist or `src` holds
        segments back: True if it does not reach `dst` now (held, or a reset dropped)."""
        cut = self._port_dropped(src.local, dst.local)
        if kind == _RST:  # never retransmitted: lost at the rule, or it ends the connection
            if cut:
                self.stats["dropped"] += 1
                self._event(src, "drop rst at a port cut")
                return True
            self._drop_held(src)
            return False
        if not cut and not src._held:
            if kind != _ACK and self._port_dropped(dst.local, src.local):
                self._awaiting_ack(src)  # it arrives, but the ACK is dropped on its way back
            return False
        if not src._held:
            self._event(src, f"hold {kind} {len(data)}: port cut, retransmitted later")
        src._held.append((kind, data))
        src._held_bytes += len(data)
        self.stats["held"] += 1
        self._awaiting_ack(src)
        return True

    def _drop_held(self, sock: SimSocket) -> None:
        sock._held.clear()
        sock._held_bytes = 0
        if sock._rexmit is not None:
            sock._rexmit.cancel()
            sock._rexmit = None

    def _awaiting_ack(self, sock: SimSocket) -> None:
        """`sock` sent what was held or whose ACK cannot come back: its kernel retransmits on
        Linux's backoff from now (unless it already does)."""
        if sock._rexmit is None:
            sock._rexmit_from = self.loop.time()
            sock._rexmit_i = 0
            self._next_retransmission(sock)

    def _next_retransmission(self, sock: SimSocket) -> None:
        if sock._rexmit_i < len(self._rexmit_at):
            at = sock._rexmit_from + self._rexmit_at[sock._rexmit_i]
            sock._rexmit_i += 1
            sock._rexmit = self.loop.call_at(at, self._retransmit, sock, context=self.context)
        else:
            sock._rexmit = self.loop.call_at(
                sock._rexmit_from + self.retransmit_timeout,
                self._give_up,
                sock,
                context=self.context,
            )

    def _retransmit(self, sock: SimSocket) -> None:
        """One retransmission of `sock`'s oldest unacknowledged segment: when no rule drops
        it any more its held segments arrive a latency later, and when the ACK can come back
        the retransmissions end; otherwise the next one is due."""
        sock._rexmit = None
        conn, peer = sock._conn, sock.peer
        if conn.reset:
            self._drop_held(sock)
            return
        if sock._held and not self._port_dropped(sock.local, peer.local):
            due = self.loop.time() + self._latency(sock.local[0], peer.local[0])
            self.loop.call_at(due, self._deliver_held, sock, context=self.context)
        if sock._held or self._port_dropped(peer.local, sock.local):
            self._next_retransmission(sock)

    def _deliver_held(self, sock: SimSocket) -> None:
        """The retransmission arrived: the held segments, in order, unless a rule or a
        partition stops it again (a partition makes it a black hole, as for any segment)."""
        conn, dst = sock._conn, sock.peer
        if conn.reset or not sock._held:
            return
        if conn.blackholed or not self.reachable(sock.local[0], dst.local[0]):
            self.stats["dropped"] += len(sock._held)
            if not conn.blackholed:
                conn.blackholed = True
                self._event(sock, "drop held segments: black hole from now on")
            sock._stuck_bytes += sock._held_bytes
            self._drop_held(sock)
            self._retransmitting(sock)
            return
        if self._port_dropped(sock.local, dst.local):
            return  # cut again: the next retransmission tries
        self._event(sock, f"late {len(sock._held)} held segment(s), {sock._held_bytes} bytes")
        held, sock._held = sock._held, collections.deque()
        sock._held_bytes = 0
        if not self._port_dropped(dst.local, sock.local) and sock._rexmit is not None:
            sock._rexmit.cancel()  # acknowledged
            sock._rexmit = None
        for kind, data in held:
            if conn.reset:
                break
            self._deliver(sock, dst, kind, data)
        sock._wrote_less()
        self._forget_if_done(conn)

    def _give_up(self, sock: SimSocket) -> None:
        """The retransmissions ran out (tcp_retries2): the kernel drops the connection, the
        application gets ETIMEDOUT, and what reaches this side later is answered with a reset."""
        sock._rexmit = None
        self._drop_held(sock)
        if sock._conn.reset:
            return
        self._etimedout(sock, "a port cut")

    def _etimedout(self, sock: SimSocket, where: str) -> None:
        """The kernel gives the connection up (tcp_retries2 ran out at `where`): the
        application gets ETIMEDOUT, and what reaches this side later is answered with a
        reset."""
        self._event(sock, f"etimedout: retransmissions exhausted at {where}")
        sock._app_closed = True
        if not sock._lost:
            sock._lose(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))
        else:
            self._forget_if_done(sock._conn)

    def _retransmitting(self, sock: SimSocket) -> None:
        """`sock` sent into a black hole: it gives up after the retransmission timeout."""
        if sock._rto is None and not sock._lost:
            sock._rto = self.loop.call_later(
                self.retransmit_timeout, sock._timed_out, context=self.context
            )

    def _forget_if_done(self, conn: _Connection) -> None:
        """Forget a connection whose both sides are gone and that carries nothing more."""
        client, server = conn.client, conn.server
        if (
            client._lost
            and server._lost
            and not client._out
            and not server._out
            and not client._held
            and not server._held
        ):
            self._connections.pop(conn.id, None)

    # ----- connecting -----------------------------------------------------------------------

    async def _connect(
        self, src: SimHost, host: str, port: int, attach: Callable[[SimSocket], _T]
    ) -> _T:
        """Connect from `src` to `host`:`port`; `attach(client socket)` gives the caller's end
        (streams, or a protocol's transport) once the connection is established."""
        if host not in self._hosts:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        loop = self.loop
        start = loop.time()
        retries = iter(SYN_RETRIES)
        local = (src.name, src._ephemeral_port())
        target = (host, port)
        while True:
            self._note(f"{_fmt(local)}->{_fmt(target)} syn")
            latency = self._latency(src.name, host)
            through = self._netem_syn(src.name) if self._netem else 0.0
            await asyncio.sleep(latency + (through or 0.0))
            if (
                through is not None
                and self.reachable(src.name, host)
                and not (self._port_cuts and self._port_dropped(local, target, syn=True))
            ):
                listener = self._listeners.get(target)
                if listener is None:
                    if self.reachable(host, src.name) and not (
                        self._port_cuts and self._port_dropped(target, local)
                    ):
                        latency = self._latency(host, src.name)
                        back = self._netem_syn(host) if self._netem else 0.0
                        await asyncio.sleep(latency + (back or 0.0))
                        if back is not None:
                            self._note(f"{_fmt(local)}->{_fmt(target)} refused")
                            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
                elif listener._has_room():
                    client = self._new_connection(local, target)
                    server = client.peer
                    server.listener = listener
                    listener._handshaking[server] = None
                    established = False
                    try:
                        latency = self._latency(host, src.name)  # SYN-ACK
                        back = self._netem_syn(host) if self._netem else 0.0
                        await asyncio.sleep(latency + (back or 0.0))
                        if (
                            back is not None
                            and self.reachable(host, src.name)
                            and server.listener is listener
                            and not (self._port_cuts and self._port_dropped(target, local))
                        ):
                            established = True
                    finally:
                        if not established:  # lost, or the connect was given up
                            listener._forget(server)
                            server.listener = None
                            client._lost = server._lost = True
                            self._connections.pop(client._conn.id, None)
                    if established:
                        self._note(f"{_fmt(local)}->{_fmt(target)} c{client._conn.id} established")
                        end = attach(client)
                        self._send(client, _ACK, b"")
                        return end
            # the SYN or its answer was lost (or the backlog was full): Linux sends it again
            wait = next(retries, None)
            at = start + (wait if wait is not None else self.syn_timeout)
            await asyncio.sleep(max(0.0, at - loop.time()))
            if wait is None:
                self._note(f"{_fmt(local)}->{_fmt(target)} etimedout")
                raise TimeoutError(errno.ETIMEDOUT, "Connection timed out")

    def _new_connection(self, local: Address, remote: Address) -> SimSocket:
        self._next_id += 1
        conn = _Connection(self._next_id)
        client = SimSocket(self, conn, local, remote)
        server = SimSocket(self, conn, remote, local)
        client.peer, server.peer = server, client
        conn.client, conn.server = client, server
        self._connections[conn.id] = conn
        return client

    # ----- trace ----------------------------------------------------------------------------

    def _note(self, what: str) -> None:
        if self.on_event is not None:
            self.on_event(f"{self.loop.time():.6f} net {what}")

    def _event(self, sock: SimSocket, what: str) -> None:
        if self.on_event is not None:
            self.on_event(
                f"{self.loop.time():.6f} c{sock._conn.id} "
                f"{_fmt(sock.local)}->{_fmt(sock.remote)} {what}"
            )


def _fmt(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


__all__ = [
    "PortCut",
    "SimAccepted",
    "SimHost",
    "SimListener",
    "SimNetwork",
    "SimSocket",
    "retransmissions",
]
