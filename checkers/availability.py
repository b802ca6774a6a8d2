"""Availability of a run: how much work the clients got done during and after each fault.

A safety checker says whether what happened was allowed; it says nothing about whether
anything happened. This module reads the same history and answers the liveness questions a
Jepsen report asks (Bufstream's Jepsen analysis reports stuck producers and consumers as
liveness bugs):

- the *baseline*: ok completions per second before the first fault;
- per fault window (nemesis `start-X` .. `stop-X`, an instant fault from its invocation to its
  completion): the ok rate during the window, relative to the baseline;
- after each heal (to the next fault, or to the end): the ok rate relative to the baseline,
  and the time from the heal until the ok rate (in bins of `bin_s`) is back at or above half the
  baseline (`None`: it never came back);
- stuck processes: a process with no ok completion for `stuck_s` seconds or more (from its
  first invocation, between two oks, or to its last completion, or to the end of the history
  when an op is still open) while the other processes completed at least one ok op per second
  of that stretch.
- stuck consumers (queue histories; Bufstream's "stuck consumer"): a process whose polls keep
  completing ok and empty (at least `min_polls` of them, nothing for any key) for `stuck_s`
  seconds or more while a key it is assigned has a record beyond its position known to be
  readable. A record at offset o of
  key k is known readable from the first ok poll (by any process) that returned it, or from the
  ok send that acknowledged it when some poll later read k at o or beyond (a lost write is a
  safety anomaly, not a stuck consumer). The process's assignment and position are followed
  through its ok `assign` ops (added keys start from the beginning, as the harness's client
  assigns them), `subscribe` ops and recorded rebalances (assigned keys start at the
  `committed` offset when recorded, else the beginning), and its own polls (a failed poll or
  transaction that read records ends a stretch too: the consumer was fetching, and its client
  seeks back to where the ok reads left it). Each stretch says
  whether it lay wholly inside fault windows (a consumer cut off from a leader is expected to
  starve until the heal; one still starved after it is a liveness bug).

What an op is (`is_client_completion`): the completion of a client op; nemesis ops and the
harness's `crash` pseudo-op (a client torn down) are not ops. `op_counts` counts them; the
report's header and the queue checker's `stats` count the same thing.

`availability(ops)` returns a JSON-ready dict (results.json's optional `availability` field,
docs/history-format.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from itertools import accumulate, pairwise
from typing import Any

from isrlab.checkers.queue.codec import polls_in, sends_in

__all__ = [
    "NOT_OPS",
    "availability",
    "fault_windows",
    "is_client_completion",
    "nemesis_ops",
    "op_counts",
]

NS = 1e9
#: Client `f`s that are not operations on the system under test.
NOT_OPS = frozenset({"crash"})


def is_client_completion(op: dict[str, Any]) -> bool:
    """True for the completion (ok / fail / info) of a client op."""
    return (
        op.get("process") != "nemesis"
        and op.get("type") in ("ok", "fail", "info")
        and op.get("f") not in NOT_OPS
    )


def op_counts(ops: Iterable[dict[str, Any]]) -> dict[str, int]:
    """{"ops", "ok", "fail", "info"}: completions of client ops (see the module doc)."""
    counts = {"ops": 0, "ok": 0, "fail": 0, "info": 0}
    for op in ops:
        if is_client_completion(op):
            counts["ops"] += 1
            counts[op["type"]] += 1
    return counts


def nemesis_ops(ops: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per nemesis op: {"f", "start_s", "end_s", "value"}.

    The nemesis records both the invocation and the completion of an op as `info`, one op at a
    time: consecutive nemesis entries with the same `f` are paired; the value is the
    completion's (what was done) unless it is null, then the invocation's (what was asked)."""
    out: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for op in ops:
        if op.get("process") != "nemesis" or op.get("type") not in ("info", "invoke"):
            continue
        t = op["time"] / NS
        f = str(op.get("f", ""))
        if pending is not None and pending["f"] == f:
            if op.get("value") is not None:
                pending["value"] = op.get("value")
            pending["end_s"] = t
            out.append(pending)
            pending = None
            continue
        if pending is not None:  # an invocation never completed: keep it as an instant
            out.append(pending)
        pending = {"f": f, "start_s": t, "end_s": t, "value": op.get("value")}
    if pending is not None:
        out.append(pending)
    return out


def fault_windows(ops: Sequence[dict[str, Any]], end_s: float) -> list[tuple[str, float, float]]:
    """(fault kind, start s, heal s), sorted by start: `start-X` (its invocation) to the
    completion of `stop-X` or `heal-all`; a fault still active at the end runs to `end_s`.
    Other nemesis ops (`kill`...) are faults from their invocation to their completion."""
    open_: dict[str, float] = {}
    out: list[tuple[str, float, float]] = []
    for n in nemesis_ops(ops):
        f = n["f"]
        kind = f.split("-", 1)[1] if f.startswith(("start-", "stop-")) else f
        if f == "heal-all":
            out.extend((k, start, n["end_s"]) for k, start in open_.items())
            open_.clear()
        elif f.startswith("start-"):
            open_.setdefault(kind, n["start_s"])
        elif f.startswith("stop-"):
            if kind in open_:
                out.append((kind, open_.pop(kind), n["end_s"]))
        else:
            out.append((f, n["start_s"], n["end_s"]))
    out.extend((kind, start, end_s) for kind, start in open_.items())
    return sorted(out, key=lambda x: (x[1], x[2], x[0]))


def _rate(times: list[float], a: float, b: float) -> float | None:
    if b - a <= 0:
        return None
    return (bisect.bisect_left(times, b) - bisect.bisect_left(times, a)) / (b - a)


def _rel(rate: float | None, base: float | None) -> float | None:
    if rate is None or not base:
        return None
    return round(rate / base, 4)


def _recovery(
    times: list[float], heal: float, until: float, base: float, bin_s: float
) -> float | None:
    """Seconds from `heal` to the start of the first bin whose ok rate is >= base / 2."""
    t = heal
    while t + bin_s <= until + 1e-9:
        n = bisect.bisect_left(times, t + bin_s) - bisect.bisect_left(times, t)
        if n / bin_s >= base / 2:
            return round(t - heal, 3)
        t += bin_s
    return None


def _stuck(
    ops: Sequence[dict[str, Any]], ok_times: list[float], end_s: float, stuck_s: float
) -> list[dict[str, Any]]:
    first_invoke: dict[Any, float] = {}
    oks: dict[Any, list[float]] = {}
    last_event: dict[Any, float] = {}
    open_: dict[Any, bool] = {}
    for op in ops:
        p = op.get("process")
        if p == "nemesis" or op.get("f") in NOT_OPS:
            continue
        t = op["time"] / NS
        if op.get("type") == "invoke":
            first_invoke.setdefault(p, t)
            open_[p] = True
        else:
            open_[p] = False
            if op.get("type") == "ok":
                oks.setdefault(p, []).append(t)
        last_event[p] = t
    out = []
    for p, start in first_invoke.items():
        life_end = end_s if open_.get(p) else last_event[p]
        marks = [start, *oks.get(p, []), life_end]
        own = oks.get(p, [])
        for a, b in pairwise(marks):
            if b - a < stuck_s:
                continue
            others = bisect.bisect_left(ok_times, b) - bisect.bisect_left(ok_times, a)
            others -= bisect.bisect_left(own, b) - bisect.bisect_left(own, a)
            if others >= b - a:
                out.append(
                    {
                        "process": p,
                        "from_s": round(a, 3),
                        "to_s": round(b, 3),
                        "seconds": round(b - a, 3),
                        "others_ok": others,
                        "open_at_end": bool(open_.get(p)) and b == end_s,
                    }
                )
    return sorted(out, key=lambda s: (-s["seconds"], str(s["process"])))


def _reads(op: dict[str, Any]) -> Iterable[tuple[str, list[Any]]]:
    """(key, records) of every poll micro-op of a poll or txn completion."""
    if op.get("f") in ("poll", "txn"):
        for _, reads in polls_in(op.get("value")):
            yield from reads.items()


def _offsets(records: list[Any]) -> list[int]:
    return [r[0] for r in records if isinstance(r, list) and r and isinstance(r[0], int)]


def _sent(op: dict[str, Any]) -> Iterable[tuple[str, int]]:
    """(key, offset) of the acknowledged sends of a send or txn completion."""
    if op.get("f") in ("send", "txn"):
        for _, k, offset, _ in sends_in(op.get("value")):
            if isinstance(offset, int):
                yield k, offset


class _Readable:
    """When each offset of a key was first known readable (the module doc's rule)."""

    def __init__(self, ops: Sequence[dict[str, Any]]) -> None:
        first: dict[str, dict[int, float]] = {}
        max_read: dict[str, int] = {}
        acked: list[tuple[str, int, float]] = []
        for op in ops:
            if op.get("type") != "ok" or op.get("process") == "nemesis":
                continue
            t = op["time"] / NS
            for k, records in _reads(op):
                for o in _offsets(records):
                    seen = first.setdefault(k, {})
                    if o not in seen:
                        seen[o] = t
                    if o > max_read.get(k, -1):
                        max_read[k] = o
            acked.extend((k, o, t) for k, o in _sent(op))
        for k, o, t in acked:
            if o <= max_read.get(k, -1):
                seen = first.setdefault(k, {})
                seen[o] = min(seen.get(o, t), t)
        # Per key: offsets ascending with the earliest time any offset at or above each was
        # readable (a suffix minimum), so "the first time something past position p was
        # readable" is one bisection; and times ascending with the highest offset readable by
        # then (a prefix maximum).
        self._offs: dict[str, list[int]] = {}
        self._since: dict[str, list[float]] = {}
        self._times: dict[str, list[float]] = {}
        self._upto: dict[str, list[int]] = {}
        for k, seen in first.items():
            offs = sorted(seen)
            since = [seen[o] for o in offs]
            for i in range(len(since) - 2, -1, -1):
                since[i] = min(since[i], since[i + 1])
            self._offs[k], self._since[k] = offs, since
            by_time = sorted((t, o) for o, t in seen.items())
            upto = list(accumulate((o for _, o in by_time), max))
            self._times[k], self._upto[k] = [t for t, _ in by_time], upto

    def past(self, key: str, position: int, now: float) -> int | None:
        """The highest offset of `key` known readable at `now` if some record past `position`
        (the last offset read) was readable by then, else None."""
        offs = self._offs.get(key)
        if not offs:
            return None
        i = bisect.bisect_right(offs, position)
        if i == len(offs) or self._since[key][i] > now:
            return None
        return self._upto[key][bisect.bisect_right(self._times[key], now) - 1]


def _stuck_consumers(
    ops: Sequence[dict[str, Any]],
    windows: Sequence[tuple[str, float, float]],
    stuck_s: float,
    min_polls: int = 3,
) -> list[dict[str, Any]]:
    readable = _Readable(ops)
    # per process: key -> last offset read (-1: from the beginning); None: assignment unknown
    pos: dict[Any, dict[str, int] | None] = {}
    # per process, an open stretch of empty polls while behind:
    # {"from", "to", "polls", "keys": {key: [next offset to read, highest readable]}}
    open_: dict[Any, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []

    def close(p: Any) -> None:
        st = open_.pop(p, None)
        if st is None or st["to"] - st["from"] < stuck_s or st["polls"] < min_polls:
            return
        a, b = st["from"], st["to"]
        out.append(
            {
                "process": p,
                "from_s": round(a, 3),
                "to_s": round(b, 3),
                "seconds": round(b - a, 3),
                "empty_polls": st["polls"],
                "behind": {
                    k: {"position": v[0], "readable_up_to": v[1]}
                    for k, v in sorted(st["keys"].items())
                },
                "in_fault": any(w[1] <= a and b <= w[2] for w in windows),
            }
        )

    for op in ops:
        p = op.get("process")
        typ = op.get("type")
        if p == "nemesis" or typ == "invoke" or op.get("f") in NOT_OPS:
            continue
        t = op["time"] / NS
        f = op.get("f")
        mine = pos.get(p, {})
        # The op first (it replaces the assignment), then the rebalances during it.
        if f in ("assign", "subscribe"):
            if typ != "ok" or not isinstance(op.get("value"), list):
                mine = None  # half done or unknown: say nothing until the next assignment
            elif f == "assign":
                keep = mine or {}
                mine = {k: keep.get(k, -1) for k in op["value"] if isinstance(k, str)}
            else:
                mine = {}
            close(p)
        reb = op.get("rebalance")
        if isinstance(reb, dict) and mine is not None:
            for k in reb.get("revoked") or []:
                mine.pop(k, None)
            committed = reb.get("committed") or {}
            for k in reb.get("assigned") or []:
                c = committed.get(k)
                mine[k] = c - 1 if isinstance(c, int) and c >= 0 else -1
            close(p)  # a new assignment: a new stretch
        pos[p] = mine
        if typ == "info":
            close(p)  # the process is gone
            continue
        if typ != "ok" and f in ("poll", "txn") and any(dict(_reads(op)).values()):
            # a failed op that read records (an aborted transaction): the consumer was
            # fetching; its client seeks back to the op's first offsets, where the position
            # followed here already is (only ok reads move it)
            close(p)
            continue
        if typ != "ok" or mine is None or f not in ("poll", "txn"):
            continue
        polls = [m for m in op.get("value") or [] if isinstance(m, list) and m[:1] == ["poll"]]
        if not polls:
            continue  # a txn without a poll micro-op says nothing of the consumer
        got = dict(_reads(op))
        if any(got.values()):  # progress (bare values without offsets too)
            for k, records in got.items():
                if k in mine:
                    mine[k] = max(mine[k], *_offsets(records), -1)
            close(p)
            continue
        behind = {}
        for k, last in mine.items():
            upto = readable.past(k, last, t)
            if upto is not None:
                behind[k] = [last + 1, upto]
        if not behind:
            close(p)  # caught up: an empty poll is what it should get
            continue
        st = open_.get(p)
        if st is None:  # from the first empty poll after a record was readable
            open_[p] = st = {"from": t, "to": t, "polls": 0, "keys": {}}
        st["to"] = t
        st["polls"] += 1
        st["keys"].update(behind)
    for p in list(open_):
        close(p)
    return sorted(out, key=lambda s: (-s["seconds"], str(s["process"])))


def availability(
    ops: Sequence[dict[str, Any]],
    *,
    stuck_s: float = 10.0,
    bin_s: float | None = None,
    max_stuck: int = 50,
) -> dict[str, Any]:
    """The module doc's figures for one history, as a JSON-ready dict."""
    end_s = max((op["time"] for op in ops), default=0) / NS
    ok_times = sorted(
        op["time"] / NS for op in ops if is_client_completion(op) and op["type"] == "ok"
    )
    first = min(
        (
            op["time"] / NS
            for op in ops
            if op.get("process") != "nemesis" and op.get("type") == "invoke"
        ),
        default=0.0,
    )
    windows = fault_windows(ops, end_s)
    if bin_s is None:
        bin_s = min(1.0, max(end_s / 200, 0.1))
    base_end = windows[0][1] if windows else end_s
    baseline = _rate(ok_times, first, base_end)
    out_windows: list[dict[str, Any]] = []
    for i, (kind, a, b) in enumerate(windows):
        during = _rate(ok_times, a, b)
        # After the heal: to the start of the next fault that starts later, or the end.
        nxt = min((w[1] for w in windows[i + 1 :] if w[1] >= b), default=end_s)
        overlapped = any(w[1] < b < w[2] for j, w in enumerate(windows) if j != i)
        after: dict[str, Any] | None = None
        if b < end_s:
            rate = _rate(ok_times, b, nxt)
            after = {
                "until_s": round(nxt, 3),
                "ok_per_s": None if rate is None else round(rate, 3),
                "relative": _rel(rate, baseline),
                "recovery_s": (_recovery(ok_times, b, nxt, baseline, bin_s) if baseline else None),
                "other_fault_active": overlapped,
            }
        out_windows.append(
            {
                "fault": kind,
                "start_s": round(a, 3),
                "end_s": round(b, 3),
                "ok_per_s": None if during is None else round(during, 3),
                "relative": _rel(during, baseline),
                "after_heal": after,
            }
        )
    stuck = _stuck(ops, ok_times, end_s, stuck_s)
    consumers = _stuck_consumers(ops, windows, stuck_s)
    return {
        "baseline_ok_per_s": None if baseline is None else round(baseline, 3),
        "baseline_s": [round(first, 3), round(base_end, 3)],
        "bin_s": round(bin_s, 3),
        "stuck_s": stuck_s,
        "windows": out_windows,
        "stuck": stuck[:max_stuck],
        "stuck_count": len(stuck),
        "stuck_consumers": consumers[:max_stuck],
        "stuck_consumer_count": len(consumers),
    }
