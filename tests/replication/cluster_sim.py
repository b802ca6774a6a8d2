"""A deterministic simulated cluster around the sans-IO cores, for tests.

One partition, brokers ``0..n-1`` all assigned. Each broker has a :class:`MemoryLog` (which
survives crashes, minus unflushed data on a lossy crash) and a :class:`Partition` (rebuilt on
restart). A simulated ZooKeeper holds the state znode (with versions) and the set of registered
brokers; a :class:`Controller` makes the decisions. Broker-to-broker and controller-to-broker
traffic goes through ``network``, a list of in-flight messages that tests deliver, drop or
reorder at will; ZooKeeper operations are synchronous. Time only moves with :meth:`advance`.

Produce requests go straight from a (never failing) client to a broker, and the client records
each acks=all success in ``acked`` as value -> offset.

Every event enters a core through the method the broker's shell (``broker/partition.py``) calls
for it: ``become_leader_or_follower``, ``on_produce``, ``on_fetch``, ``on_offsets_for_leader_epoch``,
``on_fetch_response``, ``on_isr_update_result``, ``tick``; so what hypothesis explores here is the
production path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from isrlab.broker.controller import Controller, NotifyBrokers, ReadStateZnode, WriteAssignmentZnode
from isrlab.broker.controller.controller import ControllerAction
from isrlab.broker.replication import (
    ACKS_ALL,
    Action,
    ErrorCode,
    FetchResponse,
    LeaderAndIsr,
    MemoryLog,
    OffsetsForLeaderEpochResponse,
    Partition,
    ProduceResponse,
    ReplicationConfig,
    SendFetch,
    SendOffsetsForLeaderEpoch,
    TopicPartition,
    TxnValue,
    WriteStateZnode,
)

TP = TopicPartition("t", 0)


@dataclass
class Message:
    """Something in flight between two brokers (or from the controller, src -1)."""

    kind: str  # fetch | fetch_response | epoch | epoch_response | leader_and_isr
    src: int
    dst: int
    body: Any

    @property
    def droppable(self) -> bool:
        # The controller's channel retries until delivery; only data-plane traffic is lost.
        return self.kind != "leader_and_isr"


class SimCluster:
    """See the module docstring."""

    def __init__(
        self,
        n_brokers: int = 3,
        config: ReplicationConfig | None = None,
        unclean_leader_election: bool = False,
        produce_timeout_ms: int = 30_000,
        partition_class: type[Partition] = Partition,
    ) -> None:
        self.brokers = tuple(range(n_brokers))
        self.partition_class = partition_class
        self.config = config or ReplicationConfig()
        self.produce_timeout_ms = produce_timeout_ms
        self.now = 0
        self.logs = {b: MemoryLog() for b in self.brokers}
        self.alive = dict.fromkeys(self.brokers, True)
        self.registered = set(self.brokers)
        self.partitions: dict[int, Partition] = {
            b: partition_class(TP, b, self.logs[b], self.config) for b in self.brokers
        }
        self.zk_state: LeaderAndIsr | None = None
        self.network: list[Message] = []
        self.isolated: set[int] = set()
        self.controller = Controller(
            1,
            unclean_leader_election,
            eligible_leader_replicas=self.config.eligible_leader_replicas_enable,
            min_insync_replicas=self.config.min_insync_replicas,
        )
        # Brokers whose last stop was a crash: they register with an unclean shutdown.
        self.crashed: set[int] = set()
        self.acked: dict[int, int] = {}
        self.acked_acks1: dict[int, int] = {}
        self.produce_errors: dict[int, ErrorCode] = {}
        self._produce_acks: dict[int, int] = {}
        self._next_value = 0
        self.trace: list[str] = []
        self._run_controller(self.controller.on_broker_change(self.registered))
        self._run_controller(self.controller.add_topic(TP.topic, {TP.partition: self.brokers}))

    # ------------------------------------------------------------------ ZooKeeper
    def _cas(self, write: WriteStateZnode) -> tuple[bool, int]:
        current = self.zk_state
        if write.expected_version is None:
            ok = current is None
        else:
            ok = current is not None and current.zk_version == write.expected_version
        if not ok:
            return False, current.zk_version if current else -1
        version = 0 if current is None else current.zk_version + 1
        self.zk_state = replace(write.state, zk_version=version)
        return True, version

    def _run_controller(self, actions: list[ControllerAction]) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, WriteStateZnode):
                ok, version = self._cas(action)
                self.trace.append(f"controller write {action.state} ok={ok}")
                queue += self.controller.on_write_result(action.tp, ok, version)
            elif isinstance(action, ReadStateZnode):
                assert self.zk_state is not None
                queue += self.controller.on_state_read(action.tp, self.zk_state)
            elif isinstance(action, NotifyBrokers):
                for b in action.brokers:
                    self.network.append(
                        Message("leader_and_isr", -1, b, (action.state, action.replicas))
                    )
            elif isinstance(action, WriteAssignmentZnode):
                pass  # the assignment lives in the controller already

    # ------------------------------------------------------------------ broker actions
    def _run_broker(self, b: int, actions: list[Action]) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, SendFetch):
                self.network.append(Message("fetch", b, action.leader_id, action))
            elif isinstance(action, SendOffsetsForLeaderEpoch):
                self.network.append(Message("epoch", b, action.leader_id, action))
            elif isinstance(action, FetchResponse):
                records = self.logs[b].read(action.fetch_offset, action.records_end)
                self.network.append(
                    Message("fetch_response", b, action.replica_id, (action, records))
                )
            elif isinstance(action, ProduceResponse):
                self._on_produce_response(action)
            elif isinstance(action, WriteStateZnode):
                ok, version = self._cas(action)
                self.trace.append(f"leader {b} isr write {action.state.isr} ok={ok}")
                queue += self.partitions[b].on_isr_update_result(
                    ok, version, self.now, action.state
                )
                if ok:
                    self._run_controller(self.controller.on_isr_change_notification([TP]))

    def _on_produce_response(self, response: ProduceResponse) -> None:
        value = response.request_id
        acks = self._produce_acks.pop(value, None)
        if response.error is ErrorCode.NONE:
            if acks == ACKS_ALL:
                self.acked[value] = response.base_offset
            else:
                self.acked_acks1[value] = response.base_offset
        else:
            self.produce_errors[value] = response.error

    # ------------------------------------------------------------------ steps
    def produce(
        self,
        broker: int | None = None,
        acks: int = ACKS_ALL,
        txn: tuple[int, str | None] | None = None,
    ) -> int | None:
        """Produce a fresh value to ``broker`` (default: the leader in ZooKeeper); ``txn``
        (producer id, None or "commit"/"abort") makes it transactional data or a marker."""
        if broker is None:
            broker = self.zk_state.leader if self.zk_state else -1
        if broker < 0 or not self.alive.get(broker, False):
            return None
        value = self._next_value
        self._next_value += 1
        self._produce_acks[value] = acks
        record = value if txn is None else TxnValue(value, txn[0], txn[1])
        actions = self.partitions[broker].on_produce(
            value, [record], acks, self.produce_timeout_ms, self.now
        )
        self.trace.append(f"produce {record!r} acks={acks} to {broker}")
        self._run_broker(broker, actions)
        return value

    def deliver(self, index: int = 0) -> Message:
        """Deliver the ``index``-th in-flight message."""
        msg = self.network.pop(index)
        if msg.droppable and (msg.src in self.isolated) != (msg.dst in self.isolated):
            self.trace.append(f"lost across partition {msg.kind} {msg.src}->{msg.dst}")
            return msg
        self.trace.append(f"deliver {msg.kind} {msg.src}->{msg.dst}")
        if not self.alive[msg.dst]:
            return msg
        b, p = msg.dst, self.partitions[msg.dst]
        if msg.kind == "leader_and_isr":
            state, replicas = msg.body
            self._run_broker(b, p.become_leader_or_follower(state, replicas, self.now))
        elif msg.kind == "fetch":
            f: SendFetch = msg.body
            self._run_broker(
                b,
                p.on_fetch(
                    f.replica_id,
                    f.fetch_offset,
                    f.current_leader_epoch,
                    self.now,
                    request_id=f.request_id,
                    max_wait_ms=f.max_wait_ms,
                ),
            )
        elif msg.kind == "epoch":
            e: SendOffsetsForLeaderEpoch = msg.body
            reply = p.on_offsets_for_leader_epoch(e.current_leader_epoch, e.leader_epoch)
            self.network.append(Message("epoch_response", b, msg.src, (e.request_id, reply)))
        elif msg.kind == "fetch_response":
            r, records = msg.body
            self._run_broker(
                b,
                p.on_fetch_response(
                    r.request_id,
                    r.error,
                    records,
                    r.high_watermark,
                    r.log_start_offset,
                    r.log_end_offset,
                    self.now,
                ),
            )
        elif msg.kind == "epoch_response":
            request_id, reply = msg.body
            assert isinstance(reply, OffsetsForLeaderEpochResponse)
            self._run_broker(
                b,
                p.on_offsets_for_leader_epoch_response(
                    request_id, reply.error, reply.leader_epoch, reply.end_offset, self.now
                ),
            )
        return msg

    def deliver_all(self, max_messages: int = 200) -> None:
        """Deliver in order until the network is quiet (or ``max_messages`` were delivered)."""
        for _ in range(max_messages):
            if not self.network:
                return
            self.deliver(0)

    def find(self, kind: str, src: int | None = None, dst: int | None = None) -> int:
        """Index of the first in-flight message matching; raises LookupError if none."""
        for i, m in enumerate(self.network):
            if m.kind == kind and src in (None, m.src) and dst in (None, m.dst):
                return i
        raise LookupError(f"no {kind} message {src}->{dst} in flight: {self.network}")

    def deliver_where(self, kind: str, src: int | None = None, dst: int | None = None) -> Message:
        return self.deliver(self.find(kind, src, dst))

    def drop_where(self, kind: str, src: int | None = None, dst: int | None = None) -> Message:
        return self.drop(self.find(kind, src, dst))

    def drop(self, index: int = 0) -> Message:
        msg = self.network.pop(index)
        self.trace.append(f"drop {msg.kind} {msg.src}->{msg.dst}")
        return msg

    def advance(self, ms: int) -> None:
        """Let ``ms`` of simulated time pass and tick every live broker. Each tick is held to
        the partition's ``next_tick_ms`` (what lets the broker's shell skip ticks): a tick
        before that time must do nothing."""
        due = {b: self.partitions[b].next_tick_ms(self.now) for b in self.brokers}
        self.now += ms
        self.trace.append(f"advance {ms} -> {self.now}")
        for b in self.brokers:
            if self.alive[b]:
                actions = self.partitions[b].tick(self.now)
                at = due[b]
                assert actions == [] or (at is not None and self.now >= at), (
                    f"broker {b}: next_tick_ms said {at}, but tick({self.now}) gave {actions}"
                )
                self._run_broker(b, actions)

    def crash(self, b: int, lose_unflushed: bool = False) -> None:
        """Kill broker ``b``; its ZooKeeper session lives on until :meth:`expire`."""
        self.alive[b] = False
        self.crashed.add(b)
        self.network = [m for m in self.network if b not in (m.src, m.dst)]
        if lose_unflushed:
            self.logs[b].crash()
        self.trace.append(f"crash {b} lose_unflushed={lose_unflushed}")

    def shutdown(self, b: int) -> None:
        """Stop broker ``b`` cleanly: its log is flushed, its session closed at once (the
        controller hears of it), and it registers next time after a clean shutdown."""
        self.logs[b].flush()
        self.alive[b] = False
        self.crashed.discard(b)
        self.network = [m for m in self.network if b not in (m.src, m.dst)]
        self.trace.append(f"shutdown {b}")
        self.expire(b)

    def isolate(self, b: int) -> None:
        """Cut ``b`` off from the brokers outside the isolated group (ZooKeeper unaffected)."""
        self.isolated.add(b)
        self.trace.append(f"isolate {b} -> {sorted(self.isolated)}")

    def heal(self) -> None:
        self.isolated.clear()
        self.trace.append("heal")

    def session_expiry(self, b: int) -> None:
        """Live broker ``b`` loses its ZooKeeper session (a long GC pause, a partition from
        ZooKeeper) and re-registers: the controller handles a failure then a startup while
        ``b`` keeps running on its old state until the new LeaderAndIsr reaches it."""
        self.trace.append(f"session expiry of live broker {b}")
        self._run_controller(self.controller.on_broker_change(self.registered - {b}))
        self._run_controller(self.controller.on_broker_change(self.registered))

    def expire(self, b: int) -> None:
        """ZooKeeper expires dead broker ``b``'s session: the controller hears of it."""
        self.registered.discard(b)
        self.trace.append(f"expire {b}")
        self._run_controller(self.controller.on_broker_change(self.registered))

    def restart(self, b: int, noticed: bool = True) -> None:
        """Start broker ``b`` again from its log. A bounce the controller had not yet noticed
        is handled as failure + startup, as Kafka's controller does since 1.1; with
        ``noticed=False`` the controller misses it (a restart within the session timeout,
        KAFKA-1120) and the broker only reads its partition state from ZooKeeper."""
        self.alive[b] = True
        self.partitions[b] = self.partition_class(TP, b, self.logs[b], self.config)
        unclean = {b} & self.crashed
        self.crashed.discard(b)
        self.trace.append(f"restart {b} noticed={noticed} unclean={bool(unclean)}")
        if not noticed and b in self.registered:
            assert self.zk_state is not None
            self.network.append(Message("leader_and_isr", -1, b, (self.zk_state, self.brokers)))
            return
        if b in self.registered:
            self._run_controller(self.controller.on_broker_change(self.registered - {b}))
        self.registered.add(b)
        self._run_controller(self.controller.on_broker_change(self.registered, unclean))

    def flush(self, b: int) -> None:
        self.logs[b].flush()

    def settle(self, rounds: int = 5, step_ms: int = 600) -> None:
        """Let the cluster converge: deliver everything, pass a little time, repeat."""
        for _ in range(rounds):
            self.deliver_all()
            self.advance(step_ms)
        self.deliver_all()

    # ------------------------------------------------------------------ views
    def leader(self) -> int | None:
        """The broker ZooKeeper names leader, if it is alive and acts as leader of that epoch."""
        st = self.zk_state
        if st is None or st.leader < 0 or not self.alive[st.leader]:
            return None
        p = self.partitions[st.leader]
        if not p.is_leader or p.leader_epoch != st.leader_epoch:
            return None
        return st.leader

    def values(self, b: int) -> list[Any]:
        return [v for v, _ in self.logs[b].read(0, self.logs[b].log_end_offset)]
