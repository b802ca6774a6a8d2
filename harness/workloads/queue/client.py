"""The queue workload's client: one logical process talking Kafka through confluent-kafka.

`QueueClient(test, node_bootstrap, process, node=None)` owns one producer and one
consumer (librdkafka, which releases the GIL, so one thread per process scales).
`open()` creates them, `invoke(op) -> completed op` performs one operation of
docs/history-format.md (send, poll, txn, assign, subscribe, commit, crash) and returns
its completion in exactly the spec's shapes (written with `checkers.queue.codec`, the
codec the checker reads them with), `close()` tears them down without waiting.

Keys are "topic/partition" strings; values are ints sent as their decimal ASCII bytes.
A record whose bytes are not an int is reported as the string it holds, so the checker
can call it a garbage read.

Error mapping, after Jepsen's Kafka client (jepsen.redpanda.workload.queue/with-errors):

- definite (`fail`): the record was never handed to the network (produce() refused it,
  purged from the queue) or the error says the write cannot have happened: unknown or
  invalid topic/partition, authorization, invalid replication factor, not controller,
  out-of-order sequence, fenced producer, invalid producer epoch, record too large;
- indefinite (`info`): everything else: client-side timeouts (no delivery report in
  time, librdkafka's message timeout), transport errors, NOT_LEADER_FOR_PARTITION
  (KAFKA-13574: can come back after the append), request timeouts, not enough replicas
  after append, unknown server errors.

An op with several sends is `ok` when all were acknowledged, `fail` when all definitely
failed and `info` otherwise. Each send's third element is `[offset, v]` when acked with an
offset, `[null, v]` when acked without one (acks=0), and the bare `v` otherwise. Errors
that leave the producer unusable (fenced, out of order, fatal) set `broken`: the
interpreter then replaces the client and the process. A completion that is not `ok`
rolls the consumer back to the first offset it read in that op (an aborted transaction
rewinds), as Jepsen's with-consumer-rollback.

Consumer groups (test['group'], set when processes can subscribe): every consumer of the
test uses the group id; `subscribe` subscribes to the topics of its keys with rebalance
callbacks, and the next completion after a rebalance carries `rebalance`: {"generation",
"assigned", "revoked", "committed"} (docs/history-format.md): the keys the group assigned and
revoked since the previous completion (lost partitions count as revoked), the generation
(`generation_of`), and, per assigned key, the group's committed offset the client fetched in
the assign callback (null: none). An `assign` after a `subscribe` drops the member (see
`_close_consumer`: group members are never closed, they time out) and assigns on a new
consumer; a `subscribe` that replaces an assignment records the
assigned keys as revoked (their positions are gone). `commit` commits, synchronously, the
next offset to read of every key the process owns and has polled (the completion's value
names them; the invoke cannot know them); it is `fail` when the coordinator refused it before appending
(`DEFINITE_COMMIT_ERRORS`) or nothing was sent, `info` otherwise.

Every completion carries `node`. A sample (test['watermark_p'], default 0.1) of ok send,
poll and txn completions carries `watermarks` for the keys the op touched, queried from
the partition leaders (ListOffsets, on the process's own admin connection) after the op's
body and before its completion. The consumer's cached watermarks are not used: a fetch
response the broker built before another op's observation can arrive during this op, and
its older high watermark would look like the cluster's going backwards in real time. Send
and txn completions carry `producer` (id and epoch from librdkafka's statistics, -1 until
known).

Test keys used: acks ("all"), idempotence (False), txn (False), isolation_level
("read_uncommitted"), seed, and the workload's knobs (`options.QueueOptions`, their defaults
and meaning): op_timeout_ms, watermark_p, linger_ms, request_timeout_ms, fetch_wait_max_ms,
retries, poll_ms, session_timeout_ms, heartbeat_interval_ms, max_poll_interval_ms and
assignment_strategy (group consumers),
producer_config / consumer_config (extra librdkafka settings); group; transactional_ids
(with txn, thread i's transactional.id is item i, shared by the thread's successive
processes; a thread beyond the list, or no list, gets an id of its own per process).
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from isrlab.checkers.queue import codec
from isrlab.harness.workloads.queue.options import QueueOptions

__all__ = [
    "DEFINITE_COMMIT_ERRORS",
    "DEFINITE_ERRORS",
    "LIBRDKAFKA_LOG",
    "ClientError",
    "QueueClient",
    "classify",
    "error_name",
    "generation_of",
    "parse_key",
    "send_verdict",
    "touched_keys",
]

log = logging.getLogger(__name__)

Op = dict[str, Any]

# Errors that prove a produce did not happen (Jepsen's definite set, in librdkafka codes).
DEFINITE_ERRORS: frozenset[int] = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.NOT_CONTROLLER,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.PRODUCER_FENCED,
        KafkaError._FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError._PURGE_QUEUE,
        KafkaError._QUEUE_FULL,
        KafkaError.INVALID_REQUIRED_ACKS,
    }
)

# Errors that prove an offset commit did not happen: the coordinator refused it before
# appending (Kafka's GroupCoordinator.handleCommitOffsets checks member, generation and state
# first), or librdkafka never sent it. Not NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE: Kafka
# turns a failed or timed-out append of the offsets record (NOT_LEADER_OR_FOLLOWER,
# NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT) into those, so the record may still commit.
DEFINITE_COMMIT_ERRORS: frozenset[int] = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.OFFSET_METADATA_TOO_LARGE,
        KafkaError.INVALID_COMMIT_OFFSET_SIZE,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.INVALID_GROUP_ID,
        KafkaError._NO_OFFSET,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
        KafkaError._INVALID_ARG,
        KafkaError._UNKNOWN_PARTITION,
    }
)

# Errors after which the producer cannot be used again.
_BREAKING_ERRORS: frozenset[int] = frozenset(
    {
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.PRODUCER_FENCED,
        KafkaError._FENCED,
        KafkaError._FATAL,
    }
)

_INVALID = -1001  # librdkafka's OFFSET_INVALID / "no watermark cached"
# How long past its own timeout a transactional call may take before it is given up.
TXN_GRACE_S = 5.0


class _LibrdkafkaLog:
    """librdkafka's log lines, demoted to DEBUG: refused connections and timeouts are what
    a fault-injection test provokes on purpose, not errors of the harness."""

    def __init__(self) -> None:
        self._log = logging.getLogger(__name__ + ".librdkafka")

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self._log.log(logging.CRITICAL if level >= logging.CRITICAL else logging.DEBUG, fmt, *args)


LIBRDKAFKA_LOG = _LibrdkafkaLog()


class ClientError(RuntimeError):
    """The client could not be opened (bad config, no transactions on the broker, ...)."""


def parse_key(key: str) -> tuple[str, int]:
    """ "t1/0" -> ("t1", 0)."""
    topic, sep, part = str(key).rpartition("/")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"key {key!r} is not 'topic/partition' (e.g. 't0/0')")
    return topic, int(part)


def error_name(err: KafkaError) -> str:
    """A stable, readable error name: "not-leader-for-partition", "-msg-timed-out"..."""
    name = err.name() or str(err.code())
    return name.lower().replace("_", "-").lstrip("-")


def classify(err: KafkaError) -> str:
    """ "fail" when `err` proves the write did not happen, else "info"."""
    return "fail" if err.code() in DEFINITE_ERRORS else "info"


def _decode(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class _Pending:
    """One produced record waiting for its delivery report."""

    __slots__ = ("done", "err", "i", "offset")

    def __init__(self, i: int) -> None:
        self.i = i
        self.done = False
        self.err: KafkaError | None = None
        self.offset: int | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.err = err
        if err is None:
            off = msg.offset()
            self.offset = off if off is not None and off >= 0 else None
        self.done = True


def with_rebalance(done: Op, reb: Mapping[str, Any] | None) -> Op:
    """`done` with the history's `rebalance` field (the spec's subscribe mode) made from the
    rebalances a consumer saw since its previous completion (`reb`: the generation, the
    assigned, revoked and committed keys), if it saw any; shared with the simulated group
    consumer (harness/sim/group.py)."""
    if reb is not None:
        done["rebalance"] = {
            "generation": reb["generation"],
            "assigned": sorted(reb["assigned"]),
            "revoked": sorted(reb["revoked"]),
            "committed": dict(sorted(reb["committed"].items())),
        }
    return done


class QueueClient:
    """One process's producer + consumer. Not thread-safe: one worker thread owns it."""

    def __init__(
        self,
        test: Mapping[str, Any],
        node_bootstrap: str,
        process: int,
        node: str | None = None,
        thread: int | None = None,
    ) -> None:
        self.test = test
        self.bootstrap = node_bootstrap
        self.process = process
        self.node = node or node_bootstrap
        self.txn = bool(test.get("txn", False))
        self.idempotent = bool(test.get("idempotence", False)) or self.txn
        self.knobs = QueueOptions.from_test(test)
        self.op_timeout = self.knobs.op_timeout_ms / 1000
        self.poll_s = self.knobs.poll_ms / 1000
        self.watermark_p = self.knobs.watermark_p
        self._rng = random.Random(f"{test.get('seed', 0)}/{process}")
        # The test's transactional id of this thread (its processes take turns with it: a new
        # one fences the last, as a restarted Kafka application does), else one of its own.
        ids = test.get("transactional_ids") or ()
        self.transactional_id: str | None = None
        if self.txn:
            self.transactional_id = (
                str(ids[thread])
                if thread is not None and thread < len(ids)
                else f"isrlab-{process}-{uuid.uuid4().hex[:8]}"
            )
        self.producer: Producer | None = None
        self._admin: AdminClient | None = None
        self.consumer: Consumer | None = None
        self.broken = False
        self.assigned: set[str] = set()
        self.subscribed = False
        # The consumer group of the test (subscribe mode), None in assign-only tests.
        self.group: str | None = str(test["group"]) if test.get("group") else None
        # Per key the process owns: the next offset to read, as far as its polls tell.
        self.next_offsets: dict[str, int] = {}
        # Rebalances seen since the last completion (the next completion carries them).
        self._rebalance: dict[str, Any] | None = None
        self._rebalance_count = 0
        self._topics: list[str] = []  # the subscription (while subscribed)
        self._grouped = False  # the consumer has subscribed (has group callbacks)
        self._producer_id = -1
        self._producer_epoch = -1

    @classmethod
    def factory(
        cls, test: Mapping[str, Any], nodes: Mapping[str, str]
    ) -> Callable[[int, int], QueueClient]:
        """client_factory(process, thread) for the interpreter, binding thread t to the
        t-th node (round robin) as Jepsen does: that node is the client's `node` and its
        first bootstrap server; the other nodes follow, so a client still starts while
        its own node is down. `nodes` maps node names to "host:port"."""
        names = list(nodes)
        if not names:
            raise ValueError("QueueClient.factory needs at least one node")

        def make(process: int, thread: int) -> QueueClient:
            i = thread % len(names)
            order = names[i:] + names[:i]
            bootstrap = ",".join(nodes[n] for n in order)
            return cls(test, bootstrap, process, node=names[i], thread=thread)

        return make

    # ----- lifecycle ----------------------------------------------------------------------

    def producer_config(self) -> dict[str, Any]:
        t, k = self.test, self.knobs
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"isrlab-p{self.process}",
            "acks": str(t.get("acks", "all")),
            "enable.idempotence": self.idempotent,
            # No batching delay: every op waits for its own records (no flush() per op).
            "linger.ms": k.linger_ms,
            "message.timeout.ms": k.op_timeout_ms,
            "request.timeout.ms": k.request_timeout_ms,
            "socket.connection.setup.timeout.ms": k.request_timeout_ms,
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
            "logger": LIBRDKAFKA_LOG,
            # Warnings and worse only: info lines are printed straight to stderr at destroy.
            "log_level": 4,
        }
        if k.retries is not None:
            conf["retries"] = k.retries
        if self.idempotent:
            # Producer id and epoch are only visible in librdkafka's statistics.
            conf["statistics.interval.ms"] = 1000
            conf["stats_cb"] = self._on_stats
        if self.transactional_id:
            conf["transactional.id"] = self.transactional_id
            conf["transaction.timeout.ms"] = max(60000, k.op_timeout_ms * 2)
        conf.update(k.producer_config or {})
        return conf

    def consumer_config(self) -> dict[str, Any]:
        t, k = self.test, self.knobs
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"isrlab-c{self.process}",
            # Required by librdkafka, unused with assign() (assign never joins the group); a
            # test in which processes subscribe gives every consumer the test's group.
            "group.id": self.group or f"isrlab-{self.process}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": str(t.get("isolation_level", "read_uncommitted")),
            "fetch.wait.max.ms": k.fetch_wait_max_ms,
            "socket.connection.setup.timeout.ms": k.request_timeout_ms,
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
            "logger": LIBRDKAFKA_LOG,
            # Warnings and worse only: info lines are printed straight to stderr at destroy.
            "log_level": 4,
        }
        if self.group:
            # Members that stop heartbeating (paused, partitioned away) leave within seconds;
            # the rebalance timeout (max.poll.interval.ms) bounds how long a rebalance waits
            # for members that are busy in other ops. Offsets are committed by commit ops only.
            conf["session.timeout.ms"] = k.session_timeout_ms
            # Members learn of a rebalance from their heartbeat (librdkafka's default of 3 s
            # would dominate every rebalance); never above a third of the session.
            conf["heartbeat.interval.ms"] = min(
                k.heartbeat_interval_ms, max(1, k.session_timeout_ms // 3)
            )
            conf["max.poll.interval.ms"] = max(k.max_poll_interval_ms, k.session_timeout_ms)
            conf["partition.assignment.strategy"] = k.assignment_strategy
        conf.update(k.consumer_config or {})
        return conf

    def admin_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"isrlab-a{self.process}",
            "socket.connection.setup.timeout.ms": self.knobs.request_timeout_ms,
            "reconnect.backoff.max.ms": 1000,
            "logger": LIBRDKAFKA_LOG,
            "log_level": 4,
        }

    def open(self) -> QueueClient:
        """Create the producer and consumer (and init transactions when test['txn'])."""
        try:
            self.producer = Producer(self.producer_config())
            self.consumer = Consumer(self.consumer_config())
            if self.watermark_p > 0:
                self._admin = AdminClient(self.admin_config())
        except KafkaException as e:
            raise ClientError(f"cannot create Kafka clients for {self.bootstrap}: {e}") from e
        if self.transactional_id:
            try:
                self.producer.init_transactions(self.op_timeout)
            except KafkaException as e:
                self.close()
                raise ClientError(
                    f"init_transactions on {self.bootstrap} failed ({e.args[0]}): does the "
                    "broker support transactions? Run without --txn otherwise."
                ) from e
        return self

    def close(self) -> None:
        """Drop the clients without waiting for anything still in flight (idempotent)."""
        self._admin = None  # nothing to close: it goes when the last reference does
        producer, self.producer = self.producer, None
        consumer, self.consumer = self.consumer, None
        if producer is not None:
            try:
                producer.purge(in_queue=True, in_flight=True, blocking=False)
                producer.flush(0)
            except (KafkaException, RuntimeError) as e:
                log.debug("closing producer: %s", e)
        if consumer is not None:
            self._close_consumer(consumer)
        self.assigned = set()
        self.subscribed = False
        self.next_offsets = {}

    def _close_consumer(self, consumer: Consumer) -> None:
        """Close an assign-only consumer; drop a group member without closing it.

        Closing a member runs its rebalance callbacks inside close(), where confluent-kafka's
        automatic unassign after the callback can wait forever on librdkafka (seen: a crash op
        holding the GIL for good, every other process stopped with it). Dropped, the member
        leaves nothing to call back (rd_kafka_destroy without consumer close): it stays in
        the group until its session times out, as a crashed client does, and the keys it
        held are recorded here as revoked."""
        if not self._grouped:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as e:
                log.debug("closing consumer: %s", e)
            return
        if self.assigned:
            self._pending_rebalance(consumer)["revoked"].update(self.assigned)
        self._grouped = False

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.broken = True
        log.debug("process %s: %s", self.process, err)

    def _on_stats(self, raw: str) -> None:
        try:
            eos = orjson.loads(raw).get("eos") or {}
        except orjson.JSONDecodeError:
            return
        self._producer_id = int(eos.get("producer_id", self._producer_id))
        self._producer_epoch = int(eos.get("producer_epoch", self._producer_epoch))

    # ----- ops ----------------------------------------------------------------------------

    def invoke(self, op: Mapping[str, Any]) -> Op:
        """Perform `op` (an invoke: f, value, optional `_` hints); return its completion."""
        f = op["f"]
        base: Op = {k: v for k, v in op.items() if not k.startswith("_")}
        base["node"] = self.node
        if f == "crash":
            self.close()
            return self._with_rebalance({**base, "type": "info", "value": None})
        if self.producer is None or self.consumer is None:
            return {**base, "type": "fail", "error": "client-not-open"}
        if f == "assign":
            done = self._assign(base, op.get("_seek") == "beginning")
        elif f == "subscribe":
            done = self._subscribe(base)
        elif f == "commit":
            done = self._commit(base)
        elif f in codec.DATA_FS:
            done = self._transact(base, float(op.get("_poll_ms", self.poll_s * 1000)) / 1000)
        else:
            done = {**base, "type": "fail", "error": f"unknown-f:{f}"}
        return self._with_rebalance(done)

    # -- consumer groups

    def _with_rebalance(self, done: Op) -> Op:
        """``done`` with the rebalances seen since the previous completion, if any."""
        reb, self._rebalance = self._rebalance, None
        return with_rebalance(done, reb)

    def _pending_rebalance(self, consumer: Consumer) -> dict[str, Any]:
        if self._rebalance is None:
            self._rebalance = {
                "generation": -1,
                "assigned": set(),
                "revoked": set(),
                "committed": {},
            }
        self._rebalance["generation"] = self._generation(consumer)
        return self._rebalance

    def _generation(self, consumer: Consumer) -> int:
        """The group generation the consumer is in, read from librdkafka's serialized group
        metadata (consumer_group_metadata(): b"CGMDv2:", then the int32 generation id in
        native byte order, as rd_kafka_consumer_group_metadata_write lays it out); when that
        layout is not found, the number of assignments this client received (documented in
        docs/history-format.md as the fallback)."""
        try:
            meta = consumer.consumer_group_metadata()
        except (KafkaException, RuntimeError, TypeError) as e:
            log.debug("consumer_group_metadata: %s", e)
            meta = None
        return generation_of(meta, self._rebalance_count)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [f"{tp.topic}/{tp.partition}" for tp in partitions]
        self._rebalance_count += 1
        reb = self._pending_rebalance(consumer)
        reb["assigned"].update(keys)
        self.assigned.update(keys)
        for k in keys:
            self.next_offsets.pop(k, None)  # starts afresh: the committed offset or earliest
        reb["committed"].update(self._committed(consumer, partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [f"{tp.topic}/{tp.partition}" for tp in partitions]
        reb = self._pending_rebalance(consumer)
        reb["revoked"].update(keys)
        self.assigned.difference_update(keys)
        for k in keys:
            self.next_offsets.pop(k, None)

    def _committed(
        self, consumer: Consumer, partitions: list[TopicPartition]
    ) -> dict[str, int | None]:
        """The group's committed offsets of ``partitions`` (None: nothing committed), asked
        of the coordinator; keys it could not tell are left out."""
        if not partitions:
            return {}
        try:
            got = consumer.committed(
                [TopicPartition(tp.topic, tp.partition) for tp in partitions],
                timeout=min(self.op_timeout, self.knobs.request_timeout_ms / 1000),
            )
        except KafkaException as e:
            log.debug("process %s: committed offsets: %s", self.process, e)
            return {}
        out: dict[str, int | None] = {}
        for tp in got:
            if tp.error is not None:
                continue
            out[f"{tp.topic}/{tp.partition}"] = tp.offset if tp.offset >= 0 else None
        return out

    def _commit(self, op: Op) -> Op:
        """Commit the next offset to read of every key the process owns and has polled
        (Kafka's meaning of a committed offset), synchronously."""
        consumer = self.consumer
        assert consumer is not None
        offsets = {k: self.next_offsets[k] for k in sorted(self.assigned) if k in self.next_offsets}
        value = [codec.commit(offsets)]
        if not self.subscribed:
            # Assigned keys belong to no group member: nothing is sent.
            return {**op, "type": "fail", "value": value, "error": "not-subscribed"}
        if not offsets:
            return {**op, "type": "fail", "value": value, "error": "nothing-to-commit"}
        tps = [TopicPartition(*parse_key(k), off) for k, off in offsets.items()]
        try:
            result = self._commit_within(consumer, tps, self.op_timeout)
        except TimeoutError:
            # librdkafka's synchronous commit waits for a coordinator without end (seen: a
            # commit sent while the coordinator was partitioned away blocked its process for
            # good, and the run never reached its final phase). Unknown: it may still be done.
            return {**op, "type": "info", "value": value, "error": ["commit", "timeout"]}
        except KafkaException as e:
            err: KafkaError = e.args[0]
            kind = "fail" if err.code() in DEFINITE_COMMIT_ERRORS else "info"
            return {**op, "type": kind, "value": value, "error": ["commit", error_name(err)]}
        errors = [tp.error for tp in result or [] if tp.error is not None]
        if not errors:
            return {**op, "type": "ok", "value": value}
        definite = all(e.code() in DEFINITE_COMMIT_ERRORS for e in errors)
        kind = "fail" if definite and len(errors) == len(tps) else "info"
        names = sorted({error_name(e) for e in errors})
        return {**op, "type": kind, "value": value, "error": ["commit", *names]}

    def _within(self, call: Callable[[], Any], timeout: float) -> Any:
        """``call()``, given up after ``timeout`` seconds plus a grace of `TXN_GRACE_S`
        (TimeoutError): librdkafka's transactional calls take a timeout but were seen to block
        far past it (send_offsets_to_transaction, for minutes, while the transaction
        coordinator was being killed). The call goes on in its own thread, which is left
        behind; the caller gives the client up (`broken`), and the next process of the thread
        fences this producer with the same transactional id."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = call()
            except BaseException as e:  # handed to the caller
                box["error"] = e

        worker = threading.Thread(target=run, name=f"isrlab-txn-{self.process}", daemon=True)
        worker.start()
        worker.join(timeout + TXN_GRACE_S)
        if worker.is_alive():
            raise TimeoutError
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _commit_within(
        self, consumer: Consumer, tps: list[TopicPartition], timeout: float
    ) -> list[TopicPartition] | None:
        """``consumer.commit(offsets=tps, asynchronous=False)``, given up after ``timeout``
        seconds (TimeoutError): the call goes on in its own thread, which is left behind; the
        info completion makes the interpreter replace this process's client."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = consumer.commit(offsets=tps, asynchronous=False)
            except BaseException as e:  # handed to the caller
                box["error"] = e

        worker = threading.Thread(target=run, name=f"isrlab-commit-{self.process}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise TimeoutError
        if "error" in box:
            raise box["error"]
        result: list[TopicPartition] | None = box.get("result")
        return result

    def _assign(self, op: Op, from_beginning: bool) -> Op:
        consumer = self.consumer
        assert consumer is not None
        try:
            wanted = set(op["value"])
            tps = {k: parse_key(k) for k in wanted}
        except (TypeError, ValueError) as e:
            return {**op, "type": "fail", "error": ["bad-keys", str(e)]}
        if self.subscribed:
            return self._leave_group_and_assign(op, wanted, from_beginning)
        keep = set() if from_beginning else self.assigned & wanted
        drop = self.assigned - keep
        add = wanted - keep
        changed = False
        for k in drop | (set(self.next_offsets) - keep):
            self.next_offsets.pop(k, None)
        try:
            if drop:
                # Incremental changes keep the fetch position of keys that stay assigned:
                # a full assign() would restart them and the next poll would go back.
                consumer.incremental_unassign([TopicPartition(*parse_key(k)) for k in drop])
                changed = True
                self.assigned -= drop
            if add:
                consumer.incremental_assign(
                    [TopicPartition(*tps[k], OFFSET_BEGINNING) for k in sorted(add)]
                )
                self.assigned |= add
        except KafkaException as e:
            # Half done is not "nothing happened": only an untouched assignment is a fail.
            kind = "info" if changed else "fail"
            return {**op, "type": kind, "error": ["assign", str(e.args[0])]}
        return {**op, "type": "ok"}

    def _leave_group_and_assign(self, op: Op, wanted: set[str], from_beginning: bool) -> Op:
        """assign after subscribe: librdkafka revokes a subscription's partitions only in a
        later poll, whose automatic unassign would undo a manual assignment made meanwhile, so
        the member is dropped (`_close_consumer`; its keys recorded as revoked) and a new
        consumer assigns. Keys that stay resume at the next offset this process's polls reached
        (else the group's committed offset, where the old consumer would have started)."""
        keep = set() if from_beginning else self.assigned & wanted
        resume = {k: self.next_offsets.get(k, OFFSET_STORED) for k in keep}
        consumer, self.consumer = self.consumer, None
        self.subscribed = False
        assert consumer is not None
        self._close_consumer(consumer)
        del consumer  # (the last reference: destroyed here, before the new consumer)
        self.assigned = set()
        self.next_offsets = {k: off for k, off in resume.items() if off >= 0}
        try:
            self.consumer = Consumer(self.consumer_config())
            self.consumer.incremental_assign(
                [
                    TopicPartition(*parse_key(k), resume.get(k, OFFSET_BEGINNING))
                    for k in sorted(wanted)
                ]
            )
        except KafkaException as e:
            # The old consumer is gone: this process cannot say what it is assigned.
            self.broken = True
            return {**op, "type": "info", "error": ["assign", str(e.args[0])]}
        self.assigned = set(wanted)
        return {**op, "type": "ok"}

    def _subscribe(self, op: Op) -> Op:
        consumer = self.consumer
        assert consumer is not None
        try:
            topics = sorted({parse_key(k)[0] for k in op["value"]})
        except (TypeError, ValueError) as e:
            return {**op, "type": "fail", "error": ["bad-keys", str(e)]}
        if self.subscribed and topics == self._topics:
            # The subscription already is what the op asks: as Kafka's Java consumer, no
            # rejoin (librdkafka would revoke everything and rejoin the group).
            return {**op, "type": "ok"}
        try:
            if self.assigned and not self.subscribed:
                consumer.incremental_unassign(
                    [TopicPartition(*parse_key(k)) for k in self.assigned]
                )
                # The manual assignment is gone, positions with it: the completion says so
                # as a revocation (what the process then reads comes from the group's
                # assignments, each recorded as it arrives).
                self._pending_rebalance(consumer)["revoked"].update(self.assigned)
                self.assigned = set()
                self.next_offsets = {}
            # What the group assigns arrives in the rebalance callbacks, during later polls.
            self._grouped = True
            consumer.subscribe(
                topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
        except KafkaException as e:
            return {**op, "type": "info", "error": ["subscribe", str(e.args[0])]}
        self.subscribed = True
        self._topics = topics
        return {**op, "type": "ok"}

    # -- send / poll / txn

    def _watermarks(self, keys: list[str], deadline: float) -> Op:
        """Low/high watermarks of `keys` asked of their leaders now (skips keys that fail).

        Through the client's own admin connection: on the consumer's connection the
        ListOffsets request would queue behind a long-polling fetch (the broker answers a
        connection's requests in order), adding up to fetch.wait.max.ms to the op.
        """
        admin = self._admin
        if admin is None or not keys:
            return {}
        try:
            tps = {k: TopicPartition(*parse_key(k)) for k in keys}
            earliest = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps.values()})
            latest = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps.values()})
        except (KafkaException, ValueError) as e:
            log.debug("watermarks of %s: %s", keys, e)
            return {}
        out: dict[str, dict[str, int]] = {}
        for k, tp in tps.items():
            try:
                lo = earliest[tp].result(max(0.001, deadline - time.monotonic())).offset
                hi = latest[tp].result(max(0.001, deadline - time.monotonic())).offset
            except (KafkaException, FutureTimeout, KeyError) as e:
                log.debug("watermarks of %s: %r", k, e)
                continue
            if lo >= 0 and hi >= 0:
                out[k] = {"low": lo, "high": hi}
        return {"watermarks": out} if out else {}

    def _producer_info(self) -> Op:
        return {
            "producer": {
                "id": self._producer_id,
                "epoch": self._producer_epoch,
                "idempotent": self.idempotent,
                "transactional_id": self.transactional_id or "",
            }
        }

    def _transact(self, op: Op, poll_s: float) -> Op:
        producer, consumer = self.producer, self.consumer
        assert producer is not None and consumer is not None
        mops: list[Any] = list(op["value"] or [])
        out: list[Any] = [list(m) for m in mops]
        first_read: dict[str, int] = {}
        # None until a send run or an error decides: "ok" | "fail" | "info"
        verdict: str | None = None
        errors: list[Any] = []
        has_send = any(m and m[0] == codec.SEND for m in mops)
        deadline = time.monotonic() + self.op_timeout
        in_txn = committing = False
        try:
            if self.txn:
                producer.begin_transaction()
                in_txn = True
            i = 0
            while i < len(mops):
                if mops[i][0] == codec.SEND:
                    j = i
                    while j < len(mops) and mops[j][0] == codec.SEND:
                        j += 1
                    # Consecutive sends go out together and are awaited together.
                    v, errs = self._send_run(mops, out, i, j, deadline)
                    verdict = _worse(verdict, v)
                    errors += errs
                    i = j
                    if verdict != "ok" and self.txn:
                        break
                elif mops[i][0] == codec.POLL:
                    out[i] = codec.poll_result(self._poll(poll_s, first_read))
                    i += 1
                else:
                    raise ValueError(f"unknown micro-op {mops[i]!r}")
            verdict = verdict or "ok"
            if in_txn:
                if verdict == "ok":
                    committing = True
                    left = max(0.1, deadline - time.monotonic())
                    try:
                        self._within(lambda: producer.commit_transaction(left), left)
                    except TimeoutError:
                        # Unknown, as a commit that timed out (Jepsen: indefinite).
                        errors.append(["commit", "timeout"])
                        verdict = "info"
                        self.broken = True
                    in_txn = False
                else:
                    # Something in the body went wrong: aborting makes the whole op a fail.
                    in_txn = False
                    verdict = self._abort(errors)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            errors.append(error_name(err))
            if err.code() in _BREAKING_ERRORS or err.fatal():
                self.broken = True
            if in_txn and (not committing or err.txn_requires_abort()):
                # Before the commit, or a commit the broker refused: abort and it's a fail.
                verdict = self._abort(errors)
            elif in_txn:
                # The commit timed out or its outcome is unknown (Jepsen: indefinite).
                verdict = "info"
                self.broken = True
            else:
                verdict = _worse(verdict, classify(err))
        except (ValueError, TypeError, IndexError) as e:
            errors.append(["bad-op", str(e)])
            verdict = _worse(verdict, "info" if has_send else "fail")
            if in_txn:
                verdict = self._abort(errors)
        verdict = verdict or "ok"
        if verdict != "ok":
            self._rollback(first_read)
        result: Op = {**op, "type": verdict, "value": out}
        if errors:
            result["error"] = errors[0] if len(errors) == 1 else errors
        if verdict == "ok" and self.watermark_p > 0 and self._rng.random() < self.watermark_p:
            result.update(self._watermarks(touched_keys(mops, out), deadline))
        if has_send:
            result.update(self._producer_info())
        return result

    def _send_run(
        self, mops: list[Any], out: list[Any], i: int, j: int, deadline: float
    ) -> tuple[str, list[Any]]:
        producer = self.producer
        assert producer is not None
        pending: list[_Pending] = []
        errors: list[Any] = []
        refused = 0
        for n in range(i, j):
            _, k, v = mops[n]
            topic, part = parse_key(k)
            p = _Pending(n)
            try:
                producer.produce(topic, str(v).encode(), partition=part, on_delivery=p)
            except BufferError:
                errors.append("queue-full")
                refused += 1
                out[n] = codec.send(k, v)
                continue
            except KafkaException as e:
                # produce() refused the record: it never left this process.
                errors.append(error_name(e.args[0]))
                refused += 1
                out[n] = codec.send(k, v)
                if e.args[0].fatal():
                    self.broken = True
                continue
            pending.append(p)
        while any(not p.done for p in pending):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            producer.poll(min(0.05, left))
        acked = failed = unknown = 0
        for p in pending:
            _, k, v = mops[p.i]
            if not p.done:
                unknown += 1
                out[p.i] = codec.send(k, v)
                errors.append("timeout")
            elif p.err is None:
                acked += 1
                out[p.i] = codec.send_result(k, v, p.offset)
            else:
                out[p.i] = codec.send(k, v)
                errors.append(error_name(p.err))
                if p.err.code() in _BREAKING_ERRORS or p.err.fatal():
                    self.broken = True
                if classify(p.err) == "fail":
                    failed += 1
                else:
                    unknown += 1
        failed += refused
        return send_verdict(acked, failed, unknown), errors

    def _poll(self, timeout: float, first_read: dict[str, int]) -> dict[str, list[list[Any]]]:
        consumer = self.consumer
        assert consumer is not None
        if not self.subscribed and not self.assigned and not consumer.assignment():
            # (a subscribed consumer polls even with nothing assigned: its rebalance
            # callbacks, and so its assignment, come from poll)
            return {}
        # Block only for the first record; then take whatever else is already fetched.
        first = consumer.poll(timeout)
        msgs = [first] if first is not None else []
        if first is not None:
            msgs += consumer.consume(100000, 0)
        read: dict[str, list[list[Any]]] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                log.debug("process %s poll: %s", self.process, err)
                continue
            k = f"{m.topic()}/{m.partition()}"
            off = m.offset()
            read.setdefault(k, []).append([off, _decode(m.value())])
            if off is not None:
                self.next_offsets[k] = off + 1
                if k not in first_read:
                    first_read[k] = off
        return read

    def _abort(self, errors: list[Any]) -> str:
        """Abort the open transaction (bounded: `_within`): the op is a fail if that worked,
        else unknown."""
        producer = self.producer
        assert producer is not None
        try:
            self._within(lambda: producer.abort_transaction(self.op_timeout), self.op_timeout)
        except TimeoutError:
            errors.append(["abort", "timeout"])
            self.broken = True
            return "info"
        except KafkaException as e:
            errors.append(["abort", error_name(e.args[0])])
            self.broken = True
            return "info"
        return "fail"

    def _rollback(self, first_read: dict[str, int]) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        for k, off in first_read.items():
            if k not in self.assigned:
                continue
            try:
                consumer.seek(TopicPartition(*parse_key(k), off))
                self.next_offsets[k] = off
            except KafkaException as e:
                # Not fetching that partition yet: nothing to rewind, or the process ends.
                log.debug("rollback %s to %s: %s", k, off, e)
                self.broken = True


def send_verdict(acked: int, failed: int, unknown: int) -> str:
    """A run of sends' outcome from its records' fates: ok when all were acknowledged, fail
    when all definitely failed, info otherwise (also used by harness/sim/client.py)."""
    if unknown == 0 and failed == 0:
        return "ok"
    if unknown == 0 and acked == 0:
        return "fail"
    return "info"


def touched_keys(mops: list[Any], out: list[Any]) -> list[str]:
    """The keys an op's micro-ops sent to (`mops`, the invoke) or read (`out`, completed
    polls), sorted: the keys its watermarks are asked for."""
    touched = {m[1] for m in mops if m[0] == codec.SEND}
    for m in out:
        if m[0] == codec.POLL and len(m) > 1:
            touched.update(m[1])
    return sorted(touched)


_CGMD_MAGIC = b"CGMDv2:"


def generation_of(meta: Any, fallback: int) -> int:
    """The generation id in librdkafka's serialized consumer group metadata (``b"CGMDv2:"``
    then a native-order int32), or ``fallback`` when ``meta`` is not laid out that way."""
    if isinstance(meta, bytes) and meta.startswith(_CGMD_MAGIC) and len(meta) >= 11:
        return int(struct.unpack_from("=i", meta, len(_CGMD_MAGIC))[0])
    return fallback


def _worse(a: str | None, b: str) -> str:
    """Combine the outcomes of two parts of one op (None: nothing decided yet)."""
    if a is None:
        return b
    order = {"ok": 0, "fail": 1, "info": 2}
    if {a, b} == {"ok", "fail"}:
        # Part happened and part certainly did not: neither ok nor fail.
        return "info"
    return a if order[a] >= order[b] else b
