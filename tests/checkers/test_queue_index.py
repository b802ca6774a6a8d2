"""The queue checker's indexing shortcuts against plain, definition-shaped reference code.

`QueueAnalysis._index` builds each key's version order incrementally while it walks the
records, and `_lost_and_unseen` skips keys where every value was read by an ok op. The
reference analysis below gathers each key's observations into a list and adds them one
by one (`VersionOrder.add`), then runs the lost-write and unseen checks without any
shortcut. Both must give the same version orders (contents and insertion orders) and
the same full results on simulated histories and on mutated ones: read gaps, reordered
reads, garbage values, reads of failed writes, reads of an op's own write,
non-consecutive offsets, duplicated values and more.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from isrlab.checkers.queue.analysis import QueueAnalysis, _results
from isrlab.checkers.queue.ops import INFO, OK, QueueOp
from isrlab.checkers.queue.version_order import VersionOrder
from tests.checkers.test_queue_load import MUTATIONS, Ops, _completions, _history, _renumber


class ReferenceAnalysis(QueueAnalysis):
    """`QueueAnalysis` with `_index` and `_lost_and_unseen` written the plain way."""

    def _index(self) -> None:
        seen: dict[Any, list[tuple[Any, Any]]] = {}
        infos: list[QueueOp] = []
        n_sends = n_reads = 0
        for rec in self.records:
            if rec.sends:
                n_sends += len(rec.sends)
                if rec.kind == INFO:
                    infos.append(rec)
                    rec.committed = False
            for k, o, v in rec.sends:
                ws = self.writer.setdefault(k, {})
                if v not in ws or rec.kind < ws[v].kind:
                    ws[v] = rec
                if rec.kind == OK and o is not None:
                    seen.setdefault(k, []).append((o, v))
            for k, pairs in rec.reads.items():
                if not pairs:
                    continue
                n_reads += len(pairs)
                seen.setdefault(k, []).extend((o, v) for o, v in pairs)
                if rec.kind == OK:
                    self.ok_reads.setdefault(k, set()).update(v for _o, v in pairs)
        for rec in infos:
            rec.committed = any(
                v in self.ok_reads.get(k, ()) and self.writer[k][v] is rec for k, _o, v in rec.sends
            )
            if rec.committed:
                for k, o, v in rec.sends:
                    if o is not None:
                        seen.setdefault(k, []).append((o, v))
        for k, obs in seen.items():
            vo = VersionOrder(k)
            for o, v in obs:
                if o is not None:
                    vo.add(o, v)
            vo.seal()
            self.orders[k] = vo
        self.stats.update(sends=n_sends, reads=n_reads)

    def _lost_and_unseen(self) -> None:
        for k, vo in self.orders.items():
            oks = self.ok_reads.get(k)
            if not oks:
                continue
            bound, bound_v = -1, None
            for v in oks:
                i = vo.first_index(v)
                if i is not None and i > bound:
                    bound, bound_v = i, v
            if bound < 0:
                continue
            ws = self.writer.get(k, {})
            lost = []
            for v in vo.voff:
                li = vo.last_index(v)
                w = ws.get(v)
                if v in oks or li is None or li > bound or w is None or not w.committed:
                    continue
                lost.append((li, v, w))
            lost.sort(key=lambda t: t[0])
            reader = self._an_ok_reader(k, bound_v) if lost else None
            for li, v, w in lost:
                if self.anomalies.hit("lost-write"):
                    self.anomalies.example(
                        "lost-write",
                        {
                            "key": k,
                            "value": v,
                            "index": li,
                            "offset": vo.offsets[li],
                            "max_read_index": bound,
                            "max_read_offset": vo.offsets[bound],
                            "writer": w.index,
                            "max_read": None if reader is None else reader.index,
                            "explanation": f"{w.describe()} committed {self._f(v)} to key "
                            f"{self._f(k)} at offset {vo.offsets[li]}, at or below offset "
                            f"{vo.offsets[bound]} (value {self._f(bound_v)}) which "
                            + ("an ok op" if reader is None else reader.describe())
                            + f" read, yet no ok op ever read {self._f(v)}",
                        },
                    )
        per_key: dict[Any, list[tuple[Any, QueueOp]]] = {}
        for rec in self.records:
            for k, _o, v in rec.sends:
                if rec.kind == OK and v not in self.ok_reads.get(k, ()):
                    per_key.setdefault(k, []).append((v, rec))
        for k, items in sorted(per_key.items(), key=lambda kv: str(kv[0])):
            self.anomalies.add(
                "unseen",
                {
                    "key": k,
                    "count": len(items),
                    "values": [v for v, _ in items[:32]],
                    "writers": [r.index for _, r in items[:32]],
                    "explanation": f"{len(items)} value(s) acknowledged to key {self._f(k)} "
                    f"were never read by an ok op by the end of the history, e.g. "
                    f"{self._f(items[0][0])} sent by {items[0][1].describe()}",
                },
                count=len(items),
            )

    @staticmethod
    def _f(x: Any) -> str:
        from isrlab.checkers.queue.cases import fmt

        return fmt(x)


def _check(cls: type[QueueAnalysis], ops: Ops, **opts: Any) -> tuple[dict[str, Any], Any]:
    analysis = cls(ops, **opts)
    analysis.run()
    orders = {
        k: (
            list(vo.log.items()),
            list(vo.voff.items()),
            vo.conflicts,
            {v: sorted(s) for v, s in vo.multi.items()},
            vo.offsets,
        )
        for k, vo in analysis.orders.items()
    }
    return _results(analysis, None, None, None), orders


# -- more mutations (besides test_queue_load's) ----------------------------------------------


def _polls(ops: Ops) -> list[tuple[int, list[Any]]]:
    """(completion index, pair list) of every non-empty poll result."""
    out = []
    for i in _completions(ops):
        for mop in ops[i]["value"] or ():
            if mop[0] == "poll" and len(mop) > 1:
                out.extend((i, pairs) for pairs in mop[1].values() if pairs)
    return out


def _sent(ops: Ops, typ: str | None = None) -> list[tuple[int, str, Any, Any]]:
    """(completion index, key, offset, value) of every send of a completion."""
    out = []
    for i in _completions(ops, ("send", "txn")):
        if typ is None or ops[i]["type"] == typ:
            for m in ops[i]["value"] or ():
                if m[0] == "send" and isinstance(m[2], list):
                    out.append((i, m[1], m[2][0], m[2][1]))
    return out


def m_read_failed_write(ops: Ops, rng: random.Random) -> None:
    """Some poll returns a value whose send failed."""
    sends, polls = _sent(ops), _polls(ops)
    if sends and polls:
        i, _k, o, v = rng.choice(sends)
        ops[i]["type"] = "fail"
        _j, pairs = rng.choice(polls)
        pairs.insert(rng.randrange(len(pairs) + 1), [o, v])


def m_read_own_write(ops: Ops, rng: random.Random) -> None:
    """A txn polls the value it sends itself."""
    for i in rng.sample(_completions(ops, ("txn",)), min(5, len(_completions(ops, ("txn",))))):
        mine = [m for m in ops[i]["value"] if m[0] == "send" and isinstance(m[2], list)]
        polls = [m for m in ops[i]["value"] if m[0] == "poll" and len(m) > 1 and m[1]]
        if mine and polls:
            m = rng.choice(mine)
            polls[0][1].setdefault(m[1], []).append(list(m[2]))
            return


def m_offset_gap(ops: Ops, rng: random.Random) -> None:
    """Every offset of a key from some point on moves up: non-consecutive offsets."""
    sends = _sent(ops, "ok")
    if not sends:
        return
    _i, key, cut, _v = rng.choice(sends)
    if cut is None:
        return
    step = rng.choice([1, 2, 5])
    for i in _completions(ops):
        for m in ops[i]["value"] or ():
            if m[0] == "send" and m[1] == key and isinstance(m[2], list):
                if m[2][0] is not None and m[2][0] >= cut:
                    m[2][0] += step
            elif m[0] == "poll" and len(m) > 1:
                for pair in m[1].get(key, ()):
                    if pair[0] is not None and pair[0] >= cut:
                        pair[0] += step


def m_read_gap(ops: Ops, rng: random.Random) -> None:
    """A long poll loses a record in its middle."""
    polls = [(i, p) for i, p in _polls(ops) if len(p) > 2]
    if polls:
        _i, pairs = rng.choice(polls)
        del pairs[rng.randrange(1, len(pairs) - 1)]


def m_swap_reads(ops: Ops, rng: random.Random) -> None:
    """Two records of a poll swap places."""
    polls = [(i, p) for i, p in _polls(ops) if len(p) > 1]
    if polls:
        _i, pairs = rng.choice(polls)
        a, b = rng.sample(range(len(pairs)), 2)
        pairs[a], pairs[b] = pairs[b], pairs[a]


def m_unread(ops: Ops, rng: random.Random) -> None:
    """Every read of some acknowledged value disappears (lost-write or unseen)."""
    sends = _sent(ops, "ok")
    if sends:
        _i, key, _o, v = rng.choice(sends)
        for op in ops:
            for m in (op["value"] or ()) if op["type"] != "invoke" else ():
                if m[0] == "poll" and len(m) > 1 and key in m[1]:
                    m[1][key] = [p for p in m[1][key] if p[1] != v]


def m_duplicate_value(ops: Ops, rng: random.Random) -> None:
    """A value sits at a second offset (or a second value at the same offset)."""
    polls = _polls(ops)
    if polls:
        _i, pairs = rng.choice(polls)
        o, v = rng.choice(pairs)
        if rng.random() < 0.5:
            pairs.append([(o or 0) + rng.choice([1, 7]), v])
        else:
            pairs.append([o, rng.choice([v, "other", 10**6])])


MORE = [
    m_read_failed_write,
    m_read_own_write,
    m_offset_gap,
    m_read_gap,
    m_swap_reads,
    m_unread,
    m_duplicate_value,
]


def mutated(seed: int, interleave: bool, rng: random.Random, times: tuple[int, int]) -> Ops:
    """A simulated history with `times` (a range) random mutations, mostly from MORE, drawn
    from `rng`; renumbered."""
    ops = copy.deepcopy(_history(seed, interleave))
    for _ in range(rng.randint(*times)):
        rng.choice(MORE if rng.random() < 0.6 else MUTATIONS)(ops, rng)
    return _renumber(ops)


@pytest.mark.parametrize("interleave", [False, True])
def test_simulated_histories_match_the_reference(interleave: bool) -> None:
    for seed in range(20):
        ops = _history(seed, interleave, seed % 3, keys=3)
        assert _check(QueueAnalysis, ops) == _check(ReferenceAnalysis, ops), seed


def test_mutated_histories_match_the_reference() -> None:
    found: set[str] = set()
    for seed in range(150):
        rng = random.Random(seed)
        ops = mutated(seed, seed % 2 == 1, rng, (1, 3))
        for opts in ({}, {"ww_deps": False, "max_examples": 2}):
            try:
                fast = _check(QueueAnalysis, ops, **opts)
            except Exception as e:
                with pytest.raises(type(e)):
                    _check(ReferenceAnalysis, ops, **opts)
                continue
            assert fast == _check(ReferenceAnalysis, ops, **opts), (seed, opts)
            found.update(fast[0]["anomaly_types"])
    # The mutations reached the checks whose shortcuts are tested here.
    assert {
        "lost-write",
        "unseen",
        "garbage-read",
        "G1a",
        "duplicate",
        "inconsistent-offsets",
        "int-poll-skip",
        "int-nonmonotonic-poll",
    } <= found, found
