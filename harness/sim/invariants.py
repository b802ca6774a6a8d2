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
  bytes on every member of its ISR that is alive, and the same as the first leader that
  exposed them as committed (a later leader holding other bytes below its HW, or an ISR
  member missing them, is a violation).

The data check is incremental: the bytes of each broker incarnation's log are read once, as
the high watermark moves past them. `check()` returns what changed (for a trace) and raises
`InvariantViolation` naming the invariant; `SimCluster` adds the virtual time and the event.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from isrlab.broker.replication import LeaderAndIsr

#: how much of a log one check reads at most per partition and member (the rest next event)
READ_CHUNK = 16 << 20


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


@dataclass
class _Canon:
    """What is committed of one partition: batches from offset `start`, contiguous."""

    start: int = -1
    batches: dict[int, _Batch] = field(default_factory=dict)  # base offset -> batch
    end: int = -1  # the offset after the last batch

    def covering(self, offset: int) -> _Batch | None:
        return self.batches.get(offset)


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
        out.append(_Batch(base, base + delta, zlib.crc32(data[pos:end])))
        pos = end
    return out


class Invariants:
    def __init__(self, state_znodes: Any = None) -> None:
        """`state_znodes()` gives `(path, data, mzxid)` of every partition state znode (the
        simulated ensemble's, read directly); None checks brokers only."""
        self.state_znodes = state_znodes
        self.leaders: dict[tuple[tuple[str, int], int], int] = {}
        self.zk_epochs: dict[str, tuple[int, int]] = {}  # path -> (mzxid, leader epoch)
        self.zk_seen: dict[str, tuple[int, int, tuple[int, ...]]] = {}  # leader, epoch, ISR
        self.leader_hw: dict[tuple[int, int, tuple[str, int], int], int] = {}
        self.canon: dict[tuple[str, int], _Canon] = {}
        self.verified: dict[tuple[int, int, tuple[str, int]], int] = {}
        self.checks = 0

    # ----- the check -----------------------------------------------------------------------

    def check(self, brokers: Iterable[LiveBroker]) -> list[str]:
        """Check every invariant now; what changed (new leaders, HWs, ZooKeeper epochs) as
        lines for a trace. Raises InvariantViolation."""
        self.checks += 1
        changes: list[str] = []
        live = [b for b in brokers if b.server is not None]
        by_id = {b.id: b for b in live}
        if self.state_znodes is not None:
            self._check_znodes(changes)
        for b in live:
            for tp, hp in sorted(b.server.replica_manager.partitions.items()):
                if not hp.is_leader:
                    continue
                tp = (tp[0], tp[1])
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
                elif hw < before:
                    raise InvariantViolation(
                        f"the high watermark of {tp[0]}-{tp[1]} on its leader, broker {b.id} "
                        f"(epoch {epoch}), went down from {before} to {hw}"
                    )
                elif hw > before:
                    changes.append(f"hw {tp[0]}-{tp[1]} broker {b.id} {before} -> {hw}")
                self.leader_hw[key] = hw
                self._check_committed(tp, hw, b, hp.isr, by_id)
        return changes

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
    ) -> None:
        canon = self.canon.setdefault(tp, _Canon())
        # the leader first: what it holds below its HW and nobody committed yet is canon
        for m in [leader.id] + [r for r in isr if r != leader.id]:
            member = by_id.get(m)
            if member is None:
                continue  # down: checked again when it is back
            hp = member.server.replica_manager.partitions.get(tp)
            if hp is None:
                continue
            lg = hp.log
            key = (member.id, member.incarnation, tp)
            start = self.verified.get(key, -1)
            if start < 0:
                start = lg.log_start_offset
            start = max(start, lg.log_start_offset)
            if canon.start < 0:
                canon.start = canon.end = lg.log_start_offset
            start = max(start, canon.start)
            if lg.log_end_offset < hw:
                raise InvariantViolation(
                    f"{tp[0]}-{tp[1]}: broker {m}, in the ISR {isr} of leader {leader.id}, "
                    f"has its log end at {lg.log_end_offset}, below the high watermark {hw}"
                )
            while start < hw:
                data = lg.read(start, READ_CHUNK, max_offset=hw).read_bytes()
                batches = parse_batches(data)
                if not batches:
                    break
                for batch in batches:
                    self._agree(tp, canon, batch, m, leader.id)
                start = batches[-1].last + 1
            self.verified[key] = start

    @staticmethod
    def _agree(tp: tuple[str, int], canon: _Canon, batch: _Batch, member: int, leader: int) -> None:
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
            raise InvariantViolation(
                f"{tp[0]}-{tp[1]}: committed batch at offset {batch.base} differs on broker "
                f"{member} (offsets {batch.base}..{batch.last}, crc {batch.crc:08x}) from "
                f"what was committed (offsets {known.base}..{known.last}, crc {known.crc:08x})"
                f" (leader {leader})"
            )


def state_znodes(core: Any, chroot: str = "") -> Any:
    """`Invariants(state_znodes=...)` for a `SimZooKeeper`: its partition state znodes (none
    when nothing was written since the last call)."""

    last = [-1]

    def read() -> list[tuple[str, bytes, int]]:
        if core.zxid == last[0]:
            return []  # no write since the last look
        last[0] = core.zxid
        prefix = chroot + "/brokers/topics/"
        out = []
        for path, node in core.nodes.items():
            if path.startswith(prefix) and path.endswith("/state"):
                out.append((path, node.data, node.mzxid))
        return out

    return read


__all__ = ["InvariantViolation", "Invariants", "parse_batches", "state_znodes"]
