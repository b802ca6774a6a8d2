"""An in-memory Kafka for the eos workload's unit tests: just the confluent-kafka calls the
queue and eos clients make, with Kafka's transactional rules.

`FakeKafka` holds partition logs, one consumer group and the transaction coordinator's
state. `install(monkeypatch)` makes the clients' `Producer` and `Consumer` its fakes.

- Producer: `init_transactions` bumps the transactional id's epoch and aborts the
  transaction the id left open (zombie fencing); a producer of an older epoch is fenced
  (a fatal `_FENCED`); transactional records stay invisible to read_committed consumers
  until committed (the first open record is the last stable offset); `abort_transaction`
  aborts them (they keep their offsets); `send_offsets_to_transaction` is refused with an
  abortable ILLEGAL_GENERATION when the consumer's group metadata is of an old generation
  (KIP-447), and its offsets are committed to the group with the transaction.
- Consumer: `subscribe` joins the group; a join or a member going away (its consumer
  object garbage collected: it stopped heartbeating) starts a new generation, and every
  member goes through an eager rebalance (revoke everything, assign its share, round robin)
  in its next poll; positions start at the group's committed offsets (else the
  beginning), once no open transaction holds offsets of the assigned partitions (KIP-447's
  require_stable: the assignment waits); a consumer commit of an old generation is refused
  (ILLEGAL_GENERATION).
- Faults: `hang` (set: send_offsets_to_transaction, commit_transaction and
  abort_transaction block until `released` is set), `send_errors` (the delivery reports of the
  next sends: a KafkaError, None for a normal delivery, "never" for no report at all),
  `commit_errors` (raised by the next `commit_transaction`), `abort_errors` (by the next
  `abort_transaction`), `offsets_errors` (by the next `send_offsets_to_transaction`);
  `committed_errors` (by the next consumer `committed`).
- A transaction whose producer object is gone stays open, as after a kill -9, until a
  producer with its id initialises, or until `expire_dead()` (the coordinator's
  transaction timeout) aborts it.
"""

from __future__ import annotations

import itertools
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

_INVALID = -1001


@dataclass
class Record:
    offset: int
    value: bytes
    txn: tuple[str, int] | None = None  # (transactional id, epoch) of an open/ended txn
    state: str = "committed"  # "open" | "committed" | "aborted"


@dataclass
class _Txn:
    epoch: int = 0
    records: list[Record] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    owner: Any = None  # weakref to the producer that holds the open transaction


class FakeKafka:
    def __init__(self, keys: list[str], transactions: bool = True) -> None:
        self.lock = threading.RLock()
        self.logs: dict[tuple[str, int], list[Record]] = {}
        for k in keys:
            t, _, p = k.rpartition("/")
            self.logs[(t, int(p))] = []
        self.transactions = transactions
        self.txns: dict[str, _Txn] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.generation = 0
        self.members: list[weakref.ref[FakeConsumer]] = []
        self.topics: set[str] = set()
        self.send_errors: list[KafkaError | str | None] = []
        self.commit_errors: list[KafkaError] = []
        self.abort_errors: list[KafkaError] = []
        self.offsets_errors: list[KafkaError] = []
        self.committed_errors: list[KafkaError] = []
        # set: transactional calls block until it is cleared (librdkafka past its timeouts)
        self.hang = threading.Event()
        self.released = threading.Event()
        self.calls: list[str] = []
        self._ids = itertools.count()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
        from isrlab.harness.workloads.queue import client as qc

        monkeypatch.setattr(qc, "Producer", lambda conf: FakeProducer(self, conf))
        monkeypatch.setattr(qc, "Consumer", lambda conf: FakeConsumer(self, conf))
        return self

    # -- the group

    def live_members(self) -> list[FakeConsumer]:
        alive = [m() for m in self.members]
        live = [m for m in alive if m is not None]
        if len(live) != len(self.members):
            self.members = [weakref.ref(m) for m in live]
            self.rebalance()
        return live

    def join(self, member: FakeConsumer) -> None:
        with self.lock:
            self.members.append(weakref.ref(member))
            self.topics |= set(member.topics)
            self.rebalance()

    def rebalance(self) -> None:
        self.generation += 1
        live = [m for m in (r() for r in self.members) if m is not None]
        parts = sorted(tp for tp in self.logs if tp[0] in self.topics)
        for i, m in enumerate(live):
            m.pending = (self.generation, parts[i :: len(live)])

    # -- records

    def visible(self, tp: tuple[str, int], pos: int, committed_only: bool) -> list[Record]:
        out = []
        for r in self.logs[tp][pos:]:
            if r.state == "open" and committed_only and r.txn is not None:
                txn = self.txns[r.txn[0]]
                if txn.owner is not None and txn.owner() is not None:
                    break  # the last stable offset
                # its producer is gone: the coordinator's transaction timeout aborts it
                # (taken as already expired)
                self.expire_dead()
            if r.state == "aborted" and committed_only:
                continue
            out.append(r)
        return out

    def expire_dead(self) -> int:
        """Abort the open transactions whose producer is gone (the transaction timeout)."""
        n = 0
        with self.lock:
            for txn in self.txns.values():
                if txn.records and (txn.owner is None or txn.owner() is None):
                    for r in txn.records:
                        r.state = "aborted"
                    txn.records, txn.offsets = [], {}
                    n += 1
        return n

    def values(self, topic: str, committed_only: bool = True) -> list[int]:
        """Every value of topic's partitions a read_committed (or uncommitted) reader sees."""
        with self.lock:
            return [
                int(r.value)
                for tp in sorted(self.logs)
                if tp[0] == topic
                for r in self.visible(tp, 0, committed_only)
            ]


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        self._t, self._p, self._o, self._v = topic, partition, offset, value

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes:
        return self._v

    def error(self) -> None:
        return None


class FakeProducer:
    def __init__(self, kafka: FakeKafka, conf: dict[str, Any]) -> None:
        self.kafka = kafka
        self.tid: str | None = conf.get("transactional.id")
        self.epoch = -1
        self.in_txn = False
        self._reports: list[tuple[Callable[..., None], KafkaError | None, FakeMessage]] = []

    def _fenced(self) -> None:
        assert self.tid is not None
        if self.kafka.txns[self.tid].epoch != self.epoch:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    def init_transactions(self, timeout: float) -> None:
        k = self.kafka
        if not k.transactions or self.tid is None:
            raise KafkaException(KafkaError(KafkaError._UNSUPPORTED_FEATURE, "no transactions"))
        with k.lock:
            txn = k.txns.setdefault(self.tid, _Txn(epoch=-1))
            txn.epoch += 1
            for r in txn.records:  # the zombie's transaction is aborted
                r.state = "aborted"
            txn.records, txn.offsets, txn.owner = [], {}, None
            self.epoch = txn.epoch
            k.calls.append(f"init {self.tid} {self.epoch}")

    def begin_transaction(self) -> None:
        with self.kafka.lock:
            self._fenced()
            self.in_txn = True
            self.kafka.txns[self.tid or ""].owner = weakref.ref(self)

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: Any) -> None:
        k = self.kafka
        with k.lock:
            report = k.send_errors.pop(0) if k.send_errors else None
            if isinstance(report, str):  # "never": no delivery report at all
                return
            if report is not None:
                self._reports.append(
                    (on_delivery, report, FakeMessage(topic, partition, -1, value))
                )
                return
            log = k.logs[(topic, partition)]
            rec = Record(len(log), value)
            if self.tid is not None and self.in_txn:
                self._fenced()
                rec.txn, rec.state = (self.tid, self.epoch), "open"
                k.txns[self.tid].records.append(rec)
            log.append(rec)
            self._reports.append(
                (on_delivery, None, FakeMessage(topic, partition, rec.offset, value))
            )

    def poll(self, timeout: float) -> int:
        reports, self._reports = self._reports, []
        for cb, err, msg in reports:
            cb(err, msg)
        return len(reports)

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], meta: bytes, timeout: float
    ) -> None:
        k = self.kafka
        if k.hang.is_set():
            k.released.wait()
        with k.lock:
            self._fenced()
            if k.offsets_errors:
                raise KafkaException(k.offsets_errors.pop(0))
            (gen,) = struct.unpack_from("=i", meta, 7)
            if gen != k.generation:
                raise KafkaException(
                    KafkaError(
                        KafkaError.ILLEGAL_GENERATION, "old generation", txn_requires_abort=True
                    )
                )
            txn = k.txns[self.tid or ""]
            for tp in offsets:
                txn.offsets[(tp.topic, tp.partition)] = tp.offset

    def commit_transaction(self, timeout: float) -> None:
        k = self.kafka
        if k.hang.is_set():
            k.released.wait()
        with k.lock:
            self._fenced()
            if k.commit_errors:
                raise KafkaException(k.commit_errors.pop(0))
            txn = k.txns[self.tid or ""]
            for r in txn.records:
                r.state = "committed"
            k.committed.update(txn.offsets)
            k.calls.append(f"commit {self.tid} {len(txn.records)}")
            txn.records, txn.offsets, txn.owner = [], {}, None
            self.in_txn = False

    def abort_transaction(self, timeout: float) -> None:
        k = self.kafka
        if k.hang.is_set():
            k.released.wait()
        with k.lock:
            self._fenced()
            if k.abort_errors:
                raise KafkaException(k.abort_errors.pop(0))
            txn = k.txns[self.tid or ""]
            for r in txn.records:
                r.state = "aborted"
            k.calls.append(f"abort {self.tid} {len(txn.records)}")
            txn.records, txn.offsets, txn.owner = [], {}, None
            self.in_txn = False

    def purge(self, **kw: Any) -> None:
        self._reports = []

    def flush(self, timeout: float) -> int:
        return 0


class FakeConsumer:
    def __init__(self, kafka: FakeKafka, conf: dict[str, Any]) -> None:
        self.kafka = kafka
        self.committed_only = conf.get("isolation.level") == "read_committed"
        self.positions: dict[tuple[str, int], int] = {}
        self.topics: list[str] = []
        self.callbacks: dict[str, Any] = {}
        self.pending: tuple[int, list[tuple[str, int]]] | None = None
        self.generation = -1
        self.id = next(kafka._ids)

    # group membership
    def subscribe(
        self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None
    ) -> None:
        self.topics = list(topics)
        self.callbacks = {"assign": on_assign, "revoke": on_revoke}
        self.kafka.join(self)

    def consumer_group_metadata(self) -> bytes:
        return b"CGMDv2:" + struct.pack("=i", self.generation) + b"\x00" * 8

    def _serve_rebalance(self) -> None:
        k = self.kafka
        with k.lock:
            k.live_members()  # members that went away start a new generation
            if self.pending is None:
                return
            gen, parts = self.pending
            if any(tp in txn.offsets for txn in k.txns.values() for tp in parts):
                # KIP-447: an open transaction holds offsets of these partitions; the fetch of
                # committed offsets (require_stable) waits until it commits or aborts
                return
            self.pending = None
            if self.positions and self.callbacks.get("revoke"):
                self.callbacks["revoke"](
                    self, [TopicPartition(t, p) for t, p in sorted(self.positions)]
                )
            self.positions = {}
            self.generation = gen
            tps = [TopicPartition(t, p) for t, p in parts]
            if self.callbacks.get("assign"):
                self.callbacks["assign"](self, tps)
            for tp in parts:
                self.positions[tp] = k.committed.get(tp, 0)

    # fetching
    def _next(self, n: int) -> list[FakeMessage]:
        k = self.kafka
        out: list[FakeMessage] = []
        with k.lock:
            for tp in sorted(self.positions):
                for r in k.visible(tp, self.positions[tp], self.committed_only):
                    if len(out) >= n:
                        return out
                    out.append(FakeMessage(tp[0], tp[1], r.offset, r.value))
                    self.positions[tp] = r.offset + 1
                # (read_committed: stops before the first open record)
        return out

    def poll(self, timeout: float) -> FakeMessage | None:
        if self.topics:
            self._serve_rebalance()
        got = self._next(1)
        if not got:
            time.sleep(min(timeout, 0.002))  # (a poll waits for records; other threads run)
        return got[0] if got else None

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        return self._next(n)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.positions)]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        with self.kafka.lock:
            for tp in tps:
                off = tp.offset
                if off < 0:
                    off = (
                        self.kafka.committed.get((tp.topic, tp.partition), 0)
                        if off != OFFSET_BEGINNING
                        else 0
                    )
                self.positions[(tp.topic, tp.partition)] = off

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions.pop((tp.topic, tp.partition), None)

    def seek(self, tp: TopicPartition) -> None:
        key = (tp.topic, tp.partition)
        if key not in self.positions:
            raise KafkaException(KafkaError(KafkaError._STATE, "not assigned"))
        self.positions[key] = 0 if tp.offset == OFFSET_BEGINNING else tp.offset

    def committed(self, tps: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        k = self.kafka
        with k.lock:
            if k.committed_errors:
                raise KafkaException(k.committed_errors.pop(0))
            return [
                TopicPartition(
                    tp.topic, tp.partition, k.committed.get((tp.topic, tp.partition), _INVALID)
                )
                for tp in tps
            ]

    def commit(
        self, offsets: list[TopicPartition], asynchronous: bool = True
    ) -> list[TopicPartition]:
        k = self.kafka
        with k.lock:
            k.live_members()
            if self.generation != k.generation:
                raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "old generation"))
            for tp in offsets:
                k.committed[(tp.topic, tp.partition)] = tp.offset
        return offsets

    def close(self) -> None:
        self.positions = {}
