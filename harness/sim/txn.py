"""Transactions for the simulated queue client: librdkafka's transactional producer and its
read_committed consumer, as `QueueClient` (harness/workloads/queue/client.py) drives them with
``--txn`` and ``--isolation-level read_committed``.

`attach(client, test, thread)` is called by `SimQueueClient` (harness/sim/client.py): it gives
the client a `SimTxnProducer` when test["txn"] (thread t's transactional id is
test["transactional_ids"][t], shared by the thread's successive processes, as QueueClient's),
and `fetch_committed` serves its fetches when test["isolation_level"] is read_committed.

The producer, after librdkafka 2.x (rdkafka_txnmgr.c, rdkafka_idempotence.c, rdkafka_request.c):

- init_transactions (the client's `open`, bounded by op_timeout_ms): FindCoordinator (key type
  1, the transactional id) to the client's own node first, then the others; InitProducerId v4
  to the coordinator, retried every 500 ms on any error that is not fatal (CONCURRENT_TRANSACTIONS,
  COORDINATOR_LOAD_IN_PROGRESS, ...; NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and a failed
  connection look the coordinator up again). Not done in time: `ClientError`, as QueueClient's
  `open` raises when init_transactions fails;
- every data op (send, poll, txn) is one transaction, as QueueClient's `_transact` with txn:
  begin (local), the op's micro-ops, then commit when every send was acknowledged, else abort;
- before the first produce to a partition in a transaction: AddPartitionsToTxn v0 to the
  coordinator, one request for the partitions a run of sends adds (librdkafka batches its
  pending partitions). Retried on NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE (coordinator
  looked up again), COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_TOPIC_OR_PARTITION (500 ms),
  CONCURRENT_TRANSACTIONS (20 ms) and a failed connection; fatal: INVALID_PRODUCER_EPOCH,
  PRODUCER_FENCED, INVALID_TXN_STATE, the authorization errors; UNKNOWN_PRODUCER_ID and
  INVALID_PRODUCER_ID_MAPPING are abortable with an epoch bump, anything else abortable. A
  partition that was not added sends nothing: its records time out in the queue (`info`
  "timeout" at the op's deadline, as QueueClient's send run waits for them);
- produce: transactional batches (the attribute bit, the producer id and epoch, sequence numbers
  per partition as the idempotent producer's) in a Produce v8 that names the transactional id
  (KIP-890's verification needs it), retried as the idempotent producer's. Then, as librdkafka
  for a transactional producer: INVALID_PRODUCER_EPOCH and OUT_OF_ORDER_SEQUENCE_NUMBER are
  fatal (the client is broken), UNKNOWN_PRODUCER_ID and a batch that times out (the op's
  deadline, message.timeout.ms) are abortable with an epoch bump, any other non-retriable
  error is abortable; each record's `ok`/`fail`/`info` is QueueClient's rule;
- commit: EndTxn v1 (commit) to the coordinator, skipped when no partition was added (librdkafka
  sends nothing for an empty transaction); retried until the commit's time (what is left of the
  op, at least 0.1 s) on a failed connection, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE (the
  coordinator looked up again: librdkafka's coordinator handle follows it),
  COORDINATOR_LOAD_IN_PROGRESS and CONCURRENT_TRANSACTIONS. Ok: the op is `ok`. Not done in
  time: `info` ("timed-out") and the client is broken, as QueueClient's commit that raises a
  retriable error; fatal (fencing, INVALID_TXN_STATE): `info`, broken; abortable: the
  transaction is aborted and the op is `fail` (or `info` if the abort fails);
- abort (bounded by op_timeout_ms, as QueueClient's abort_transaction(op_timeout)): EndTxn
  (abort), retried as the commit's and skipped when no partition was added; then, after an
  abortable error that asks for an epoch bump, InitProducerId v4 with the current producer id
  and epoch (KIP-360, on the ended transaction; sequence numbers start again at 0). Done: the
  op is `fail`; not done, or a fatal error: `info` (["abort", error]) and the client is broken;
- completions: QueueClient's shapes, with `producer` naming the transactional id; a completion
  that is not `ok` rewinds the consumer to the first offset it read, as QueueClient's rollback.

The read_committed consumer: Fetch v11 with isolation level 1 (the broker answers below the
last stable offset, with the aborted transactions overlapping the data); data batches of a
producer whose aborted transaction the fetched range holds are dropped until that producer's
abort marker, control batches are skipped (librdkafka's and the Java consumer's filter), and the
position moves past every whole batch returned, control and aborted ones included.

send_offsets_to_transaction (the eos copier's, harness/sim/eos.py): AddOffsetsToTxn v3 to the
transaction coordinator (the group's __consumer_offsets partition joins the transaction; sent
again after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / a failed connection, the coordinator
looked up again, COORDINATOR_LOAD_IN_PROGRESS and CONCURRENT_TRANSACTIONS (20 ms); fatal and
abortable errors as AddPartitionsToTxn's), then TxnOffsetCommit v3 with the consumer's group
metadata (generation, member id) to the group coordinator, the failed partitions sent again
after retry.backoff.ms on coordinator errors, REQUEST_TIMED_OUT, COORDINATOR_LOAD_IN_PROGRESS,
UNKNOWN_TOPIC_OR_PARTITION and UNSTABLE_OFFSET_COMMIT; fencing and INVALID_TXN_STATE fatal,
UNKNOWN_PRODUCER_ID abortable with a bump, anything else (a stale generation or member id)
abortable. Bounded by the op's deadline ("timed-out").

Not modelled: a
transaction's producer id changing because its epoch is exhausted (the broker rotates it; the
client takes what InitProducerId answers), librdkafka's transaction coordinator monitor and
its exponential back-offs.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.client import ConnectionFailed
from isrlab.checkers.queue import codec
from isrlab.harness.sim import wire
from isrlab.harness.sim.client import (
    _BREAKING,
    _DEFINITE,
    _REFRESH,
    _RETRIABLE,
    RETRY_BACKOFF_S,
    ClientError,
    _Delivery,
    _error_name,
    tally_deliveries,
)
from isrlab.harness.sim.cluster import EPOCH
from isrlab.harness.workloads.queue.client import _decode as _decode_value
from isrlab.harness.workloads.queue.client import _worse, parse_key

if TYPE_CHECKING:
    from isrlab.harness.sim.client import SimQueueClient

__all__ = [
    "SimTxnProducer",
    "attach",
    "committed_records",
    "encode_committed_fetch",
    "fetch_committed",
    "transactional_id",
]

E = ErrorCode
Op = dict[str, Any]
TP = tuple[str, int]

#: FindCoordinator's key type of a transactional id
KEY_TYPE_TRANSACTION = 1
#: librdkafka's PID state machine timer (InitProducerId retried after it)
PID_RETRY_S = 0.5
#: AddPartitionsToTxn's retry back-off (librdkafka: 500 ms, as its coordinator query retry)
ADD_RETRY_S = 0.5
#: AddPartitionsToTxn's back-off after CONCURRENT_TRANSACTIONS (librdkafka: 20 ms)
CONCURRENT_RETRY_S = 0.02

#: Kafka's authorization error codes (the broker has no authorization and no names for them)
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 53, 31

_COORD = frozenset({E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE})
#: AddPartitionsToTxn / EndTxn errors librdkafka makes fatal
_TXN_FATAL = frozenset(
    {
        E.INVALID_PRODUCER_EPOCH,
        E.PRODUCER_FENCED,
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        CLUSTER_AUTHORIZATION_FAILED,
        E.INVALID_TXN_STATE,
    }
)
#: InitProducerId errors librdkafka makes fatal (rd_kafka_idemp_check_error)
_PID_FATAL = frozenset(
    {
        E.INVALID_PRODUCER_EPOCH,
        E.PRODUCER_FENCED,
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        CLUSTER_AUTHORIZATION_FAILED,
        E.INVALID_TRANSACTION_TIMEOUT,
    }
)
#: errors after which the transaction must be aborted with an epoch bump (KIP-360)
_BUMP = frozenset({E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_ID_MAPPING})
_FENCING = frozenset({E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED})


def transactional_id(test: Mapping[str, Any], process: int, thread: int | None) -> str:
    """Thread t's id from test["transactional_ids"], else one of this process's own (as
    QueueClient, whose own ids are random: here named after the process, deterministic)."""
    ids = test.get("transactional_ids") or ()
    if thread is not None and 0 <= thread < len(ids):
        return str(ids[thread])
    return f"isrlab-{process}-sim"


def attach(client: SimQueueClient, test: Mapping[str, Any], thread: int | None) -> None:
    """Give `client` its transactional producer (test["txn"]) and read_committed fetches."""
    if test.get("txn"):
        client.txn = SimTxnProducer(client, transactional_id(test, client.process, thread))
    if test.get("isolation_level") == "read_committed":
        client.fetch_hook = functools.partial(fetch_committed, client)


class SimTxnProducer:
    """One client's transactional producer (see the module doc)."""

    def __init__(self, client: SimQueueClient, txn_id: str) -> None:
        self.c = client
        self.transactional_id = txn_id
        #: QueueClient's transaction.timeout.ms
        self.timeout_ms = max(60000, client.knobs.op_timeout_ms * 2)
        self.coordinator: tuple[str, int] | None = None
        #: a fatal error's name (the producer cannot go on), and whether it proves the
        #: records of the op that saw it were not written
        self.fatal: str | None = None
        self.fatal_definite = False
        # the transaction: partitions added, AddPartitionsToTxn requests that may have reached
        # the coordinator (librdkafka's txn_req_cnt), an abortable error and its epoch bump
        self.added: set[TP] = set()
        self.req_cnt = 0
        self.abortable: str | None = None
        self.bump = False

    # ----- coordinator and producer id ------------------------------------------------------

    async def _coordinator(self, deadline: float) -> tuple[str, int] | None:
        """The transaction coordinator's address (FindCoordinator when unknown); None when
        none answered before `deadline`."""
        if self.coordinator is None:
            req = FindCoordinatorRequest[2](
                key=self.transactional_id, key_type=KEY_TYPE_TRANSACTION
            )
            resp = await self.c.find_coordinator(
                req, deadline, lambda: self.coordinator is not None
            )
            if resp is not None:
                self.coordinator = (resp.host, resp.port)
        return self.coordinator

    async def _request(
        self, req: Any, deadline: float, on_send: Callable[[], None] | None = None
    ) -> Any:
        """`req` to the coordinator; None when no coordinator answered in time or the
        connection failed (the coordinator is then looked up again). `on_send` is called
        when the request is sent."""
        c = self.c
        coord = await self._coordinator(deadline)
        left = min(c.request_timeout, c._left(deadline))
        if coord is None or left <= 0:
            return None
        if on_send is not None:
            on_send()
        try:
            return await c._conn(*coord).request(req, left)
        except ConnectionFailed:
            self.coordinator = None
            return None

    async def _init_pid(self, deadline: float, bump: bool) -> str | None:
        """InitProducerId (with the current producer id and epoch when `bump`: KIP-360);
        None when a producer id and epoch were assigned, else the error's name ("timed-out",
        or a fatal error, which is then set)."""
        c = self.c
        while True:
            if c._left(deadline) <= 0:
                return "timed-out"
            req = InitProducerIdRequest[4](
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.timeout_ms,
                producer_id=c._pid if bump else -1,
                producer_epoch=c._epoch if bump else -1,
            )
            resp = await self._request(req, deadline)
            if resp is not None:
                code = resp.error_code
                if code == 0:
                    c._pid, c._epoch = resp.producer_id, resp.producer_epoch
                    c._seq = {}
                    return None
                if code in _PID_FATAL:
                    return self._set_fatal(code)
                if code in _COORD:
                    self.coordinator = None
            await asyncio.sleep(min(PID_RETRY_S, c._left(deadline)))

    def _set_fatal(self, code: int) -> str:
        # librdkafka normalizes fencing errors to its local _FENCED ("fenced")
        name = "fenced" if code in _FENCING else _error_name(code)
        if self.fatal is None:
            self.fatal = name
            self.fatal_definite = code in _FENCING or code in _DEFINITE
        self.c.broken = True
        return self.fatal

    def _set_abortable(self, name: str, bump: bool = False) -> None:
        if self.abortable is None:
            self.abortable = name
        self.bump = self.bump or bump

    async def init_transactions(self) -> None:
        """init_transactions(op_timeout): ClientError when it does not succeed."""
        c = self.c
        err = await self._init_pid(c._loop_time() + c.op_timeout, bump=False)
        if err is not None:
            raise ClientError(
                f"init_transactions for {self.transactional_id} failed ({err}): does the "
                "broker support transactions? Run without --txn otherwise."
            )

    # ----- the transaction ------------------------------------------------------------------

    def _begin(self) -> None:
        self.added = set()
        self.req_cnt = 0
        self.abortable = None
        self.bump = False

    async def transact(self, op: Op, poll_s: float) -> Op:
        """QueueClient._transact with txn: the op's micro-ops in one transaction."""
        c = self.c
        mops: list[Any] = list(op["value"] or [])
        out: list[Any] = [list(m) for m in mops]
        first_read: dict[str, int] = {}
        verdict: str | None = None
        errors: list[Any] = []
        has_send = any(m and m[0] == codec.SEND for m in mops)
        deadline = c._loop_time() + c.op_timeout
        in_txn = False
        try:
            if self.fatal is not None:
                # begin_transaction raises the fatal error
                errors.append(self.fatal)
                c.broken = True
                verdict = "fail" if self.fatal_definite else "info"
            else:
                self._begin()
                in_txn = True
                i = 0
                while i < len(mops):
                    if mops[i][0] == codec.SEND:
                        j = i
                        while j < len(mops) and mops[j][0] == codec.SEND:
                            j += 1
                        v, errs = await self._send_run(mops, out, i, j, deadline)
                        verdict = _worse(verdict, v)
                        errors += errs
                        i = j
                        if verdict != "ok":
                            break
                    elif mops[i][0] == codec.POLL:
                        out[i] = codec.poll_result(await c._poll(poll_s, first_read))
                        i += 1
                    else:
                        raise ValueError(f"unknown micro-op {mops[i]!r}")
                verdict = verdict or "ok"
                in_txn = False
                if verdict == "ok":
                    left = max(0.1, c._left(deadline))
                    verdict = await self._commit(c._loop_time() + left, errors)
                else:
                    verdict = await self._abort(errors)
        except (ValueError, TypeError, IndexError) as e:
            errors.append(["bad-op", str(e)])
            verdict = _worse(verdict, "info" if has_send else "fail")
            if in_txn:
                verdict = await self._abort(errors)
        return await c._complete(
            op, verdict or "ok", out, errors, first_read, deadline, self.transactional_id
        )

    async def _commit(self, deadline: float, errors: list[Any]) -> str:
        """commit_transaction: the op's verdict (see the module doc)."""
        err = self.abortable
        if err is None and self.fatal is None:
            err = await self._end_txn(commit=True, deadline=deadline)
            if err is None:
                return "ok"
        if self.fatal is not None:
            errors.append(self.fatal)
            self.c.broken = True
            return "info"
        if self.abortable is not None:
            # the commit raised an error that requires an abort
            errors.append(self.abortable)
            return await self._abort(errors)
        # retriable (timed out): unknown, and QueueClient gives the client up
        errors.append(err)
        self.c.broken = True
        return "info"

    async def _abort(self, errors: list[Any]) -> str:
        """abort_transaction(op_timeout): "fail" when done, else "info" (broken)."""
        c = self.c
        deadline = c._loop_time() + c.op_timeout
        err: str | None = self.fatal
        if err is None:
            # librdkafka ends the transaction first (EndTxn abort, unless nothing was added),
            # then bumps the epoch if the error asked for it: a bump while the transaction is
            # open would be a fence (the coordinator aborts it with a bumped epoch and the
            # retry is PRODUCER_FENCED)
            err = await self._end_txn(commit=False, deadline=deadline)
            if err is not None and self.fatal is None and self.bump:
                err = None  # EndTxn asked for an epoch bump: the bump ends it
            if err is None and self.bump:
                err = await self._init_pid(deadline, bump=True)
        if err is None:
            self._begin()
            return "fail"
        errors.append(["abort", err])
        c.broken = True
        return "info"

    async def _end_txn(self, commit: bool, deadline: float) -> str | None:
        """EndTxn; None when done (or nothing to end), else the error's name: "timed-out",
        a fatal error or an abortable one (both then set)."""
        if self.req_cnt == 0 and not self.added:
            return None  # no partition registered: librdkafka sends no EndTxn
        c = self.c
        while True:
            if c._left(deadline) <= 0:
                return "timed-out"
            req = EndTxnRequest[1](
                transactional_id=self.transactional_id,
                producer_id=c._pid,
                producer_epoch=c._epoch,
                committed=commit,
            )
            resp = await self._request(req, deadline)
            if resp is not None:
                code = resp.error_code
                if code == 0:
                    return None
                if code in _TXN_FATAL:
                    return self._set_fatal(code)
                if code in _BUMP:
                    self._set_abortable(_error_name(code), bump=True)
                    return _error_name(code)
                if code in _COORD:
                    self.coordinator = None
                elif code not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.CONCURRENT_TRANSACTIONS):
                    self._set_abortable(_error_name(code))
                    return _error_name(code)
            await asyncio.sleep(min(RETRY_BACKOFF_S, c._left(deadline)))

    async def _add_partitions(self, tps: list[TP], deadline: float) -> None:
        """AddPartitionsToTxn for those of `tps` not in the transaction yet, until they are,
        an error ends it (fatal or abortable, then set) or `deadline`."""
        c = self.c
        todo = sorted(set(tps) - self.added)
        while todo and self.fatal is None and self.abortable is None:
            if c._left(deadline) <= 0:
                return
            topics: dict[str, list[int]] = {}
            for t, p in todo:
                topics.setdefault(t, []).append(p)
            A = AddPartitionsToTxnRequest[0]
            req = A(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=c._pid,
                v3_and_below_producer_epoch=c._epoch,
                v3_and_below_topics=[
                    A.AddPartitionsToTxnTopic(name=t, partitions=ps)
                    for t, ps in sorted(topics.items())
                ],
            )
            # librdkafka's txn_req_cnt counts the requests sent (an answer with an error takes
            # it back): an abort sends EndTxn only if one may have reached the coordinator
            resp = await self._request(req, deadline, self._sent)
            backoff = ADD_RETRY_S
            if resp is not None:
                error = 0
                for t in resp.results_by_topic_v3_and_below:
                    for p in t.results_by_partition:
                        if p.partition_error_code == 0:
                            self.added.add((t.name, p.partition_index))
                        elif not error or error == E.OPERATION_NOT_ATTEMPTED:
                            error = p.partition_error_code
                if error:
                    self.req_cnt -= 1  # an answer: the request did not add them
                    if error in _COORD:
                        self.coordinator = None
                    elif error == E.CONCURRENT_TRANSACTIONS:
                        backoff = CONCURRENT_RETRY_S
                    elif error in (E.COORDINATOR_LOAD_IN_PROGRESS, E.UNKNOWN_TOPIC_OR_PARTITION):
                        pass
                    elif error in _TXN_FATAL:
                        self._set_fatal(error)
                        return
                    elif error in _BUMP:
                        self._set_abortable(_error_name(error), bump=True)
                        return
                    else:
                        self._set_abortable(_error_name(error))
                        return
            todo = sorted(set(tps) - self.added)
            if todo:
                await asyncio.sleep(min(backoff, c._left(deadline)))

    def _sent(self) -> None:
        self.req_cnt += 1

    # ----- send_offsets_to_transaction -----------------------------------------------------

    async def send_offsets_to_transaction(
        self, offsets: Mapping[str, int], member: Any, deadline: float
    ) -> str | None:
        """send_offsets_to_transaction(offsets, the consumer's group metadata): None when the
        offsets are in the transaction, else the error's name ("timed-out", or a fatal or
        abortable error, which is then set). `member` is the consumer's `SimGroupMember`
        (group id, generation, member id, its coordinator). See the module doc."""
        if self.fatal is not None:
            return self.fatal
        if self.abortable is not None:
            return self.abortable
        if not offsets:
            return None  # librdkafka returns at once for an empty list
        err = await self._add_offsets(member.group, deadline)
        if err is not None:
            return err
        return await self._txn_offset_commit(offsets, member, deadline)

    async def _add_offsets(self, group: str, deadline: float) -> str | None:
        """AddOffsetsToTxn v3 to the transaction coordinator until it answers without a
        retriable error (rd_kafka_txn_handle_AddOffsetsToTxn's classes)."""
        c = self.c
        while True:
            if c._left(deadline) <= 0:
                return "timed-out"
            req = AddOffsetsToTxnRequest[3](
                transactional_id=self.transactional_id,
                producer_id=c._pid,
                producer_epoch=c._epoch,
                group_id=group,
            )
            resp = await self._request(req, deadline, self._sent)
            backoff = ADD_RETRY_S
            if resp is not None:
                code = resp.error_code
                if code == 0:
                    return None
                self.req_cnt -= 1  # an answer: the group's partition was not added
                if code in _COORD:
                    self.coordinator = None
                elif code == E.CONCURRENT_TRANSACTIONS:
                    backoff = CONCURRENT_RETRY_S
                elif code == E.COORDINATOR_LOAD_IN_PROGRESS:
                    pass
                elif code in _TXN_FATAL:
                    return self._set_fatal(code)
                elif code in _BUMP:
                    self._set_abortable(_error_name(code), bump=True)
                    return _error_name(code)
                else:
                    self._set_abortable(_error_name(code))
                    return _error_name(code)
            await asyncio.sleep(min(backoff, c._left(deadline)))

    async def _txn_offset_commit(
        self, offsets: Mapping[str, int], member: Any, deadline: float
    ) -> str | None:
        """TxnOffsetCommit v3 (with the member's generation and id: KIP-447) to the group
        coordinator, the partitions still failing sent again (rd_kafka_txn_handle_
        TxnOffsetCommit's classes: coordinator errors and REQUEST_TIMED_OUT look the
        coordinator up again, COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_TOPIC_OR_PARTITION and
        UNSTABLE_OFFSET_COMMIT are retried, fencing and INVALID_TXN_STATE are fatal,
        UNKNOWN_PRODUCER_ID asks for an epoch bump, the rest, the group's
        ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID included, is abortable)."""
        c = self.c
        todo = dict(offsets)
        R = TxnOffsetCommitRequest[3]
        T = R.TxnOffsetCommitRequestTopic
        P = T.TxnOffsetCommitRequestPartition
        retry = {
            E.COORDINATOR_LOAD_IN_PROGRESS,
            E.UNKNOWN_TOPIC_OR_PARTITION,
            E.UNSTABLE_OFFSET_COMMIT,
        }
        while todo:
            if c._left(deadline) <= 0:
                return "timed-out"
            by_topic: dict[str, list[Any]] = {}
            for k, off in sorted(todo.items()):
                t, p = parse_key(k)
                by_topic.setdefault(t, []).append(
                    P(
                        partition_index=p,
                        committed_offset=off,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                )
            generation, member_id = member.group_metadata()
            req = R(
                transactional_id=self.transactional_id,
                group_id=member.group,
                producer_id=c._pid,
                producer_epoch=c._epoch,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=None,
                topics=[T(name=t, partitions=ps) for t, ps in sorted(by_topic.items())],
            )
            resp = await member._request(req, deadline)
            if resp is not None:
                for t in resp.topics:
                    for p in t.partitions:
                        k = f"{t.name}/{p.partition_index}"
                        code = p.error_code
                        if code == 0:
                            todo.pop(k, None)
                        elif code in _COORD or code == E.REQUEST_TIMED_OUT:
                            member.coordinator = None
                        elif code in retry:
                            pass
                        elif code in _TXN_FATAL:
                            return self._set_fatal(code)
                        elif code in _BUMP:
                            self._set_abortable(_error_name(code), bump=True)
                            return _error_name(code)
                        else:
                            self._set_abortable(_error_name(code))
                            return _error_name(code)
            if todo:
                await asyncio.sleep(min(RETRY_BACKOFF_S, c._left(deadline)))
        return None

    # ----- produce --------------------------------------------------------------------------

    async def _send_run(
        self, mops: list[Any], out: list[Any], i: int, j: int, deadline: float
    ) -> tuple[str, list[Any]]:
        """QueueClient._send_run in a transaction: the run's new partitions added (one
        AddPartitionsToTxn), then a transactional batch per partition."""
        c = self.c
        by_tp: dict[TP, list[int]] = {}
        for n in range(i, j):
            by_tp.setdefault(parse_key(mops[n][1]), []).append(n)
        loop = asyncio.get_running_loop()
        adding = loop.create_task(self._add_partitions(list(by_tp), deadline))
        tasks = {
            tp: loop.create_task(
                self._deliver(tp, [str(mops[n][2]).encode() for n in ns], deadline, adding)
            )
            for tp, ns in by_tp.items()
        }
        await asyncio.wait(list(tasks.values()), timeout=c._left(deadline) + 0.001)
        if not adding.done():
            adding.cancel()
        deliveries: dict[TP, _Delivery] = {}
        for tp in by_tp:
            task = tasks[tp]
            if task.done():
                deliveries[tp] = task.result()
            else:
                # the records time out (message.timeout.ms): librdkafka's epoch bump, as their
                # sequence numbers may or may not be in the log
                task.cancel()
                self._set_abortable("msg-timed-out", bump=True)
                deliveries[tp] = _Delivery("info", error="timeout")
        return tally_deliveries(mops, out, by_tp, deliveries)

    async def _deliver(
        self, tp: TP, values: list[bytes], deadline: float, adding: asyncio.Task[None]
    ) -> _Delivery:
        c = self.c
        if self.fatal is not None:
            # produce() refuses the record: it never left the process
            return _Delivery("fail" if self.fatal_definite else "info", error=self.fatal)
        await asyncio.shield(adding)
        if tp not in self.added:
            if self.fatal is not None:
                return _Delivery("fail" if self.fatal_definite else "info", error=self.fatal)
            # never sent: the records wait in librdkafka's queue until they time out
            await asyncio.sleep(c._left(deadline))
            self._set_abortable("msg-timed-out", bump=True)
            return _Delivery("info", error="timeout")
        pid, epoch = c._pid, c._epoch
        seq = c._seq.get(tp, 0)
        c._seq[tp] = seq + len(values)
        builder = MemoryRecordsBuilder(
            magic=2,
            compression_type=0,
            batch_size=1 << 20,
            transactional=True,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
        )
        ts = int((EPOCH + c._loop_time()) * 1000)
        for v in values:
            builder.append(timestamp=ts, key=None, value=v, headers=[])
        builder.close()
        return await self._produce(tp, bytes(builder.buffer()), deadline)

    async def _produce(self, tp: TP, records: bytes, deadline: float) -> _Delivery:
        c = self.c
        attempts = 0
        encode = functools.partial(
            _encode_produce,
            self.transactional_id,
            c.acks,
            c.knobs.request_timeout_ms,
            tp,
            records,
        )
        while True:
            if c._left(deadline) <= 0:
                self._set_abortable("msg-timed-out", bump=True)
                return _Delivery("info", error="msg-timed-out")
            if self.fatal is not None:
                return _Delivery("info", error=self.fatal)
            leader = await c._leader(tp, deadline)
            conn = None if leader is None else c._broker_conn(leader)
            if conn is None:
                await c._backoff(deadline)
                continue
            left = min(c.request_timeout, c._left(deadline))
            try:
                parts = await conn.call(
                    encode, wire.decode_produce_response, max(0.001, left), answer=True
                )
            except ConnectionFailed:
                c._forget(tp)
                attempts += 1
                if c.retries is not None and attempts > c.retries:
                    self._set_abortable("transport")
                    return _Delivery("info", error="transport")
                await c._backoff(deadline)
                continue
            err = parts[0].error_code
            if err == 0:
                base = parts[0].base_offset
                return _Delivery("ok", base if base >= 0 else None)
            if err == E.DUPLICATE_SEQUENCE_NUMBER:
                return _Delivery("ok")
            if err in _RETRIABLE:
                if err in _REFRESH:
                    c._forget(tp)
                attempts += 1
                if c.retries is None or attempts <= c.retries:
                    await c._backoff(deadline)
                    continue
            name = _error_name(err)
            if err == E.INVALID_PRODUCER_EPOCH or err in _BREAKING:
                self._set_fatal(err)
            elif err in _BUMP:
                self._set_abortable(name, bump=True)
            else:
                self._set_abortable(name)
            return _Delivery("fail" if err in _DEFINITE else "info", error=name)


def _encode_produce(
    txn_id: str,
    acks: int,
    timeout_ms: int,
    tp: TP,
    records: bytes,
    correlation: int,
    client_id: str,
) -> bytes:
    """A transactional Produce v8 of one batch (kafka-python's schema: the transactional id
    is what wire.encode_produce_request leaves out)."""
    P = ProduceRequest[wire.PRODUCE_VERSION]
    req = P(
        transactional_id=txn_id,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[
            P.TopicProduceData(
                name=tp[0],
                partition_data=[
                    P.TopicProduceData.PartitionProduceData(index=tp[1], records=records)
                ],
            )
        ],
    )
    req.with_header(correlation_id=correlation, client_id=client_id)
    return req.encode(header=True, framed=True)  # type: ignore[no-any-return]


# ----- read_committed ------------------------------------------------------------------------

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_FETCH_TOP = struct.Struct(">ihi")  # throttle time, error code, session id
_FETCHED = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_BATCH_HEAD = struct.Struct(">qiibIhiqqqhii")  # a v2 record batch's 61-byte header
_CONTROL, _TRANSACTIONAL = 0x20, 0x10


def encode_committed_fetch(
    correlation: int,
    client_id: str,
    max_wait_ms: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
) -> bytes:
    """wire.encode_fetch_request's consumer Fetch v11 with isolation level 1 (read_committed):
    the same bytes but the isolation byte (after the header, replica, wait, min and max)."""
    data = bytearray(
        wire.encode_fetch_request(correlation, client_id, max_wait_ms, 1, 1 << 20, topics)
    )
    data[4 + 10 + len(client_id.encode()) + 16] = 1
    return bytes(data)


def _decode_fetch(
    frame: bytes | memoryview,
) -> list[tuple[str, int, int, list[tuple[int, int]], bytes]]:
    """A FetchResponse v11 -> [(topic, partition, error, aborted [(pid, first offset)],
    records)] (wire.decode_fetch_response, keeping the aborted transactions)."""
    buf = memoryview(frame)
    out: list[tuple[str, int, int, list[tuple[int, int]], bytes]] = []
    try:
        pos = 4 + _FETCH_TOP.size
        (n_topics,) = _I32.unpack_from(buf, pos)
        pos += 4
        for _ in range(n_topics):
            (n,) = _I16.unpack_from(buf, pos)
            topic = bytes(buf[pos + 2 : pos + 2 + n]).decode()
            pos += 2 + n
            (n_parts,) = _I32.unpack_from(buf, pos)
            pos += 4
            for _ in range(n_parts):
                index, perr, _hw, _lso, _start = _FETCHED.unpack_from(buf, pos)
                pos += _FETCHED.size
                (n_aborted,) = _I32.unpack_from(buf, pos)
                pos += 4
                aborted = []
                for _ in range(max(n_aborted, 0)):
                    aborted.append(_ABORTED.unpack_from(buf, pos))
                    pos += _ABORTED.size
                pos += 4  # preferred read replica
                (n_records,) = _I32.unpack_from(buf, pos)
                pos += 4
                records = b""
                if n_records > 0:
                    if pos + n_records > len(buf):
                        raise wire.MalformedResponse("records run past the end of the frame")
                    records = bytes(buf[pos : pos + n_records])
                    pos += n_records
                out.append((topic, index, perr, aborted, records))
    except (struct.error, UnicodeDecodeError) as e:
        raise wire.MalformedResponse(f"fetch response cut short or garbled: {e}") from None
    return out


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at `pos` -> (value, position after it)."""
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def _is_abort_marker(data: bytes, pos: int) -> bool:
    """Whether the control batch at `pos` is an abort marker (its record's key: version,
    type; type 0 is ABORT)."""
    p = pos + _BATCH_HEAD.size
    _, p = _uvarint(data, p)  # record length
    p += 1  # attributes
    _, p = _uvarint(data, p)  # timestamp delta
    _, p = _uvarint(data, p)  # offset delta
    n, p = _uvarint(data, p)  # key length
    if n < 4:
        return False
    (kind,) = _I16.unpack_from(data, p + 2)
    return kind == 0


def committed_records(
    data: bytes, aborted: list[tuple[int, int]]
) -> tuple[list[tuple[int, bytes | None]], int | None]:
    """(offset, value) of the committed data records of the whole v2 batches in `data`, and
    the offset after the last whole batch (None: none). `aborted` is the response's aborted
    transactions: a producer's data batches are dropped from its aborted transaction's first
    offset on until its abort marker (the Java consumer's and librdkafka's filter)."""
    pending = sorted(aborted, key=lambda a: a[1])
    k = 0
    open_aborted: set[int] = set()
    out: list[tuple[int, bytes | None]] = []
    next_offset: int | None = None
    pos, size = 0, len(data)
    while pos + 12 <= size:
        (length,) = _I32.unpack_from(data, pos + 8)
        end = pos + 12 + length
        if end > size or length < _BATCH_HEAD.size - 12:
            break
        head = _BATCH_HEAD.unpack_from(data, pos)
        base, attributes, last_delta, pid = head[0], head[5], head[6], head[9]
        last = base + last_delta
        next_offset = last + 1
        while k < len(pending) and pending[k][1] <= last:
            open_aborted.add(pending[k][0])
            k += 1
        if attributes & _CONTROL:
            if pid in open_aborted and _is_abort_marker(data, pos):
                open_aborted.discard(pid)
        elif not (attributes & _TRANSACTIONAL and pid in open_aborted):
            out.extend(wire.decode_records(data[pos:end]))
        pos = end
    return out, next_offset


async def fetch_committed(
    c: SimQueueClient, leader: int, keys: list[str], left: float
) -> dict[str, list[list[Any]]]:
    """SimQueueClient._fetch at isolation level read_committed (see the module doc)."""
    conn = c._broker_conn(leader)
    if conn is None:
        return {}
    max_wait = min(c.knobs.fetch_wait_max_ms, max(0, int(left * 1000)))
    topics: dict[str, list[tuple[int, int, int]]] = {}
    for k in keys:
        t, p = parse_key(k)
        position = c.positions[k]
        assert position is not None
        topics.setdefault(t, []).append((p, position, 1 << 20))
    encode = functools.partial(
        _encode_committed, max_wait, sorted(topics.items(), key=lambda t: t[0])
    )
    timeout = max_wait / 1000 + c.request_timeout
    try:
        parts = await conn.call(encode, _decode_fetch, timeout)
    except ConnectionFailed:
        for k in keys:
            c._forget(parse_key(k))
        return {}
    out: dict[str, list[list[Any]]] = {}
    for topic, partition, error, aborted, records in parts:
        k = f"{topic}/{partition}"
        if k not in c.assigned or c.positions.get(k) is None:
            continue  # unassigned meanwhile
        if error == E.OFFSET_OUT_OF_RANGE:
            c.positions[k] = None  # auto.offset.reset=earliest
            continue
        if error != 0:
            if error in _REFRESH:
                c._forget((topic, partition))
            continue
        pos = c.positions[k]
        assert pos is not None
        got, next_offset = committed_records(records, aborted)
        pairs = [[o, v] for o, v in _values(got) if o >= pos]
        if pairs:
            out[k] = pairs
        if next_offset is not None and next_offset > pos:
            c.positions[k] = next_offset
    return out


def _encode_committed(
    max_wait_ms: int,
    topics: list[tuple[str, list[tuple[int, int, int]]]],
    correlation: int,
    client_id: str,
) -> bytes:
    return encode_committed_fetch(correlation, client_id, max_wait_ms, topics)


def _values(got: list[tuple[int, bytes | None]]) -> list[tuple[int, Any]]:
    """(offset, value) with the value decoded as the client decodes it (an int, else text)."""
    return [(o, _decode_value(v)) for o, v in got]
