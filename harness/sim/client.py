"""A simulated Kafka client for the queue workload: `QueueClient`'s ops and completion shapes
(harness/workloads/queue/client.py), performed as asyncio code on the simulated network.

`SimQueueClient(test, transport, bootstrap, process, node)` talks the Kafka protocol to the
brokers of a `SimCluster` over `transport` (`cluster.net.host(...)`): Produce, Fetch and
ListOffsets requests, their responses and the fetched records through the hand-written
codecs of `harness/sim/wire.py` (held to kafka-python's by tests/sim/test_client_wire.py),
the rarer requests through kafka-python's classes (as `broker/network/client.py`); batches
are built as kafka-python's record-batch builder builds them (`wire.encode_batch`).
`SimQueueClient.factory(test, net, nodes)` is the interpreter's client_factory(process,
thread): thread t is bound to node t mod n (its `node`, first in its bootstrap order, as
`QueueClient.factory`) and connects from host "client<t>".

What it does, after librdkafka where it matters for anomalies:

- metadata: a Metadata request to the first bootstrap broker that answers (own node first),
  the leader of each partition cached; refreshed (one request at a time, shared by everyone
  waiting) when a leader is unknown, after NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
  LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH and a connection that failed or timed out. An
  isolated broker's stale answer is believed, as a real client believes it;
- connections: one per broker, requests pipelined and answers matched by correlation id, a
  request timeout (request_timeout_ms) closes the connection (librdkafka and the Java client
  tear it down too), connecting is bounded by the same timeout;
- producer: acks from the test (0, 1, all); idempotent when test["idempotence"] (absent:
  Kafka 3.x's default, on with acks=all), which needs acks=all (else `open` refuses, as
  librdkafka does): InitProducerId first, per-partition sequence numbers, a retried batch
  keeps its sequence (so the broker answers a retry of an append that happened with the
  original offset); without idempotence a retry is a new append and can duplicate. The op's
  consecutive sends to one partition go out as one batch, partitions in parallel. Retriable
  errors (leadership, NOT_ENOUGH_REPLICAS[_AFTER_APPEND], REQUEST_TIMED_OUT, a connection
  lost or timed out) are retried after retry.backoff.ms (100 ms) until `retries` (the knob;
  unset: unbounded, librdkafka's) or until the batch's delivery timeout, the op's
  op_timeout_ms (librdkafka's message.timeout.ms), after which the send completes as `info`
  ("msg-timed-out"), never `fail`. Other errors are `fail` or `info` by
  `queue.client.DEFINITE_ERRORS`'s rule (`_DEFINITE` below names the same errors by
  broker code). An idempotent batch that did not end ok makes the producer take a new
  producer id before its next batch (librdkafka's idempotent reset). acks=0: the request is
  written and the send is ok with offset null, as librdkafka reports it;
- consumer (assign only): `assign` adds keys at the log start (ListOffsets earliest: the
  same as librdkafka's OFFSET_BEGINNING), keeps the positions of keys that stay, `_seek`
  "beginning" restarts every key; `poll` sends one Fetch per leader (max_wait
  fetch_wait_max_ms, min_bytes 1) and repeats until records arrive or the poll timeout
  passes (a poll that returns nothing has always taken its timeout, with nothing assigned
  too, as librdkafka's poll blocks for it; a deadline less than MIN_WAIT_S away counts as
  passed: the loop can run a timer due within its clock resolution without moving its
  clock); the broker returns records below the high watermark only; positions move past
  what was returned; OFFSET_OUT_OF_RANGE resets a key to the log start
  (auto.offset.reset=earliest). Control batches are skipped;
- completions: QueueClient's shapes through `checkers.queue.codec` (sends
  `[offset, v]`, `[null, v]` with acks=0, bare `v` when not acknowledged; polls
  `{k: [[offset, v], ...]}`), `node`, `producer` on sends, and `watermarks` (ListOffsets
  earliest/latest from the leaders) on a seeded sample (watermark_p) of ok data ops. A
  completion that is not ok rewinds the positions to the first offset it read, as
  QueueClient's rollback;
- transactions (test["txn"]) and read_committed (test["isolation_level"]): harness/sim/txn.py
  (`attach`, called here): librdkafka's transactional producer, every data op one
  transaction as QueueClient's, and a read_committed fetch that drops aborted transactions.

Known differences from librdkafka: no background prefetch (a poll fetches when called, so a
consumer reads later than librdkafka would); no linger/batching across ops and one
in-flight batch per partition per op (librdkafka pipelines up to 5); retry backoff is flat
100 ms (librdkafka backs off exponentially up to 1 s); no periodic metadata refresh, no
fetch-position validation with leader epochs (KIP-320: librdkafka ≥ 1.9 detects a truncated
log and resets), though metadata naming an older leader epoch than one already seen is
ignored as librdkafka ≥ 2.1 ignores it; no compression. Consumer groups (`subscribe`, `commit`,
when test["group"] is set): harness/sim/group.py (`attach`, called here), librdkafka's group
consumer; its rebalances are taken during polls and the next completion carries them
(`rebalance`); without a group those ops complete as `fail` ("unsupported-in-sim"). Transactions: no
send_offsets_to_transaction (the queue workload sends none), no coordinator monitor, flat
back-offs (harness/sim/txn.py's module doc).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka.protocol.api_header import ResponseClassRegistry
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest

from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.client import ConnectionFailed
from isrlab.broker.network.transport import Transport
from isrlab.checkers.queue import codec
from isrlab.harness.sim import wire
from isrlab.harness.sim.cluster import EPOCH, PORT
from isrlab.harness.workloads.queue.client import (
    ClientError,
    _worse,
    parse_key,
    send_verdict,
    touched_keys,
)
from isrlab.harness.workloads.queue.client import _decode as _decode_value
from isrlab.harness.workloads.queue.options import QueueOptions

__all__ = ["UNSUPPORTED", "SimQueueClient"]

log = logging.getLogger(__name__)

Op = dict[str, Any]
TP = tuple[str, int]

#: the error of ops the simulated client does not perform
UNSUPPORTED = "unsupported-in-sim"

#: librdkafka's retry.backoff.ms
RETRY_BACKOFF_S = 0.1
#: how long to wait before asking for a coordinator again (librdkafka's coordinator query
#: after a failure: 500 ms at first)
COORD_RETRY_S = 0.5

#: what is left of a deadline below this is nothing: the loop runs a timer that is due within
#: its clock resolution (1 ns) without moving its clock, so a wait for a few ulps of virtual
#: time can end before the clock has reached the deadline, and a loop "until the deadline"
#: would ask again at the same instant for ever while other tasks keep the loop busy
MIN_WAIT_S = 1e-6

E = ErrorCode
#: broker errors after which the leader is looked up again
_REFRESH = frozenset(
    {
        E.NOT_LEADER_OR_FOLLOWER,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.LEADER_NOT_AVAILABLE,
        E.FENCED_LEADER_EPOCH,
        E.UNKNOWN_LEADER_EPOCH,
        E.KAFKA_STORAGE_ERROR,
    }
)
#: produce errors retried with the same batch (and sequence)
_RETRIABLE = _REFRESH | {
    E.NOT_ENOUGH_REPLICAS,
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    E.REQUEST_TIMED_OUT,
    E.COORDINATOR_LOAD_IN_PROGRESS,
}
#: produce errors that prove the batch was not appended: queue.client.DEFINITE_ERRORS's
#: broker errors (the rest of that set are librdkafka's local errors)
_DEFINITE = frozenset(
    {
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.INVALID_TOPIC_EXCEPTION,
        E.INVALID_REPLICATION_FACTOR,
        E.NOT_CONTROLLER,
        E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        E.PRODUCER_FENCED,
        E.INVALID_PRODUCER_EPOCH,
        E.MESSAGE_TOO_LARGE,
        E.INVALID_REQUIRED_ACKS,
    }
)
#: produce errors after which the producer cannot go on (QueueClient's _BREAKING_ERRORS)
_BREAKING = frozenset({E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.PRODUCER_FENCED})


def _error_name(code: int) -> str:
    """QueueClient's error_name for a broker error code: "not-leader-or-follower"."""
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return name.lower().replace("_", "-")


class _Conn:
    """One connection to a broker: requests pipelined, answers matched by correlation id.

    The connection's bytes go to a `_Frames` protocol (`SimHost.connect_protocol`), which
    cuts the answers out of them and hands each to its caller's future as the segment holding
    its end arrives: no reading task (and no wake-up of one per answer), no asyncio streams."""

    def __init__(self, transport: Any, host: str, port: int, client_id: str) -> None:
        self.transport = transport
        self.host, self.port, self.client_id = host, port, client_id
        self._frames: _Frames | None = None
        self._connect_lock = asyncio.Lock()
        self._correlation = 0
        self._waiting: dict[int, tuple[asyncio.Future[Any], Callable[[bytes], Any]]] = {}

    async def _connect(self, timeout: float) -> _Frames:
        async with self._connect_lock:
            if self._frames is not None:
                return self._frames
            frames = _Frames(self)
            try:
                await asyncio.wait_for(
                    self.transport.connect_protocol(self.host, self.port, frames), timeout
                )
            except (OSError, TimeoutError) as e:
                raise ConnectionFailed(
                    f"cannot connect to {self.host}:{self.port}: {e!r}"
                ) from None
            self._frames = frames
            return frames

    def _answer(self, frame: bytes) -> None:
        """An answer arrived (`frame`: from the correlation id on): its caller's future gets
        it decoded (or the decoder's error); an answer nobody waits for any more (its caller
        timed out or was cancelled) is dropped."""
        (correlation,) = _CORRELATION.unpack_from(frame, 0)
        entry = self._waiting.pop(correlation, None)
        if entry is None:
            return
        fut, decode = entry
        if fut.done():
            return
        try:
            response = decode(frame)
        except Exception as e:  # a frame the decoder cannot read: the caller's error
            fut.set_exception(e)
        else:
            fut.set_result(response)

    def _fail(self, exc: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for fut, _ in waiting.values():
            if not fut.done():
                fut.set_exception(exc)
        self.close()

    async def request(self, request: Any, timeout: float, *, answer: bool = True) -> Any:
        """Send `request` (a kafka-python request object); its response (None when `answer`
        is false: acks=0). Raises ConnectionFailed when the connection fails or no answer
        comes within `timeout` (the connection is then closed)."""
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY][request.API_VERSION]

        def encode(correlation: int, client_id: str) -> bytes:
            request.with_header(correlation_id=correlation, client_id=client_id)
            return request.encode(header=True, framed=True)  # type: ignore[no-any-return]

        return await self.call(
            encode, lambda frame: cls.decode(frame, header=True), timeout, answer=answer
        )

    async def call(
        self,
        encode: Callable[[int, str], bytes],
        decode: Callable[[bytes], Any],
        timeout: float,
        *,
        answer: bool = True,
    ) -> Any:
        """`request` with the framed request from `encode(correlation id, client id)` and the
        response from `decode(frame)` (harness/sim/wire.py's hand-written codecs)."""
        frames = await self._connect(timeout)
        self._correlation += 1
        correlation = self._correlation
        data = encode(correlation, self.client_id)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if answer:
            self._waiting[correlation] = (fut, decode)
        try:
            frames.sock.write(data)
            if frames.paused or frames.sock.is_closing():
                await frames.drain()
            if not answer:
                return None
            # the timeout as one timer on the answer's future: asyncio.wait_for would add a
            # waiter future and a callback, an event more per request
            timer = asyncio.get_running_loop().call_later(timeout, _time_out, fut)
            try:
                return await fut
            finally:
                timer.cancel()
        except TimeoutError:
            self._fail(ConnectionFailed(f"{self.host}:{self.port}: request timed out"))
            raise ConnectionFailed(f"{self.host}:{self.port}: request timed out") from None
        except OSError as e:
            self._fail(ConnectionFailed(f"{self.host}:{self.port}: {e!r}"))
            raise ConnectionFailed(f"{self.host}:{self.port}: {e!r}") from None
        finally:
            self._waiting.pop(correlation, None)

    def close(self) -> None:
        frames, self._frames = self._frames, None
        if frames is not None:
            with contextlib.suppress(Exception):
                frames.sock.close()


_SIZE = struct.Struct(">i")
_CORRELATION = _SIZE


class _Frames(asyncio.Protocol):
    """The protocol of one `_Conn`'s connection: cuts size-prefixed frames out of the bytes
    as they arrive and gives each to the connection (`_Conn._answer`); the connection's end
    (EOF, a reset, a timeout) fails what waits on it. Write flow control as asyncio's
    streams: `drain()` waits while the transport has paused writing, and raises once the
    connection is lost."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.sock: Any = None
        self._buf = bytearray()
        self._need = 4  # bytes the buffer needs before the next frame can be cut
        self.paused = False
        self._lost = False
        self._drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.sock = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return
            data = bytes(buf)
            buf.clear()
        n = len(data)
        pos = 0
        conn = self.conn
        while n - pos >= 4:
            (size,) = _SIZE.unpack_from(data, pos)
            end = pos + 4 + size
            if end > n:
                self._need = end - pos
                break
            frame = data[pos + 4 : end]
            pos = end
            if conn._frames is self:
                conn._answer(frame)
        else:
            self._need = 4
        if pos < n:
            buf += data[pos:]

    def eof_received(self) -> bool:
        self._end(asyncio.IncompleteReadError(bytes(self._buf), self._need))
        return True  # (closed by the connection's failure)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._end(exc or asyncio.IncompleteReadError(bytes(self._buf), self._need))

    def _end(self, exc: BaseException) -> None:
        self._lost = True
        self._buf.clear()
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("Connection lost"))
        if self.conn._frames is self:
            self.conn._fail(ConnectionFailed(f"{self.conn.host}:{self.conn.port}: {exc!r}"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        """asyncio's `StreamWriter.drain`: a closing transport lets the loop run once, a lost
        connection raises ConnectionResetError, a paused one waits for `resume_writing`."""
        if self.sock.is_closing():
            await asyncio.sleep(0)
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if self.paused:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain


async def _within(coro: Any, timeout: float) -> tuple[bool, Any]:
    """(True, what `coro` returned) or, when `timeout` passed first (`coro` cancelled),
    (False, None): `asyncio.wait` of one task, run in the caller's task."""
    cm = asyncio.timeout(timeout)
    try:
        async with cm:
            return True, await coro
    except TimeoutError:
        if not cm.expired():
            raise
        return False, None


async def _all_within(coros: list[Any], timeout: float) -> list[asyncio.Task[Any]]:
    """Each of `coros` in a task of its own, until all are done or `timeout` passed: the
    tasks, in order (those not done still running: the caller cancels them). As
    `asyncio.wait(tasks, timeout=timeout)`, but each task, as it ends, counts itself done
    in its own last step: no done callback (a loop event each) per task."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    left = [len(coros)]

    async def run(coro: Any) -> Any:
        try:
            return await coro
        finally:
            left[0] -= 1
            if left[0] == 0 and not waiter.done():
                waiter.set_result(None)

    tasks = [loop.create_task(run(c)) for c in coros]
    timer = loop.call_later(timeout, _release, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
    return tasks


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class _Delivery:
    """What became of one batch: "ok" (offset: the base offset, None when unknown), "fail"
    (definitely not appended) or "info" (unknown), with an error name."""

    __slots__ = ("error", "offset", "outcome")

    def __init__(self, outcome: str, offset: int | None = None, error: str | None = None):
        self.outcome = outcome
        self.offset = offset
        self.error = error


def tally_deliveries(
    mops: list[Any], out: list[Any], by_tp: Mapping[TP, list[int]], deliveries: Mapping[TP, Any]
) -> tuple[str, list[Any]]:
    """A run of sends' completions from each partition's delivery (`by_tp`: the micro-op
    indexes sent to each partition, in order): `out` filled as QueueClient fills it (an
    acknowledged send's offset, the bare value otherwise), and the run's verdict and errors."""
    acked = failed = unknown = 0
    errors: list[Any] = []
    for tp, ns in by_tp.items():
        d = deliveries[tp]
        for x, n in enumerate(ns):
            _, k, v = mops[n]
            if d.outcome == "ok":
                acked += 1
                out[n] = codec.send_result(k, v, None if d.offset is None else d.offset + x)
            else:
                out[n] = codec.send(k, v)
                errors.append(d.error)
                if d.outcome == "fail":
                    failed += 1
                else:
                    unknown += 1
    return send_verdict(acked, failed, unknown), errors


def metadata_request(topics: Sequence[str]) -> Any:
    """Metadata v8 for `topics`, as librdkafka asks it (no auto-creation, no ACL operations)."""
    M = MetadataRequest[8]
    return M(
        topics=[M.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


class SimQueueClient:
    """One process's producer + consumer on the simulated network (see the module doc)."""

    def __init__(
        self,
        test: Mapping[str, Any],
        transport: Transport,
        bootstrap: Sequence[str],
        process: int,
        node: str | None = None,
        port: int = PORT,
        thread: int | None = None,
    ) -> None:
        self.test = test
        self.transport = transport
        self.bootstrap = list(bootstrap)
        self.port = port
        self.process = process
        self.node = node or self.bootstrap[0]
        self.knobs = QueueOptions.from_test(test)
        acks = str(test.get("acks", "all"))
        self.acks = -1 if acks in ("all", "-1") else int(acks)
        idem = test.get("idempotence")
        self.idempotent = bool(self.acks == -1 if idem is None else idem)
        self.op_timeout = self.knobs.op_timeout_ms / 1000
        self.request_timeout = self.knobs.request_timeout_ms / 1000
        self.retries = self.knobs.retries
        self.watermark_p = self.knobs.watermark_p
        self._rng = random.Random(f"{test.get('seed', 0)}/{process}")
        self.broken = False
        self._open = False
        # metadata
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[TP, int] = {}
        # the newest leader epoch seen per partition: metadata naming an older one is stale
        # (a broker cut off from the cluster still answers as the leader it was) and is
        # ignored, as librdkafka >= 2.1 does (KIP-320)
        self._leader_epochs: dict[TP, int] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._conns: dict[str, _Conn] = {}
        # producer
        self._pid = -1
        self._epoch = -1
        self._seq: dict[TP, int] = {}
        # consumer: assigned keys and their next offset to fetch (None: the log start)
        self.assigned: set[str] = set()
        self.positions: dict[str, int | None] = {}
        # transactions and read_committed (harness/sim/txn.py)
        self.txn: Any = None
        self.fetch_hook: Callable[[int, list[str], float], Any] | None = None
        if test.get("txn") or test.get("isolation_level") == "read_committed":
            from isrlab.harness.sim import txn

            txn.attach(self, test, thread)
        # consumer groups (harness/sim/group.py): when a process may subscribe
        self.group: Any = None
        if test.get("group"):
            from isrlab.harness.sim import group

            group.attach(self)

    @classmethod
    def factory(
        cls, test: Mapping[str, Any], net: Any, nodes: Sequence[str], port: int = PORT
    ) -> Callable[[int, int], SimQueueClient]:
        """client_factory(process, thread): thread t bound to nodes[t mod n] (first in its
        bootstrap order), connecting from host "client<t>" of `net` (a SimNetwork)."""
        names = list(nodes)
        if not names:
            raise ValueError("SimQueueClient.factory needs at least one node")

        def make(process: int, thread: int) -> SimQueueClient:
            i = thread % len(names)
            order = names[i:] + names[:i]
            return cls(
                test,
                net.host(f"client{thread}"),
                order,
                process,
                node=names[i],
                port=port,
                thread=thread,
            )

        return make

    # ----- lifecycle ----------------------------------------------------------------------

    async def open(self) -> SimQueueClient:
        if self.idempotent and self.acks != -1:
            raise ClientError(
                "idempotence needs acks=all (librdkafka refuses enable.idempotence with "
                f"acks={self.acks})"
            )
        if self.txn is not None:
            await self.txn.init_transactions()
        self._open = True
        return self

    async def close(self) -> None:
        self._open = False
        if self.group is not None:
            self.group.drop()  # no LeaveGroup: the member times out, as QueueClient's
        conns, self._conns = self._conns, {}
        for c in conns.values():
            c.close()
        self.assigned = set()
        self.positions = {}

    # ----- connections and metadata -------------------------------------------------------

    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def _conn(self, host: str, port: int) -> _Conn:
        key = f"{host}:{port}"
        c = self._conns.get(key)
        if c is None:
            c = self._conns[key] = _Conn(self.transport, host, port, f"isrlab-sim-{self.process}")
        return c

    def _broker_conn(self, broker_id: int) -> _Conn | None:
        addr = self._brokers.get(broker_id)
        return None if addr is None else self._conn(*addr)

    def _forget(self, tp: TP) -> None:
        self._leaders.pop(tp, None)

    async def _refresh(self, deadline: float) -> None:
        """One Metadata request at a time; callers meanwhile wait for its answer."""
        if self._refreshing is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._refreshing), self._left(deadline))
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refreshing = fut
        try:
            await self._refresh_once(deadline)
        finally:
            self._refreshing = None
            fut.set_result(None)

    def _hosts(self) -> list[tuple[str, int]]:
        """Whom to ask, in order: the bootstrap servers, then each broker the metadata named."""
        hosts = [(h, self.port) for h in self.bootstrap]
        for b in sorted(self._brokers):
            if self._brokers[b] not in hosts:
                hosts.append(self._brokers[b])
        return hosts

    async def find_coordinator(
        self, req: Any, deadline: float, known: Callable[[], bool]
    ) -> Any | None:
        """Ask the brokers (`_hosts`) one after another with `req`, a FindCoordinator request,
        until one answers; an error answer (no coordinator yet) is waited out for
        `COORD_RETRY_S` and asked again. The answer without error; None when `known()` became
        true meanwhile (another task found the coordinator) or nobody answered before
        `deadline`."""
        while not known():
            if self._left(deadline) <= 0:
                return None
            for host, port in self._hosts():
                left = min(self.request_timeout, self._left(deadline))
                if left <= 0:
                    return None
                try:
                    resp = await self._conn(host, port).request(req, left)
                except ConnectionFailed:
                    continue
                if resp.error_code == 0:
                    return resp
                break  # an answer: an error to wait out
            await asyncio.sleep(min(COORD_RETRY_S, self._left(deadline)))
        return None

    async def _refresh_once(self, deadline: float) -> None:
        topics = sorted({parse_key(k)[0] for k in self.test.get("keys") or ()})
        for host, port in self._hosts():
            left = min(self.request_timeout, self._left(deadline))
            if left <= 0:
                return
            req = metadata_request(topics)
            try:
                resp = await self._conn(host, port).request(req, left)
            except ConnectionFailed as e:
                log.debug("process %s: metadata from %s: %s", self.process, host, e)
                continue
            self._brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
            for t in resp.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition_index)
                    if p.leader_epoch < self._leader_epochs.get(tp, -1):
                        continue  # stale: keep what a newer epoch said
                    if t.error_code == 0 and p.error_code == 0 and p.leader_id >= 0:
                        self._leaders[tp] = p.leader_id
                        self._leader_epochs[tp] = p.leader_epoch
                    else:
                        self._leaders.pop(tp, None)
            return

    async def _leader(self, tp: TP, deadline: float) -> int | None:
        """The cached leader of `tp` (looked up when unknown), None if none is known."""
        leader = self._leaders.get(tp)
        if leader is None or leader not in self._brokers:
            await self._refresh(deadline)
            leader = self._leaders.get(tp)
        return leader if leader is not None and leader in self._brokers else None

    def _left(self, deadline: float) -> float:
        """Virtual seconds left until `deadline`; 0 once less than MIN_WAIT_S is."""
        left = deadline - self._loop_time()
        return left if left >= MIN_WAIT_S else 0.0

    async def _backoff(self, deadline: float) -> None:
        await asyncio.sleep(min(RETRY_BACKOFF_S, self._left(deadline)))

    # ----- ops ----------------------------------------------------------------------------

    async def invoke(self, op: Mapping[str, Any]) -> Op:
        """Perform `op` (an invoke: f, value, optional `_` hints); return its completion."""
        f = op["f"]
        base: Op = {k: v for k, v in op.items() if not k.startswith("_")}
        base["node"] = self.node
        done = await self._invoke(f, op, base)
        if self.group is not None:
            done = self.group.with_rebalance(done)
        return done

    async def _invoke(self, f: str, op: Mapping[str, Any], base: Op) -> Op:
        if f == "crash":
            await self.close()
            return {**base, "type": "info", "value": None}
        if not self._open:
            return {**base, "type": "fail", "error": "client-not-open"}
        if f == "assign":
            return await self._assign(base, op.get("_seek") == "beginning")
        if f in ("subscribe", "commit"):
            if self.group is None:
                return {**base, "type": "fail", "error": UNSUPPORTED}
            if f == "subscribe":
                return await self.group.subscribe(base)  # type: ignore[no-any-return]
            return await self.group.commit(base)  # type: ignore[no-any-return]
        if f in codec.DATA_FS:
            poll_s = float(op.get("_poll_ms", self.knobs.poll_ms)) / 1000
            if self.txn is not None:
                return await self.txn.transact(base, poll_s)  # type: ignore[no-any-return]
            return await self._transact(base, poll_s)
        return {**base, "type": "fail", "error": f"unknown-f:{f}"}

    async def _assign(self, op: Op, from_beginning: bool) -> Op:
        try:
            wanted = set(op["value"])
            for k in wanted:
                parse_key(k)
        except (TypeError, ValueError) as e:
            return {**op, "type": "fail", "error": ["bad-keys", str(e)]}
        keep = set() if from_beginning else self.assigned & wanted
        if self.group is not None and self.group.subscribed:
            # QueueClient drops the member (its keys revoked) and assigns on a new consumer:
            # kept keys resume where this process's reads reached, else at the group's
            # committed offset (looked up before they are fetched if still unknown)
            stored = keep & self.group.stored
            self.group.drop()
            self.group.stored = stored
        for k in sorted(self.assigned - keep):
            self.positions.pop(k, None)
        for k in sorted(wanted - keep):
            self.positions[k] = None  # OFFSET_BEGINNING
        self.assigned = set(wanted)
        return {**op, "type": "ok"}

    async def _transact(self, op: Op, poll_s: float) -> Op:
        mops: list[Any] = list(op["value"] or [])
        out: list[Any] = [list(m) for m in mops]
        first_read: dict[str, int] = {}
        verdict: str | None = None
        errors: list[Any] = []
        has_send = any(m and m[0] == codec.SEND for m in mops)
        deadline = self._loop_time() + self.op_timeout
        try:
            i = 0
            while i < len(mops):
                if mops[i][0] == codec.SEND:
                    j = i
                    while j < len(mops) and mops[j][0] == codec.SEND:
                        j += 1
                    v, errs = await self._send_run(mops, out, i, j, deadline)
                    verdict = _worse(verdict, v)
                    errors += errs
                    i = j
                elif mops[i][0] == codec.POLL:
                    out[i] = codec.poll_result(await self._poll(poll_s, first_read))
                    i += 1
                else:
                    raise ValueError(f"unknown micro-op {mops[i]!r}")
        except (ValueError, TypeError, IndexError) as e:
            errors.append(["bad-op", str(e)])
            verdict = _worse(verdict, "info" if has_send else "fail")
        return await self._complete(op, verdict or "ok", out, errors, first_read, deadline)

    async def _complete(
        self,
        op: Op,
        verdict: str,
        out: list[Any],
        errors: list[Any],
        first_read: dict[str, int],
        deadline: float,
        transactional_id: str = "",
    ) -> Op:
        """A data op's completion as QueueClient shapes it: positions rewound to the first
        offset read unless ok, the error(s), sampled watermarks on ok, the producer on sends."""
        mops: list[Any] = list(op["value"] or [])
        if verdict != "ok":
            for k, off in first_read.items():
                if k in self.assigned:
                    self.positions[k] = off
        result: Op = {**op, "type": verdict, "value": out}
        if errors:
            result["error"] = errors[0] if len(errors) == 1 else errors
        if verdict == "ok" and self.watermark_p > 0 and self._rng.random() < self.watermark_p:
            result.update(await self._watermarks(touched_keys(mops, out), deadline))
        if any(m and m[0] == codec.SEND for m in mops):
            result["producer"] = {
                "id": self._pid,
                "epoch": self._epoch,
                "idempotent": self.idempotent or bool(transactional_id),
                "transactional_id": transactional_id,
            }
        return result

    # -- producer

    async def _send_run(
        self, mops: list[Any], out: list[Any], i: int, j: int, deadline: float
    ) -> tuple[str, list[Any]]:
        by_tp: dict[TP, list[int]] = {}
        for n in range(i, j):
            by_tp.setdefault(parse_key(mops[n][1]), []).append(n)
        timeout = self._left(deadline) + 0.001
        deliveries: dict[TP, _Delivery] = {}
        if len(by_tp) == 1:  # one partition: in this task (no task, no wait's callbacks)
            ((tp, ns),) = by_tp.items()
            values = [str(mops[n][2]).encode() for n in ns]
            delivered, got = await _within(self._deliver(tp, values, deadline), timeout)
            deliveries[tp] = got if delivered else _Delivery("info", error="timeout")
        else:
            coros = [
                self._deliver(tp, [str(mops[n][2]).encode() for n in ns], deadline)
                for tp, ns in by_tp.items()
            ]
            tasks = dict(zip(by_tp, await _all_within(coros, timeout), strict=True))
            for tp, task in tasks.items():
                if task.done():
                    deliveries[tp] = task.result()
                else:
                    task.cancel()
                    deliveries[tp] = _Delivery("info", error="timeout")
        return tally_deliveries(mops, out, by_tp, deliveries)

    async def _init_pid(self, deadline: float) -> bool:
        """An idempotent producer's id (InitProducerId to any broker); False at the deadline."""
        while self._pid < 0:
            if self._left(deadline) <= 0:
                return False
            hosts = [self._brokers[b] for b in sorted(self._brokers)] or [
                (h, self.port) for h in self.bootstrap
            ]
            for host, port in hosts:
                left = min(self.request_timeout, self._left(deadline))
                if left <= 0:
                    return False
                req = InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60000)
                try:
                    resp = await self._conn(host, port).request(req, left)
                except ConnectionFailed:
                    continue
                if resp.error_code == 0:
                    self._pid, self._epoch = resp.producer_id, resp.producer_epoch
                    self._seq = {}
                    return True
            await self._backoff(deadline)
        return True

    async def _deliver(self, tp: TP, values: list[bytes], deadline: float) -> _Delivery:
        """Produce one batch to `tp`'s leader, retried until acknowledged, a non-retriable
        error, `retries` or the deadline (see the module doc)."""
        pid = epoch = seq = -1
        if self.idempotent:
            if not await self._init_pid(deadline):
                # nothing was sent: librdkafka times the message out in its queue
                return _Delivery("info", error="msg-timed-out")
            pid, epoch = self._pid, self._epoch
            seq = self._seq.get(tp, 0)
            self._seq[tp] = seq + len(values)
        ts = int((EPOCH + self._loop_time()) * 1000)
        records = wire.encode_batch(values, ts, pid, epoch, seq)
        d = await self._retry(tp, records, deadline)
        if self.idempotent and d.outcome != "ok" and self._pid == pid:
            # librdkafka: after a batch that may or may not be in the log, a fresh producer id
            # (its sequence numbers would otherwise be out of order from now on)
            self._pid = self._epoch = -1
        return d

    async def _retry(self, tp: TP, records: bytes, deadline: float) -> _Delivery:
        attempts = 0
        while True:
            if self._left(deadline) <= 0:
                return _Delivery("info", error="msg-timed-out")
            leader = await self._leader(tp, deadline)
            conn = None if leader is None else self._broker_conn(leader)
            if conn is None:
                await self._backoff(deadline)
                continue
            left = min(self.request_timeout, self._left(deadline))
            try:
                resp = await conn.call(
                    functools.partial(
                        _produce, self.acks, self.knobs.request_timeout_ms, tp, records
                    ),
                    wire.decode_produce_response,
                    max(0.001, left),
                    answer=self.acks != 0,
                )
            except ConnectionFailed as e:
                log.debug("process %s: produce %s: %s", self.process, tp, e)
                self._forget(tp)
                attempts += 1
                if self.retries is not None and attempts > self.retries:
                    return _Delivery("info", error="transport")
                await self._backoff(deadline)
                continue
            if resp is None:  # acks=0: written, nothing comes back
                return _Delivery("ok")
            p = resp[0]
            err = p.error_code
            if err == 0:
                return _Delivery("ok", p.base_offset if p.base_offset >= 0 else None)
            if err == E.DUPLICATE_SEQUENCE_NUMBER:
                return _Delivery("ok")
            if err in _BREAKING:
                self.broken = True
            if err in _RETRIABLE:
                if err in _REFRESH:
                    self._forget(tp)
                attempts += 1
                if self.retries is None or attempts <= self.retries:
                    await self._backoff(deadline)
                    continue
            outcome = "fail" if err in _DEFINITE else "info"
            return _Delivery(outcome, error=_error_name(err))

    # -- consumer

    async def _list_offsets(
        self, keys: Sequence[str], timestamp: int, deadline: float
    ) -> dict[str, int]:
        """Per key, ListOffsets of `timestamp` (-2 earliest, -1 latest: the high watermark)
        asked of its leader; keys that fail are left out."""
        by_leader: dict[int, list[TP]] = {}
        for k in keys:
            tp = parse_key(k)
            leader = await self._leader(tp, deadline)
            if leader is not None:
                by_leader.setdefault(leader, []).append(tp)
        out: dict[str, int] = {}
        for leader, tps in sorted(by_leader.items()):
            conn = self._broker_conn(leader)
            left = min(self.request_timeout, self._left(deadline))
            if conn is None or left <= 0:
                continue
            topics: dict[str, list[int]] = {}
            for t, p in tps:
                topics.setdefault(t, []).append(p)
            try:
                parts = await conn.call(
                    functools.partial(_list_offsets, timestamp, sorted(topics.items())),
                    wire.decode_list_offsets_response,
                    left,
                )
            except ConnectionFailed:
                for tp in tps:
                    self._forget(tp)
                continue
            for part in parts:
                if part.error_code == 0 and part.offset >= 0:
                    out[f"{part.topic}/{part.partition}"] = part.offset
                elif part.error_code in _REFRESH:
                    self._forget((part.topic, part.partition))
        return out

    async def _watermarks(self, keys: list[str], deadline: float) -> Op:
        if not keys:
            return {}
        deadline = max(deadline, self._loop_time() + self.request_timeout)
        low = await self._list_offsets(keys, -2, deadline)
        high = await self._list_offsets(keys, -1, deadline)
        out = {k: {"low": low[k], "high": high[k]} for k in keys if k in low and k in high}
        return {"watermarks": out} if out else {}

    async def _poll(self, timeout: float, first_read: dict[str, int]) -> dict[str, list[list[Any]]]:
        """Fetch until records arrive or `timeout` has passed: a poll that returns nothing has
        taken its timeout of virtual time (librdkafka's poll blocks for its timeout, with or
        without an assignment), so a generator that polls again at once cannot spin at one
        virtual instant."""
        read: dict[str, list[list[Any]]] = {}
        deadline = self._loop_time() + timeout
        stored: set[str] = set()  # keys waiting for their group's committed offset
        if self.group is not None:
            # a member's rebalances are taken during polls, as librdkafka's callbacks
            await self.group.serve(deadline)
            while not self.assigned and self.group.subscribed and self._left(deadline) > 0:
                await self.group.wait(self._left(deadline))
                await self.group.serve(deadline)
            stored = self.group.stored
        if not self.assigned:
            await asyncio.sleep(self._left(deadline))
            return read
        while True:
            if self.group is not None:
                await self.group.serve(deadline)
                stored = self.group.stored
            unset = sorted(
                k for k in self.assigned if self.positions.get(k) is None and k not in stored
            )
            if unset:
                for k, off in (await self._list_offsets(unset, -2, deadline)).items():
                    self.positions[k] = off
            by_leader: dict[int, list[str]] = {}
            for k in sorted(self.assigned):
                if self.positions.get(k) is None:
                    continue
                leader = await self._leader(parse_key(k), deadline)
                if leader is not None:
                    by_leader.setdefault(leader, []).append(k)
            left = self._left(deadline)
            if len(by_leader) == 1 and left > 0:  # one leader: in this task
                ((leader, ks),) = by_leader.items()
                fetched, got = await _within(self._fetch(leader, ks, left), left)
                for k, pairs in (got if fetched else {}).items():
                    read.setdefault(k, []).extend(pairs)
                    if pairs and k not in first_read:
                        first_read[k] = pairs[0][0]
            elif by_leader and left > 0:
                tasks = await _all_within(
                    [self._fetch(leader, ks, left) for leader, ks in sorted(by_leader.items())],
                    left,
                )
                done = [task for task in tasks if task.done()]
                for task in tasks:
                    if not task.done():
                        task.cancel()
                # (in leader order: the completion lists keys as the fetches were made)
                for task in tasks:
                    if task in done:
                        for k, pairs in task.result().items():
                            read.setdefault(k, []).extend(pairs)
                            if pairs and k not in first_read:
                                first_read[k] = pairs[0][0]
            if read or self._left(deadline) <= 0:
                if self.group is not None:
                    self.group.note_read(read)
                return read
            if not by_leader:
                await self._backoff(deadline)

    async def _fetch(self, leader: int, keys: list[str], left: float) -> dict[str, list[list[Any]]]:
        if self.fetch_hook is not None:
            return await self.fetch_hook(leader, keys, left)  # type: ignore[no-any-return]
        conn = self._broker_conn(leader)
        if conn is None:
            return {}
        max_wait = min(self.knobs.fetch_wait_max_ms, max(0, int(left * 1000)))
        topics: dict[str, list[tuple[int, int, int]]] = {}
        for k in keys:
            t, p = parse_key(k)
            position = self.positions[k]
            assert position is not None
            topics.setdefault(t, []).append((p, position, 1 << 20))
        encode = functools.partial(
            _fetch_request, max_wait, 1, 1 << 20, sorted(topics.items(), key=lambda t: t[0])
        )
        timeout = max_wait / 1000 + self.request_timeout
        try:
            _, parts = await conn.call(encode, wire.decode_fetch_response, timeout)
        except ConnectionFailed:
            for k in keys:
                self._forget(parse_key(k))
            return {}
        out: dict[str, list[list[Any]]] = {}
        for p in parts:
            k = f"{p.topic}/{p.partition}"
            if k not in self.assigned or self.positions.get(k) is None:
                continue  # unassigned meanwhile
            if p.error_code == E.OFFSET_OUT_OF_RANGE:
                self.positions[k] = None  # auto.offset.reset=earliest
                continue
            if p.error_code != 0:
                if p.error_code in _REFRESH:
                    self._forget((p.topic, p.partition))
                continue
            pos = self.positions[k]
            assert pos is not None
            pairs = [[o, v] for o, v in _records(p.records) if o >= pos]
            if pairs:
                out[k] = pairs
                self.positions[k] = pairs[-1][0] + 1
        return out


def _produce(
    acks: int, timeout_ms: int, tp: TP, records: bytes, correlation: int, client_id: str
) -> bytes:
    return wire.encode_produce_request(
        correlation, client_id, acks, timeout_ms, tp[0], tp[1], records
    )


def _list_offsets(
    timestamp: int, topics: list[tuple[str, list[int]]], correlation: int, client_id: str
) -> bytes:
    return wire.encode_list_offsets_request(correlation, client_id, timestamp, topics)


def _fetch_request(
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
    correlation: int,
    client_id: str,
) -> bytes:
    return wire.encode_fetch_request(
        correlation, client_id, max_wait_ms, min_bytes, max_bytes, topics
    )


def _records(data: bytes) -> list[tuple[int, Any]]:
    """(offset, value) of the data records in a fetch's record bytes (whole batches only,
    control batches skipped); a value that is not an int is kept as its text."""
    return [(o, _decode_value(v)) for o, v in wire.decode_records(data)]
