"""The eos workload's clients: the copier, and the queue client for everyone else.

`EosCopier` is a `QueueClient` (same producer, consumer, rebalance recording, crash and
error mapping) whose consumer reads the input keys as a member of the test's consumer group
(``group``, subscribe mode) at read_committed, and whose ``txn`` op is one copy, as Kafka's
transactions_test copier and Jepsen's intent:

1. poll (``_poll_ms``): the records of the input keys the group gave this copier;
2. with transactions (``txn``): begin, send every value verbatim to the output key paired
   with its input key (input key i -> output key i of ``eos``), await the acks,
   `send_offsets_to_transaction` with the next offset to read of every input key copied and
   the consumer's group metadata (the group coordinator fences a copier of an old
   generation), commit;
   without (``--no-txn``, at-least-once): send, await the acks, then commit the offsets to the
   group (a synchronous consumer commit);
3. anything that goes wrong before the commit aborts the transaction and rewinds the consumer
   to the group's committed offsets (Kafka's resetToLastCommittedPositions); a rebalance
   during the poll drops the batch the same way (what was read may belong to another member
   now). The transactional calls are bounded (`QueueClient._within`): librdkafka was seen to block in
   send_offsets_to_transaction far past its timeout while the coordinator was killed; such
   a copy is a ``fail`` (nothing will commit it) or, for a commit, ``info``, and the client is
   given up.

The op's completion value is the poll (what was read, even when the copy failed) followed
by the sends to the output keys, in the shapes of docs/history-format.md: ``ok`` the copy
committed, ``fail`` it certainly did not (aborted, or nothing was sent), ``info`` unknown (a
commit that timed out, an abort that failed, a kill). A poll that reads nothing is an ``ok``
op without sends; no transaction is begun for it.

The hint ``_kill`` (the generator's copier kills) kills the copier in the middle of a copy
with something to copy: after the sends are acknowledged and before the commit, the client
is dropped without aborting or committing (``info``, error ``killed``). The thread goes on
as a new process, whose copier takes the same transactional id: its `init_transactions`
fences the killed one and aborts its transaction (without transactions, its sends stay and
the new copier copies them again from the committed offsets: at-least-once).

With the knob ``copier_zombies`` a killed copier is not dropped but lives on as a zombie (Kafka's
zombie instance: a paused or partitioned application whose replacement has taken over): it
leaves the group and keeps its producer, still inside its transaction. When a later copier of
the same transactional id has sent a copy and not yet committed it, and that copy writes to an
output key the zombie wrote to, the zombie sends its own copies to those keys again and tries
to commit. Producer epoch fencing refuses every zombie write (the new copier's
`init_transactions` bumped the epoch); with `transaction.producer.epoch.fencing.enable=false`
the leaders accept them into the new copier's open transaction, whose commit makes them
visible: the output holds a value twice (eos-duplicate). The new copier's op records what the
zombie did under the optional key ``zombie``; a zombie that finds no such copy within
`ZOMBIE_TRIES` copies of its id is dropped.

`client_factory(test, nodes, workload)` gives each thread its client by role
(`EosWorkload.role`): copiers an `EosCopier`; producers and readers a non-transactional
`QueueClient` (readers at the test's ``isolation_level``); and, once the workload drains,
every new process a read_committed `QueueClient` for the final reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from isrlab.checkers.queue import codec
from isrlab.harness.workloads.eos.options import EosOptions
from isrlab.harness.workloads.queue.client import (
    _BREAKING_ERRORS,
    DEFINITE_COMMIT_ERRORS,
    ClientError,
    QueueClient,
    error_name,
    parse_key,
)

__all__ = ["ClientError", "EosCopier", "client_factory"]

log = logging.getLogger(__name__)

Op = dict[str, Any]

# Copies of its transactional id a zombie waits for one with a shared output key.
ZOMBIE_TRIES = 200


class _Zombie:
    """A killed copier's producer, inside its transaction, with the copies it sent."""

    def __init__(self, producer: Any, process: int, sends: list[tuple[str, Any]]) -> None:
        self.producer = producer
        self.process = process
        self.sends = sends  # (output key, value)
        self.tries = 0

    def drop(self) -> None:
        try:
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
            self.producer.flush(0)
        except (KafkaException, RuntimeError) as e:
            log.debug("dropping a zombie copier: %s", e)


# transactional id -> its zombie (at most one: a new one replaces and drops the old)
_zombies: dict[str, _Zombie] = {}
_zombies_lock = threading.Lock()
# How the zombies of this run ended ("woken", "gave-up", "replaced", "closed": its copier's
# process ended first, "left": the run ended first); read by `drop_zombies`.
_fates: Counter[str] = Counter()


def drop_zombies() -> dict[str, int]:
    """Drop every zombie copier (the run is over): how the run's zombies ended."""
    with _zombies_lock:
        zombies = list(_zombies.values())
        _zombies.clear()
        _fates["left"] += len(zombies)
        fates = dict(_fates)
        _fates.clear()
    for z in zombies:
        z.drop()
    return fates


class _Roles(Protocol):
    draining: bool

    def role(self, thread: int) -> str: ...


class EosCopier(QueueClient):
    """One copier process (see the module docstring). Not thread-safe: one worker owns it."""

    def __init__(
        self,
        test: Mapping[str, Any],
        node_bootstrap: str,
        process: int,
        node: str | None = None,
        thread: int | None = None,
    ) -> None:
        super().__init__(test, node_bootstrap, process, node=node, thread=thread)
        eos = test.get("eos") or {}
        inputs, outputs = list(eos.get("input") or ()), list(eos.get("output") or ())
        if not inputs or len(inputs) != len(outputs):
            raise ValueError("the eos copier needs test['eos'] = {input: [...], output: [...]}")
        self.output_of: dict[str, str] = dict(zip(inputs, outputs, strict=True))
        self.eos_knobs = EosOptions.from_test(test)
        self._op_revoked = False
        self._zombified = False

    def producer_config(self) -> dict[str, Any]:
        conf = super().producer_config()
        if self.transactional_id:
            # (librdkafka wants message.timeout.ms <= transaction.timeout.ms)
            conf["transaction.timeout.ms"] = max(
                self.eos_knobs.transaction_timeout_ms, self.knobs.op_timeout_ms
            )
        return conf

    def consumer_config(self) -> dict[str, Any]:
        conf = super().consumer_config()
        # A copier never copies what an aborted or open transaction wrote upstream.
        conf["isolation.level"] = "read_committed"
        return conf

    def invoke(self, op: Mapping[str, Any]) -> Op:
        if op["f"] != "txn" or self.producer is None or self.consumer is None:
            return super().invoke(op)
        base: Op = {k: v for k, v in op.items() if not k.startswith("_")}
        base["node"] = self.node
        poll_s = float(op.get("_poll_ms", self.poll_s * 1000)) / 1000
        done = self._copy(base, poll_s, bool(op.get("_kill")))
        return self._with_rebalance(done)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._op_revoked = True
        super()._on_revoke(consumer, partitions)

    # -- one copy

    def _copy(self, op: Op, poll_s: float, kill: bool) -> Op:
        producer, consumer = self.producer, self.consumer
        assert producer is not None and consumer is not None
        if not self.subscribed:
            return {**op, "type": "fail", "error": "not-subscribed"}
        self._op_revoked = False
        first_read: dict[str, int] = {}
        try:
            reads = self._poll(poll_s, first_read)
        except KafkaException as e:
            # (a fatal consumer error: nothing was sent)
            self.broken = True
            return {**op, "type": "fail", "error": ["poll", error_name(e.args[0])]}
        poll = codec.poll_result(reads)
        records = [(k, o, v) for k, pairs in reads.items() for o, v in pairs]
        if not records:
            return {**op, "type": "ok", "value": [poll]}
        if self._op_revoked:
            # Part of the batch may belong to another member now: copy nothing.
            self._rewind()
            return {**op, "type": "fail", "value": [poll], "error": "rebalanced"}
        bad = [k for k, _o, _v in records if k not in self.output_of]
        if bad:
            self._rewind()
            return {**op, "type": "fail", "value": [poll], "error": ["not-an-input-key", bad[0]]}
        mops = [codec.send(self.output_of[k], v) for k, _o, v in records]
        out: list[Any] = [list(m) for m in mops]
        # The next offset to read of every input key copied (Kafka's meaning of a commit).
        offsets: dict[str, int] = {}
        for k, o, _v in records:
            if o is not None:
                offsets[k] = max(offsets.get(k, 0), o + 1)
        deadline = time.monotonic() + self.op_timeout
        errors: list[Any] = []
        zombie: Op = {}
        verdict = self._txn_copy(mops, out, offsets, deadline, kill, errors, zombie)
        if verdict == "killed":
            if self.eos_knobs.copier_zombies and self.transactional_id and self.producer:
                self._become_zombie(mops)
            else:
                self.close()
            verdict = "info"
            errors.append("killed")
        elif verdict != "ok":
            self._rewind()
        result: Op = {**op, "type": verdict, "value": [poll, *out]}
        if errors:
            result["error"] = errors[0] if len(errors) == 1 else errors
        result.update(self._producer_info())
        if zombie:
            result["zombie"] = zombie
        return result

    # -- zombies

    def _become_zombie(self, mops: list[Any]) -> None:
        """Hand this copier's producer, inside its transaction, to a zombie (see the module
        docstring); `close` then drops only the consumer."""
        transactional_id = self.transactional_id
        assert transactional_id is not None
        z = _Zombie(self.producer, self.process, [(k, v) for _f, k, v in mops])
        self.producer = None
        self.close()  # the consumer (it leaves the group as a crashed member does)
        self._zombified = True  # closing this client again (the interpreter) keeps the zombie
        with _zombies_lock:
            old = _zombies.pop(transactional_id, None)
            _zombies[transactional_id] = z
            if old is not None:
                _fates["replaced"] += 1
        if old is not None:
            old.drop()

    def close(self) -> None:
        """Drop the clients, and the zombie of this copier's transactional id (a copier
        closes at the end of its process: nothing of its id may write after that)."""
        super().close()
        if self.transactional_id and not self._zombified:
            with _zombies_lock:
                z = _zombies.pop(self.transactional_id, None)
                if z is not None:
                    _fates["closed"] += 1
            if z is not None:
                z.drop()

    def _wake_zombie(self, mops: list[Any], deadline: float) -> Op:
        """The zombie of this copier's transactional id, if any, sends its copies to the
        output keys this copy wrote to, then tries to commit: what happened, or {}."""
        if not self.transactional_id:
            return {}
        keys = {k for _f, k, _v in mops}
        with _zombies_lock:
            z = _zombies.get(self.transactional_id)
            if z is None:
                return {}
            sends = [(k, v) for k, v in z.sends if k in keys]
            z.tries += 1
            if not sends and z.tries < ZOMBIE_TRIES:
                return {}
            del _zombies[self.transactional_id]
            _fates["woken" if sends else "gave-up"] += 1
        if not sends:
            z.drop()
            return {"process": z.process, "gave-up": True}
        results: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            results.append("ok" if err is None else error_name(err))

        refused: list[str] = []
        for k, v in sends:
            topic, part = parse_key(k)
            try:
                z.producer.produce(topic, str(v).encode(), partition=part, on_delivery=report)
            except BufferError:
                refused.append("queue-full")
            except KafkaException as e:
                refused.append(error_name(e.args[0]))
        left = max(0.1, deadline - time.monotonic())
        z.producer.flush(left)
        try:
            left = max(0.1, deadline - time.monotonic())
            self._within(lambda: z.producer.commit_transaction(left), left)
            commit = "ok"
        except TimeoutError:
            commit = "timeout"
        except KafkaException as e:
            commit = error_name(e.args[0])
        z.drop()
        acked = results.count("ok")
        return {
            "process": z.process,
            "sends": [list(codec.send(k, v)) for k, v in sends],
            "acked": acked,
            "errors": sorted({r for r in results if r != "ok"} | set(refused)),
            "commit": commit,
        }

    def _txn_copy(
        self,
        mops: list[Any],
        out: list[Any],
        offsets: dict[str, int],
        deadline: float,
        kill: bool,
        errors: list[Any],
        zombie: Op,
    ) -> str:
        """Send the copies and commit them with the offsets: "ok", "fail", "info" or
        "killed" (the caller drops the client)."""
        producer, consumer = self.producer, self.consumer
        assert producer is not None and consumer is not None
        tps = [TopicPartition(*parse_key(k), off) for k, off in sorted(offsets.items())]
        in_txn = committing = False
        try:
            if self.txn:
                producer.begin_transaction()
                in_txn = True
            verdict, errs = self._send_run(mops, out, 0, len(mops), deadline)
            errors += errs
            if verdict != "ok":
                if in_txn:
                    in_txn = False
                    return self._abort(errors)
                # At-least-once: a send that may have happened is not undone.
                return verdict
            if kill:
                return "killed"
            if in_txn and self.eos_knobs.copier_zombies:
                zombie.update(self._wake_zombie(mops, deadline))
            left = max(0.1, deadline - time.monotonic())
            if in_txn:
                meta = consumer.consumer_group_metadata()
                try:
                    self._within(
                        lambda: producer.send_offsets_to_transaction(tps, meta, left), left
                    )
                except TimeoutError:
                    # Nothing will commit this transaction (the coordinator aborts it, or the
                    # next copier's init_transactions does), but this client cannot abort it.
                    errors.append(["send-offsets", "timeout"])
                    self.broken = True
                    return "fail"
                committing = True
                left = max(0.1, deadline - time.monotonic())
                try:
                    self._within(lambda: producer.commit_transaction(left), left)
                except TimeoutError:
                    errors.append(["commit", "timeout"])
                    self.broken = True
                    return "info"
                in_txn = False
                return "ok"
            return self._commit_offsets(tps, left, errors)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            errors.append(error_name(err))
            if err.code() in _BREAKING_ERRORS or err.fatal():
                self.broken = True
            if in_txn and (not committing or err.txn_requires_abort()):
                # Before the commit, or a commit the broker refused: abort, and it's a fail.
                return self._abort(errors)
            # The commit's outcome is unknown (Jepsen: indefinite): a new process takes over.
            self.broken = True
            return "info"

    def _commit_offsets(self, tps: list[TopicPartition], timeout: float, errors: list[Any]) -> str:
        """At-least-once: commit the copied offsets to the group after the sends (ok), or
        give the op up as unknown: the sends happened whatever becomes of the commit."""
        consumer = self.consumer
        assert consumer is not None
        try:
            result = self._commit_within(consumer, tps, timeout)
        except TimeoutError:
            errors.append(["commit", "timeout"])
            return "info"
        except KafkaException as e:
            errors.append(["commit", error_name(e.args[0])])
            return "info"
        failed = [tp.error for tp in result or [] if tp.error is not None]
        if failed:
            errors.append(["commit", *sorted({error_name(e) for e in failed})])
            if not all(e.code() in DEFINITE_COMMIT_ERRORS for e in failed):
                self.broken = True
            return "info"
        return "ok"

    def _rewind(self) -> None:
        """Seek every assigned input key back to the group's committed offset (the beginning
        where the group has none); a client that cannot is replaced (`broken`)."""
        consumer = self.consumer
        if consumer is None or not self.assigned:
            return
        tps = [TopicPartition(*parse_key(k)) for k in sorted(self.assigned)]
        try:
            committed = consumer.committed(
                tps, timeout=min(self.op_timeout, self.knobs.request_timeout_ms / 1000)
            )
            for tp in committed:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                off = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, off))
                k = f"{tp.topic}/{tp.partition}"
                if off >= 0:
                    self.next_offsets[k] = off
                else:
                    self.next_offsets.pop(k, None)
        except KafkaException as e:
            log.debug("process %s: rewinding to the committed offsets: %s", self.process, e)
            self.broken = True


def client_factory(
    test: Mapping[str, Any], nodes: Mapping[str, str], workload: _Roles
) -> Callable[[int, int], QueueClient]:
    """client_factory(process, thread) for the interpreter (see the module docstring); each
    thread is bound to its node as in `QueueClient.factory`."""
    plain = {**test, "txn": False}
    drain = {**plain, "isolation_level": "read_committed", "watermark_p": 0.0}
    by_role: dict[str, Callable[[int, int], QueueClient]] = {
        "copier": EosCopier.factory(test, nodes),
        "producer": QueueClient.factory(plain, nodes),
        "reader": QueueClient.factory(plain, nodes),
        "drain": QueueClient.factory(drain, nodes),
    }

    def make(process: int, thread: int) -> QueueClient:
        role = "drain" if workload.draining else workload.role(thread)
        return by_role[role](process, thread)

    return make
