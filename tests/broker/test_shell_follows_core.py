"""The broker's shells decide nothing about replication: a differential test.

A real standalone `KafkaServer`, in-process (requests go through the broker's own codec, its API
handlers, the ReplicaManager, `HostedPartition` and an on-disk `Log`; only the socket is left
out), and the replication core alone (a `Partition` over a `MemoryLog`) are given the same inputs:
partition states (leader epoch, ISR out of replicas 0, 1, 2, leader or follower) under any
min.insync.replicas, produces with acks 0/1/all, follower and consumer fetches at any offset with
any current leader epoch and isolation level, ListOffsets and OffsetForLeaderEpoch. Both keep
their ISR in a `LocalStateStore` (compare-and-set, like the znode). Every answer must agree:
error codes, offsets, high watermark, last stable offset, the offsets a fetch serves, and whether
and how each produce has completed after every step.

So a shell that re-checks a rule itself (ISR size against min.insync.replicas, a fetch bound, a
leader epoch) or goes around the core answers differently for some input, and hypothesis finds
it: e.g. a produce check with `<=` instead of `<` fails at |ISR| == min.insync.replicas.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kafka.protocol.api_header import ResponseClassRegistry
from kafka.protocol.consumer import OffsetForLeaderEpochRequest
from kafka.protocol.producer import ProduceResponse as WireProduceResponse

from isrlab.broker.config import BrokerConfig
from isrlab.broker.log.control import build_control_batch
from isrlab.broker.log.record_batch import iter_batches
from isrlab.broker.network.codec import decode_request
from isrlab.broker.replica_manager import LocalStateStore
from isrlab.broker.replication import (
    Action,
    LeaderAndIsr,
    MemoryLog,
    Partition,
    ProduceResponse,
    ReplicationConfig,
    TopicPartition,
    TxnValue,
    WriteStateZnode,
)
from isrlab.broker.server import KafkaServer
from tests.broker.rawclient import build_batch, fetch_request, list_offsets_request, produce_req

TOPIC = "diff"
TP = TopicPartition(TOPIC, 0)
REPLICAS = (0, 1, 2)
PRODUCE_TIMEOUT_MS = 600_000  # nothing may time out: neither side is ticked

# A current leader epoch relative to the partition's: -1 skips the check.
EPOCHS = st.sampled_from(["current", "current", "none", "older", "newer"])
# A fetch offset: the log end, the high watermark, or a number (past the end included).
OFFSETS = st.one_of(st.sampled_from(["leo", "leo", "hw"]), st.integers(min_value=-1, max_value=8))


def _served_offsets(records: bytes | None) -> list[int]:
    return [
        offset
        for batch in iter_batches(bytes(records or b""))
        for offset in range(batch.base_offset, batch.next_offset)
    ]


class ShellFollowsCore(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="isrlab-diff-")
        self.correlation_id = 0
        self.now = 0
        self.value = 0
        self.server: KafkaServer | None = None
        self.twin: Partition | None = None
        self.twin_store = LocalStateStore()
        # request id -> (the shell's handler task, acks); the twin's answers by request id
        self.produces: dict[int, tuple[asyncio.Task[Any], int]] = {}
        self.twin_answers: dict[int, ProduceResponse] = {}
        self.waiting: set[int] = set()  # acks=all produces not answered at once
        # transactional appends (data from producers 1 and 2, markers from "the coordinator"),
        # through ReplicaManager.append: value -> (task, acks); and the next sequence per pid
        self.txn_appends: dict[int, tuple[asyncio.Task[Any], int]] = {}
        self.sequences: dict[int, int] = {}

    # ------------------------------------------------------------------ plumbing
    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _settle(self) -> None:
        # Let spawned work run: ISR writes to the state store and their results, handler tasks.
        for _ in range(10):
            await asyncio.sleep(0)

    def _call(self, request: Any) -> Any:
        """One request through the broker's codec and handlers; the decoded response."""
        assert self.server is not None
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="diff")
        decoded = decode_request(bytes(request.encode(header=True)))
        parts = self._run(self.server.handle(decoded, None))  # type: ignore[arg-type]
        self._run(self._settle())
        cls = ResponseClassRegistry._response_class_registry[request.API_KEY]
        return cls[request.API_VERSION].decode(b"".join(parts)[4:], header=True)

    def _twin(self, actions: list[Action]) -> list[Action]:
        """Carry out the twin core's actions as a minimal shell would; returns the rest."""
        assert self.twin is not None
        rest: list[Action] = []
        queue = list(actions)
        while queue:
            a = queue.pop(0)
            if isinstance(a, ProduceResponse):
                self.twin_answers[a.request_id] = a
            elif isinstance(a, WriteStateZnode):
                ok, version = self._run(self.twin_store.write_state(a))
                queue += self.twin.on_isr_update_result(ok, version, self._tick(), a.state)
            else:
                rest.append(a)  # fetch answers, follower requests (never delivered here)
        return rest

    def _tick(self) -> int:
        self.now += 1
        return self.now

    def _epoch(self, choice: str) -> int:
        assert self.twin is not None
        current = self.twin.leader_epoch
        return {"none": -1, "current": current, "older": current - 1, "newer": current + 1}[choice]

    def _offset(self, choice: int | str) -> int:
        assert self.twin is not None
        if choice == "leo":
            return self.twin.log_end_offset
        if choice == "hw":
            return self.twin.high_watermark
        assert isinstance(choice, int)
        return choice

    # ------------------------------------------------------------------ rules
    @initialize(
        min_isr=st.integers(min_value=1, max_value=3),
        others=st.frozensets(st.sampled_from(REPLICAS)),
    )
    def start(self, min_isr: int, others: frozenset[int]) -> None:
        """A standalone broker with the partition; then it leads replicas 0, 1, 2 (epoch 1)."""
        log_dir = Path(self.tmp.name) / "logs"
        config = BrokerConfig(
            {
                "broker.id": "0",
                "log.dirs": str(log_dir),
                "listeners": "PLAINTEXT://127.0.0.1:19092",  # never bound: no socket here
                "zero.copy.threshold.bytes": "0",
            }
        )
        self.server = KafkaServer(config)
        self._run(
            self.server.create_topic(TOPIC, 1, 1, None, {"min.insync.replicas": str(min_isr)})
        )
        hp = self.server.replica_manager.get((TOPIC, 0))
        # The twin starts as the standalone broker started its replica: leader, ISR = {self}.
        self.twin = Partition(TP, 0, MemoryLog(), ReplicationConfig(min_insync_replicas=min_isr))
        self._twin(
            self.twin.become_leader_or_follower(
                LeaderAndIsr(0, hp.leader_epoch, (0,), 0, 0), [0], self._tick()
            )
        )
        self.partition_state(0, 1, others)

    @rule(
        leader=st.sampled_from([0, 0, 0, 1]),
        bump=st.integers(min_value=-1, max_value=2),
        others=st.frozensets(st.sampled_from(REPLICAS)),
    )
    def partition_state(self, leader: int, bump: int, others: frozenset[int]) -> None:
        """A state from the controller: this broker leads (0) or follows (1), at an older
        (stale), the same or a newer leader epoch, with any ISR holding the leader. A state of
        the same epoch is first written to the znode (both stores), so it comes with a newer
        version, as an ISR change someone else wrote does."""
        assert self.server is not None and self.twin is not None
        shell_store = self.server.replica_manager.state_store
        assert isinstance(shell_store, LocalStateStore)
        version = self.twin_store.versions.get(TP, 0)
        assert shell_store.versions.get(TP, 0) == version
        isr = tuple(sorted(others | {leader}))
        state = LeaderAndIsr(leader, self.twin.leader_epoch + bump, isr, 1, zk_version=version)
        if bump == 0:
            write = WriteStateZnode(TP, state, expected_version=version)
            for store in (shell_store, self.twin_store):
                ok, new_version = self._run(store.write_state(write))
                assert ok
            state = replace(state, zk_version=new_version)
        server = self.server

        async def become() -> None:  # the shell spawns follower requests on the running loop
            server.replica_manager.become((TOPIC, 0), state, list(REPLICAS))
            await self._settle()

        self._run(become())
        self._twin(self.twin.become_leader_or_follower(state, REPLICAS, self._tick()))

    @rule(acks=st.sampled_from([-1, 0, 1]))
    def produce(self, acks: int) -> None:
        assert self.server is not None and self.twin is not None
        self.value += 1
        self.correlation_id += 1
        request = produce_req(
            TOPIC, build_batch([b"v%d" % self.value]), acks, timeout_ms=PRODUCE_TIMEOUT_MS
        )
        request.with_header(correlation_id=self.correlation_id, client_id="diff")
        decoded = decode_request(bytes(request.encode(header=True)))
        task = self.loop.create_task(self.server.handle(decoded, None))  # type: ignore[arg-type]
        self._run(self._settle())
        self.produces[self.value] = (task, acks)
        self.waiting.update([self.value] if not task.done() else [])
        self._twin(
            self.twin.on_produce(self.value, [self.value], acks, PRODUCE_TIMEOUT_MS, self._tick())
        )
        answer = self.twin_answers.get(self.value)
        event(f"produce acks={acks}: {answer.error.name if answer else 'no answer yet'}")

    @rule(
        pid=st.sampled_from([1, 2]),
        kind=st.sampled_from(["data", "data", "commit", "abort"]),
        acks=st.sampled_from([-1, 1]),
    )
    def transactional(self, pid: int, kind: str, acks: int) -> None:
        """Transactional data of producer ``pid`` (a client's) or its transaction marker
        (written as the transaction coordinator writes it); the twin gets a TxnValue."""
        assert self.server is not None and self.twin is not None
        self.value += 1
        if kind == "data":
            seq = self.sequences.get(pid, 0)
            batch = build_batch(
                [b"t%d" % self.value],
                transactional=True,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq,
            )
            origin = "client"
        else:
            batch = build_control_batch(pid, 0, kind == "commit", 0, 1)
            origin = "coordinator"
        hp = self.server.replica_manager.get((TOPIC, 0))
        leo = hp.log.log_end_offset
        server = self.server

        async def append() -> Any:
            result = server.replica_manager.append(
                (TOPIC, 0), memoryview(batch), acks, PRODUCE_TIMEOUT_MS, origin=origin
            )
            return await result if isinstance(result, asyncio.Future) else result

        task = self.loop.create_task(append())
        self._run(self._settle())
        if kind == "data" and hp.log.log_end_offset != leo:
            self.sequences[pid] = self.sequences.get(pid, 0) + 1
        self.txn_appends[self.value] = (task, acks)
        record = TxnValue(self.value, pid, None if kind == "data" else kind)
        self._twin(
            self.twin.on_produce(self.value, [record], acks, PRODUCE_TIMEOUT_MS, self._tick())
        )
        event(f"transactional {kind}")

    @rule(
        replica=st.sampled_from([1, 2, -1]),
        offset=OFFSETS,
        epoch=EPOCHS,
        read_committed=st.booleans(),
    )
    def fetch(self, replica: int, offset: int | str, epoch: str, read_committed: bool) -> None:
        """A follower's fetch (its acknowledgement) or a consumer's."""
        assert self.twin is not None
        fetch_offset, current_epoch = self._offset(offset), self._epoch(epoch)
        request = fetch_request(
            TOPIC,
            offset=fetch_offset,
            replica_id=replica,
            current_leader_epoch=current_epoch,
            isolation_level=int(read_committed),
        )
        shell = self._call(request).responses[0].partitions[0]
        (twin,) = self._twin(
            self.twin.on_fetch(
                replica,
                fetch_offset,
                current_epoch,
                self._tick(),
                read_committed=read_committed,
            )
        )
        assert (shell.error_code, shell.high_watermark, shell.log_start_offset) == (
            int(twin.error),
            twin.high_watermark,
            twin.log_start_offset,
        )
        event(f"fetch by {'follower' if replica >= 0 else 'consumer'}: {twin.error.name}")
        assert shell.last_stable_offset == twin.last_stable_offset
        assert _served_offsets(shell.records) == list(range(fetch_offset, twin.records_end))

    @rule(
        timestamp=st.sampled_from([-1, -2]),
        replica=st.sampled_from([-1, 1]),
        epoch=EPOCHS,
        read_committed=st.booleans(),
    )
    def list_offsets(self, timestamp: int, replica: int, epoch: str, read_committed: bool) -> None:
        assert self.twin is not None
        current_epoch = self._epoch(epoch)
        request = list_offsets_request(
            TOPIC,
            {0: timestamp},
            replica_id=replica,
            current_leader_epoch=current_epoch,
            isolation_level=int(read_committed),
        )
        shell = self._call(request).topics[0].partitions[0]
        twin = self.twin.on_list_offsets(current_epoch, replica, read_committed)
        event(f"list offsets: {twin.error.name}")
        assert shell.error_code == int(twin.error)
        if not twin.error:
            assert shell.offset == (twin.earliest if timestamp == -2 else twin.latest)
            assert shell.leader_epoch == twin.leader_epoch

    @rule(epoch=EPOCHS, asked=st.integers(min_value=-1, max_value=5))
    def offsets_for_leader_epoch(self, epoch: str, asked: int) -> None:
        assert self.twin is not None
        current_epoch = self._epoch(epoch)
        R = OffsetForLeaderEpochRequest[3]
        request = R(
            replica_id=1,
            topics=[
                R.OffsetForLeaderTopic(
                    topic=TOPIC,
                    partitions=[
                        R.OffsetForLeaderTopic.OffsetForLeaderPartition(
                            partition=0, current_leader_epoch=current_epoch, leader_epoch=asked
                        )
                    ],
                )
            ],
        )
        shell = self._call(request).topics[0].partitions[0]
        twin = self.twin.on_offsets_for_leader_epoch(current_epoch, asked)
        assert (shell.error_code, shell.leader_epoch, shell.end_offset) == (
            int(twin.error),
            twin.leader_epoch,
            twin.end_offset,
        )

    # ------------------------------------------------------------------ invariants
    @invariant()
    def produces_complete_alike(self) -> None:
        """Every produce has completed on both sides or on neither, with the same answer."""
        for value, (task, acks) in self.produces.items():
            twin = self.twin_answers.get(value)
            if acks == 0:
                assert task.done() and task.result() is None  # acks=0: never a response
                continue
            assert task.done() == (twin is not None), f"produce {value} acks={acks}"
            if twin is not None:
                frame = b"".join(task.result())[4:]
                p = WireProduceResponse[8].decode(frame, header=True).responses[0]
                p = p.partition_responses[0]
                assert p.error_code == int(twin.error), f"produce {value} acks={acks}"
                if not twin.error:
                    assert p.base_offset == twin.base_offset
                if value in self.waiting:
                    self.waiting.discard(value)
                    event(f"produce acks=-1 answered after waiting: {twin.error.name}")

    @invariant()
    def transactional_appends_complete_alike(self) -> None:
        for value, (task, acks) in self.txn_appends.items():
            twin = self.twin_answers.get(value)
            assert task.done() == (twin is not None), f"transactional append {value} acks={acks}"
            if twin is not None:
                assert int(task.result().error) == int(twin.error), f"append {value}"
                if not twin.error:
                    assert task.result().base_offset == twin.base_offset

    @invariant()
    def same_log_end_and_high_watermark(self) -> None:
        if self.server is not None and self.twin is not None:
            hp = self.server.replica_manager.get((TOPIC, 0))
            assert (hp.log.log_end_offset, hp.high_watermark) == (
                self.twin.log_end_offset,
                self.twin.high_watermark,
            )

    def teardown(self) -> None:
        if self.server is not None:
            for task, _ in [*self.produces.values(), *self.txn_appends.values()]:
                task.cancel()
            self._run(self.server.replica_manager.stop())
            self.server.log_manager.close()
        self.loop.close()
        self.tmp.cleanup()


ShellFollowsCore.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_shell_follows_core = ShellFollowsCore.TestCase
