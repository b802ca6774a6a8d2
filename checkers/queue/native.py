"""The explaining checker's results from the native core, for histories with anomalies.

`Screen.explain` (`_screen.pyx`) runs every pass of `checkers.queue.analysis.QueueAnalysis`
over the screen's flat arrays: it counts every case of every anomaly and keeps the raw
fields (record indices, key ids, values, offsets) of the first `max_examples` of each, in
the checker's order. This module turns those into the checker's results with the
checker's own code: the case builders of `checkers.queue.cases` write every example,
`VersionOrder`s are rebuilt for the keys an example needs, and the dependency cycles are
found and explained by `checkers.queue.cycles` over records made for the ops on them.
Only the op records an example names are made.

What the native passes do not settle goes back to the checker (`explain` returns None):
consumer-group ops, a history with no ok data op, lost writes whose bound two values
share. tests/checkers/test_queue_native.py holds the results to the checker's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from isrlab.checkers.queue.cases import CaseBuilders
from isrlab.checkers.queue.cycles import _cyclic_indices, explain_cycles
from isrlab.checkers.queue.ops import QueueOp, invoked_sends
from isrlab.checkers.queue.results import Anomalies
from isrlab.checkers.queue.version_order import VersionOrder

__all__ = ["NativeAnalysis", "explain"]


class _KeyWriters:
    """One key's writers (value -> its writer's record), as `QueueAnalysis.writer[k]`."""

    __slots__ = ("_an", "_kid")

    def __init__(self, an: NativeAnalysis, kid: int) -> None:
        self._an = an
        self._kid = kid

    def get(self, v: Any, default: Any = None) -> Any:
        if type(v) is not int:
            return default
        try:
            ri = self._an.sc.writer_of(self._kid, v)
        except OverflowError:
            return default
        return default if ri < 0 else self._an.rec(ri)


class _Writers:
    __slots__ = ("_an",)

    def __init__(self, an: NativeAnalysis) -> None:
        self._an = an

    def get(self, k: Any, default: Any = None) -> Any:
        kid = self._an.kid_of(k)
        return default if kid is None else _KeyWriters(self._an, kid)


class _Orders:
    """key -> `VersionOrder`, rebuilt from the native one on first use."""

    __slots__ = ("_an", "_made")

    def __init__(self, an: NativeAnalysis) -> None:
        self._an = an
        self._made: dict[int, VersionOrder | None] = {}

    def get(self, k: Any, default: Any = None) -> Any:
        kid = self._an.kid_of(k)
        if kid is None:
            return default
        vo = self.of(kid)
        return default if vo is None else vo

    def __getitem__(self, k: Any) -> VersionOrder:
        vo = self.get(k)
        if vo is None:
            raise KeyError(k)
        return vo  # type: ignore[no-any-return]

    def of(self, kid: int) -> VersionOrder | None:
        if kid not in self._made:
            parts = self._an.sc.order_parts(kid)
            vo = None
            if parts is not None:
                offsets, values, voff, multi, conflicts = parts
                vo = VersionOrder(self._an.keys[kid])
                vo.log = dict(zip(offsets, values, strict=True))
                vo.voff = dict(voff)
                vo.multi = multi
                vo.conflicts = conflicts
                vo.seal()
            self._made[kid] = vo
        return self._made[kid]


class NativeAnalysis(CaseBuilders):
    """What the case builders and `cycles.explain_cycles` read of a `QueueAnalysis`,
    answered from the native core: `anomalies`, `stats`, `writer`, `orders`, `by_pos`."""

    def __init__(self, sc: Any, max_examples: int) -> None:
        self.sc = sc
        self.anomalies = Anomalies(max_examples)
        self.kids: dict[Any, int] = sc.key_ids()
        self.keys: list[Any] = [None] * len(self.kids)
        for k, i in self.kids.items():
            self.keys[i] = k
        self.writer = _Writers(self)
        self.orders = _Orders(self)
        self.by_pos: dict[int, QueueOp] = {}
        self.stats: dict[str, Any] = {}
        self._recs: dict[int, QueueOp] = {}

    def kid_of(self, k: Any) -> int | None:
        try:
            return self.kids.get(k)
        except TypeError:
            return None

    def rec(self, ri: int) -> QueueOp:
        """The `QueueOp` of native record `ri` (one object per record)."""
        rec = self._recs.get(ri)
        if rec is None:
            f, kind, pos, index, inv, process, committed, idem, sends, reads = self.sc.record(ri)
            rec = QueueOp(f, kind, pos, index, inv, process)
            keys = self.keys
            if sends:
                rec.sends = [(keys[k], o, v) for k, o, v in sends]
            if reads:
                rec.reads = {keys[k]: pairs for k, pairs in reads}
            rec.committed = committed
            rec.idem = idem
            self._recs[ri] = rec
        return rec

    def build(self, out: dict[str, Any], ww_deps: bool, ops: Callable[[], Iterable[Any]]) -> None:
        """The examples of `Screen.explain`'s answer `out`, then its counts, then the cycles."""
        keys, rec, orders = self.keys, self.rec, self.orders
        an = self.anomalies
        exs: dict[str, list[tuple[Any, ...]]] = out["examples"]
        for case in exs.get("inconsistent-offsets", ()):
            k, o, index, values, writers = case
            an.add("inconsistent-offsets", self._inconsistent(keys[k], o, index, values, writers))
        for name in ("duplicate", "idempotence-duplicate"):
            for k, v, offs, w in exs.get(name, ()):
                c = self._duplicate_case(keys[k], v, offs, None if w < 0 else rec(w))
                an.add(name, c if name == "duplicate" else self._idem_case(c))
        for k, v, li, off, bound, bound_off, bound_v, w, reader in exs.get("lost-write", ()):
            an.add(
                "lost-write",
                self._lost_write(
                    keys[k],
                    v,
                    li,
                    off,
                    bound,
                    bound_off,
                    bound_v,
                    rec(w),
                    None if reader < 0 else rec(reader),
                ),
            )
        unseen = [(keys[k], n, items) for k, (n, items) in out["unseen"].items()]
        for k, n, items in sorted(unseen, key=lambda u: str(u[0])):
            self._unseen(k, n, [(v, rec(ri)) for v, ri in items])
        if out["garbage"]:
            attempted = invoked_sends(ops())
            for ri, k, o, v in out["garbage"]:
                if v not in attempted.get(keys[k], ()):
                    self._garbage(rec(ri), keys[k], o, v)
        for ri, k, o, v in exs.get("precommitted-read", ()):
            self._precommitted(rec(ri), keys[k], o, v)
        for ri, w, k, o, v in exs.get("G1a", ()):
            self._g1a(rec(ri), rec(w), keys[k], o, v)
        for name in ("int-poll-skip", "poll-skip", "int-send-skip"):
            for a, b, k, v1, v2, i1, i2 in exs.get(name, ()):
                vo = orders.of(k)
                assert vo is not None
                self._skip(name, rec(a), rec(b), keys[k], v1, v2, i1, i2, vo)
        for name in (
            "int-nonmonotonic-poll",
            "nonmonotonic-poll",
            "nonmonotonic-send",
            "int-nonmonotonic-send",
        ):
            for a, b, k, v1, v2, delta in exs.get(name, ()):
                self._nonmono(name, rec(a), rec(b), keys[k], v1, v2, delta)
        for a, ao, b, k, bo, bv in exs.get("realtime-send-order", ()):
            self._realtime_send(rec(a), ao, rec(b), keys[k], bo, bv)
        for a, ah, b, k, bh in exs.get("hw-regression", ()):
            self._hw_regression(rec(a), ah, rec(b), keys[k], bh)
        for a, ah, b, k, bh in exs.get("hw-regression-realtime", ()):
            self._hw_regression_rt(rec(a), ah, rec(b), keys[k], bh)
        for case in exs.get("committed-truncation", ()):
            if case[0]:
                _gap, a, k, mo, v0, b, prev_o, o = case
                self._truncation_gap(rec(a), keys[k], mo, v0, rec(b), prev_o, o)
            else:
                _gap, a, k, o, v0, b, v = case
                self._truncation_replaced(rec(a), keys[k], o, v0, rec(b), v)
        for name, n in out["counts"].items():
            an.counts[name] = n  # every case, examples or not
        self.stats.update(out["stats"])
        if self.stats["backward_edges"]:
            nodes, adj = self.sc.region_graph(ww_deps)
            alive = sorted(nodes[i] for i in _cyclic_indices(adj, len(nodes)))
            if alive:
                explain_cycles(self, [rec(ri) for ri in alive], self.sc.chains_among(alive))


def explain(
    sc: Any, ww_deps: bool, max_examples: int, ops: Callable[[], Iterable[Any]]
) -> NativeAnalysis | None:
    """The checker's anomalies and stats of the history fed to `sc` (a `Screen`), or None
    when the checker must find them. `ops`: the history's op dicts again (read only if
    some value read has no writer, for the values invokes tried to send)."""
    out = sc.explain(ww_deps, max_examples)
    if isinstance(out, str):
        return None
    na = NativeAnalysis(sc, max_examples)
    na.build(out, ww_deps, ops)
    return na
