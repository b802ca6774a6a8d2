"""The queue checker: every anomaly of docs/anomalies.md for Kafka-like logs.

`check_queue(ops)` takes a history (the spec's op dicts) and returns the spec's results
dict. Semantics follow Jepsen's Kafka checker (jepsen.tests.kafka) and the precise
definitions of anomalies.md; notable rules:

- committed send = a send in an `ok` op, or in an `info` op one of whose values some `ok`
  op read; `fail` sends never committed;
- the version order takes every poll of every completion type (polls in failed or
  unknown ops observed real records) and committed sends that report an offset;
- a process's consumer position only moves on `ok` ops; assign/subscribe (ok or info)
  keeps the positions (and send tracking) of keys still assigned; a consumer-group
  rebalance that assigns or revokes a key (subscribe mode) forgets the position in it,
  and within its op the key's reads are not held to each other (Jepsen's rebalanced
  keys); commits and rebalances give `committed-offset-regression`
  (`checkers.queue.group`);
- an `info` send nobody read is never lost; an invoke without completion counts as info;
- "A before B in real time" means A's completion precedes B's invoke in the history.

Work is a few linear passes over compact `QueueOp` records plus per-key dicts; the
cycle anomalies live in `checkers.queue.cycles`.
"""

from __future__ import annotations

import sys
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

from isrlab.checkers.history import HistoryError, gc_paused, nothing_checked
from isrlab.checkers.queue.cases import CaseBuilders, fmt
from isrlab.checkers.queue.cycles import cycle_anomalies
from isrlab.checkers.queue.group import GroupOffsets
from isrlab.checkers.queue.load import QueueFile, QueueHistory
from isrlab.checkers.queue.ops import (
    DATA_FS,
    FAIL,
    INFO,
    OK,
    QueueOp,
    check_pairs,
    invoked_sends,
    parse_ops,
)
from isrlab.checkers.queue.policy import allowed_types
from isrlab.checkers.queue.results import Anomalies, results_dict
from isrlab.checkers.queue.screen import screen_file, screen_ops
from isrlab.checkers.queue.version_order import VersionOrder

__all__ = ["QueueAnalysis", "check_queue", "offset_cases"]

_MISSING = object()
_VALUE = itemgetter(1)
_KIND = attrgetter("kind")


_fmt = fmt


class _RunningMax:
    """Per-key maximum of a quantity over completions, queryable as of any history position.

    Callers append (position, value, op) to the three lists whenever a completion raises
    the maximum (`values[-1]`), in history order; that append is inlined in the hot loop.
    """

    __slots__ = ("positions", "recs", "values")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.values: list[int] = []
        self.recs: list[QueueOp] = []

    def before(self, pos: int) -> tuple[int, QueueOp] | None:
        """The max among completions strictly before history position `pos`."""
        i = bisect_left(self.positions, pos) - 1
        if i < 0:
            return None
        return self.values[i], self.recs[i]


class QueueAnalysis(CaseBuilders):
    """All intermediate structures of one queue check; `run()` fills `anomalies`."""

    def __init__(
        self,
        ops: Sequence[dict[str, Any]] | QueueHistory,
        *,
        ww_deps: bool = True,
        max_examples: int = 32,
    ) -> None:
        if isinstance(ops, QueueHistory):
            self.records, self.saw_subscribe = ops.records, ops.saw_subscribe
        else:
            self.records, self.saw_subscribe = parse_ops(ops)
        self._ops: Iterable[dict[str, Any]] = ops
        self._attempted: dict[Any, set[Any]] | None = None
        self.ww_deps = ww_deps
        self.anomalies = Anomalies(max_examples)
        self.orders: dict[Any, VersionOrder] = {}
        self.writer: dict[Any, dict[Any, QueueOp]] = {}
        self.ok_reads: dict[Any, set[Any]] = {}
        self.ok_senders: list[QueueOp] = []  # ok ops that sent something, in completion order
        self.by_pos: dict[int, QueueOp] = {}  # filled by cycle_anomalies when needed
        self.stats: dict[str, Any] = {}
        # Some completion carries a consumer-group rebalance (set by `_op_checks`).
        self.saw_rebalance = False
        # Keys where committed data may have been replaced or have vanished.
        self.suspect_keys: set[Any] = set()
        # (reader, writer) completion positions of wr edges whose writer completed later.
        self.backward_wr: list[tuple[int, int]] = []

    @property
    def attempted(self) -> dict[Any, set[Any]]:
        """key -> values invokes tried to send (`invoked_sends`), computed on first use."""
        if self._attempted is None:
            self._attempted = invoked_sends(self._ops)
        return self._attempted

    # -- building -------------------------------------------------------------------------

    def _index(self) -> None:
        """One pass: writers, ok reads, and the version orders (see the module doc).

        Each key's observations (acked offsets of ok sends, then reads, op by op; then
        acked offsets of proven info sends) go into its `VersionOrder` in that order as the
        pass meets them (while the op's pairs are still in the CPU cache), and the orders
        are sealed at the end.
        """
        writer = self.writer
        ok_reads = self.ok_reads
        orders = self.orders = {}
        infos: list[QueueOp] = []
        ok_senders = self.ok_senders = []
        n_sends = n_reads = 0
        for rec in self.records:
            sends = rec.sends
            kind = rec.kind
            if sends:
                n_sends += len(sends)
                if kind == OK:
                    ok_senders.append(rec)
                elif kind == INFO:
                    infos.append(rec)
                    rec.committed = False  # records of a `QueueHistory` may be checked again
                for k, o, v in sends:
                    w = writer.get(k)
                    if w is None:
                        writer[k] = {v: rec}
                    else:
                        # A value is sent once, except a copier retrying an aborted copy:
                        # the attempt that took effect (ok, then info, then fail) wins.
                        prior = w.get(v)
                        if prior is None or kind < prior.kind:
                            w[v] = rec
                    if kind == OK and o is not None:
                        vo = orders.get(k)
                        if vo is None:
                            orders[k] = vo = VersionOrder(k)
                        vo.extend(((o, v),))
            reads = rec.reads
            if reads:
                for k, pairs in reads.items():
                    if not pairs:
                        continue
                    n_reads += len(pairs)
                    vo = orders.get(k)
                    if vo is None:
                        orders[k] = vo = VersionOrder(k)
                    vo.extend(pairs)
                    if kind == OK:
                        s = ok_reads.get(k)
                        if s is None:
                            ok_reads[k] = s = set()
                        s.update(map(_VALUE, pairs))
        # Proven info ops (some ok op read one of their values) committed: their acked
        # offsets join the version order too. A value also sent by a later attempt that
        # took effect (a copier's retry) proves only that attempt, its writer.
        for rec in infos:
            for k, _o, v in rec.sends:
                s = ok_reads.get(k)
                if s is not None and v in s and writer[k][v] is rec:
                    rec.committed = True
                    break
            if rec.committed:
                for k, o, v in rec.sends:
                    if o is not None:
                        vo = orders.get(k)
                        if vo is None:
                            orders[k] = vo = VersionOrder(k)
                        vo.extend(((o, v),))
        for vo in orders.values():
            vo.seal()
        self.stats.update(sends=n_sends, reads=n_reads)

    # -- checks over the version orders ------------------------------------------------------

    def _order_checks(self) -> None:
        an = self.anomalies
        for k, vo in self.orders.items():
            ws = self.writer.get(k, {})
            for o, values in vo.conflicts.items():
                if an.hit("inconsistent-offsets"):
                    writers = [ws[v].index for v in values if v in ws]
                    an.example(
                        "inconsistent-offsets",
                        self._inconsistent(k, o, vo.oidx[o], values, writers),
                    )
            for v, offs in vo.multi.items():
                w = ws.get(v)
                case = self._duplicate_case(k, v, sorted(offs), w)
                an.add("duplicate", case)
                if w is not None and w.idem:
                    an.add("idempotence-duplicate", self._idem_case(case))

    def _lost_and_unseen(self) -> None:
        for k, vo in self.orders.items():
            oks = self.ok_reads.get(k)
            if not oks or oks.issuperset(vo.voff):
                continue  # every value of the key was read by some ok op: none was lost
            bound = -1
            bound_v: Any = None
            if vo.multi:
                for v in oks:
                    i = vo.first_index(v)
                    if i is not None and i > bound:
                        bound, bound_v = i, v
            else:
                # first_index inlined: with no value at several offsets it is oidx[voff[v]].
                voff_get = vo.voff.get
                oidx = vo.oidx
                for v in oks:
                    o = voff_get(v)
                    if o is not None:
                        i = oidx[o]
                        if i > bound:
                            bound, bound_v = i, v
            if bound < 0:
                continue
            bound_offset = vo.offsets[bound]
            ws = self.writer.get(k, {})
            lost = []
            for v in vo.voff:
                if v in oks:
                    continue
                li = vo.last_index(v)
                if li is None or li > bound:
                    continue
                w = ws.get(v)
                if w is None or not w.committed:
                    continue
                lost.append((li, v, w))
            if not lost:
                continue
            lost.sort(key=lambda t: t[0])
            reader = self._an_ok_reader(k, bound_v)
            for li, v, w in lost:
                if self.anomalies.hit("lost-write"):
                    self.anomalies.example(
                        "lost-write",
                        self._lost_write(
                            k, v, li, vo.offsets[li], bound, bound_offset, bound_v, w, reader
                        ),
                    )
        # unseen: acknowledged sends no ok op read by the end.
        per_key: dict[Any, list[tuple[Any, QueueOp]]] = {}
        for rec in self.ok_senders:
            for k, _o, v in rec.sends:
                s = self.ok_reads.get(k)
                if s is None or v not in s:
                    per_key.setdefault(k, []).append((v, rec))
        for k, items in sorted(per_key.items(), key=lambda kv: str(kv[0])):
            self._unseen(k, len(items), items[:32])

    def _an_ok_reader(self, k: Any, v: Any) -> QueueOp | None:
        for rec in self.records:
            if rec.kind == OK:
                pairs = rec.reads.get(k)
                if pairs and any(p[1] == v for p in pairs):
                    return rec
        return None

    # -- one pass over ops in completion order ------------------------------------------------

    def _op_checks(self) -> None:
        orders = self.orders
        writer = self.writer
        positions: dict[Any, dict[Any, tuple[int | None, Any, QueueOp]]] = {}
        last_sends: dict[Any, dict[Any, tuple[int | None, Any, QueueOp]]] = {}
        hw_seen: dict[Any, dict[Any, tuple[int, QueueOp]]] = {}
        hw_max: dict[Any, _RunningMax] = {}
        send_max: dict[Any, _RunningMax] = {}
        empty: dict[Any, QueueOp] = {}
        backward = self.backward_wr
        group = GroupOffsets(self.anomalies)
        for rec in self.records:
            p = rec.process
            rpos = rec.pos
            # Keys a consumer-group rebalance assigned or revoked during this op: the
            # process's position in them starts afresh (subscribe mode).
            rebalanced: frozenset[Any] | tuple[()] = ()
            f = rec.f
            if rec.reb is not None:
                rebalanced = group.rebalance(rec, rec.reb)
                pp = positions.get(p)
                if pp:
                    # An assign that leaves the group (the revocation rides on it) resumes
                    # the keys it names where the process was: their positions stay.
                    kept = rec.value if f == "assign" and rec.kind != FAIL else None
                    if not isinstance(kept, list):
                        kept = []
                    for k in rebalanced:
                        if k not in kept:
                            pp.pop(k, None)
            if f == "commit":
                if rec.kind == OK:
                    group.commit(rec)
                continue
            if f == "assign" or f == "subscribe":
                if rec.kind != FAIL and isinstance(rec.value, list):
                    keep = set(rec.value)
                    for table in (positions, last_sends):
                        t = table.get(p)
                        if t:
                            table[p] = {k: x for k, x in t.items() if k in keep}
                    if f == "assign":
                        group.explicit_assign(p)
                continue
            kind = rec.kind
            is_ok = kind == OK
            committed = rec.committed
            # ---- reads
            for k, pairs in rec.reads.items():
                if not pairs:
                    continue
                if group.starts:
                    group.first_read(rec, k, pairs[0][0])
                vo = orders[k]
                ws = writer.get(k, empty)
                oidx = vo.oidx
                prev_i: int | None = None
                prev: Any = _MISSING
                for o, v in pairs:
                    w = ws.get(v)
                    if w is None:
                        if v not in self.attempted.get(k, ()):
                            self._garbage(rec, k, o, v)
                    elif w is rec:
                        self._precommitted(rec, k, o, v)
                    elif is_ok and w.kind == FAIL:
                        self._g1a(rec, w, k, o, v)
                    elif w.pos > rpos and w.committed and committed:
                        # A wr edge against completion order: cycles can only lie
                        # within the spans of such edges (checkers.queue.cycles).
                        backward.append((rpos, w.pos))
                    i = oidx[o] if o is not None else vo.first_index(v)
                    if prev_i is not None and i is not None:
                        delta = i - prev_i
                        if delta != 1:
                            if delta > 1:
                                self.suspect_keys.add(k)
                            # A rebalance of the key during the op may have moved the
                            # consumer between two of its reads (Jepsen: rebalanced keys).
                            if k in rebalanced:
                                pass
                            elif delta > 1:
                                self._skip("int-poll-skip", rec, rec, k, prev, v, prev_i, i, vo)
                            else:
                                self._nonmono("int-nonmonotonic-poll", rec, rec, k, prev, v, delta)
                    prev_i = i
                    prev = v
                first_o, first_v = pairs[0]
                first_i = oidx[first_o] if first_o is not None else vo.first_index(first_v)
                pp = positions.get(p)
                if pp is not None:
                    last = pp.get(k)
                    li = None if last is None else last[0]
                    if last is not None and li is not None and first_i is not None:
                        lv, lrec = last[1], last[2]
                        delta = first_i - li
                        if delta > 1:
                            self._skip("poll-skip", lrec, rec, k, lv, first_v, li, first_i, vo)
                        elif delta < 1:
                            self._nonmono("nonmonotonic-poll", lrec, rec, k, lv, first_v, delta)
                if kind == OK:
                    if pp is None:
                        positions[p] = pp = {}
                    pp[k] = (prev_i, prev, rec)
            # ---- sends
            sends = rec.sends
            if len(sends) == 1 and rec.committed:
                # The common single send: no internal order, just the process's order.
                k, o, v = sends[0]
                vo_k = orders.get(k)
                i = None if vo_k is None else vo_k.index_of(o, v)
                ls = last_sends.get(p)
                if ls is None:
                    last_sends[p] = ls = {}
                last = ls.get(k)
                if last is not None and last[0] is not None and i is not None:
                    delta = i - last[0]
                    if delta < 1:
                        self._nonmono("nonmonotonic-send", last[2], rec, k, last[1], v, delta)
                ls[k] = (i, v, rec)
            elif sends:
                this: dict[Any, tuple[int | None, Any]] = {}
                firsts: dict[Any, tuple[int | None, Any]] = {}
                for k, o, v in sends:
                    vo_k = orders.get(k)
                    if vo_k is None:
                        i = None
                    elif rec.committed and o is not None:
                        i = vo_k.oidx.get(o)
                    else:
                        i = vo_k.first_index(v)
                    before = this.get(k)
                    if before is None:
                        firsts[k] = (i, v)
                    else:
                        bi, bv = before
                        if bi is not None and i is not None:
                            delta = i - bi
                            if delta > 1 and vo_k is not None:
                                self._skip("int-send-skip", rec, rec, k, bv, v, bi, i, vo_k)
                            elif delta < 1:
                                self._nonmono("int-nonmonotonic-send", rec, rec, k, bv, v, delta)
                    this[k] = (i, v)
                if rec.committed:
                    ls = last_sends.get(p)
                    if ls is None:
                        last_sends[p] = ls = {}
                    for k, (fi, fv) in firsts.items():
                        last = ls.get(k)
                        if last is not None and last[0] is not None and fi is not None:
                            delta = fi - last[0]
                            if delta < 1:
                                self._nonmono(
                                    "nonmonotonic-send", last[2], rec, k, last[1], fv, delta
                                )
                        li, lv = this[k]
                        ls[k] = (li, lv, rec)
            if kind != OK:
                continue
            # ---- realtime send order (ok sends with known offsets); the bisect is only
            # needed when the newest maximum exceeds this offset
            for k, o, v in rec.sends:
                if o is None:
                    continue
                rm = send_max.get(k)
                if rm is None:
                    send_max[k] = rm = _RunningMax()
                top = rm.values
                if not top or o > top[-1]:
                    rm.positions.append(rpos)
                    top.append(o)
                    rm.recs.append(rec)
                elif top[-1] > o:
                    prior = rm.before(rec.inv)
                    if prior is not None and prior[0] > o:
                        self._realtime_send(prior[1], prior[0], rec, k, o, v)
            # ---- watermarks
            wm = rec.wm
            if wm:
                seen = hw_seen.get(p)
                if seen is None:
                    hw_seen[p] = seen = {}
                for k, marks in wm.items():
                    high = marks.get("high") if type(marks) is dict else None
                    if type(high) is not int:
                        continue
                    last_hw = seen.get(k)
                    if last_hw is not None and high < last_hw[0]:
                        self._hw_regression(last_hw[1], last_hw[0], rec, k, high)
                    seen[k] = (high, rec)
                    rm = hw_max.get(k)
                    if rm is None:
                        hw_max[k] = rm = _RunningMax()
                    top = rm.values
                    if not top or high > top[-1]:
                        rm.positions.append(rpos)
                        top.append(high)
                        rm.recs.append(rec)
                    elif top[-1] > high:
                        prior = rm.before(rec.inv)
                        if prior is not None and prior[0] > high:
                            self._hw_regression_rt(prior[1], prior[0], rec, k, high)
        self.saw_rebalance = group.n_rebalances > 0
        if group.n_rebalances or group.n_commits:
            self.stats.update(rebalances=group.n_rebalances, commits=group.n_commits)

    def _truncation_checks(self) -> None:
        """committed-truncation, for keys with a conflicting offset or a gap inside a poll.

        Replacing committed data makes an offset hold two values (inconsistent-offsets) and
        losing it makes a later poll jump over a known offset (int-poll-skip), so only
        those keys need the exact, position-aware replay done here.
        """
        keys = self.suspect_keys | {k for k, vo in self.orders.items() if vo.conflicts}
        if not keys:
            return
        # Per suspect key: offset -> (value, completion position, op) once committed,
        # the committed offsets sorted, and the highest low watermark seen so far.
        committed: dict[Any, dict[int, tuple[Any, int, QueueOp]]] = {k: {} for k in keys}
        committed_sorted: dict[Any, list[int]] = {k: [] for k in keys}
        low: dict[Any, int] = dict.fromkeys(keys, -1)
        for rec in self.records:
            if rec.kind != OK:
                continue
            for k, pairs in rec.reads.items():
                cm = committed.get(k)
                if not cm or not pairs:
                    continue
                cs = committed_sorted[k]
                lo = low[k]
                prev_o = None
                for o, v in pairs:
                    if o is None:
                        continue
                    c = cm.get(o)
                    if c is not None and c[1] < rec.inv and c[0] != v and o >= lo:
                        self._truncation_replaced(c[2], k, o, c[0], rec, v)
                    if prev_o is not None and o > prev_o + 1:
                        j = bisect_left(cs, prev_o + 1)
                        while j < len(cs) and cs[j] < o:
                            mo = cs[j]
                            c = cm[mo]
                            if c[1] < rec.inv and mo >= lo:
                                self._truncation_gap(c[2], k, mo, c[0], rec, prev_o, o)
                            j += 1
                    prev_o = o
            wm = rec.wm
            if not wm:
                continue
            for k, marks in wm.items():
                if k not in committed or not isinstance(marks, dict):
                    continue
                lw = marks.get("low")
                if isinstance(lw, int) and lw > low[k]:
                    low[k] = lw
                high = marks.get("high")
                if not isinstance(high, int):
                    continue
                cm = committed[k]
                cs = committed_sorted[k]
                acked = [(o, v) for sk, o, v in rec.sends if sk == k]
                for o, v in [*rec.reads.get(k, ()), *acked]:
                    if o is not None and o < high and o not in cm:
                        cm[o] = (v, rec.pos, rec)
                        insort(cs, o)

    # -- driver ------------------------------------------------------------------------------

    def run(self, eos: Mapping[str, Iterable[Any]] | None = None) -> None:
        self._index()
        self._order_checks()
        self._lost_and_unseen()
        self._op_checks()
        self._truncation_checks()
        cycle_anomalies(self)
        if eos:
            from isrlab.checkers.eos import check_eos

            inputs, outputs = list(eos.get("input", ())), list(eos.get("output", ()))
            out_set = set(outputs)
            consumed: dict[Any, int] = {}
            links: set[tuple[Any, Any]] = set()
            for rec in self.records:
                sent_to = {k for k, _o, _v in rec.sends if k in out_set}
                # Only ok copier transactions bound what was consumed: an info one is "proven"
                # by a read of one of its output values, but a retried copy sends the same
                # values, so that read may prove the other attempt (seen in property tests).
                # An info one still links its keys (it read them and sent to them, whatever
                # became of it): an output key written only by info copies is compared with
                # the inputs they read (property tests found one left unlinked).
                if rec.kind not in (OK, INFO) or not sent_to:
                    continue
                for k in inputs:
                    offs = [o for o, _v in rec.reads.get(k, ()) if o is not None]
                    if offs:
                        links.update((k, out) for out in sent_to)
                        if rec.kind == OK and max(offs) > consumed.get(k, -1):
                            consumed[k] = max(offs)
            for name, cases in check_eos(self.orders, inputs, outputs, consumed, links).items():
                self.anomalies.add_all(name, cases)
        recs = self.records
        kinds = Counter(map(_KIND, recs))
        self.stats.update(
            ops=len(recs),
            ok=kinds[OK],
            info=kinds[INFO],
            fail=kinds[FAIL],
            keys=len(self.orders),
            max_offset=max(
                (vo.offsets[-1] for vo in self.orders.values() if vo.offsets), default=-1
            ),
        )


def offset_cases(ops: Sequence[dict[str, Any]]) -> dict[str, set[tuple[Any, int, Any]]]:
    """Every (key, offset, value) the `committed-truncation` and `inconsistent-offsets` cases
    of a history name, all of them (a check keeps only the first `max_examples` cases of each):
    for ``committed-truncation`` the committed value each case says was replaced or vanished,
    for ``inconsistent-offsets`` each value of each conflicting offset. Only the two passes
    these anomalies come from run: the version orders, then the committed-truncation replay,
    here over every key (the check replays only keys with a conflicting offset or a gap inside
    a poll, the only keys where the replay can find a case).
    """
    analysis = QueueAnalysis(ops, max_examples=sys.maxsize)
    analysis._index()
    analysis.suspect_keys = set(analysis.orders)
    analysis._truncation_checks()
    truncated = {
        (ex["key"], ex["offset"], ex["value"])
        for ex in analysis.anomalies.examples.get("committed-truncation", [])
    }
    conflicting = {
        (k, o, v)
        for k, vo in analysis.orders.items()
        for o, values in vo.conflicts.items()
        for v in values
    }
    return {"committed-truncation": truncated, "inconsistent-offsets": conflicting}


def check_queue(
    ops: Sequence[dict[str, Any]] | QueueHistory | QueueFile,
    *,
    allow: set[str] | None = None,
    disallow: set[str] | None = None,
    subscribe: bool | None = None,
    eos: dict[str, Any] | None = None,
    ww_deps: bool = True,
    max_examples: int = 32,
    screen: bool = True,
) -> dict[str, Any]:
    """Check a queue-workload history; return the spec's results dict.

    subscribe=None infers the mode from the history (any subscribe op). eos names the
    consume-transform-produce keys: {"input": [...], "output": [...]}. ww_deps=False
    drops version-order (ww) edges from the dependency graph, as Jepsen's :ww-deps.

    `ops` may be a `QueueHistory` (`checkers.queue.load.load_queue`): the same check
    without op dicts. Should the check fail on it, the history is checked again as op
    dicts, so that the error is the one the dict path gives. It may also be a
    `QueueFile` (`checkers.api.load_for_check`), loaded only if the screen needs it.

    A history given as a file or as op dicts is first screened natively
    (`checkers.queue.screen`): one with no anomaly gets its results from the screen's
    stats, the same results the checker gives. One with anomalies is explained by the
    native core (`checkers.queue.native`: the checker's passes compiled, its case builders
    and cycle code for the examples), the same results again; what that leaves, and
    checks with `eos`, and all checks with screen=False, go to the checker.
    """
    screened = None
    if screen and not eos:
        if isinstance(ops, QueueFile):
            screened = screen_file(ops.path, ww_deps=ww_deps, max_examples=max_examples)
        elif isinstance(ops, list):
            screened = screen_ops(ops, ww_deps=ww_deps, max_examples=max_examples)
        if screened is not None and screened.stats is not None:
            if isinstance(ops, QueueFile):
                ops.n_ops = screened.n_ops
            sub = screened.saw_subscribe if subscribe is None else subscribe
            allowed = allowed_types(subscribe=sub, allow=allow, disallow=disallow)
            return results_dict(
                Anomalies(max_examples), allowed, screened.stats | {"subscribe_mode": sub}
            )
        if screened is not None and screened.explained is not None:
            # Anomalies, found and counted by the native core, explained by the case
            # builders (`checkers.queue.native`): the checker's results.
            if isinstance(ops, QueueFile):
                ops.n_ops = screened.n_ops
            sub = screened.saw_subscribe if subscribe is None else subscribe
            allowed = allowed_types(subscribe=sub, allow=allow, disallow=disallow)
            na = screened.explained
            return results_dict(na.anomalies, allowed, na.stats | {"subscribe_mode": sub})
    if isinstance(ops, QueueFile):
        ops = ops.load()
    if isinstance(ops, QueueHistory):
        try:
            with gc_paused():
                analysis = QueueAnalysis(ops, ww_deps=ww_deps, max_examples=max_examples)
                analysis.run(eos)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            ops = ops.op_dicts()
        else:
            return _results(analysis, allow, disallow, subscribe)
    with gc_paused():
        try:
            analysis = QueueAnalysis(ops, ww_deps=ww_deps, max_examples=max_examples)
            analysis.run(eos)
        except (TypeError, ValueError, IndexError, KeyError) as e:
            if isinstance(e, HistoryError):
                raise
            # The fast path does not check every pair; find the op that broke it.
            check_pairs(ops)
            raise HistoryError(f"malformed queue history: {e!r}") from e
    return _results(analysis, allow, disallow, subscribe)


def _results(
    analysis: QueueAnalysis,
    allow: set[str] | None,
    disallow: set[str] | None,
    subscribe: bool | None,
) -> dict[str, Any]:
    sub = analysis.saw_subscribe if subscribe is None else subscribe
    allowed = allowed_types(
        subscribe=sub, rebalances=analysis.saw_rebalance, allow=allow, disallow=disallow
    )
    stats = dict(analysis.stats)
    stats["subscribe_mode"] = sub
    results = results_dict(analysis.anomalies, allowed, stats)
    if not any(r.kind == OK and r.f in DATA_FS for r in analysis.records):
        nothing_checked(results, "no ok send, poll or txn in the history")
    return results
