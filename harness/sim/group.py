"""Consumer groups for the simulated queue client: librdkafka's group consumer, as
`QueueClient` (harness/workloads/queue/client.py) drives it with ``subscribe`` and ``commit``.

`attach(client)` is called by `SimQueueClient` (harness/sim/client.py) when the test names a
group (test["group"]: some process can subscribe); it gives the client a `SimGroupMember`.
The member speaks the classic group protocol to the broker's group coordinator, with
kafka-python's request classes (as the client's other rare requests) and the consumer
protocol's subscription and assignment (the broker's `decode_consumer_assignment` and
`consumer_subscription_topics` read what is written here). What it does, after librdkafka
2.x (rdkafka_cgrp.c, the eager protocol) where it matters for anomalies:

- the coordinator: FindCoordinator v3 (key type 0, the group) to the client's own node first,
  then the others, every 500 ms until one answers; looked up again after NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE or a connection that failed or timed out;
- a background task per member (librdkafka's main thread), started by the first `subscribe`:
  JoinGroup v5 (KIP-394: MEMBER_ID_REQUIRED hands out the member id, the join is sent again
  with it; session.timeout.ms and max.poll.interval.ms as QueueClient configures them; the
  protocol is the test's assignment_strategy, roundrobin, range or cooperative-sticky: see
  below), then SyncGroup v3: the leader computes the assignment from the members' subscriptions and the partitions metadata
  gives (librdkafka's roundrobin: members by member id, partitions by topic then number, each
  to the next member subscribed to its topic; range: per topic, contiguous ranges, the first
  P mod M members one more); then Heartbeat v3 every heartbeat.interval.ms (min(knob,
  session/3), QueueClient's) of virtual time, each after the previous answer;
- rejoin (eager: every owned partition revoked first): REBALANCE_IN_PROGRESS (heartbeat,
  SyncGroup), ILLEGAL_GENERATION (the assignment lost, the member id kept), UNKNOWN_MEMBER_ID
  (lost, the member id dropped), NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE (the coordinator
  looked up again), a coordinator that changed after a failed connection, a changed
  subscription; no successful heartbeat for session.timeout.ms: the assignment is lost and the
  member id dropped (librdkafka's session timeout check), then a new join;
- the application's side (QueueClient's rebalance callbacks, which librdkafka serves in
  poll): what the background task decided is queued, and the client's ops take it (`serve`):
  at the start of every poll (and every fetch round of a poll) and of every commit. An
  assignment records its keys and fetches the group's committed offsets (OffsetFetch v7,
  require_stable with read_committed, bounded by min(op_timeout_ms, request_timeout_ms): the
  assign callback's `committed()`): they go into the completion's ``rebalance.committed`` and
  are where the keys are read from (none: the log start, auto.offset.reset=earliest; a key the
  OffsetFetch did not answer is looked up again before it is fetched). A revocation (or a lost
  assignment) drops the keys and their positions. The next completion carries
  ``rebalance`` {generation, assigned, revoked, committed} as QueueClient's;
- `commit`: OffsetCommit v8 of the next offset to read of every owned key the process has
  read since it was assigned (QueueClient's next_offsets), with the member's generation and
  id, synchronous: sent again after retry.backoff.ms on NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE, REQUEST_TIMED_OUT, COORDINATOR_LOAD_IN_PROGRESS or a failed
  connection (the coordinator looked up again) until the op's deadline (op_timeout_ms, as
  QueueClient bounds librdkafka's commit); `ok` when every partition is committed, `fail`
  when every partition has an error of `DEFINITE_COMMIT_ERRORS` (refused before the append),
  else `info`; ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID also make the member rejoin;
- `drop` (an `assign` after a subscribe, a crash, a closed client): the member is dropped
  without LeaveGroup (QueueClient never closes a member, it times out of the group) and its
  keys recorded as revoked.

cooperative-sticky (KIP-429's incremental protocol, librdkafka's rdkafka_cgrp.c cooperative
paths): the subscription is v1, with the partitions the member owns; the leader runs a sticky
assignor (`assign_sticky`: balanced, owned partitions kept where balance allows,
deterministic) and then KIP-429's adjustment (`cooperative_adjust`: a partition another member
still owns is left out of its new owner's assignment). The member keeps its partitions while it
rejoins (REBALANCE_IN_PROGRESS, a changed coordinator...), and after a SyncGroup queues only
what changed: the partitions it lost as a revocation, then the ones it gained as an assignment
(an assignment, empty or not, when nothing was revoked; never an empty revocation, as
librdkafka). Once the application has taken a revocation (`serve`), the member rejoins, and the
next rebalance hands the partitions over; before any join it waits until the application has
taken every revocation queued (librdkafka rejoins after the incremental unassign). A changed
subscription revokes only the partitions of the topics left. Lost (UNKNOWN_MEMBER_ID from
JoinGroup, UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION from SyncGroup or Heartbeat, or no
successful heartbeat or SyncGroup for session.timeout.ms, also while it fails to rejoin):
everything is revoked, as QueueClient's on_lost. QueueClient commits nothing in its revoke callback, nor does this member.

Not reproduced: static membership, librdkafka waiting for the application to handle a
revocation before it rejoins, with the eager assignors (the background task rejoins at once; the client stops fetching the revoked keys at its next poll,
and a commit takes the pending rebalances first, so it never commits a revoked key under a newer
generation, which librdkafka's wait also rules out; a transaction's offsets go with the
generation and member id of the last assignment the application took, `group_metadata`, as
librdkafka's consumer_group_metadata() would give them),
max.poll.interval.ms on the client side (a member that does not poll is not made to leave),
librdkafka's exponential back-offs (flat retry.backoff.ms and 500 ms for the coordinator),
auto-commit (the queue workload commits explicitly, enable.auto.commit=false).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from isrlab.broker.coordinator.group.group import consumer_subscription_topics
from isrlab.broker.coordinator.group.records import decode_consumer_assignment
from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.client import ConnectionFailed
from isrlab.checkers.queue import codec
from isrlab.harness.sim.client import RETRY_BACKOFF_S, metadata_request
from isrlab.harness.workloads.queue.client import parse_key, with_rebalance

if TYPE_CHECKING:
    from isrlab.harness.sim.client import SimQueueClient

__all__ = [
    "ASSIGNORS",
    "COOPERATIVE",
    "DEFINITE_COMMIT_ERRORS",
    "SimGroupMember",
    "assign_cooperative_sticky",
    "assign_range",
    "assign_roundrobin",
    "assign_sticky",
    "attach",
    "cooperative_adjust",
    "decode_owned_partitions",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

log = logging.getLogger(__name__)

Op = dict[str, Any]
E = ErrorCode

#: FindCoordinator's key type of a group
KEY_TYPE_GROUP = 0
#: librdkafka gives a JoinGroup max.poll.interval.ms plus this to answer (the coordinator holds
#: it for the whole rebalance)
JOIN_GRACE_S = 3.0

#: errors after which the coordinator is looked up again
_COORD = frozenset({E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE})
#: commit errors after which the commit is sent again
_COMMIT_RETRY = _COORD | {E.REQUEST_TIMED_OUT, E.COORDINATOR_LOAD_IN_PROGRESS}
#: QueueClient's DEFINITE_COMMIT_ERRORS by broker code: the coordinator refused the commit
#: before appending it (the rest of that set are librdkafka's local errors)
DEFINITE_COMMIT_ERRORS = frozenset(
    {
        E.ILLEGAL_GENERATION,
        E.UNKNOWN_MEMBER_ID,
        E.REBALANCE_IN_PROGRESS,
        E.FENCED_INSTANCE_ID,
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.OFFSET_METADATA_TOO_LARGE,
        E.INVALID_COMMIT_OFFSET_SIZE,
        29,  # TOPIC_AUTHORIZATION_FAILED (the broker has no ACLs: never sent)
        30,  # GROUP_AUTHORIZATION_FAILED
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.INVALID_GROUP_ID,
    }
)


def attach(client: SimQueueClient) -> None:
    """Give `client` its group member (test["group"] set: a process may subscribe)."""
    client.group = SimGroupMember(client, str(client.test["group"]))


# ----- the consumer protocol ---------------------------------------------------------------


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def encode_subscription(
    topics: Iterable[str], owned: Iterable[tuple[str, int]] | None = None
) -> bytes:
    """ConsumerProtocolSubscription v0 (`owned` None: the eager assignors'): version, the
    topics, no user data; v1 with `owned` (the cooperative assignor's, KIP-429): then the
    partitions the member owns, [topic, [partition]] by topic and partition."""
    ts = sorted(topics)
    head = b"".join(_string(t) for t in ts) + struct.pack(">i", -1)
    if owned is None:
        return struct.pack(">hi", 0, len(ts)) + head
    return struct.pack(">hi", 1, len(ts)) + head + _topic_partitions(owned)


def _topic_partitions(tps: Iterable[tuple[str, int]]) -> bytes:
    """[topic string, [partition int32]], topics by name, partitions in order."""
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    out = [struct.pack(">i", len(by_topic))]
    for t in sorted(by_topic):
        ps = sorted(by_topic[t])
        out.append(_string(t) + struct.pack(f">i{len(ps)}i", len(ps), *ps))
    return b"".join(out)


def decode_owned_partitions(metadata: bytes) -> list[tuple[str, int]]:
    """The owned partitions of a ConsumerProtocolSubscription (v1+; none before v1), in the
    order written; ValueError when the bytes are cut short."""
    try:
        (version, n) = struct.unpack_from(">hi", metadata, 0)
        pos = 6
        for _ in range(n):
            (ln,) = struct.unpack_from(">h", metadata, pos)
            pos += 2 + max(ln, 0)
        (ud,) = struct.unpack_from(">i", metadata, pos)
        pos += 4 + max(ud, 0)
        if version < 1:
            return []
        out: list[tuple[str, int]] = []
        (nt,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        for _ in range(nt):
            (ln,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            topic = metadata[pos : pos + ln].decode("utf-8")
            pos += ln
            (np_,) = struct.unpack_from(">i", metadata, pos)
            pos += 4
            for p in struct.unpack_from(f">{np_}i", metadata, pos):
                out.append((topic, p))
            pos += 4 * np_
        return out
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"consumer protocol subscription: {e}") from e


def decode_subscription(metadata: bytes) -> list[str]:
    """A member's subscribed topics (the broker's own reader)."""
    return consumer_subscription_topics(metadata)


def encode_assignment(tps: Iterable[tuple[str, int]]) -> bytes:
    """ConsumerProtocolAssignment v0: version, [topic, [partition]], no user data."""
    return struct.pack(">h", 0) + _topic_partitions(tps) + struct.pack(">i", -1)


def assign_roundrobin(
    members: Mapping[str, list[str]], partitions: Mapping[str, int]
) -> dict[str, list[tuple[str, int]]]:
    """librdkafka's roundrobin assignor: members sorted by id, every partition of every
    subscribed topic (topics by name, partitions in order) to the next member, in circular
    order, that subscribes to its topic."""
    ids = sorted(members)
    out: dict[str, list[tuple[str, int]]] = {m: [] for m in ids}
    topics = sorted({t for ts in members.values() for t in ts if t in partitions})
    nxt = 0
    for t in topics:
        for p in range(partitions[t]):
            for step in range(len(ids)):
                m = ids[(nxt + step) % len(ids)]
                if t in members[m]:
                    out[m].append((t, p))
                    nxt = (nxt + step + 1) % len(ids)
                    break
    return out


def assign_range(
    members: Mapping[str, list[str]], partitions: Mapping[str, int]
) -> dict[str, list[tuple[str, int]]]:
    """The range assignor: per topic, its subscribers sorted by id take contiguous ranges of
    P // M partitions, the first P % M of them one more."""
    out: dict[str, list[tuple[str, int]]] = {m: [] for m in sorted(members)}
    topics = sorted({t for ts in members.values() for t in ts if t in partitions})
    for t in topics:
        subs = sorted(m for m, ts in members.items() if t in ts)
        n, extra = divmod(partitions[t], len(subs))
        start = 0
        for i, m in enumerate(subs):
            length = n + (1 if i < extra else 0)
            out[m].extend((t, p) for p in range(start, start + length))
            start += length
    return out


TP = tuple[str, int]


def assign_sticky(
    members: Mapping[str, list[str]],
    partitions: Mapping[str, int],
    owned: Mapping[str, Iterable[TP]] | None = None,
) -> dict[str, list[TP]]:
    """A sticky assignment (after KIP-54's goals, as librdkafka's sticky assignor has them:
    balanced first, then as few moves as possible), deterministic: the same inputs give the
    same output, whatever their order.

    1. every member keeps the partitions it owns (`owned`, from its subscription) that exist
       and whose topic it subscribes to; a partition two members claim is kept by neither;
    2. the partitions left, by topic then number, go one by one to the member subscribed to
       the topic with the fewest partitions (ties: the smallest member id);
    3. then, while some member has at least two more partitions than another member subscribed
       to one of them, the most loaded member (ties: smallest id) gives the least loaded such
       member (ties: smallest id) its first such partition (by topic, number). Each move lowers
       the sum of the squared counts, so this ends; at the end no single move balances better
       (with equal subscriptions: counts differ by at most one).

    Not librdkafka's algorithm move for move (its port of Kafka's AbstractStickyAssignor
    reassigns through a sorted set of candidates and keeps no tie order this one could follow);
    the first partitions move, as librdkafka 2.x moved them in a real run (one member owning
    t-0..t-3, a second joining: the second got t-0 and t-1, over two generations)."""
    ids = sorted(members)
    subs = {m: {t for t in members[m] if t in partitions} for m in ids}
    out: dict[str, list[TP]] = {m: [] for m in ids}
    claims: dict[TP, list[str]] = {}
    for m in ids:
        for t, p in sorted(set((owned or {}).get(m, ()))):
            if t in subs[m] and 0 <= p < partitions[t]:
                claims.setdefault((t, p), []).append(m)
    held: set[TP] = set()
    for tp, ms in sorted(claims.items()):
        if len(ms) == 1:
            out[ms[0]].append(tp)
            held.add(tp)
    for t in sorted({t for ts in subs.values() for t in ts}):
        for p in range(partitions[t]):
            if (t, p) in held:
                continue
            m = min((m for m in ids if t in subs[m]), key=lambda m: (len(out[m]), m))
            out[m].append((t, p))
    while True:
        move = None
        for a in sorted(ids, key=lambda m: (-len(out[m]), m)):
            for b in sorted(ids, key=lambda m: (len(out[m]), m)):
                if len(out[a]) - len(out[b]) < 2:
                    break
                movable = [tp for tp in out[a] if tp[0] in subs[b]]
                if movable:
                    move = (a, b, min(movable))
                    break
            if move is not None:
                break
        if move is None:
            break
        a, b, tp = move
        out[a].remove(tp)
        out[b].append(tp)
    return {m: sorted(tps) for m, tps in out.items()}


def cooperative_adjust(
    plan: Mapping[str, list[TP]], owned: Mapping[str, Iterable[TP]]
) -> dict[str, list[TP]]:
    """KIP-429's adjustment of an assignment, as librdkafka's leader makes it
    (rd_kafka_cooperative_protocol_adjust_assignment): a partition the plan gives a member
    that another member owns (and this one does not) is left out of this generation's
    assignment: its owner, which no longer has it in its assignment, revokes it and rejoins,
    and the next rebalance hands it over. Partitions nobody owns, or that the member owns
    itself, are given at once. A partition a member owns that the plan gives nobody (its
    topic missing from the leader's metadata) is given back to its owner (the smallest id
    when several claim it), as librdkafka's "unknown but owned" partitions."""
    owners: dict[TP, set[str]] = {}
    for m, tps in owned.items():
        for tp in tps:
            owners.setdefault(tp, set()).add(m)
    out = {
        m: [tp for tp in tps if not owners.get(tp) or m in owners[tp]] for m, tps in plan.items()
    }
    planned = {tp for tps in plan.values() for tp in tps}
    for tp, ms in sorted(owners.items()):
        m = min(ms)
        if tp not in planned and m in out:
            out[m] = sorted([*out[m], tp])
    return out


def assign_cooperative_sticky(
    members: Mapping[str, list[str]],
    partitions: Mapping[str, int],
    owned: Mapping[str, Iterable[TP]] | None = None,
) -> dict[str, list[TP]]:
    """librdkafka's cooperative-sticky: the sticky assignment (`assign_sticky`), then the
    cooperative adjustment (`cooperative_adjust`)."""
    owned = {m: list(tps) for m, tps in (owned or {}).items()}
    return cooperative_adjust(assign_sticky(members, partitions, owned), owned)


#: the cooperative assignor's name (QueueOptions.assignment_strategy)
COOPERATIVE = "cooperative-sticky"

#: assignment strategies the simulated member implements (QueueOptions.assignment_strategy):
#: the eager ones take (members, partitions); COOPERATIVE's also takes the owned partitions
ASSIGNORS: dict[str, Any] = {
    "roundrobin": assign_roundrobin,
    "range": assign_range,
    COOPERATIVE: assign_cooperative_sticky,
}


# ----- the member ------------------------------------------------------------------------


class SimGroupMember:
    """One client's group consumer (see the module doc)."""

    def __init__(self, client: SimQueueClient, group: str) -> None:
        self.c = client
        self.group = group
        k = client.knobs
        self.session_ms = k.session_timeout_ms
        self.heartbeat_s = min(k.heartbeat_interval_ms, max(1, k.session_timeout_ms // 3)) / 1000
        self.rebalance_ms = max(k.max_poll_interval_ms, k.session_timeout_ms)
        self.strategy = k.assignment_strategy
        #: KIP-429's incremental protocol (the cooperative-sticky assignor)
        self.cooperative = self.strategy == COOPERATIVE
        #: the last successful SyncGroup or Heartbeat (the session timeout counts from it)
        self.last_ok = 0.0
        self.require_stable = client.test.get("isolation_level") == "read_committed"
        #: the coordinator: (node id, host, port)
        self.coordinator: tuple[int, str, int] | None = None
        self.member_id = ""
        self.generation = -1
        #: the generation and member id of the last assignment the application took: what
        #: librdkafka's consumer_group_metadata() gives with the eager assignors, where the
        #: member does not rejoin before the application took the revocation, so the
        #: application never holds a generation its polls did not hand it (`group_metadata`)
        self.app_generation = -1
        self.app_member_id = ""
        self.topics: list[str] = []  # the subscription (empty: not subscribed)
        self.owned: set[str] = set()  # what the last SyncGroup gave (the background's view)
        #: decisions of the background task the client has not taken yet: ("assign" |
        #: "revoke", keys, generation, member id, rejoin once taken: a cooperative revocation)
        self.events: list[tuple[str, set[str], int, str, bool]] = []
        self._event = asyncio.Event()
        self._taken = asyncio.Event()  # the application took what was queued (serve)
        self._wake = asyncio.Event()  # the background task: rejoin or stop now
        self._rejoin = False
        self._task: asyncio.Task[None] | None = None
        #: keys the process read since they were assigned (QueueClient's next_offsets keys)
        self.read: set[str] = set()
        #: assigned keys whose committed offset is not known yet (not fetched until it is)
        self.stored: set[str] = set()
        #: the rebalances taken since the previous completion
        self.pending: dict[str, Any] | None = None

    @property
    def subscribed(self) -> bool:
        return bool(self.topics)

    # ----- the application's side -------------------------------------------------------

    def _pending(self) -> dict[str, Any]:
        if self.pending is None:
            self.pending = {"generation": -1, "assigned": set(), "revoked": set(), "committed": {}}
        self.pending["generation"] = self.generation
        return self.pending

    def with_rebalance(self, done: Op) -> Op:
        """`done` with the rebalances taken since the previous completion, if any."""
        reb, self.pending = self.pending, None
        return with_rebalance(done, reb)

    def _enqueue(self, kind: str, keys: set[str], rejoin: bool = False) -> None:
        self.events.append((kind, set(keys), self.generation, self.member_id, rejoin))
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Until the background task queues something for the application, or `timeout`."""
        if self.events or timeout <= 0:
            return
        self._event.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()

    async def serve(self, deadline: float) -> None:
        """Take what the background task decided (the rebalance callbacks: see the module
        doc); then look up committed offsets still unknown."""
        c = self.c
        while self.events:
            kind, keys, generation, member_id, rejoin = self.events.pop(0)
            reb = self._pending()
            reb["generation"] = generation
            if kind == "revoke":
                reb["revoked"].update(keys)
                c.assigned.difference_update(keys)
                for k in keys:
                    c.positions.pop(k, None)
                    self.read.discard(k)
                    self.stored.discard(k)
                if rejoin and generation == self.generation:
                    # cooperative: what was lost is handed over in the next rebalance,
                    # which this member starts once it has let the partitions go
                    self._request_rejoin()
                continue
            self.app_generation, self.app_member_id = generation, member_id
            reb["assigned"].update(keys)
            c.assigned.update(keys)
            for k in keys:
                c.positions.pop(k, None)
                self.read.discard(k)
            self.stored.update(keys)
            limit = c._loop_time() + min(c.op_timeout, c.request_timeout)
            got = await self.committed(sorted(keys), limit)
            reb["committed"].update(got)
            self._resume(got)
        self._taken.set()
        if self.stored:
            self._resume(await self.committed(sorted(self.stored), deadline))

    def group_metadata(self) -> tuple[int, str]:
        """(generation, member id) for a TxnOffsetCommit (KIP-447), as librdkafka's
        consumer_group_metadata() gives them. With the eager assignors librdkafka rejoins only
        after the application took the revocation (in a poll), so between a poll and the
        sending of its offsets the generation cannot move: here the background task rejoins at
        once, and the application's view is the last assignment it took. (Sending the
        background's newer generation let a copier commit offsets of a key the rebalance had
        given to another copier: the same input copied twice, `isrlab sim --workload eos --txn
        --concurrency 6 --nemesis kill --seed 45`.) With cooperative-sticky librdkafka's
        generation is the background's, and a revoked partition is handed over only after the
        application let it go."""
        if self.cooperative:
            return self.generation, self.member_id
        return self.app_generation, self.app_member_id

    def _resume(self, committed: Mapping[str, int | None]) -> None:
        c = self.c
        for k, off in committed.items():
            if k in self.stored and k in c.assigned:
                self.stored.discard(k)
                c.positions[k] = off  # None: the log start (auto.offset.reset=earliest)

    def note_read(self, read: Mapping[str, Any]) -> None:
        self.read.update(k for k, pairs in read.items() if pairs)

    async def subscribe(self, op: Op) -> Op:
        c = self.c
        try:
            topics = sorted({parse_key(k)[0] for k in op["value"]})
        except (TypeError, ValueError) as e:
            return {**op, "type": "fail", "error": ["bad-keys", str(e)]}
        if self.subscribed and topics == self.topics:
            return {**op, "type": "ok"}  # as QueueClient: no rejoin
        if c.assigned and not self.subscribed:
            # the manual assignment is gone, positions with it (QueueClient's revocation)
            self._pending()["revoked"].update(c.assigned)
            c.assigned = set()
            c.positions = {}
            self.read = set()
        if self.cooperative and self.subscribed:
            # only the partitions of topics no longer subscribed are revoked
            gone = {k for k in self.owned if parse_key(k)[0] not in topics}
            if gone:
                self.owned -= gone
                self._enqueue("revoke", gone)
        self.topics = topics
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self._request_rejoin()
        return {**op, "type": "ok"}

    def drop(self) -> None:
        """Drop the member without LeaveGroup (it times out of the group); its keys are
        recorded as revoked."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        if self.subscribed and self.c.assigned:
            self._pending()["revoked"].update(self.c.assigned)
        self.topics = []
        self.events = []
        self.owned = set()
        self.read = set()
        self.stored = set()
        self.member_id = ""
        self.generation = -1
        self.app_generation, self.app_member_id = -1, ""
        self.coordinator = None

    def _request_rejoin(self) -> None:
        self._rejoin = True
        self._wake.set()

    async def commit(self, op: Op) -> Op:
        c = self.c
        deadline = c._loop_time() + c.op_timeout
        if self.subscribed:
            await self.serve(deadline)
        offsets = {
            k: pos
            for k in sorted(c.assigned)
            if k in self.read and (pos := c.positions.get(k)) is not None
        }
        value = [codec.commit(offsets)]
        if not self.subscribed:
            return {**op, "type": "fail", "value": value, "error": "not-subscribed"}
        if not offsets:
            return {**op, "type": "fail", "value": value, "error": "nothing-to-commit"}
        kind, error = await self.commit_offsets(offsets, deadline)
        done: Op = {**op, "type": kind, "value": value}
        if error is not None:
            done["error"] = error
        return done

    async def commit_offsets(
        self, offsets: Mapping[str, int], deadline: float
    ) -> tuple[str, list[str] | None]:
        """A synchronous OffsetCommit of `offsets` (key -> next offset to read) with this
        member's generation, retried as librdkafka retries it until `deadline`: ("ok", None),
        or ("fail" when every partition was refused for certain, else "info", ["commit",
        error names...] or ["commit", "timeout"])."""
        c = self.c
        C = OffsetCommitRequest[8]
        T = C.OffsetCommitRequestTopic
        P = T.OffsetCommitRequestPartition
        by_topic: dict[str, list[Any]] = {}
        for k, off in offsets.items():
            t, p = parse_key(k)
            by_topic.setdefault(t, []).append(
                P(
                    partition_index=p,
                    committed_offset=off,
                    committed_leader_epoch=-1,
                    committed_metadata="",
                )
            )
        while True:
            req = C(
                group_id=self.group,
                generation_id_or_member_epoch=self.generation,
                member_id=self.member_id,
                group_instance_id=None,
                topics=[T(name=t, partitions=ps) for t, ps in sorted(by_topic.items())],
            )
            resp = await self._request(req, deadline)
            if resp is None:
                if c._left(deadline) <= 0:
                    return "info", ["commit", "timeout"]
                await asyncio.sleep(min(RETRY_BACKOFF_S, c._left(deadline)))
                continue
            codes = [p.error_code for t in resp.topics for p in t.partitions]
            if any(code in _COMMIT_RETRY for code in codes) and c._left(deadline) > 0:
                if any(code in _COORD for code in codes):
                    self.coordinator = None
                await asyncio.sleep(min(RETRY_BACKOFF_S, c._left(deadline)))
                continue
            errors = [code for code in codes if code != 0]
            if not errors:
                return "ok", None
            if any(code in (E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID) for code in errors):
                self._request_rejoin()
            definite = len(errors) == len(offsets) and all(
                code in DEFINITE_COMMIT_ERRORS for code in errors
            )
            names = sorted({_error_name(code) for code in errors})
            return ("fail" if definite else "info"), ["commit", *names]

    async def committed(self, keys: list[str], deadline: float) -> dict[str, int | None]:
        """The group's committed offsets of `keys` (None: none), OffsetFetch v7 to the
        coordinator, retried until `deadline`; keys it could not tell are left out."""
        c = self.c
        if not keys:
            return {}
        F = OffsetFetchRequest[7]
        by_topic: dict[str, list[int]] = {}
        for k in keys:
            t, p = parse_key(k)
            by_topic.setdefault(t, []).append(p)
        while c._left(deadline) > 0:
            req = F(
                group_id=self.group,
                topics=[
                    F.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
                    for t, ps in sorted(by_topic.items())
                ],
                require_stable=self.require_stable,
            )
            resp = await self._request(req, deadline)
            if resp is not None:
                if resp.error_code in _COORD:
                    self.coordinator = None
                elif resp.error_code == 0:
                    out: dict[str, int | None] = {}
                    for t in resp.topics:
                        for p in t.partitions:
                            if p.error_code == 0:
                                k = f"{t.name}/{p.partition_index}"
                                out[k] = p.committed_offset if p.committed_offset >= 0 else None
                    if out:
                        return out
            await asyncio.sleep(min(RETRY_BACKOFF_S, c._left(deadline)))
        return {}

    # ----- the coordinator ----------------------------------------------------------------

    async def _find_coordinator(self, deadline: float) -> tuple[int, str, int] | None:
        if self.coordinator is None:
            req = FindCoordinatorRequest[3](key=self.group, key_type=KEY_TYPE_GROUP)
            resp = await self.c.find_coordinator(
                req, deadline, lambda: self.coordinator is not None
            )
            if resp is not None:
                self.coordinator = (resp.node_id, resp.host, resp.port)
        return self.coordinator

    async def _request(self, req: Any, deadline: float, timeout: float | None = None) -> Any:
        """`req` to the coordinator; None when none answered in time or the connection
        failed (the coordinator is then looked up again)."""
        c = self.c
        coord = await self._find_coordinator(deadline)
        left = min(c.request_timeout if timeout is None else timeout, c._left(deadline))
        if coord is None or left <= 0:
            return None
        try:
            return await c._conn(coord[1], coord[2]).request(req, left)
        except ConnectionFailed as e:
            log.debug("process %s: group request: %s", c.process, e)
            self.coordinator = None
            return None

    # ----- the background task ------------------------------------------------------------

    def _lose(self) -> None:
        """The assignment is lost (revoked for the application) and the generation gone."""
        if self.owned:
            self._enqueue("revoke", self.owned)
        self.owned = set()
        self.generation = -1

    async def _run(self) -> None:
        while self.subscribed:
            self._rejoin = False
            if self.owned and not self.cooperative:  # eager: everything revoked before a join
                self._enqueue("revoke", self.owned)
                self.owned = set()
            if self.cooperative:
                await self._revocations_taken()
            joined = await self._join_and_sync()
            if not joined:
                if (
                    self.cooperative
                    and self.owned
                    and self.c._loop_time() - self.last_ok >= self.session_ms / 1000
                ):
                    # cooperative members keep their partitions while they rejoin, until
                    # the session times out (librdkafka's session timeout check)
                    self._lose()
                    self.member_id = ""
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            await self._heartbeats()

    async def _revocations_taken(self) -> None:
        """Until the application has taken every revocation queued (librdkafka rejoins only
        after the rebalance callback's incremental unassign, or a lost assignment's unassign,
        is done)."""
        while any(kind == "revoke" for kind, *_ in self.events):
            self._taken.clear()
            await self._taken.wait()

    async def _join_and_sync(self) -> bool:
        c = self.c
        far = c._loop_time() + 3600.0
        join_timeout = self.rebalance_ms / 1000 + JOIN_GRACE_S
        J = JoinGroupRequest[5]
        while True:
            if await self._find_coordinator(far) is None:
                return False
            req = J(
                group_id=self.group,
                session_timeout_ms=self.session_ms,
                rebalance_timeout_ms=self.rebalance_ms,
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[
                    J.JoinGroupRequestProtocol(name=self.strategy, metadata=self._metadata())
                ],
            )
            resp = await self._request(req, far, join_timeout)
            if resp is None:
                return False
            code = resp.error_code
            if code == E.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            if code == E.UNKNOWN_MEMBER_ID:
                if self.cooperative:
                    self._lose()  # (librdkafka: revoke all, lost)
                self.member_id = ""
                self.generation = -1
                return False
            if code in _COORD:
                self.coordinator = None
                return False
            if code != 0:
                log.debug("process %s: JoinGroup: %s", c.process, _error_name(code))
                return False
            break
        self.member_id = resp.member_id
        generation = resp.generation_id
        S = SyncGroupRequest[3]
        assignments: list[Any] = []
        if resp.leader == self.member_id:
            plan = await self._assign(resp.members)
            assignments = [
                S.SyncGroupRequestAssignment(member_id=m, assignment=encode_assignment(tps))
                for m, tps in sorted(plan.items())
            ]
        sreq = S(
            group_id=self.group,
            generation_id=generation,
            member_id=self.member_id,
            group_instance_id=None,
            assignments=assignments,
        )
        sresp = await self._request(sreq, far, join_timeout)
        if sresp is None:
            return False
        code = sresp.error_code
        if code != 0:
            if self.cooperative and code in (E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID):
                self._lose()  # (librdkafka: revoke all, lost)
            if code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            if code in _COORD:
                self.coordinator = None
            log.debug("process %s: SyncGroup: %s", c.process, _error_name(code))
            return False
        self.generation = generation
        self.last_ok = c._loop_time()
        tps, _ = (
            decode_consumer_assignment(bytes(sresp.assignment)) if sresp.assignment else ([], None)
        )
        new = {f"{t}/{p}" for t, p in tps}
        if not self.cooperative:
            self.owned = new
            self._enqueue("assign", self.owned)
            return True
        # KIP-429: only what changed; a revocation first, then a rejoin once it is taken
        # (serve); no revocation: the assign callback, even when nothing was added
        revoked, added = self.owned - new, new - self.owned
        self.owned = new
        if revoked:
            self._enqueue("revoke", revoked, rejoin=True)
        if added or not revoked:
            self._enqueue("assign", added)
        return True

    def _metadata(self) -> bytes:
        """This member's subscription: v1 with the partitions it owns (cooperative), else v0."""
        if not self.cooperative:
            return encode_subscription(self.topics)
        return encode_subscription(self.topics, [parse_key(k) for k in self.owned])

    async def _assign(self, members: list[Any]) -> dict[str, list[tuple[str, int]]]:
        """The leader's assignment of the group's members (their subscriptions)."""
        subs: dict[str, list[str]] = {}
        owned: dict[str, list[TP]] = {}
        for m in members:
            try:
                subs[m.member_id] = decode_subscription(bytes(m.metadata))
                if self.cooperative:
                    owned[m.member_id] = decode_owned_partitions(bytes(m.metadata))
            except ValueError:
                subs[m.member_id] = []
        topics = sorted({t for ts in subs.values() for t in ts})
        partitions = await self._partitions(topics)
        if self.cooperative:
            return assign_cooperative_sticky(subs, partitions, owned)
        return ASSIGNORS.get(self.strategy, assign_roundrobin)(subs, partitions)  # type: ignore[no-any-return]

    async def _partitions(self, topics: list[str]) -> dict[str, int]:
        """Partition counts of `topics` from a Metadata request (any broker that answers)."""
        c = self.c
        for host in c.bootstrap:
            req = metadata_request(topics)
            try:
                resp = await c._conn(host, c.port).request(req, c.request_timeout)
            except ConnectionFailed:
                continue
            return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}
        return {}

    async def _heartbeats(self) -> None:
        """Heartbeat every heartbeat_s until a rejoin is needed (see the module doc)."""
        c = self.c
        last_ok = c._loop_time()
        session_s = self.session_ms / 1000
        while self.subscribed:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_s):
                    await self._wake.wait()
            if self._rejoin:
                return
            now = c._loop_time()
            if now - last_ok >= session_s:
                # librdkafka's session timeout: the assignment is lost, the member id too
                self._lose()
                self.member_id = ""
                return
            old = self.coordinator
            deadline = last_ok + session_s
            req = HeartbeatRequest[3](
                group_id=self.group,
                generation_id=self.generation,
                member_id=self.member_id,
                group_instance_id=None,
            )
            resp = await self._request(req, deadline)
            if resp is None:
                if old is not None and self.coordinator is None:
                    # a failed connection: rejoin if another broker is the coordinator now
                    new = await self._find_coordinator(deadline)
                    if new is not None and new[0] != old[0]:
                        return
                continue
            code = resp.error_code
            if code == 0:
                last_ok = self.last_ok = c._loop_time()
            elif code == E.REBALANCE_IN_PROGRESS:
                return
            elif code == E.UNKNOWN_MEMBER_ID:
                self._lose()
                self.member_id = ""
                return
            elif code in (E.ILLEGAL_GENERATION, E.FENCED_INSTANCE_ID):
                self._lose()
                return
            elif code in _COORD:
                self.coordinator = None
                return


def _error_name(code: int) -> str:
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return name.lower().replace("_", "-")
