"""Consumer groups in a queue history: rebalances, commits, and `committed-offset-regression`.

Subscribe mode (docs/history-format.md): a completion may carry a ``rebalance`` object
(the rebalances the client saw since its previous op, taken to have happened during
this op), optionally with ``committed``, the group's committed offsets the client
fetched for the keys it was assigned; ``commit`` ops commit offsets (Kafka's meaning:
the next offset to read). `GroupOffsets` follows them in completion order, as
`QueueAnalysis._op_checks` walks the records, and reports docs/anomalies.md's
`committed-offset-regression`: for a key k, an observed committed offset lower than
the offset of an `ok` commit of k that completed before the observing op was invoked.
An observation is

- a ``rebalance.committed[k]`` (null: the group has no committed offset for k, lower than
  any), the op carrying it being the observer;
- the first offset a process reads of k after a rebalance newly assigned k to it (when
  the rebalance carries no ``committed[k]``, which is then the observation): the position
  the member started from, which Kafka takes from the group's committed offset.
  The committed offset was fetched during the op carrying the rebalance, so commits count
  only when they completed before that op's invoke. An ok or info ``assign`` of the
  process in between (an explicit reset) cancels the observation, a rebalance revoking k
  too. When k is both revoked and assigned in the rebalance of an op that itself reads
  k, the op's reads may precede the rebalance: no observation then.

The maximum offset committed so far counts, so a later ok commit of a lower offset does
not excuse a lower observation: the anomaly is what the group is seen to hold, and the
example names such a commit when there is one.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from isrlab.checkers.queue.cases import fmt
from isrlab.checkers.queue.ops import QueueOp, Rebalance

if TYPE_CHECKING:
    from isrlab.checkers.queue.results import Anomalies

__all__ = ["GroupOffsets"]

NAME = "committed-offset-regression"


class _Committed:
    """One key's ok commits: the running maximum over completion positions, and all of them."""

    __slots__ = ("all", "positions", "recs", "values")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.values: list[int] = []
        self.recs: list[QueueOp] = []
        self.all: list[tuple[int, QueueOp]] = []

    def add(self, offset: int, rec: QueueOp) -> None:
        self.all.append((offset, rec))
        if not self.values or offset > self.values[-1]:
            self.positions.append(rec.pos)
            self.values.append(offset)
            self.recs.append(rec)

    def before(self, pos: int) -> tuple[int, QueueOp] | None:
        """The highest offset among commits completed strictly before position `pos`."""
        i = bisect_left(self.positions, pos) - 1
        if i < 0:
            return None
        return self.values[i], self.recs[i]

    def lowered(self, offset: int, after: QueueOp, before: int) -> QueueOp | None:
        """The last ok commit of exactly `offset`, invoked after `after` completed and
        completed before position `before`: the group was told to go back there."""
        found = None
        for o, rec in self.all:
            if rec.pos >= before:
                break
            if o == offset and rec.inv > after.pos:
                found = rec
        return found


class GroupOffsets:
    """The consumer-group state `_op_checks` keeps while walking the records."""

    def __init__(self, anomalies: Anomalies) -> None:
        self.anomalies = anomalies
        self.committed: dict[Any, _Committed] = {}
        # process -> key -> the op whose rebalance newly assigned the key to the process,
        # until the process's first read of it.
        self.starts: dict[Any, dict[Any, QueueOp]] = {}
        self.n_rebalances = 0
        self.n_commits = 0

    def commit(self, rec: QueueOp) -> None:
        """An ok commit op completed."""
        self.n_commits += 1
        for k, o in rec.value.items():
            c = self.committed.get(k)
            if c is None:
                self.committed[k] = c = _Committed()
            c.add(o, rec)

    def rebalance(self, rec: QueueOp, reb: Rebalance) -> frozenset[Any]:
        """The rebalance `rec`'s completion carries; returns the keys it assigned or revoked."""
        self.n_rebalances += 1
        p = rec.process
        started = self.starts.get(p)
        if started:
            for k in reb.revoked:
                started.pop(k, None)
        fetched = reb.committed or {}
        for k, o in fetched.items():
            self._observe(k, o, rec, rec, reb, fetch=True)
        for k in reb.assigned:
            if k in fetched or (k in reb.revoked and rec.reads.get(k)):
                # The fetch is the observation (the member starts there); or reads of
                # this very op may come from before the rebalance moved it.
                if started:
                    started.pop(k, None)
                continue
            if started is None:
                self.starts[p] = started = {}
            started[k] = rec
        return frozenset(reb.assigned) | frozenset(reb.revoked)

    def explicit_assign(self, process: Any) -> None:
        """An ok or info assign: the process's next reads start where it said, not at the
        group's committed offsets."""
        self.starts.pop(process, None)

    def first_read(self, rec: QueueOp, k: Any, offset: Any) -> None:
        """`rec` read key k starting at `offset`: the first read since a rebalance assigned
        k to the process is where the member started."""
        started = self.starts.get(rec.process)
        if not started:
            return
        reb_rec = started.pop(k, None)
        if reb_rec is None or type(offset) is not int:
            return
        assert reb_rec.reb is not None
        self._observe(k, offset, reb_rec, rec, reb_rec.reb, fetch=False)

    def _observe(
        self,
        k: Any,
        offset: int | None,
        reb_rec: QueueOp,
        reader: QueueOp,
        reb: Rebalance,
        *,
        fetch: bool,
    ) -> None:
        """The group's committed offset of k seen as `offset` (None: none) after the
        rebalance in `reb_rec`: fetched then (`fetch`), or `reader`'s first read of k."""
        c = self.committed.get(k)
        if c is None:
            return
        prior = c.before(reb_rec.inv)
        if prior is None:
            return
        top, crec = prior
        if offset is not None and offset >= top:
            return
        if not self.anomalies.hit(NAME):
            return
        lower = None if offset is None else c.lowered(offset, crec, reader.pos)
        gen = "" if reb.generation is None else f" (generation {reb.generation})"
        seen = "no committed offset" if offset is None else f"offset {offset}"
        head = (
            f"{crec.describe()} committed offset {top} for key {fmt(k)} and completed "
            f"before {reb_rec.describe()} was invoked"
        )
        if fetch:
            how = "offset-fetch"
            found = (
                f"no committed offset of {fmt(k)} in the group"
                if offset is None
                else f"the group's committed offset of {fmt(k)} to be {offset}"
            )
            body = f"; yet in that op's rebalance{gen} the client found {found}"
            ops = [crec.index, reb_rec.index]
        else:
            how = "first-poll"
            where = "in that op" if reader is reb_rec else f"in {reader.describe()}"
            body = (
                f", whose rebalance{gen} assigned {fmt(k)} to process {reb_rec.process}; the "
                f"first record that process then read of {fmt(k)}, {where}, was at {seen}, "
                "so the member started below the group's committed offset"
            )
            ops = [crec.index, reb_rec.index]
            if reader is not reb_rec:
                ops.append(reader.index)
        tail = ": the group's committed offset went backwards"
        if lower is not None:
            tail += (
                f" (the lower offset is what {lower.describe()} committed after "
                f"{crec.describe()} had completed)"
            )
        case: dict[str, Any] = {
            "key": k,
            "offset": offset,
            "committed_offset": top,
            "offsets": [top] if offset is None else [offset, top],
            "ops": ops,
            "observed_by": how,
            "generation": reb.generation,
            "process": reb_rec.process,
        }
        if lower is not None:
            case["lower_commit"] = lower.index
        case["explanation"] = head + body + tail
        self.anomalies.example(NAME, case)
