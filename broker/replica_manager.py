"""The partitions this broker hosts and the IO their replication cores ask for (Kafka's
ReplicaManager and ReplicaFetcherManager).

- hosts `HostedPartition`s and applies partition states to them;
- ticks every core on a timer (ISR shrink, acks=all timeouts, follower re-sends);
- runs the follower side: the SendFetch actions of every partition that follows one leader
  broker go out together, one Fetch request at a time per leader over one connection (Kafka's
  ReplicaFetcherThread: a partition that asks while its leader's fetch is in flight goes in the
  next one), and each partition's part of the response is fed back to its core; each
  SendOffsetsForLeaderEpoch is a request of its own;
- writes partition state (ISR changes) through a `StateStore`: ZooKeeper compare-and-set in a
  cluster, an in-memory register for a standalone broker;
- checkpoints high watermarks to `replication-offset-checkpoint` (what a restarted replica starts
  from, and what the pre-KIP-101 truncation mode truncates to);
- wakes long-polling fetches when data or a high watermark moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kafka.protocol.consumer import ListOffsetsRequest, OffsetForLeaderEpochRequest

from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log.log import Log
from isrlab.broker.log.recovery import LogDirFailure
from isrlab.broker.network.client import ConnectionFailed, KafkaConnection
from isrlab.broker.network.replica_fetch import (
    FetchPart,
    MalformedResponse,
    decode_fetch_response,
    encode_fetch_request,
)
from isrlab.broker.network.transport import Transport
from isrlab.broker.partition import AppendResult, HostedPartition, ReadResult
from isrlab.broker.replication import (
    LeaderAndIsr,
    ReplicationConfig,
    SendFetch,
    SendOffsetsForLeaderEpoch,
    WriteStateZnode,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 4
#: how often every partition ticks (seconds)
TICK_S = 0.05


class FetchInterest(NamedTuple):
    """What a fetch waiting for data asks of one partition (the arguments of the core's
    `fetch_has_answer`)."""

    replica_id: int
    fetch_offset: int
    current_leader_epoch: int
    read_committed: bool


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class DataNotifier:
    """Wakes fetches waiting for data (long polls) when one of their partitions can answer.

    A waiter registers a future under each partition it reads, with its `FetchInterest`
    there. `notify(tp, has_answer)` wakes the waiters of that partition only (an append to one
    partition must not wake every parked fetch of the broker), and of those only the ones for
    which ``has_answer(interest)`` holds: the replica's core would answer their fetch of that
    partition with records or an error (Kafka's DelayedFetch completes on its accumulated
    bytes, not on every append). So an append does not wake the consumers waiting at the high
    watermark, nor a high-watermark move the followers waiting at the log end. Without
    ``has_answer``, or for a waiter registered without interests, every waiter of the
    partition wakes; `notify()` with no partition wakes everyone (shutdown).
    """

    def __init__(self) -> None:
        self._waiters: dict[Any, dict[asyncio.Future[None], list[FetchInterest] | None]] = {}

    def notify(
        self, tp: Any = None, has_answer: Callable[[FetchInterest], bool] | None = None
    ) -> None:
        if tp is None:
            for every in self._waiters.values():
                for waiter in every:
                    _wake(waiter)
            return
        waiters = self._waiters.get(tp)
        if not waiters:
            return
        for waiter, interests in waiters.items():
            if waiter.done():
                continue
            if has_answer is None or interests is None or any(map(has_answer, interests)):
                waiter.set_result(None)

    async def wait(
        self,
        tps: Iterable[Any],
        timeout: float,
        interests: Iterable[FetchInterest | None] | None = None,
    ) -> None:
        """Until a partition of ``tps`` is notified (with ``interests``, parallel to ``tps``:
        until one can answer its interest) or ``timeout`` seconds passed."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        keys = list(tps)
        wanted = list(interests) if interests is not None else [None] * len(keys)
        for tp, interest in zip(keys, wanted, strict=True):
            waiters = self._waiters.get(tp)
            if waiters is None:
                waiters = self._waiters[tp] = {}
            if waiter not in waiters:
                waiters[waiter] = None if interest is None else [interest]
            elif interest is None:  # the same partition twice in one wait
                waiters[waiter] = None
            else:
                listed = waiters[waiter]
                if listed is not None:
                    listed.append(interest)
        timer = loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            for tp in keys:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.pop(waiter, None)
                    if not waiters:
                        del self._waiters[tp]


class StateStore(Protocol):
    async def write_state(self, action: WriteStateZnode) -> tuple[bool, int]:
        """Conditional write; returns (succeeded, new znode version)."""
        ...


class LocalStateStore:
    """Standalone broker: the partition states live in memory, with versions like znodes."""

    def __init__(self) -> None:
        self.versions: dict[Any, int] = {}

    async def write_state(self, action: WriteStateZnode) -> tuple[bool, int]:
        current = self.versions.get(action.tp, 0)
        if action.expected_version is not None and action.expected_version != current:
            return False, current
        self.versions[action.tp] = current + 1
        return True, current + 1


class ReplicaManager:
    HW_CHECKPOINT = "replication-offset-checkpoint"

    def __init__(
        self,
        broker_id: int,
        log_dir: Path,
        replication: Callable[[str], ReplicationConfig],
        broker_address: Callable[[int], tuple[str, int] | None],
        state_store: StateStore,
        hw_checkpoint_interval_ms: int = 5000,
        transport: Transport | None = None,
    ):
        self.broker_id = broker_id
        self.transport = transport  # the fetchers' connections: None, the sockets
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.notifier = DataNotifier()
        self.replication = replication
        self.broker_address = broker_address
        self.state_store = state_store
        self.hw_checkpoint_interval_ms = hw_checkpoint_interval_ms
        self._hw_cp = OffsetCheckpointFile(log_dir / self.HW_CHECKPOINT)
        try:
            self._hw_start = dict(self._hw_cp.read())
        except FileNotFoundError:
            self._hw_start = {}
        except KafkaStorageError as e:
            # Kafka: reading the high-watermark checkpoint raises KafkaStorageException, the
            # log dir goes offline (with its only log dir, the broker does not run)
            raise LogDirFailure(
                f"the log dir goes offline, as in Kafka: {e} (the high watermarks are learned "
                "again from the leaders)"
            ) from e
        self._connections: dict[tuple[int, TopicPartition | None], KafkaConnection] = {}
        #: per leader broker: the fetches waiting for its next batched Fetch, and whether a
        #: fetcher task is sending them
        self._fetch_queue: dict[int, dict[TopicPartition, tuple[HostedPartition, SendFetch]]] = {}
        self._fetching: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._tick_timer: asyncio.TimerHandle | None = None
        self.stopping = False
        self.stop_failures = 0  # what `stop` could not write (logged)
        #: told when a hosted replica becomes leader or stops leading (the group coordinator
        #: loads and unloads its __consumer_offsets partitions), and when one is removed
        self.role_listeners: list[Callable[[HostedPartition], None]] = []
        self.removal_listeners: list[Callable[[TopicPartition], None]] = []

    # ----- hosting --------------------------------------------------------------------------

    def add(self, tp: TopicPartition, log_: Log, config: dict[str, Any]) -> HostedPartition:
        hp = self.partitions.get(tp)
        if hp is None:
            hp = HostedPartition(
                tp,
                log_,
                self.broker_id,
                config,
                self.replication(tp[0]),
                self,
                hw_checkpoint=self._hw_start.get(tp, 0),
            )
            self.partitions[tp] = hp
        return hp

    def remove(self, tp: TopicPartition) -> None:
        hp = self.partitions.pop(tp, None)
        if hp is not None:
            hp.fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            for listener in self.removal_listeners:
                listener(tp)
        for key in [k for k in self._connections if k[1] == tp]:
            self._connections.pop(key).close()
        self.notifier.notify(tp)

    def get(self, tp: TopicPartition) -> HostedPartition:
        hp = self.partitions.get(tp)
        if hp is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return hp

    def become(self, tp: TopicPartition, state: LeaderAndIsr, replicas: list[int]) -> None:
        hp = self.partitions.get(tp)
        if hp is not None:
            hp.become(state, replicas)

    # ----- produce / fetch ------------------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        records: memoryview,
        acks: int,
        timeout_ms: int,
        *,
        origin: str = "client",
    ) -> AppendResult | asyncio.Future[AppendResult]:
        """Append to a partition led here. ``origin`` "client": a Produce request (producer
        sequences checked, control batches refused with INVALID_RECORD); "coordinator": the
        broker's own coordinators (transaction markers, transactional offset commits)."""
        hp = self.partitions.get(tp)
        if hp is None:
            return AppendResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return hp.append(records, acks, timeout_ms, origin=origin)

    def read(self, tp: TopicPartition, fetch_offset: int, max_bytes: int, **kw: Any) -> ReadResult:
        hp = self.partitions.get(tp)
        if hp is None:
            return ReadResult(error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return hp.read(fetch_offset, max_bytes, **kw)

    def fetch_has_answer(self, tp: TopicPartition, interest: FetchInterest) -> bool:
        """Whether a fetch of ``tp`` would now get records or an error (a partition not
        hosted here: UNKNOWN_TOPIC_OR_PARTITION, an answer)."""
        hp = self.partitions.get(tp)
        return hp is None or hp.fetch_has_answer(interest)

    # ----- PartitionIO ----------------------------------------------------------------------

    def data_changed(self, partition: HostedPartition) -> None:
        self.notifier.notify(partition.tp, partition.fetch_has_answer)

    def role_changed(self, partition: HostedPartition) -> None:
        for listener in self.role_listeners:
            listener(partition)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _connection(self, leader: int, tp: TopicPartition | None) -> KafkaConnection | None:
        """The connection to ``leader`` for one partition's requests, or (``tp`` None) the one
        its batched fetches share."""
        key = (leader, tp)
        conn = self._connections.get(key)
        if conn is None:
            addr = self.broker_address(leader)
            if addr is None:
                return None
            conn = KafkaConnection(addr[0], addr[1], f"replica-{self.broker_id}", self.transport)
            self._connections[key] = conn
        return conn

    def send_fetch(self, partition: HostedPartition, action: SendFetch) -> None:
        leader = action.leader_id
        # a newer SendFetch of the same partition replaces one that has not gone out yet
        self._fetch_queue.setdefault(leader, {})[partition.tp] = (partition, action)
        if leader not in self._fetching:
            self._fetching.add(leader)
            self._spawn(self._fetcher(leader))

    async def _fetcher(self, leader: int) -> None:
        """Send ``leader``'s queued fetches, one batched request at a time, until none is left.
        It yields once first, so the fetches the cores emit in this turn of the loop (all the
        partitions answered by the previous response) share a request."""
        try:
            while not self.stopping:
                await asyncio.sleep(0)
                batch = self._fetch_queue.pop(leader, None)
                if not batch:
                    return
                await self._fetch(leader, list(batch.values()))
        finally:
            self._fetching.discard(leader)
            if self._fetch_queue.get(leader) and not self.stopping:
                self._fetching.add(leader)
                self._spawn(self._fetcher(leader))

    async def _fetch(self, leader: int, batch: list[tuple[HostedPartition, SendFetch]]) -> None:
        parts = [
            FetchPart(
                hp.tp[0],
                hp.tp[1],
                a.current_leader_epoch,
                a.fetch_offset,
                hp.log.log_start_offset,
                8 << 20,
            )
            for hp, a in batch
        ]
        max_wait_ms = min(a.max_wait_ms for _, a in batch)
        client_id = f"replica-{self.broker_id}"

        def encode(correlation_id: int) -> bytes:
            return encode_fetch_request(
                correlation_id, client_id, self.broker_id, max_wait_ms, 1, 16 << 20, parts
            )

        failed = (int(ErrorCode.REPLICA_NOT_AVAILABLE), b"", -1, -1)
        answers: dict[TopicPartition, tuple[int, bytes, int, int]] = {}
        conn = self._connection(leader, None)
        try:
            if conn is None:
                raise ConnectionFailed(f"broker {leader} is not registered")
            frame = await conn.exchange(encode, timeout=max_wait_ms / 1000 + 10)
            try:
                _, _, fetched = decode_fetch_response(frame)
            except MalformedResponse as e:
                conn.close()
                raise ConnectionFailed(f"broker {leader}: {e}") from None
            for f in fetched:
                answers[(f.topic, f.partition)] = (
                    f.error_code,
                    f.records,
                    f.high_watermark,
                    f.log_start_offset,
                )
        except ConnectionFailed as e:
            log.debug("fetch of %d partitions from %d failed: %s", len(batch), leader, e)
            await asyncio.sleep(0.2)
        for hp, a in batch:
            error, records, hw, log_start = answers.get(hp.tp, failed)
            leo = hw
            if error == ErrorCode.OFFSET_OUT_OF_RANGE and conn is not None:
                try:
                    leo, log_start = await self._leader_offsets(conn, hp, a.current_leader_epoch)
                except ConnectionFailed as e:
                    log.debug("%s: ListOffsets to %d failed: %s", hp.name, leader, e)
                    error, records, hw, log_start = failed
                    leo = hw
            if self.partitions.get(hp.tp) is hp and not self.stopping:
                hp.on_fetch_response(a.request_id, error, records, hw, log_start, leo)

    async def _leader_offsets(
        self, conn: KafkaConnection, hp: HostedPartition, epoch: int
    ) -> tuple[int, int]:
        L = ListOffsetsRequest[LIST_OFFSETS_VERSION]
        out = []
        for ts in (-1, -2):
            req = L(
                replica_id=self.broker_id,
                isolation_level=0,
                topics=[
                    L.ListOffsetsTopic(
                        name=hp.tp[0],
                        partitions=[
                            L.ListOffsetsTopic.ListOffsetsPartition(
                                partition_index=hp.tp[1], current_leader_epoch=epoch, timestamp=ts
                            )
                        ],
                    )
                ],
            )
            resp = await conn.request(req, timeout=10)
            out.append(resp.topics[0].partitions[0].offset)
        return out[0], out[1]

    def send_offsets_for_leader_epoch(
        self, partition: HostedPartition, action: SendOffsetsForLeaderEpoch
    ) -> None:
        self._spawn(self._epoch(partition, action))

    async def _epoch(self, hp: HostedPartition, a: SendOffsetsForLeaderEpoch) -> None:
        Req = OffsetForLeaderEpochRequest[EPOCH_VERSION]
        req = Req(
            replica_id=self.broker_id,
            topics=[
                Req.OffsetForLeaderTopic(
                    topic=hp.tp[0],
                    partitions=[
                        Req.OffsetForLeaderTopic.OffsetForLeaderPartition(
                            partition=hp.tp[1],
                            current_leader_epoch=a.current_leader_epoch,
                            leader_epoch=a.leader_epoch,
                        )
                    ],
                )
            ],
        )
        error, epoch, end = int(ErrorCode.REPLICA_NOT_AVAILABLE), -1, -1
        conn = self._connection(a.leader_id, hp.tp)
        try:
            if conn is None:
                raise ConnectionFailed(f"broker {a.leader_id} is not registered")
            resp = await conn.request(req, timeout=10)
            part = resp.topics[0].partitions[0]
            error, epoch, end = part.error_code, part.leader_epoch, part.end_offset
        except ConnectionFailed as e:
            log.debug("%s: OffsetForLeaderEpoch to %d failed: %s", hp.name, a.leader_id, e)
            await asyncio.sleep(0.2)
        if self.partitions.get(hp.tp) is hp and not self.stopping:
            hp.on_offsets_for_leader_epoch_response(a.request_id, error, epoch, end)

    def write_state(self, partition: HostedPartition, action: WriteStateZnode) -> None:
        self._spawn(self._write_state(partition, action))

    async def _write_state(self, hp: HostedPartition, action: WriteStateZnode) -> None:
        try:
            ok, version = await self.state_store.write_state(action)
        except Exception as e:
            log.warning("%s: ISR update %s failed: %s", hp.name, list(action.state.isr), e)
            ok, version = False, -1
        if ok:
            log.info("%s: ISR is now %s", hp.name, list(action.state.isr))
        elif version >= 0:
            # Kafka: "Cached zkVersion not equal to that in zookeeper, skip updating ISR".
            log.info(
                "%s: ISR update to %s refused: the state znode is at version %d, not %s; "
                "waiting for the controller's state",
                hp.name,
                list(action.state.isr),
                version,
                action.expected_version,
            )
        if self.partitions.get(hp.tp) is hp:
            hp.on_state_write_result(ok, version, action.state)

    # ----- timers ---------------------------------------------------------------------------

    def start(self) -> None:
        self._tick_timer = asyncio.get_running_loop().call_later(TICK_S, self._tick)
        self._loops.append(
            asyncio.create_task(
                self._hw_cp.write_every(
                    self.hw_checkpoint_interval_ms / 1000, self._high_watermarks
                )
            )
        )

    def _tick(self) -> None:
        """Every TICK_S: each partition's tick (a timer's callback, set again after the ticks
        as a sleeping task's next sleep would be: one loop callback per tick, not a timer's and
        a task's)."""
        for hp in list(self.partitions.values()):
            try:
                hp.tick()
            except Exception:
                log.exception("%s: tick failed", hp.name)
        self._tick_timer = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _high_watermarks(self) -> dict[TopicPartition, int]:
        return {tp: hp.high_watermark for tp, hp in self.partitions.items()}

    def checkpoint_high_watermarks(self) -> bool:
        try:
            self._hw_cp.write(self._high_watermarks())
        except KafkaStorageError as e:
            log.error("could not write %s: %s", self._hw_cp.path, e)
            return False
        return True

    async def stop(self) -> None:
        self.stopping = True
        if self._tick_timer is not None:
            self._tick_timer.cancel()
        for t in self._loops + list(self._tasks):
            t.cancel()
        for t in self._loops + list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for conn in self._connections.values():
            conn.close()
        for hp in self.partitions.values():
            hp.fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            try:
                hp.producer_state.take_snapshot()
            except (KafkaStorageError, OSError) as e:
                # the next start rebuilds producer state from the log
                self.stop_failures += 1
                log.error("%s: could not write the producer snapshot: %s", hp.name, e)
        if not self.checkpoint_high_watermarks():
            self.stop_failures += 1
        self.notifier.notify()
