"""What the coordinators' asyncio shells share (group and transaction coordinator).

A coordinator is a sans-IO core (requests in, effects out, time only through `tick`) and a shell
that carries out its effects. Both shells
- turn a request into a `ref` with a future, which the core answers with a `Reply(ref, ...)`
  effect (at once or later) — `call`;
- wake the core at its next deadline (at most every `TICK_MS`) — the timer loop;
- read a partition of their internal topic from its log start to its log end when this broker
  becomes its leader, to load the core's state — `read_batches`;
- create their internal topic on the first FindCoordinator, as Kafka does — `ensure_topic`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from isrlab.broker import clock
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.record_batch import BatchHeader, iter_batches

if TYPE_CHECKING:
    from isrlab.broker.partition import HostedPartition
    from isrlab.broker.server import KafkaServer

log = logging.getLogger(__name__)

#: the append errors of a record too large for its partition
_TOO_LARGE = frozenset(
    {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE}
)

#: bytes read per step while loading a partition
LOAD_READ_BYTES = 1 << 20
#: the timer's resolution: deadlines of the cores (heartbeat expiry, rebalance and transaction
#: timeouts) are noticed within this long (Kafka's purgatories tick at a similar grain)
TICK_MS = 100


def now_ms() -> int:
    return clock.now_ms()


class Core(Protocol):
    """What the shell needs of a coordinator core."""

    #: internal-topic partitions this broker leads and has loaded / is loading -> leader epoch
    owned: dict[int, int]
    loading: dict[int, int]

    def next_deadline(self) -> int | None: ...

    def tick(self, now: int) -> list[Any]: ...

    def begin_load(self, partition: int, epoch: int) -> list[Any]: ...

    def unload(self, partition: int) -> list[Any]: ...


class CoordinatorShell:
    #: the internal topic whose partitions this coordinator leads
    topic: str = ""

    def __init__(self, server: KafkaServer, core: Core, name: str):
        self.server = server
        self._core = core
        self.name = name
        self._refs = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._timer: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._create_lock = asyncio.Lock()

    def append_refused(self, partition: int, size: int, error: ErrorCode) -> None:
        """Log an append to the internal topic refused for its size, as Kafka does (at ERROR:
        the clients only see UNKNOWN_SERVER_ERROR, and a group or transaction whose record
        never fits is stuck for good): the record outgrew the partition's segment.bytes or
        max.message.bytes (``offsets.topic.segment.bytes``, ``transaction.state.log.segment.bytes``,
        ``message.max.bytes``)."""
        if error not in _TOO_LARGE:
            return
        log.error(
            "%s: appending %d bytes to %s-%d failed with %s: the record is larger than the "
            "topic's segment.bytes or max.message.bytes; the clients get UNKNOWN_SERVER_ERROR "
            "until the broker's limits for %s are raised",
            self.name,
            size,
            self.topic,
            partition,
            error.name,
            self.topic,
        )

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        # the first deadline is read in the next turn of the loop (as a task's first step)
        self._timer = asyncio.get_running_loop().call_soon(self._set_timer)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "stopping"))
        self._waiting.clear()

    def _set_timer(self) -> None:
        """Requests do not wake the timer (a scan of the core's state per request would cost
        the event loop dearly): it is set for the core's next deadline, at most TICK_MS away
        (a timer's callback, not a sleeping task: one loop callback per tick, not two)."""
        deadline = self._core.next_deadline()
        wait = TICK_MS / 1000 if deadline is None else (deadline - now_ms()) / 1000
        wait = min(max(wait, 0.0), TICK_MS / 1000)
        loop = asyncio.get_running_loop()
        # (a deadline already due: the next turn of the loop, as asyncio.sleep(0) would)
        self._timer = loop.call_later(wait, self._tick) if wait > 0 else loop.call_soon(self._tick)

    def _tick(self) -> None:
        try:
            self._run(self._core.tick(now_ms()))
        except Exception:  # pragma: no cover - a bug; the coordinator keeps serving
            log.exception("%s tick failed", self.name)
        self._set_timer()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- requests --------------------------------------------------------------------------

    def _run(self, effects: list[Any]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _resolve(self, ref: Any, result: Any) -> None:
        fut = self._waiting.pop(ref, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    async def call(self, method: Callable[..., list[Any]], *args: Any) -> Any:
        """Ask the core; wait for its answer to this request (now or later)."""
        ref = next(self._refs)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ref] = fut
        try:
            self._run(method(now_ms(), ref, *args))
            return await fut
        finally:
            self._waiting.pop(ref, None)

    # ----- leadership of the internal topic's partitions ------------------------------------

    def on_role_change(self, hp: HostedPartition) -> None:
        """A replica of the internal topic became leader (load it) or follower (unload)."""
        if hp.tp[0] != self.topic:
            return
        p = hp.tp[1]
        core = self._core
        if hp.is_leader:
            epoch = hp.leader_epoch
            if core.owned.get(p) == epoch or core.loading.get(p) == epoch:
                return
            self._run(core.begin_load(p, epoch))
            self._spawn(self._load(hp, p, epoch))
        elif p in core.owned or p in core.loading:
            log.info("%s: unloading %s-%d (no longer leader)", self.name, self.topic, p)
            self._run(core.unload(p))

    def on_partition_removed(self, tp: tuple[str, int]) -> None:
        if tp[0] == self.topic:
            self._run(self._core.unload(tp[1]))

    async def _load(self, hp: HostedPartition, p: int, epoch: int) -> None:  # pragma: no cover
        raise NotImplementedError

    # ----- the internal topic ----------------------------------------------------------------

    async def read_batches(self, hp: HostedPartition) -> AsyncIterator[tuple[BatchHeader, bytes]]:
        """Every batch of the partition from its log start to its log end (as Kafka loads a
        coordinator partition: what a leader holds past the high watermark is replicated before
        anything written after it can be acknowledged). Yields to the event loop between reads."""
        lg = hp.log
        offset = lg.log_start_offset
        end = lg.log_end_offset
        while offset < end:
            data = lg.read(offset, LOAD_READ_BYTES, max_offset=end).read_bytes()
            if not data:
                break
            nxt = offset
            for header in iter_batches(data):
                nxt = header.next_offset
                yield header, data[header.position : header.end_position]
            if nxt <= offset:
                break
            offset = nxt
            await asyncio.sleep(0)  # a big partition must not stall the broker

    async def ensure_topic(
        self, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> ErrorCode:
        """Create the internal topic if it does not exist yet. NONE once it exists;
        COORDINATOR_NOT_AVAILABLE meanwhile. The replication factor is capped at the live
        brokers, as a one-broker test cluster must still get a coordinator."""
        if self.topic in self.server.topics_snapshot():
            return ErrorCode.NONE
        async with self._create_lock:
            if self.topic in self.server.topics_snapshot():
                return ErrorCode.NONE
            rf = max(min(replication_factor, len(self.server.live_brokers())), 1)
            try:
                await self.server.create_topic(self.topic, partitions, rf, None, configs)
            except KafkaError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("could not create %s: %s", self.topic, e)
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    def coordinator_address(self, partition: int) -> tuple[int, str, int] | None:
        return coordinator_address(self.server, self.topic, partition)


def coordinator_address(
    server: KafkaServer, topic: str, partition: int, listener: str | None = None
) -> tuple[int, str, int] | None:
    """(broker id, host, port) of the leader of an internal topic's partition on `listener`
    (a client's: the one it connected to; default the inter-broker one), None if it has no
    live leader."""
    leader = server.partition_metadata((topic, partition)).leader
    address = server.live_brokers(listener).get(leader) if leader >= 0 else None
    if address is None:
        return None
    return leader, address[0], address[1]
