"""Invariants of a simulated cluster, checked after every event (as Kafka's KRaft simulation
checks its invariants after every message delivered and every timer fired).

They read the brokers' in-memory state (each live broker's replica manager: the replication
core of every hosted partition, its log) and the simulated ensemble's znodes, never through a
request, so checking changes nothing a broker does:

- **one leader per epoch**: for a partition and a leader epoch, at most one broker is ever
  leader (over the whole run, across crashes and restarts);
- **ZooKeeper epochs monotonic**: the leader epoch in a partition's state znode never goes down;
- **leader HW monotonic**: while a broker (one incarnation of it) leads a partition at an
  epoch, its high watermark never goes down;
- **committed data agrees**: the record batches below a leader's high watermark are the same
  bytes on every member of its ISR that is alive (as far as its log reaches), and the same as
  the first leader that exposed them as committed (a later leader holding other bytes below
  its HW, or taking over without them, is a violation). An ISR member whose log ends below
  the HW is a violation, except for a restarted broker (a later incarnation) that has not yet
  caught up: traced ("isr-member-behind-hw"). A follower restarted after losing its unsynced
  tail (a power loss, a disk put back) before its ZooKeeper session expired is still named in
  the ISR for a moment, as in ZooKeeper-era Kafka (KIP-966 closes that window); what must not
  happen is that it holds other bytes, or leads without them. A compacted log
  (`cleanup.policy=compact`) is cleaned by each replica on its own, as in Kafka: there a
  member's batch may be missing (cleaned away) or a cleaning of the committed one (the same
  base and last offsets and producer fields, no more records: the cleaner keeps a batch's
  offsets and copies the records it keeps; `cleaned_batches` counts them).

The data check is incremental: the bytes of each broker incarnation's log are read once, as
the high watermark moves past them. `check()` returns what changed (for a trace) and raises
`InvariantViolation` naming the invariant; `SimCluster` adds the virtual time and the event.

Checking after an event that changed nothing is cheap. A broker's in-memory state changes only
when its own code runs, and that runs only in its process's callbacks (or when the harness
starts or stops it: the set of live incarnations changes). So `check(brokers, ran=ids)` is
told which brokers' code the event ran (`SimCluster` knows a callback's process): only their
partitions are looked at, each through a fingerprint of what the invariants read of it (is
leader, leader epoch, high watermark, ISR, the log's start and end offsets, the hosted
partition object itself); a partition whose fingerprint moved is dirty, and every leader of
a dirty partition is checked as a full check would (an ISR member's log moving is checked at
its leader). An event of no broker (the network, the ensemble, the clients) checks only the
state znodes (by zxid: nothing when nothing was written). A change in the live set, or `ran`
None, is a full check. The trace lines come out in the same order as a full check's.
`SimCluster` calls the two most frequent cases directly: `quiet` (an event of no broker that
wrote no state znode, the live servers the same: nothing to read) and `check_broker` (a
broker's event: nothing more to do when its fingerprints did not move).
`verify_tracking=True` (or `VERIFY_TRACKING`) reads every partition of every live broker
after every check (through the properties, not the fingerprint) and raises if one changed that
the check did not treat as dirty: the tests run a failover with it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from isrlab.broker.replication import LeaderAndIsr

#: how much of a log one check reads at most per partition and member (the rest next event)
READ_CHUNK = 16 << 20

#: check after every check that the dirty tracking missed no change (slow: tests only)
VERIFY_TRACKING = False


class InvariantViolation(AssertionError):
    """An invariant does not hold."""


class LiveBroker(Protocol):
    """What the checker needs of a broker: its id, which incarnation it is, its server."""

    id: int
    incarnation: int
    server: Any  # a started ClusterKafkaServer, or None while down


@dataclass
class _Batch:
    base: int
    last: int
    crc: int
    #: (producer id, producer epoch, base sequence, records count): what a cleaning keeps of
    #: a batch besides its offsets (the count can only go down)
    meta: tuple[int, int, int, int] = (-1, -1, -1, -1)


@dataclass
class _Canon:
    """What is committed of one partition: batches from offset `start`, contiguous."""

    start: int = -1
    batches: dict[int, _Batch] = field(default_factory=dict)  # base offset -> batch
    end: int = -1  # the offset after the last batch

    def covering(self, offset: int) -> _Batch | None:
        return self.batches.get(offset)


_META = struct.Struct(">qhii")


def parse_batches(data: bytes) -> list[_Batch]:
    """Whole record batches (v2: base offset, length, ..., last offset delta) in `data`."""
    out = []
    pos = 0
    while pos + 27 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        (delta,) = struct.unpack_from(">i", data, pos + 23)
        meta = _META.unpack_from(data, pos + 43) if end - pos >= 61 else (-1, -1, -1, -1)
        out.append(_Batch(base, base + delta, zlib.crc32(data[pos:end]), meta))
        pos = end
    return out


class Invariants:
    def __init__(self, state_znodes: Any = None, *, verify_tracking: bool | None = None) -> None:
        """`state_znodes()` gives `(path, data, mzxid)` of every partition state znode (the
        simulated ensemble's, read directly); None checks brokers only. `verify_tracking`
        (default `VERIFY_TRACKING`): after every check, make sure the dirty tracking missed
        no change (see the module doc)."""
        self.state_znodes = state_znodes
        #: `state_znodes.unchanged` (None: no state znodes; one without it: always changed)
        self._znodes_unchanged: Any = (
            None if state_znodes is None else getattr(state_znodes, "unchanged", bool)
        )
        #: `state_znodes` when it is this module's (`unchanged` read in line)
        self._znodes = state_znodes if isinstance(state_znodes, _StateZnodes) else None
        self.verify_tracking = VERIFY_TRACKING if verify_tracking is None else verify_tracking
        #: broker id -> its partitions' fingerprints as last looked at (`_fingerprints`)
        self.seen: dict[int, list[tuple[Any, ...]]] = {}
        #: each broker's server at the last check (None when down; a new incarnation is a new
        #: server)
        self.live_servers: list[Any] | None = None
        #: checks that looked at every broker (the rest looked at the event's broker only)
        self.full_checks = 0
        self._verified: dict[int, dict[tuple[str, int], tuple[Any, tuple[Any, ...]]]] | None = None
        self.leaders: dict[tuple[tuple[str, int], int], int] = {}
        self.zk_epochs: dict[str, tuple[int, int]] = {}  # path -> (mzxid, leader epoch)
        self.zk_seen: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # leader, epoch, ISR
        self.leader_hw: dict[tuple[int, int, tuple[str, int], int], int] = {}
        self.canon: dict[tuple[str, int], _Canon] = {}
        self.verified: dict[tuple[int, int, tuple[str, int]], int] = {}
        #: (broker, incarnation, partition) seen in an ISR with its log end below the HW
        self.behind: set[tuple[int, int, tuple[str, int]]] = set()
        #: (broker, incarnation, partition) whose log end has reached its leader's HW
        self.caught_up: set[tuple[int, int, tuple[str, int]]] = set()
        #: (broker, partition) whose segment files a nemesis damaged: their bytes are not
        #: compared any more (`damage`)
        self.damaged: set[tuple[int, tuple[str, int]]] = set()
        self.checks = 0
        #: batches of compacted logs found cleaned on a member (see the module docstring)
        self.cleaned_batches = 0

    def damage(self, broker_id: int, tp: tuple[str, int]) -> None:
        """A nemesis damaged broker `broker_id`'s segment files of `tp` (bit flips, a cut), as
        a disk can: its copy holds other bytes from now on, which is the disk's doing, not the
        protocol's, so the committed-data check no longer reads it (reading a damaged batch
        would also be a read the broker did not make). Its log end is still held to the HW,
        and it is still held to every other invariant; the clients' checker judges what it
        serves."""
        self.damaged.add((broker_id, tp))

    # ----- the check -----------------------------------------------------------------------

    def check(self, brokers: Iterable[LiveBroker], ran: Collection[int] | None = None) -> list[str]:
        """Check every invariant now; what changed (new leaders, HWs, ZooKeeper epochs) as
        lines for a trace. Raises InvariantViolation. `ran`: the ids of the brokers whose
        code ran since the last check (None: any, a full check; see the module doc)."""
        if type(brokers) is not list:
            brokers = list(brokers)
        if ran is not None:
            if not ran:
                if self.quiet(brokers):
                    return []
            elif len(ran) == 1:
                (bid,) = ran
                for b in brokers:
                    if b.id == bid:
                        return self.check_broker(brokers, b)
        return self._check(brokers, ran)

    def check_broker(self, brokers: Sequence[LiveBroker], b: LiveBroker) -> list[str]:
        """`check(brokers, (b.id,))`: after an event of broker `b` (one of `brokers`). The
        most frequent case made cheap: no state znode written since the last check, the
        same live servers, and none of `b`'s partitions' fingerprints moved: nothing to
        check."""
        fps = None  # `b`'s fingerprints, when read here
        server = b.server
        if server is not None:
            before = self.seen.get(b.id)
            if before is not None and self._quiet(brokers):
                fps = _fingerprints(server.replica_manager.partitions)
                if fps == before:
                    self.checks += 1
                    if self.verify_tracking:
                        self._verify([c for c in brokers if c.server is not None], set())
                    return []
        return self._check(brokers, (b.id,), fps)

    def _check(
        self,
        brokers: Sequence[LiveBroker],
        ran: Collection[int] | None,
        fps: list[tuple[Any, ...]] | None = None,
    ) -> list[str]:
        """`check` (`fps`: the fingerprints of the one broker of `ran`, read already)."""
        self.checks += 1
        changes: list[str] = []
        if self.state_znodes is not None:
            self._check_znodes(changes)
        servers = [b.server for b in brokers]
        if ran is not None and servers == self.live_servers:
            if not ran:
                if self.verify_tracking:
                    self._verify([b for b in brokers if b.server is not None], set())
                return changes  # no broker's code ran: no broker state changed
            dirty: set[tuple[str, int]] | None = set()
            for b in brokers:
                if b.server is not None and b.id in ran:
                    self._look(b, dirty, fps)
            if not dirty:
                if self.verify_tracking:
                    self._verify([b for b in brokers if b.server is not None], dirty)
                return changes
        else:  # a full check
            self.live_servers = servers
            self.full_checks += 1
            self.seen = {}
            dirty = None
            for b in brokers:
                if b.server is not None:
                    self._look(b, None)
        live = [b for b in brokers if b.server is not None]
        by_id = {b.id: b for b in live}
        for b in live:
            partitions = b.server.replica_manager.partitions
            if dirty is None:
                tps = sorted(partitions)
            elif len(dirty) == 1:
                tps = [tp for tp in dirty if tp in partitions]
            else:
                tps = sorted(dirty & partitions.keys())
            for tp in tps:
                hp = partitions[tp]
                if hp.is_leader:
                    self._check_leader(b, (tp[0], tp[1]), hp, by_id, changes)
        if self.verify_tracking:
            self._verify(live, dirty)
        return changes

    def quiet(self, brokers: Sequence[LiveBroker]) -> bool:
        """`check(brokers, ())` (an event of no broker) when it would read nothing: no state
        znode written since the last check (as far as `state_znodes` can tell without
        reading them) and the same live servers (the most frequent check, made cheap):
        counted as a check, True; otherwise False (nothing done: call `check`)."""
        if not self._quiet(brokers):
            return False
        self.checks += 1
        if self.verify_tracking:
            self._verify([b for b in brokers if b.server is not None], set())
        return True

    def _quiet(self, brokers: Sequence[LiveBroker]) -> bool:
        sz = self._znodes
        if sz is not None:
            if sz.core.zxid != sz.last:
                return False
        else:
            unchanged = self._znodes_unchanged
            if unchanged is not None and not unchanged():
                return False
        return [b.server for b in brokers] == self.live_servers

    def _look(
        self,
        b: LiveBroker,
        dirty: set[tuple[str, int]] | None,
        fps: list[tuple[Any, ...]] | None = None,
    ) -> None:
        """Fingerprint broker `b`'s partitions (`fps`: read already in this check); those
        that moved go into `dirty`."""
        if fps is None:
            fps = _fingerprints(b.server.replica_manager.partitions)
        before = self.seen.get(b.id)
        self.seen[b.id] = fps
        if dirty is None or before is None:
            if dirty is not None:
                dirty.update(fp[0] for fp in fps)
            return
        if fps == before:
            return  # (each fingerprint holds its partition and the hosted partition object,
            # which compares by identity)
        # the same partitions in the same order (the usual case): compared in place
        for was, now in zip(before, fps, strict=False):
            if was[0] != now[0]:
                break  # (partitions added or removed before the end: by partition below)
            if was != now:
                dirty.add(now[0])
        else:
            for fp in fps[len(before) :]:
                dirty.add(fp[0])  # hosted since the last look
            return
        old = {fp[0]: fp for fp in before}
        for fp in fps:
            if old.get(fp[0]) != fp:
                dirty.add(fp[0])
        # (a partition no longer hosted needs no check: the data check skips a member
        # without it, and it leads nothing)

    def _verify(self, live: list[LiveBroker], dirty: set[tuple[str, int]] | None) -> None:
        """`verify_tracking`: every partition whose state (read through the properties the
        check reads, not through `_fingerprints`) changed since the last check must have been
        dirty in this one (or this one a full check)."""
        now = {
            b.id: {
                tp: (hp, _public_fingerprint(hp))
                for tp, hp in b.server.replica_manager.partitions.items()
            }
            for b in live
        }
        before, self._verified = self._verified, now
        if dirty is None or before is None:
            return
        for bid, parts in now.items():
            was = before.get(bid, {})
            for tp in parts.keys() | was.keys():
                a, c = was.get(tp), parts.get(tp)
                if tp not in dirty and (a is None or c is None or a[0] is not c[0] or a[1] != c[1]):
                    raise AssertionError(
                        f"invariant dirty tracking missed a change of {tp[0]}-{tp[1]} on broker "
                        f"{bid}: {a and a[1]} -> {c and c[1]}"
                    )

    def _check_leader(
        self,
        b: LiveBroker,
        tp: tuple[str, int],
        hp: Any,
        by_id: dict[int, LiveBroker],
        changes: list[str],
    ) -> None:
        epoch = hp.leader_epoch
        seen = self.leaders.setdefault((tp, epoch), b.id)
        if seen != b.id:
            raise InvariantViolation(
                f"two leaders of {tp[0]}-{tp[1]} at leader epoch {epoch}: broker "
                f"{seen} and broker {b.id}"
            )
        key = (b.id, b.incarnation, tp, epoch)
        hw = hp.high_watermark
        before = self.leader_hw.get(key)
        if before is None:
            changes.append(
                f"leader {tp[0]}-{tp[1]} epoch {epoch} broker {b.id} isr {hp.isr} hw {hw}"
            )
            # a leader new at its epoch holds everything committed before it took over (a
            # zombie of an older epoch is not held to what its successors committed)
            canon = self.canon.get(tp)
            if canon is not None and hp.log.log_end_offset < canon.end:
                raise InvariantViolation(
                    f"{tp[0]}-{tp[1]}: broker {b.id} leads at epoch {epoch} with its log "
                    f"end at {hp.log.log_end_offset}: the batches committed before, up to "
                    f"offset {canon.end}, are not all on it"
                )
        elif hw < before:
            raise InvariantViolation(
                f"the high watermark of {tp[0]}-{tp[1]} on its leader, broker {b.id} "
                f"(epoch {epoch}), went down from {before} to {hw}"
            )
        elif hw > before:
            changes.append(f"hw {tp[0]}-{tp[1]} broker {b.id} {before} -> {hw}")
        self.leader_hw[key] = hw
        self._check_committed(tp, hw, b, hp.isr, by_id, changes)

    def _check_znodes(self, changes: list[str]) -> None:
        for path, data, mzxid in self.state_znodes():
            before = self.zk_epochs.get(path)
            if before is not None and before[0] == mzxid:
                continue
            try:
                state = LeaderAndIsr.from_json(data, 0)
            except ValueError:
                continue
            if before is not None and state.leader_epoch < before[1]:
                raise InvariantViolation(
                    f"{path}: leader epoch went down from {before[1]} to {state.leader_epoch}"
                )
            seen = (state.leader, state.leader_epoch, tuple(state.isr))
            if self.zk_seen.get(path) != seen:
                self.zk_seen[path] = seen
                changes.append(
                    f"zk {path.rsplit('/brokers/topics/', 1)[-1]} leader {state.leader} "
                    f"epoch {state.leader_epoch} isr {list(state.isr)}"
                )
            self.zk_epochs[path] = (mzxid, state.leader_epoch)

    def _check_committed(
        self,
        tp: tuple[str, int],
        hw: int,
        leader: LiveBroker,
        isr: list[int],
        by_id: dict[int, LiveBroker],
        changes: list[str],
    ) -> None:
        canon = self.canon.get(tp)
        if canon is None:
            canon = self.canon[tp] = _Canon()
        verified = self.verified
        damaged = self.damaged
        # the leader first: what it holds below its HW and nobody committed yet is canon
        for m in [leader.id, *[r for r in isr if r != leader.id]]:
            member = by_id.get(m)
            if member is None:
                continue  # down: checked again when it is back
            hp = member.server.replica_manager.partitions.get(tp)
            if hp is None:
                continue
            lg = hp.log
            key = (member.id, member.incarnation, tp)
            log_start = lg.log_start_offset
            start = verified.get(key, -1)
            if start < log_start:
                start = log_start
            if canon.start < 0:
                canon.start = canon.end = log_start
            if start < canon.start:
                start = canon.start
            upto = hw
            log_end = lg.log_end_offset
            if log_end >= hw:
                self.caught_up.add(key)
            elif m == leader.id:
                raise InvariantViolation(
                    f"{tp[0]}-{tp[1]}: the leader, broker {m}, has its log end at "
                    f"{log_end}, below its high watermark {hw}"
                )
            elif member.incarnation > 1 and key not in self.caught_up:
                # restarted (with what its disk kept) and not yet caught up: traced
                upto = log_end
                if key not in self.behind:
                    self.behind.add(key)
                    changes.append(
                        f"isr-member-behind-hw {tp[0]}-{tp[1]} broker {m} log end "
                        f"{log_end} hw {hw} (leader {leader.id})"
                    )
            else:
                raise InvariantViolation(
                    f"{tp[0]}-{tp[1]}: broker {m}, in the ISR {isr} of leader {leader.id}, "
                    f"has its log end at {log_end}, below the high watermark {hw}"
                )
            if start < upto and not (damaged and (m, tp) in damaged):
                compacted = bool(getattr(getattr(lg, "config", None), "compact", False))
                while start < upto:
                    data = lg.read(start, READ_CHUNK, max_offset=upto).read_bytes()
                    batches = parse_batches(data)
                    if not batches:
                        break
                    for batch in batches:
                        self._agree(tp, canon, batch, m, leader.id, compacted)
                    start = batches[-1].last + 1
            verified[key] = start

    def _agree(
        self,
        tp: tuple[str, int],
        canon: _Canon,
        batch: _Batch,
        member: int,
        leader: int,
        compacted: bool = False,
    ) -> None:
        known = canon.covering(batch.base)
        if known is None:
            if batch.base != canon.end:
                raise InvariantViolation(
                    f"{tp[0]}-{tp[1]}: broker {member} holds a committed batch at "
                    f"{batch.base}..{batch.last} where the committed data ends at {canon.end}"
                    f" (leader {leader})"
                )
            canon.batches[batch.base] = batch
            canon.end = batch.last + 1
        elif (known.last, known.crc) != (batch.last, batch.crc):
            if (
                compacted
                and known.last == batch.last
                and known.meta[:3] == batch.meta[:3]
                and 0 < batch.meta[3] <= known.meta[3]
            ):
                self.cleaned_batches += 1  # a cleaning of the committed batch
                return
            raise InvariantViolation(
                f"{tp[0]}-{tp[1]}: committed batch at offset {batch.base} differs on broker "
                f"{member} (offsets {batch.base}..{batch.last}, crc {batch.crc:08x}) from "
                f"what was committed (offsets {known.base}..{known.last}, crc {known.crc:08x})"
                f" (leader {leader})"
            )


def _fingerprints(partitions: dict[Any, Any]) -> list[tuple[Any, ...]]:
    """What the invariants read of each hosted partition of `partitions` (tp -> hosted
    partition), as one comparable value: the partition, the hosted partition object
    (compared by identity), its replication core's role, leader epoch, high watermark and
    ISR, its log's start and end offsets. This runs after every event of a broker, for each
    of its partitions (8 per broker in bench_sim: 170,000 times a run), so it reads the
    fields behind the properties the check reads (the core's `_hw`, the log's
    `_log_start_offset`, its active segment's `_next_offset`), in one list comprehension; a
    segment whose end is not cached yet is read through its property. A partition object
    without these fields (the checker's own tests' stand-ins, or a broker that renamed them)
    is read through the public properties; `VERIFY_TRACKING`
    (tests/sim/test_cluster_on_sim.py) holds this to them."""
    try:
        return [
            (
                tp,
                hp,
                (core := hp.core).role,
                core.leader_epoch,
                core._hw,
                core.isr,
                (lg := hp.log)._log_start_offset,
                end
                if (end := (seg := lg._segments[-1])._next_offset) is not None
                else seg.next_offset,
            )
            for tp, hp in partitions.items()
        ]
    except AttributeError:
        return [(tp, hp, *_public_fingerprint(hp)) for tp, hp in partitions.items()]


def _public_fingerprint(hp: Any) -> tuple[Any, ...]:
    lg = getattr(hp, "log", None)
    return (
        hp.is_leader,
        hp.leader_epoch,
        hp.high_watermark,
        list(hp.isr),
        None if lg is None else lg.log_start_offset,
        None if lg is None else lg.log_end_offset,
    )


def state_znodes(core: Any, chroot: str = "") -> Any:
    """`Invariants(state_znodes=...)` for a `SimZooKeeper`: its partition state znodes (none
    when nothing was written since the last call)."""

    return _StateZnodes(core, chroot)


class _StateZnodes:
    """`state_znodes`: a call gives the partition state znodes (none when nothing was
    written since the last call); `unchanged()` says, without reading them, that a call
    would give none."""

    def __init__(self, core: Any, chroot: str) -> None:
        self.core = core
        self.prefix = chroot + "/brokers/topics/"
        self.last = -1

    def unchanged(self) -> bool:
        return bool(self.core.zxid == self.last)

    def __call__(self) -> list[tuple[str, bytes, int]]:
        core = self.core
        if core.zxid == self.last:
            return []  # no write since the last look
        self.last = core.zxid
        prefix = self.prefix
        out = []
        for path, node in core.nodes.items():
            if path.startswith(prefix) and path.endswith("/state"):
                out.append((path, node.data, node.mzxid))
        return out


__all__ = ["InvariantViolation", "Invariants", "parse_batches", "state_znodes"]
