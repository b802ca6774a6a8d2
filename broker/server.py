"""KafkaServer: wires configuration, logs, partitions, topic metadata and the socket server.

Standalone mode (no `zookeeper.connect`): this broker leads every partition of every topic, topics
live in a JSON file in the log dir. Cluster mode (with ZooKeeper) is layered on the same methods by
`broker.cluster`.

Shutdown: SIGTERM/SIGINT stop accepting requests, close every log (flush, trim indexes, write the
clean-shutdown marker) and write the checkpoints, so the next start skips recovery. A kill -9 skips
all that; the next start recovers from the recovery point. A step of the stop that fails (a full
disk) is logged and the next step still runs; a stop that does not finish within
`shutdown.timeout.ms` (a hung disk) is logged and the process exits anyway. Either way the exit
status is 1 and the logs not closed are recovered at the next start; every acknowledged record
is already in its segment file.

Start-up on a disk that is full: the logs are opened (a log that cannot be recovered stops the
start with one line naming it), checkpoints that cannot be written are logged and retried, and
the broker serves reads while appends fail with KAFKA_STORAGE_ERROR until there is room again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import shutil
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isrlab.broker import clock
from isrlab.broker.apis.admin import (
    handle_create_topics,
    handle_delete_topics,
)
from isrlab.broker.apis.fetch import handle_fetch
from isrlab.broker.apis.group import (
    handle_delete_groups,
    handle_describe_groups,
    handle_find_coordinator,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_offset_commit,
    handle_offset_delete,
    handle_offset_fetch,
    handle_sync_group,
    handle_txn_offset_commit,
)
from isrlab.broker.apis.metadata import handle_api_versions, handle_metadata
from isrlab.broker.apis.offsets import handle_list_offsets, handle_offset_for_leader_epoch
from isrlab.broker.apis.produce import handle_produce
from isrlab.broker.apis.txn import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_describe_producers,
    handle_describe_transactions,
    handle_end_txn,
    handle_init_producer_id,
    handle_list_transactions,
    handle_write_txn_markers,
)
from isrlab.broker.config import BrokerConfig, parse_per_ip_overrides, parse_topic_configs
from isrlab.broker.coordinator.group.service import GroupCoordinatorService
from isrlab.broker.coordinator.transaction.service import TransactionCoordinatorService
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log import durable
from isrlab.broker.log.errors import KafkaStorageError
from isrlab.broker.log_manager import LogManager
from isrlab.broker.network.codec import FileRegion, Request
from isrlab.broker.network.server import Connection, ConnectionLimits, Listener, SocketServer
from isrlab.broker.network.transport import SOCKETS, Transport
from isrlab.broker.partition import AppendResult, HostedPartition, ReadResult
from isrlab.broker.partition_limit import (
    FDS_PER_PARTITION,
    check_partition_budget,
    check_partition_count,
    derived_partition_limit,
    open_file_limit,
    partition_limit,
    replicas_per_broker,
)
from isrlab.broker.replica_manager import LocalStateStore, ReplicaManager, StateStore
from isrlab.broker.replication import LeaderAndIsr, ReplicationConfig, TruncationMode
from isrlab.broker.topics import LocalTopicStore, TopicInfo, assign_replicas

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass
class PartitionMetadata:
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline: list[int] = field(default_factory=list)


def connection_limits(config: BrokerConfig) -> ConnectionLimits:
    """The socket server's connection limits; the hosts of max.connections.per.ip.overrides
    are resolved to their addresses now (RuntimeError naming one that does not resolve)."""
    overrides: dict[str, int] = {}
    for host, limit in parse_per_ip_overrides(config["max.connections.per.ip.overrides"]).items():
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as e:
            raise RuntimeError(
                f"max.connections.per.ip.overrides: cannot resolve host {host!r}: {e}"
            ) from None
        for info in infos:
            overrides[str(info[4][0])] = limit
    return ConnectionLimits(
        max_connections=config["max.connections"],
        max_connections_per_ip=config["max.connections.per.ip"],
        per_ip_overrides=overrides,
        per_listener=dict(config.listener_max_connections),
        idle_ms=config["connections.max.idle.ms"],
        read_timeout_ms=config["request.read.timeout.ms"],
    )


class ProducerIdBlocks:
    """Producer ids for a standalone broker: blocks of 1000 reserved in a file before use, so a
    restart never hands out an id twice."""

    BLOCK = 1000

    def __init__(self, path: Path):
        self.path = path
        self._next = 0
        self._end = 0

    def allocate(self) -> int:
        if self._next >= self._end:
            start = int(self.path.read_text()) if self.path.exists() else 0
            # durable before use: a power loss must not hand out the same ids again
            durable.write_atomically(self.path, str(start + self.BLOCK).encode())
            self._next, self._end = start, start + self.BLOCK
        pid = self._next
        self._next += 1
        return pid


EXIT_UNCLEAN = 1


def _exit_after(timeout_ms: int) -> None:
    """Exit the process if it is still alive `timeout_ms` from now: a stop blocked in a system
    call (fsync on a hung disk) or a worker thread the interpreter would wait for cannot keep a
    stopped broker running. A thread, because the event loop itself may be the one blocked."""

    def expire() -> None:
        log.critical(
            "shutdown did not finish within shutdown.timeout.ms=%d; exiting now. Logs that were "
            "not closed are recovered at the next start (acknowledged records are in their "
            "segment files)",
            timeout_ms,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_UNCLEAN)

    timer = threading.Timer(timeout_ms / 1000, expire)
    timer.daemon = True
    timer.start()


#: Partitions a CreateTopics creates between two turns of the event loop.
HOST_BATCH = 64


class _CreateInterrupted(Exception):
    """A topic creation stopped half-way (the broker is stopping): undone, never half a topic."""


class KafkaServer:
    """One broker. `transport` is the network it listens and connects on (`None`: the
    operating system's sockets; `harness.sim.network` gives a simulated one)."""

    def __init__(
        self,
        config: BrokerConfig,
        state_store: StateStore | None = None,
        transport: Transport | None = None,
    ):
        self.config = config
        self.transport: Transport = transport or SOCKETS
        self.broker_id = config.broker_id
        self.stopping = False
        self.stop_failures = 0  # steps of the stop that could not be done (each one logged)
        self._shutdown: asyncio.Task[None] | None = None
        self.log_manager = LogManager(config)
        self.replica_manager = ReplicaManager(
            self.broker_id,
            config.log_dir,
            replication=self.replication_config,
            broker_address=self.broker_address,
            state_store=state_store or LocalStateStore(),
            hw_checkpoint_interval_ms=config["replica.high.watermark.checkpoint.interval.ms"],
            transport=self.transport,
        )
        self.log_manager.high_watermark = self._high_watermark
        self.log_manager.last_stable_offset = self._last_stable_offset
        # max.broker.partitions, never above what the open-file limit allows
        self.partition_limit, self.partition_limit_why = partition_limit(
            config["max.broker.partitions"]
        )
        self.topic_store = LocalTopicStore(config.log_dir)
        self._topics: dict[str, TopicInfo] = {}
        self.cluster_id = self._load_cluster_id()
        self.producer_ids = ProducerIdBlocks(config.log_dir / "producer-id-block")
        self.inter_broker_listener = config.inter_broker_listener()
        self.socket_server = SocketServer(
            [Listener(e.name, e.host, e.port) for e in config.listener_endpoints()],
            self.handle,
            config["socket.request.max.bytes"],
            config.queued_max_request_bytes,
            connection_limits(config),
            self.inter_broker_listener,
            self.transport,
        )
        self._handlers = {
            0: handle_produce,
            1: handle_fetch,
            2: handle_list_offsets,
            3: handle_metadata,
            8: handle_offset_commit,
            9: handle_offset_fetch,
            10: handle_find_coordinator,
            11: handle_join_group,
            12: handle_heartbeat,
            13: handle_leave_group,
            14: handle_sync_group,
            15: handle_describe_groups,
            16: handle_list_groups,
            18: handle_api_versions,
            19: handle_create_topics,
            20: handle_delete_topics,
            22: handle_init_producer_id,
            23: handle_offset_for_leader_epoch,
            24: handle_add_partitions_to_txn,
            25: handle_add_offsets_to_txn,
            26: handle_end_txn,
            27: handle_write_txn_markers,
            28: handle_txn_offset_commit,
            42: handle_delete_groups,
            47: handle_offset_delete,
            61: handle_describe_producers,
            65: handle_describe_transactions,
            66: handle_list_transactions,
        }
        self.group_coordinator = GroupCoordinatorService(self)
        self.replica_manager.role_listeners.append(self.group_coordinator.on_role_change)
        self.replica_manager.removal_listeners.append(self.group_coordinator.on_partition_removed)
        self.txn_coordinator = TransactionCoordinatorService(self)
        self.replica_manager.role_listeners.append(self.txn_coordinator.on_role_change)
        self.replica_manager.removal_listeners.append(self.txn_coordinator.on_partition_removed)
        self._stopped = asyncio.Event()

    # ----- lifecycle -------------------------------------------------------------------------

    def _load_cluster_id(self) -> str:
        """meta.properties as Kafka writes it: cluster.id and broker.id of this log dir."""
        path = self.config.log_dir / "meta.properties"
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        if path.exists():
            props = dict(
                line.split("=", 1) for line in path.read_text().splitlines() if "=" in line
            )
            stored = int(props.get("broker.id", self.broker_id))
            if stored != self.broker_id:
                raise RuntimeError(
                    f"{path} says broker.id={stored} but the config says {self.broker_id}: "
                    "this log dir belongs to another broker"
                )
            return props.get("cluster.id", "isrlab")
        cid = clock.uuid4().hex[:22]
        # fsynced, as Kafka writes it (a power loss must not leave it empty)
        text = f"version=0\nbroker.id={self.broker_id}\ncluster.id={cid}\n"
        durable.write_atomically(path, text.encode())
        return cid

    def check_hosted_partitions(self) -> None:
        """Refuse to start with more partitions than the open-file limit can hold open (the
        start would fail half-way with "Too many open files"), saying what to do instead."""
        configured = self.config["max.broker.partitions"]
        if configured is not None and configured > self.partition_limit:
            log.warning(
                "max.broker.partitions=%d is more than the open-file limit allows; using %s",
                configured,
                self.partition_limit_why,
            )
        hosted = replicas_per_broker(t.assignment for t in self._topics.values())[self.broker_id]
        nofile = open_file_limit()
        if hosted > derived_partition_limit(nofile):
            raise RuntimeError(
                f"{self.config.log_dir} holds {hosted} partitions but the open-file limit "
                f"(ulimit -n {nofile}) lets this broker keep at most "
                f"{derived_partition_limit(nofile)} open ({FDS_PER_PARTITION} descriptors each); "
                "raise ulimit -n and start again"
            )

    async def start(self) -> None:
        self._topics = self.topic_store.all()
        self.check_hosted_partitions()
        self.log_manager.load({n: self.topic_config(n) for n in self._topics})
        for name, info in self._topics.items():
            for p in info.assignment:
                self._host_partition((name, p))
        if self.log_manager.try_checkpoint():
            log.error(
                "log dir %s cannot be written: serving reads; appends fail with "
                "KAFKA_STORAGE_ERROR until it can, checkpoints are retried",
                self.config.log_dir,
            )
        self.log_manager.start_schedulers()
        self.group_coordinator.start()
        self.txn_coordinator.start()
        self.replica_manager.start()
        await self.socket_server.start()

    @property
    def bound_port(self) -> int:
        assert self.socket_server.bound_port is not None
        return self.socket_server.bound_port

    async def stop(self) -> None:
        """Stop serving, close the logs, write the checkpoints. A step that fails is logged and
        counted in `stop_failures`, and the next step still runs: a stop always ends."""
        if self.stopping:
            return
        self.stopping = True
        try:
            self.replica_manager.notifier.notify()
            await self._stop_step("stop the socket server", self.socket_server.stop)
            await self._stop_step("stop the group coordinator", self.group_coordinator.stop)
            await self._stop_step("stop the transaction coordinator", self.txn_coordinator.stop)
            await self._stop_step("stop replication", self.replica_manager.stop)
            self.stop_failures += self.replica_manager.stop_failures
            await self._stop_step("stop the log schedulers", self.log_manager.stop_schedulers)
            await self._stop_step("close the logs", self._close_logs)
        finally:
            self._stopped.set()
        if self.stop_failures:
            log.error(
                "broker %d stopped, but %d thing(s) could not be written (see above); the next "
                "start recovers those logs from their recovery points",
                self.broker_id,
                self.stop_failures,
            )
        else:
            log.info("broker %d stopped cleanly", self.broker_id)

    def _close_logs(self) -> None:
        self.stop_failures += self.log_manager.close()

    async def _stop_step(self, what: str, step: Callable[[], Any]) -> None:
        try:
            result = step()
            if inspect.isawaitable(result):
                await result
        except (KafkaStorageError, OSError) as e:
            self.stop_failures += 1
            log.error("shutdown: could not %s: %s", what, e)
        except Exception:
            self.stop_failures += 1
            log.exception("shutdown: could not %s", what)

    async def run_forever(self) -> bool:
        """Serve until SIGTERM/SIGINT, then stop; True if the stop wrote everything."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        await self.start()
        await self._stopped.wait()
        return self.stop_failures == 0

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if self._shutdown is not None:
            return
        timeout_ms = int(self.config["shutdown.timeout.ms"])
        log.info("%s: shutting down (at most shutdown.timeout.ms=%d)", sig.name, timeout_ms)
        _exit_after(timeout_ms)
        self._shutdown = asyncio.ensure_future(self._stop_on_signal())

    async def _stop_on_signal(self) -> None:
        try:
            await self.stop()
        except Exception:  # a subclass's own steps (cluster mode): logged, the stop still ends
            self.stop_failures += 1
            log.exception("shutdown failed")
        finally:
            self._stopped.set()

    # ----- request dispatch ------------------------------------------------------------------

    async def handle(
        self, request: Request, conn: Connection | None
    ) -> list[bytes | FileRegion] | None:
        handler = self._handlers[request.api_key]
        if conn is not None:  # in-process tests call handlers without a connection
            request.client_host = "/" + conn.peer.rsplit(":", 1)[0]  # as Kafka shows it
        return await handler(self, request)

    # ----- topics ----------------------------------------------------------------------------

    def topic_config(self, name: str) -> dict[str, Any]:
        info = self._topics[name]
        return parse_topic_configs(info.config, self.config.topic_defaults())

    def topics_snapshot(self) -> dict[str, TopicInfo]:
        return dict(self._topics)

    def advertised_addresses(self) -> dict[str, tuple[str, int]]:
        """This broker's address per listener name, as given out (a 0 port: the bound one)."""
        out = {}
        for e in self.config.advertised_endpoints():
            port = e.port or self.socket_server.bound_ports.get(e.name, 0)
            out[e.name] = (e.host, port)
        return out

    def live_brokers(self, listener: str | None = None) -> dict[int, tuple[str, int]]:
        """Live brokers and their address on `listener` (a client's: the one it connected
        to), by default the inter-broker listener; a broker without that listener is left
        out, as Kafka leaves it out of Metadata."""
        address = self.advertised_addresses().get(listener or self.inter_broker_listener)
        return {self.broker_id: address} if address is not None else {}

    def controller_id(self) -> int:
        return self.broker_id

    def partition_metadata(self, tp: TopicPartition) -> PartitionMetadata:
        hp = self.replica_manager.partitions.get(tp)
        if hp is None:
            return PartitionMetadata(-1, -1, [], [])
        return PartitionMetadata(hp.leader_id, hp.leader_epoch, hp.replicas, hp.isr)

    def _high_watermark(self, tp: TopicPartition) -> int | None:
        hp = self.replica_manager.partitions.get(tp)
        return hp.high_watermark if hp is not None else None

    def _last_stable_offset(self, tp: TopicPartition) -> int | None:
        hp = self.replica_manager.partitions.get(tp)
        return hp.last_stable_offset if hp is not None else None

    def replication_config(self, topic: str) -> ReplicationConfig:
        cfg = self.topic_config(topic) if topic in self._topics else self.config.topic_defaults()
        return ReplicationConfig(
            min_insync_replicas=int(cfg["min.insync.replicas"]),
            replica_lag_time_max_ms=int(self.config["replica.lag.time.max.ms"]),
            truncation_mode=TruncationMode(self.config["replica.truncation.mode"]),
            replica_fetch_wait_max_ms=int(self.config["replica.fetch.wait.max.ms"]),
            eligible_leader_replicas_enable=bool(self.config["eligible.leader.replicas.enable"]),
        )

    def broker_address(self, broker_id: int) -> tuple[str, int] | None:
        return self.live_brokers().get(broker_id)

    def _host_partition(self, tp: TopicPartition) -> HostedPartition:
        cfg = self.topic_config(tp[0])
        lg = self.log_manager.get_or_create(tp, cfg)
        hp = self.replica_manager.add(tp, lg, cfg)
        self.on_partition_hosted(hp)
        return hp

    def on_partition_hosted(self, hp: HostedPartition) -> None:
        """Standalone: lead every partition with ISR = {self}, keeping the logged epoch."""
        epoch = max(hp.adapter.latest_epoch(), 0)
        hp.become(LeaderAndIsr(self.broker_id, epoch, (self.broker_id,), 0, 0), [self.broker_id])

    def plan_assignment(
        self,
        num_partitions: int,
        replication_factor: int,
        assignment: dict[int, list[int]] | None,
        start: int = 0,
    ) -> dict[int, list[int]]:
        """Validate an explicit assignment, or place `num_partitions` x `replication_factor`
        (-1: the broker defaults) on the live brokers; KafkaError with Kafka's code if bad."""
        brokers = sorted(self.live_brokers())
        if assignment:
            if num_partitions not in (-1, len(assignment)) or replication_factor != -1:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    "with an explicit assignment, partitions and replication factor must be -1",
                )
            if sorted(assignment) != list(range(len(assignment))):
                raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions must be 0..n-1")
            for p, replicas in assignment.items():
                if not replicas or len(set(replicas)) != len(replicas):
                    raise KafkaError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {p}: bad replica list"
                    )
        else:
            if num_partitions == -1:
                num_partitions = self.config["num.partitions"]
            if replication_factor == -1:
                replication_factor = self.config["default.replication.factor"]
            if num_partitions <= 0:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS, "number of partitions must be > 0")
            if replication_factor <= 0:
                raise KafkaError(
                    ErrorCode.INVALID_REPLICATION_FACTOR, "replication factor must be > 0"
                )
            if replication_factor > len(brokers):
                raise KafkaError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {replication_factor} larger than {len(brokers)} "
                    "available broker(s)",
                )
            check_partition_count(
                num_partitions,
                replication_factor,
                len(brokers),
                self.partition_limit,
                self.partition_limit_why,
            )
            assignment = assign_replicas(num_partitions, replication_factor, brokers, start)
        # Every broker is held to this broker's limit (KIP-578 has the controller do the same).
        check_partition_budget(
            replicas_per_broker(t.assignment for t in self._topics.values()),
            assignment,
            self.partition_limit,
            self.partition_limit_why,
        )
        return assignment

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignment: dict[int, list[int]] | None,
        config: dict[str, str],
        validate_only: bool = False,
    ) -> TopicInfo:
        if name in self._topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        assignment = self.plan_assignment(num_partitions, replication_factor, assignment)
        info = TopicInfo(name, clock.uuid4(), assignment, dict(config))
        if validate_only:
            return info
        # Logs first, the topic store last: a crash in between leaves directories of an unknown
        # topic, which the next start removes; a failure removes what was made. Never half a topic.
        # The topic is known (and counted against max.broker.partitions) from here on.
        self._topics[name] = info
        try:
            for i, p in enumerate(assignment):
                if i and i % HOST_BATCH == 0:
                    # A big topic takes seconds: other requests and a SIGTERM get their turn.
                    await asyncio.sleep(0)
                    if self._topics.get(name) is not info:  # deleted meanwhile: nothing left
                        raise KafkaError(
                            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"topic {name!r} was deleted while it was being created",
                        )
                    if self.stopping:
                        raise _CreateInterrupted("the broker is shutting down")
                self._host_partition((name, p))
            self.topic_store.create(info)
        except (OSError, KafkaStorageError) as e:
            self._undo_create(info)
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"could not create topic {name!r} ({e}); nothing was created",
            ) from None
        except _CreateInterrupted as e:
            self._undo_create(info)
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, f"topic {name!r} not created: {e}; retry"
            ) from None
        log.info("created topic %s with %d partition(s)", name, len(assignment))
        return info

    def _undo_create(self, info: TopicInfo) -> None:
        for p in info.assignment:
            self.replica_manager.remove((info.name, p))
            self.log_manager.delete((info.name, p))
            shutil.rmtree(self.config.log_dir / f"{info.name}-{p}", ignore_errors=True)
        self._topics.pop(info.name, None)
        try:
            self.topic_store.delete(info.name)
        except OSError as e:
            log.warning("could not rewrite the topic store after a failed create: %s", e)

    async def auto_create_topic(self, name: str) -> ErrorCode:
        try:
            await self.create_topic(name, -1, -1, None, {})
        except KafkaError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return ErrorCode.NONE
            log.warning("auto-creating %s failed: %s", name, e)
            return e.code
        return ErrorCode.NONE

    async def delete_topic(self, name: str) -> None:
        info = self._topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        for p in info.assignment:
            self.replica_manager.remove((name, p))
            self.log_manager.delete((name, p))
        self.topic_store.delete(name)
        del self._topics[name]
        self.log_manager.checkpoint()
        log.info("deleted topic %s", name)

    async def allocate_producer_id(self) -> int:
        return self.producer_ids.allocate()

    # ----- produce / fetch -------------------------------------------------------------------

    def produce_to_partition(
        self, tp: TopicPartition, records: memoryview, acks: int, timeout_ms: int
    ) -> AppendResult | asyncio.Future[AppendResult]:
        return self.replica_manager.append(tp, records, acks, timeout_ms)

    def read_partition(
        self,
        tp: TopicPartition,
        fetch_offset: int,
        max_bytes: int,
        *,
        replica_id: int,
        current_leader_epoch: int,
        read_committed: bool,
        min_one_message: bool,
        fetcher_log_start: int = -1,
    ) -> ReadResult:
        return self.replica_manager.read(
            tp,
            fetch_offset,
            max_bytes,
            replica_id=replica_id,
            current_leader_epoch=current_leader_epoch,
            read_committed=read_committed,
            min_one_message=min_one_message,
        )
