"""The controller's IO shell: ZooKeeper election and watches around the sans-IO `Controller` core.

Every broker runs one. Election is Kafka's: whoever creates the ephemeral `/controller` znode is the
controller and bumps `/controller_epoch`; the others watch `/controller` and try again when it goes
away (the controller died or lost its ZooKeeper session). The active controller feeds the core

- broker membership (children of `/brokers/ids`) -> `on_broker_change` (elections, ISR cleanup),
- new topics (children of `/brokers/topics`) -> `add_topic` (first partition states),
- deletion requests (children of `/admin/delete_topics`) -> the topic's znodes are removed,

and executes what it returns: conditional state-znode writes (reporting the outcome back), re-reads
after a version conflict. Every ZooKeeper call goes through `zk_retry.call`: one that meets a
dropped connection is made again once the session is connected again (Kafka's ZooKeeperClient
does the same), so an event is never half-handled and a write's outcome always reaches the
core; a session that changed meanwhile ends the handling (the controller resigns).

KIP-966 in ZooKeeper mode: a broker's epoch is its registration's czxid (Kafka's ZooKeeper
broker epoch) and its registration says whether it started after a clean shutdown. A broker
whose epoch changed since the controller last looked registered anew; if it says unclean, the
core is told (``unclean_shutdown``), once. A new epoch for a broker that never looked absent (a
bounce inside one watch event) is handled as a failure then a start. After a controller
failover the registrations are compared with each state znode instead: a registration newer
than the state's last write (czxid > mzxid) was not yet taken into account; if unclean it is
reported as such, and if it is the state's leader's, the leader bounced (failure, then start).
Brokers do not lead from a state written before their registration (`ClusterKafkaServer`), so
every bounce of a leader must end in a new state write. `NotifyBrokers` needs no message: brokers watch their partitions' state
znodes, so a written state is the notification (a documented difference from Kafka's
LeaderAndIsr request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

from isrlab.broker import zk_retry
from isrlab.broker.controller.controller import (
    Controller,
    ControllerAction,
    NotifyBrokers,
    ReadStateZnode,
    WriteAssignmentZnode,
)
from isrlab.broker.replication import (
    LeaderAndIsr,
    TopicPartition,
    WriteStateZnode,
    partition_state_path,
)
from isrlab.broker.zk_client import KafkaZkClient

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(
        self,
        zk: KafkaZkClient,
        broker_id: int,
        unclean_leader_election: bool,
        eligible_leader_replicas: bool = True,
        min_insync_replicas: Callable[[str], int] | int = 1,
    ):
        self.zk = zk
        self.broker_id = broker_id
        self.unclean = unclean_leader_election
        self.eligible_leader_replicas = eligible_leader_replicas
        self.min_insync_replicas = min_insync_replicas
        # broker id -> broker epoch (registration czxid) of the live brokers last seen
        self._epochs: dict[int, int] = {}
        self.core: Controller | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._watching = False

    @property
    def is_active(self) -> bool:
        return self.core is not None and not self.core.fenced

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run())
        self.zk.zk.DataWatch("/controller", self._on_controller_znode)
        self.zk.zk.add_listener(self._on_session_state)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ----- events from kazoo's thread -------------------------------------------------------

    def _post(self, kind: str, value: Any = None) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))

    def _on_controller_znode(self, data: bytes | None, stat: Any) -> None:
        self._post("controller-znode", data)

    def _on_session_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            self._post("session-lost")
        elif state == KazooState.CONNECTED and self._watching:
            # Connected again: kazoo set the watches again and its ChildrenWatch reports
            # /brokers/ids only if the ids differ, but a broker may have bounced meanwhile
            # (same id, new registration): look at the registrations again.
            self._post("resync")

    def _watch_cluster(self) -> None:
        if self._watching:
            return
        self._watching = True
        self.zk.zk.ChildrenWatch("/brokers/ids", lambda c: self._post("brokers", c))
        self.zk.zk.ChildrenWatch("/brokers/topics", lambda c: self._post("topics", c))
        self.zk.zk.ChildrenWatch("/admin/delete_topics", lambda c: self._post("deletions", c))

    # ----- the event loop -------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            kind, value = await self._events.get()
            try:
                await self._handle(kind, value)
            except Exception:
                log.exception("controller: handling %s failed", kind)

    async def _handle(self, kind: str, value: Any) -> None:
        if kind == "controller-znode":
            if value is None:
                await self._elect()
        elif kind == "session-lost":
            if self.core is not None:
                log.warning("controller %d: ZooKeeper session lost; resigning", self.broker_id)
            self.core = None
        elif self.core is None:
            return
        elif kind == "resync":
            ids = await zk_retry.call(self.zk.zk, self.zk.broker_ids)
            await self._handle("brokers", [str(b) for b in ids])
        elif kind == "brokers":
            live = sorted(int(c) for c in value)
            regs = await zk_retry.call(self.zk.zk, self._registrations, live)
            renewed = {b for b, (epoch, _) in regs.items() if self._epochs.get(b) != epoch}
            bounced = {b for b in renewed if b in self._epochs}
            unclean = sorted(b for b in renewed if not regs[b][1])
            self._epochs = {b: epoch for b, (epoch, _) in regs.items()}
            log.info("controller: live brokers %s", live)
            if unclean:
                log.warning("controller: brokers %s registered after an unclean shutdown", unclean)
            if bounced:
                # Restarted between two looks: a failure, then a start (Kafka's broker epoch).
                await self._execute(self.core.on_broker_change(sorted(set(live) - bounced)))
            if self.core is not None:
                await self._execute(self.core.on_broker_change(live, unclean))
        elif kind == "topics":
            for name in value:
                if any(tp.topic == name for tp in self.core.assignments):
                    continue
                info = await zk_retry.call(self.zk.zk, self.zk.topic, name)
                if info is None:
                    continue
                log.info("controller: new topic %s %s", name, info.assignment)
                await self._execute(self.core.add_topic(name, info.assignment))
        elif kind == "deletions":
            for name in value:
                for tp in [tp for tp in self.core.assignments if tp.topic == name]:
                    self.core.assignments.pop(tp, None)
                    self.core.states.pop(tp, None)
                await zk_retry.call(self.zk.zk, self.zk.delete_topic_znodes, name)
                log.info("controller: deleted topic %s", name)

    async def _elect(self) -> None:
        epoch = await zk_retry.call(self.zk.zk, self.zk.try_become_controller, self.broker_id)
        if epoch is None:
            return
        log.info("broker %d is now the controller (epoch %d)", self.broker_id, epoch)
        self.core = Controller(
            epoch,
            unclean_leader_election=self.unclean,
            eligible_leader_replicas=self.eligible_leader_replicas,
            min_insync_replicas=self.min_insync_replicas,
        )
        assignments, states, written_at = await zk_retry.call(self.zk.zk, self._read_all)
        live = await zk_retry.call(self.zk.zk, self.zk.broker_ids)
        regs = await zk_retry.call(self.zk.zk, self._registrations, live)
        self._epochs = {b: e for b, (e, _) in regs.items()}
        # Registered since the state was last written: not yet taken into account by it.
        newer = {tp: [b for b, (e, _) in regs.items() if e > written_at[tp]] for tp in states}
        unclean = {tp: [b for b in bs if not regs[b][1]] for tp, bs in newer.items()}
        await self._execute(self.core.load(assignments, states, live, unclean, newer))
        self._watch_cluster()
        # Catch up with deletions requested while nobody was controller.
        for name in await zk_retry.call(self.zk.zk, self.zk.deletion_requests):
            await self._handle("deletions", [name])

    def _registrations(self, live: list[int]) -> dict[int, tuple[int, bool]]:
        """Broker epoch and clean-shutdown flag of each live broker still registered."""
        out = {}
        for b in live:
            reg = self.zk.broker_registration(b)
            if reg is not None:
                out[b] = reg
        return out

    def _read_all(
        self,
    ) -> tuple[
        dict[TopicPartition, list[int]],
        dict[TopicPartition, LeaderAndIsr],
        dict[TopicPartition, int],
    ]:
        """Assignments, partition states and the zxid of each state's last write (mzxid)."""
        assignments: dict[TopicPartition, list[int]] = {}
        states: dict[TopicPartition, LeaderAndIsr] = {}
        written_at: dict[TopicPartition, int] = {}
        for name in self.zk.topics():
            info = self.zk.topic(name)
            if info is None:
                continue
            for p, replicas in info.assignment.items():
                tp = TopicPartition(name, p)
                assignments[tp] = replicas
                try:  # one read: the state and when it was written go together
                    data, stat = self.zk.zk.get(partition_state_path(tp))
                except NoNodeError:
                    continue
                states[tp] = LeaderAndIsr.from_json(data, stat.version)
                written_at[tp] = stat.mzxid
        return assignments, states, written_at

    async def _execute(self, actions: list[ControllerAction]) -> None:
        queue = list(actions)
        while queue and self.core is not None:
            a = queue.pop(0)
            if isinstance(a, WriteStateZnode):
                ok, version = await zk_retry.call(self.zk.zk, self.zk.write_state, a)
                if ok:
                    log.info(
                        "controller: %s leader=%d epoch=%d isr=%s elr=%s",
                        a.tp,
                        a.state.leader,
                        a.state.leader_epoch,
                        list(a.state.isr),
                        list(a.state.elr),
                    )
                queue += self.core.on_write_result(a.tp, ok, version)
            elif isinstance(a, ReadStateZnode):
                st = await zk_retry.call(self.zk.zk, self.zk.partition_state, a.tp)
                if st is not None:
                    queue += self.core.on_state_read(a.tp, st)
            elif isinstance(a, WriteAssignmentZnode):
                pass  # the topic znode exists already: it is how the controller heard of it
            elif isinstance(a, NotifyBrokers):
                pass  # brokers watch the state znode; the write itself notifies them
