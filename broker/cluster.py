"""Cluster mode: a KafkaServer coordinated through ZooKeeper (`zookeeper.connect` is set).

What changes from standalone:
- topics, their assignments and configs live in ZooKeeper (`/brokers/topics`, `/config/topics`);
  CreateTopics writes them there and waits for the controller to elect leaders; DeleteTopics
  files `/admin/delete_topics/<t>` for the controller;
- the broker registers `/brokers/ids/<id>` (ephemeral; re-registered after a session expiry)
  and runs a `ControllerService`;
- partition leadership comes from the state znodes, which every broker watches: a change makes the
  hosted replica leader or follower (`HostedPartition.become`), and also feeds the metadata every
  broker gives clients (leaders, ISR, offline replicas), so clients fail over by themselves;
- ISR changes are compare-and-set writes of the state znode (`ZkStateStore`);
- producer ids come in blocks reserved in `/latest_producer_id_block`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import SessionExpiredError
from kazoo.protocol.states import KazooState

from isrlab.broker import clock, zk_retry
from isrlab.broker.config import BrokerConfig
from isrlab.broker.controller_service import ControllerService
from isrlab.broker.errors import ErrorCode, KafkaError
from isrlab.broker.log import durable
from isrlab.broker.log.log import CLEAN_SHUTDOWN_FILE
from isrlab.broker.log_manager import parse_dir_name
from isrlab.broker.network.codec import FileRegion, Request
from isrlab.broker.network.server import Connection
from isrlab.broker.network.transport import Transport
from isrlab.broker.partition import HostedPartition
from isrlab.broker.replication import LeaderAndIsr, TopicPartition, WriteStateZnode
from isrlab.broker.server import KafkaServer, PartitionMetadata
from isrlab.broker.topics import TopicInfo
from isrlab.broker.zk_client import REGISTRATION_RETRY_S, BrokerIdTaken, KafkaZkClient

log = logging.getLogger(__name__)


class ZkStateStore:
    def __init__(self, zk: KafkaZkClient):
        self.zk = zk

    async def write_state(self, action: WriteStateZnode) -> tuple[bool, int]:
        """The leader's ISR write: made again after a dropped connection (see `zk_retry`);
        a failed outcome then means a conflict, for which the controller's state follows."""
        return await zk_retry.call(self.zk.zk, self.zk.write_state, action)


class ZkTopicStore:
    """TopicStore over ZooKeeper, with a local cache kept fresh by watches."""

    def __init__(self, zk: KafkaZkClient):
        self.zk = zk
        self.cache: dict[str, TopicInfo] = {}

    def all(self) -> dict[str, TopicInfo]:
        return dict(self.cache)

    def create(self, info: TopicInfo) -> None:
        if not self.zk.create_topic(info):
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {info.name!r} already exists")

    def delete(self, name: str) -> None:
        self.zk.request_topic_deletion(name)


async def register(
    zk: KafkaZkClient, broker_id: int, advertised: tuple[Any, ...], clean_shutdown: bool = True
) -> bool:
    """`KafkaZkClient.register_broker(broker_id, *advertised, clean_shutdown)`, with its wait
    for an older session's znode to go done on the loop (`asyncio.sleep` between attempts)
    instead of in a sleeping thread: a simulation runs `to_thread` on its loop's thread, where
    a blocking sleep would stop virtual time."""
    host, port, *rest = advertised  # (host, port) or (host, port, endpoints)
    data = zk.broker_registration_data(host, port, rest[0] if rest else None, clean_shutdown)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + zk.registration_wait_s()
    while True:
        created = await asyncio.to_thread(zk.try_register_broker, broker_id, data)
        if created is not None:
            return created
        if loop.time() >= deadline:
            raise BrokerIdTaken(broker_id)
        await asyncio.sleep(REGISTRATION_RETRY_S)


class ClusterKafkaServer(KafkaServer):
    """A broker in a cluster. `transport` as KafkaServer's; `kazoo` builds its ZooKeeper
    clients (as KafkaZkClient's: kazoo's own by default, a simulated ensemble's in a
    simulation)."""

    def __init__(
        self,
        config: BrokerConfig,
        transport: Transport | None = None,
        kazoo: Callable[..., KazooClient] = KazooClient,
    ):
        self.zk = KafkaZkClient(
            config["zookeeper.connect"], config["zookeeper.session.timeout.ms"], kazoo
        )
        super().__init__(config, state_store=ZkStateStore(self.zk), transport=transport)
        self.topic_store = ZkTopicStore(self.zk)  # type: ignore[assignment]
        self.controller = ControllerService(
            self.zk,
            self.broker_id,
            config["unclean.leader.election.enable"],
            eligible_leader_replicas=config["eligible.leader.replicas.enable"],
            min_insync_replicas=lambda t: self.replication_config(t).min_insync_replicas,
        )
        # broker id -> listener name -> advertised (host, port)
        self._brokers: dict[int, dict[str, tuple[str, int]]] = {}
        self._brokers_gen = 0
        self._states: dict[tuple[str, int], LeaderAndIsr] = {}
        self._watched_topics: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid_next = 0
        self._pid_end = -1
        self._background: set[asyncio.Future[Any]] = set()
        self._controller_seen = -1
        # This incarnation's broker epoch: the czxid of its current registration (None until
        # registered). A state znode last written before it cannot make this broker leader.
        self._broker_epoch: int | None = None
        # partitions whose newest state names us leader but may not make us lead (yet): that
        # state and the zxid of its write (logged once per leader epoch; see `_may_lead`)
        self._held_leadership: dict[tuple[str, int], tuple[LeaderAndIsr, int]] = {}
        # Set once this incarnation is registered and has loaded the membership view: client
        # and replica requests wait for it (see `handle`).
        self._serving = asyncio.Event()

    def _spawn(self, coro: Any) -> None:
        fut = asyncio.ensure_future(coro)
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)

    # ----- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self.zk.start)
        except Exception as e:
            raise RuntimeError(
                f"cannot reach ZooKeeper at {self.config['zookeeper.connect']}: {e}"
            ) from None
        self.cluster_id = await asyncio.to_thread(self.zk.cluster_id)
        topics = await asyncio.to_thread(self._read_topics)
        self.topic_store.cache = topics  # type: ignore[attr-defined]
        self._topics = dict(topics)
        # KIP-966: whether the previous run closed every log (Log.open removes the markers).
        clean_shutdown = self._logs_closed_cleanly()
        self.check_hosted_partitions()
        self.log_manager.load({n: self.topic_config(n) for n in self._topics})
        for name, info in self._topics.items():
            for p, replicas in info.assignment.items():
                if self.broker_id in replicas:
                    self._host_partition((name, p))
                else:  # the metadata cache follows every partition, hosted here or not
                    self._watch_state((name, p))
        self.log_manager.checkpoint()
        self.log_manager.start_schedulers()
        self.group_coordinator.start()
        self.txn_coordinator.start()
        self.replica_manager.start()
        await self.socket_server.start()
        endpoints = self.advertised_addresses()
        host, port = endpoints[self.inter_broker_listener]
        # what register_broker takes after the id: the inter-broker address, every listener's
        self._advertised: tuple[Any, ...] = (host, port, endpoints)
        # Only the first registration of this process can report an unclean shutdown: after a
        # session expiry the broker re-registers with its logs intact.
        await register(self.zk, self.broker_id, self._advertised, clean_shutdown)
        await self._learn_broker_epoch()
        if not clean_shutdown and any(self.log_manager.logs):
            log.warning(
                "broker %d: the previous run did not close its logs cleanly; registered so "
                "(its replicas are not elected from the eligible leader replicas)",
                self.broker_id,
            )
        # The membership view is loaded before start() returns; watches keep it current.
        ids = await asyncio.to_thread(self.zk.zk.get_children, "/brokers/ids")
        self._brokers = await asyncio.to_thread(self._lookup_brokers, sorted(int(i) for i in ids))
        self._serving.set()
        self.zk.zk.add_listener(self._on_session_state)
        self.zk.zk.ChildrenWatch("/brokers/ids", self._on_brokers)
        self.zk.zk.ChildrenWatch("/brokers/topics", self._on_topics)
        self.zk.zk.DataWatch("/controller", self._on_controller)
        self.controller.start()
        log.info("broker %d registered in ZooKeeper as %s:%d", self.broker_id, host, port)

    def _logs_closed_cleanly(self) -> bool:
        """Whether the previous run stopped cleanly: the log dir's clean-shutdown marker
        (written by ``stop`` once every log closed, as Kafka has one per log dir) and every
        partition's. The log dir's marker is removed here, durably: a crash from now on is
        an unclean shutdown. A log dir never used (no marker, no partition) counts as
        unclean too: it holds nothing of what it may once have had."""
        root = self.log_manager.dir
        marker = root / CLEAN_SHUTDOWN_FILE
        clean = marker.exists() and all(
            (child / CLEAN_SHUTDOWN_FILE).exists()
            for child in root.iterdir()
            if child.is_dir() and parse_dir_name(child.name) is not None
        )
        if marker.exists():
            durable.unlink(marker)
            durable.fsync_dir(root)
        return clean

    def _read_topics(self) -> dict[str, TopicInfo]:
        out = {}
        for name in self.zk.topics():
            info = self.zk.topic(name)
            if info is not None:
                out[name] = info
        return out

    async def stop(self) -> None:
        if self.stopping:
            return
        # a controller task that died with an error must not keep the logs from being closed
        await self._stop_step("stop the controller", self.controller.stop)
        self._serving.set()  # requests still waiting are answered by the stopping broker
        await super().stop()
        if not self.stop_failures:
            # Every log closed: the next start registers after a clean shutdown (KIP-966).
            try:
                durable.write_atomically(self.log_manager.dir / CLEAN_SHUTDOWN_FILE, b"")
            except OSError as e:
                log.warning("could not write the clean-shutdown marker: %s", e)
        # Closing the session deletes our ephemeral znodes at once (no session-timeout wait),
        # but must not hang the shutdown when ZooKeeper is unreachable.
        try:
            await asyncio.wait_for(asyncio.to_thread(self.zk.close), 5)
        except (TimeoutError, Exception) as e:
            log.warning("closing the ZooKeeper session failed: %r", e)

    # ----- watches (kazoo thread -> loop) ---------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_session_state(self, state: KazooState) -> None:
        if state == KazooState.CONNECTED and self._loop is not None:
            # After an expired session the ephemeral registration is gone: register again.
            self._call(lambda: self._spawn(self._reregister()))

    async def _reregister(self) -> None:
        if self.stopping:
            return
        # Not decided by reading /brokers/ids/<id> first: after a partition a ZooKeeper follower
        # can still show the expired session's znode, and the broker would stay unregistered
        # (the controller then counts it dead for good: partitions whose ISR is this broker
        # stay offline). register_broker creates it unless this very session holds it.
        try:
            created = await register(self.zk, self.broker_id, self._advertised)
        except Exception as e:  # the session was lost again: the next CONNECTED retries
            log.warning("broker %d: registering again failed: %s", self.broker_id, e)
            return
        if created:
            log.warning(
                "broker %d: ZooKeeper session was renewed; registered again", self.broker_id
            )
        await self._learn_broker_epoch()

    async def _learn_broker_epoch(self) -> None:
        """Read this incarnation's broker epoch (its registration's czxid, KIP-380's broker
        epoch in ZooKeeper mode) after (re)registering."""
        try:
            reg = await asyncio.to_thread(self.zk.broker_registration, self.broker_id)
        except Exception as e:  # the session was lost again: the next registration retries
            log.warning("broker %d: reading its registration failed: %s", self.broker_id, e)
            return
        if reg is not None:
            self._broker_epoch = reg[0]
            self._decide_held_leadership()

    def _decide_held_leadership(self) -> None:
        """Decide again, with the broker epoch now known, the states that named this broker
        leader while it was not: the controller may elect a broker as soon as it registers,
        and the state's watch event can arrive before the read of the registration returns.
        Such a state was held back (`_may_lead`), and the controller writes nothing more: it
        must be taken now, or the broker never leads (its followers never rejoin the ISR).
        A state written before the registration stays held, as it would have been."""
        for tp, (state, written_at) in list(self._held_leadership.items()):
            del self._held_leadership[tp]
            if self._states.get(tp) == state:  # still the newest state seen for tp
                self._state_changed(tp, state, written_at)

    def _lookup_brokers(self, ids: list[int]) -> dict[int, dict[str, tuple[str, int]]]:
        out = {}
        for b in ids:
            endpoints = self.zk.broker_endpoints(b)
            if endpoints is not None:
                out[b] = endpoints
        return out

    def _on_brokers(self, children: list[str]) -> None:
        ids = sorted(int(c) for c in children)
        # Watch events arrive in order, their lookups may finish out of order: only the newest
        # event's view may be applied.
        self._brokers_gen += 1
        gen = self._brokers_gen

        async def apply() -> None:
            try:
                view = await zk_retry.call(self.zk.zk, self._lookup_brokers, ids)
            except SessionExpiredError:
                return  # the new session's watch reports the brokers again
            if gen == self._brokers_gen:
                self._brokers = view

        self._call(lambda: self._spawn(apply()))

    def _on_topics(self, children: list[str]) -> bool | None:
        names = set(children)
        self._call(self._topics_changed, names)
        return None

    def _topics_changed(self, names: set[str]) -> None:
        for gone in [n for n in self._topics if n not in names]:
            self._remove_topic_locally(gone)
        for name in sorted(names - set(self._topics)):  # (a set: its order is the hash seed's)
            self._spawn(self._add_topic_locally(name))

    async def _add_topic_locally(self, name: str) -> None:
        try:
            info = await zk_retry.call(self.zk.zk, self.zk.topic, name)
        except SessionExpiredError:
            return  # the new session's watch reports the topics again
        if info is None or name in self._topics:
            return
        self._topics[name] = info
        self.topic_store.cache[name] = info  # type: ignore[attr-defined]
        for p, replicas in info.assignment.items():
            if self.broker_id in replicas:
                self._host_partition((name, p))
            else:
                self._watch_state((name, p))

    def _remove_topic_locally(self, name: str) -> None:
        info = self._topics.pop(name, None)
        self.topic_store.cache.pop(name, None)  # type: ignore[attr-defined]
        if info is None:
            return
        for p in info.assignment:
            self._states.pop((name, p), None)
            self.replica_manager.remove((name, p))
            self.log_manager.delete((name, p))
        self.log_manager.checkpoint()
        log.info("topic %s deleted: removed local partitions", name)

    def _watch_state(self, tp: tuple[str, int]) -> None:
        path = f"/brokers/topics/{tp[0]}/partitions/{tp[1]}/state"

        def on_change(data: bytes | None, stat: Any) -> bool | None:
            if tp[0] not in self._topics and data is None:
                return False  # topic gone: stop watching
            if data is not None:
                try:
                    state = LeaderAndIsr.from_json(data, stat.version)
                except ValueError as e:
                    log.error("%s: %s", path, e)
                    return None
                self._call(self._state_changed, tp, state, stat.mzxid)
            return None

        # kazoo reads the znode when the watch is set: off the event loop
        self._spawn(asyncio.to_thread(self.zk.zk.DataWatch, path, on_change))

    def _state_changed(self, tp: tuple[str, int], state: LeaderAndIsr, written_at: int) -> None:
        """A state znode's contents and the zxid of its last write (mzxid)."""
        old = self._states.get(tp)
        # The metadata cache keeps the newest state (watch callbacks may arrive out of order)...
        if old is None or (old.leader_epoch, old.zk_version) <= (
            state.leader_epoch,
            state.zk_version,
        ):
            self._states[tp] = state
        info = self._topics.get(tp[0])
        if info is None:
            return
        if state.leader == self.broker_id and not self._may_lead(tp, state, written_at):
            return
        # ...but whether a state is news to the local replica is the replication core's call
        # (Partition.become_leader_or_follower ignores stale epochs and znode versions).
        self.replica_manager.become(tp, state, info.assignment.get(tp[1], []))
        self.replica_manager.notifier.notify(tp)

    def _may_lead(self, tp: tuple[str, int], state: LeaderAndIsr, written_at: int) -> bool:
        """Whether a state naming this broker leader may make it lead (no zombie leaders).

        A state written before this incarnation registered (mzxid below its broker epoch)
        names a previous incarnation: one killed and started again before its ZooKeeper
        session expired reads the state znode that still names it, and would lead with
        whatever its log kept (a power loss may have cut it), shrink the ISR to itself before
        the controller noticed, and make its followers truncate to it. Kafka's brokers act
        only on the controller's LeaderAndIsr, sent after the controller has seen the new
        broker epoch (KIP-380) and handled the bounce as a failure and a start; the
        controller here does the same (`ControllerService`) and writes a new state, which
        this broker then follows. A leader already leading this epoch keeps doing so (a
        session renewal changes the epoch but not what the replica holds). While the broker
        epoch is not known yet (from the registration until its read returns), a state naming
        this broker is held and decided again once it is (`_decide_held_leadership`)."""
        hp = self.replica_manager.partitions.get(tp)  # type: ignore[arg-type]
        if hp is not None and hp.is_leader and hp.leader_epoch == state.leader_epoch:
            return True
        if self._broker_epoch is not None and written_at > self._broker_epoch:
            self._held_leadership.pop(tp, None)
            return True
        held = self._held_leadership.get(tp)
        self._held_leadership[tp] = (state, written_at)
        if self._broker_epoch is None:
            # Not registered yet, or the read of the registration has not returned: decided
            # again once it has (`_decide_held_leadership`).
            log.info(
                "%s-%d: the state znode names this broker leader at epoch %d; deciding once "
                "this broker knows its broker epoch",
                tp[0],
                tp[1],
                state.leader_epoch,
            )
        elif held is None or held[0].leader_epoch != state.leader_epoch:
            log.warning(
                "%s-%d: the state znode names this broker leader at epoch %d, but was written "
                "before this broker registered; waiting for the controller's decision",
                tp[0],
                tp[1],
                state.leader_epoch,
            )
        return False

    # ----- KafkaServer overrides ------------------------------------------------------------

    async def handle(
        self, request: Request, conn: Connection | None
    ) -> list[bytes | FileRegion] | None:
        """As `KafkaServer.handle`, once the broker is registered in ZooKeeper.

        The listeners are bound first (a 0 port is advertised as the bound one), but a request
        read before the registration waits for it, as Kafka enables request processing only
        after registering the broker (KafkaServer.startup). A broker started again before its
        old session expired can register only once it has (`KafkaZkClient.register_broker`),
        up to zookeeper.session.timeout.ms later; answering meanwhile would give Metadata from
        an empty membership view (no broker, every topic), and librdkafka decommissions every
        broker such an answer leaves out: the consumer that asked fetched nothing more."""
        if conn is not None and not self._serving.is_set():
            await self._serving.wait()
        return await super().handle(request, conn)

    def on_partition_hosted(self, hp: HostedPartition) -> None:
        self._watch_state(hp.tp)

    def live_brokers(self, listener: str | None = None) -> dict[int, tuple[str, int]]:
        name = listener or self.inter_broker_listener
        return {b: eps[name] for b, eps in self._brokers.items() if name in eps}

    def controller_id(self) -> int:
        # From a watch, never a ZooKeeper read here: Metadata must not block the event loop
        # (an isolated broker's ZooKeeper calls hang until the session times out).
        return self.broker_id if self.controller.is_active else self._controller_seen

    def _on_controller(self, data: bytes | None, stat: Any) -> None:
        try:
            seen = int(json.loads(data)["brokerid"]) if data else -1
        except (ValueError, KeyError, TypeError):
            seen = -1
        self._call(setattr, self, "_controller_seen", seen)

    def partition_metadata(self, tp: tuple[str, int]) -> PartitionMetadata:
        st = self._states.get(tp)
        info = self._topics.get(tp[0])
        replicas = info.assignment.get(tp[1], []) if info else []
        if st is None:
            return PartitionMetadata(-1, -1, replicas, [], list(replicas))
        offline = [r for r in replicas if r not in self._brokers]
        leader = st.leader if st.leader in self._brokers else -1
        return PartitionMetadata(leader, st.leader_epoch, replicas, list(st.isr), offline)

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignment: dict[int, list[int]] | None,
        config: dict[str, str],
        validate_only: bool = False,
    ) -> TopicInfo:
        existing = await asyncio.to_thread(self.zk.topic, name)
        if name in self._topics or existing is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if self.broker_id not in self._brokers:
            # Just (re)started or re-registering: placing replicas on a partial view would
            # wrongly refuse or skew the assignment. Retriable, as Kafka's NOT_CONTROLLER is.
            raise KafkaError(
                ErrorCode.NOT_CONTROLLER,
                f"broker {self.broker_id} has not loaded the cluster membership yet; retry",
            )
        start = clock.uuid4().int % max(len(self._brokers), 1)
        assignment = self.plan_assignment(num_partitions, replication_factor, assignment, start)
        info = TopicInfo(name, clock.uuid4(), assignment, dict(config))
        if validate_only:
            return info
        await asyncio.to_thread(self.topic_store.create, info)
        # Wait (briefly) until the controller has elected leaders, so the topic is usable.
        deadline = clock.monotonic() + 10
        while clock.monotonic() < deadline:
            if all(self._states.get((name, p)) for p in assignment):
                break
            await asyncio.sleep(0.05)
        log.info("created topic %s: %s", name, assignment)
        return info

    async def delete_topic(self, name: str) -> None:
        existing = await asyncio.to_thread(self.zk.topic, name)
        if name not in self._topics and existing is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        await asyncio.to_thread(self.zk.request_topic_deletion, name)
        deadline = clock.monotonic() + 10
        while name in self._topics and clock.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def allocate_producer_id(self) -> int:
        if self._pid_next > self._pid_end:
            start, end = await asyncio.to_thread(self.zk.allocate_producer_id_block, self.broker_id)
            self._pid_next, self._pid_end = start, end
        pid = self._pid_next
        self._pid_next += 1
        return pid


__all__ = ["ClusterKafkaServer", "TopicPartition"]
