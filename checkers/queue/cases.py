"""Readable anomaly cases: one builder per anomaly of the queue checker.

Each builder counts a case and, while the example budget lasts, records a dict with the
ops involved (history indexes), the key, offsets or values, and an `explanation` saying
why it is an anomaly. `QueueAnalysis` inherits them; they only need `self.anomalies`.
"""

from __future__ import annotations

from typing import Any

from isrlab.checkers.queue.ops import QueueOp
from isrlab.checkers.queue.results import Anomalies
from isrlab.checkers.queue.version_order import VersionOrder

__all__ = ["CaseBuilders", "fmt"]


def fmt(v: Any) -> str:
    """A value or key as it appears in explanations (strings quoted)."""
    return repr(v) if isinstance(v, str) else str(v)


_fmt = fmt


class CaseBuilders:
    anomalies: Anomalies

    def _garbage(self, rec: QueueOp, k: Any, o: Any, v: Any) -> None:
        self.anomalies.add(
            "garbage-read",
            {
                "key": k,
                "value": v,
                "offset": o,
                "reader": rec.index,
                "explanation": f"{rec.describe()} read {_fmt(v)} at offset {o} of key "
                f"{_fmt(k)}, a value no op ever tried to send",
            },
        )

    def _precommitted(self, rec: QueueOp, k: Any, o: Any, v: Any) -> None:
        self.anomalies.add(
            "precommitted-read",
            {
                "key": k,
                "value": v,
                "offset": o,
                "op": rec.index,
                "explanation": f"{rec.describe()} sent {_fmt(v)} to key {_fmt(k)} and "
                f"read it back (offset {o}) inside the same transaction, before it "
                "committed",
            },
        )

    def _g1a(self, rec: QueueOp, w: QueueOp, k: Any, o: Any, v: Any) -> None:
        self.anomalies.add(
            "G1a",
            {
                "key": k,
                "value": v,
                "offset": o,
                "writer": w.index,
                "reader": rec.index,
                "explanation": f"{rec.describe()} read {_fmt(v)} at offset {o} of key "
                f"{_fmt(k)}, but the op that sent it, {w.describe()}, failed "
                "(aborted read)",
            },
        )

    def _skip(
        self,
        name: str,
        a: QueueOp,
        b: QueueOp,
        k: Any,
        v1: Any,
        v2: Any,
        i1: int,
        i2: int,
        vo: VersionOrder,
    ) -> None:
        def build() -> dict[str, Any]:
            skipped = [vo.log[vo.offsets[i]] for i in range(i1 + 1, min(i2, i1 + 33))]
            what = {
                "int-poll-skip": f"within {b.describe()}, consecutive reads",
                "int-send-skip": f"within {b.describe()}, consecutive sends",
                "poll-skip": f"{a.describe()} then {b.describe()}, the next poll",
            }[name]
            return {
                "key": k,
                "values": [v1, v2],
                "offsets": [vo.offsets[i1], vo.offsets[i2]],
                "delta": i2 - i1,
                "skipped": skipped,
                "ops": [a.index, b.index] if a is not b else [b.index],
                "explanation": f"{what} of key {_fmt(k)} went from {_fmt(v1)} (offset "
                f"{vo.offsets[i1]}) to {_fmt(v2)} (offset {vo.offsets[i2]}), skipping "
                f"{i2 - i1 - 1} record(s) known to exist, e.g. {skipped[:5]}",
            }

        if self.anomalies.hit(name):
            self.anomalies.example(name, build())

    def _nonmono(
        self, name: str, a: QueueOp, b: QueueOp, k: Any, v1: Any, v2: Any, delta: int
    ) -> None:
        def build() -> dict[str, Any]:
            what = {
                "int-nonmonotonic-poll": f"within {b.describe()}, a read of key {_fmt(k)}",
                "int-nonmonotonic-send": f"within {b.describe()}, a send to key {_fmt(k)}",
                "nonmonotonic-poll": f"{b.describe()} started reading key {_fmt(k)}",
                "nonmonotonic-send": f"{b.describe()} sent to key {_fmt(k)}",
            }[name]
            ref = "the previous one" if a is b else a.describe()
            return {
                "key": k,
                "values": [v1, v2],
                "delta": delta,
                "ops": [a.index, b.index] if a is not b else [b.index],
                "explanation": f"{what} at {_fmt(v2)}, which is not after {_fmt(v1)} of "
                f"{ref} (index delta {delta}): the log order went backwards or repeated",
            }

        if self.anomalies.hit(name):
            self.anomalies.example(name, build())

    def _realtime_send(self, a: QueueOp, ao: int, b: QueueOp, k: Any, bo: int, bv: Any) -> None:
        self.anomalies.add(
            "realtime-send-order",
            {
                "key": k,
                "ops": [a.index, b.index],
                "offsets": [ao, bo],
                "explanation": f"{a.describe()} had a send to key {_fmt(k)} acknowledged at "
                f"offset {ao} and completed before {b.describe()} was invoked, yet the "
                f"latter's send of {_fmt(bv)} landed earlier, at offset {bo}",
            },
        )

    def _hw_regression(self, a: QueueOp, ah: int, b: QueueOp, k: Any, bh: int) -> None:
        self.anomalies.add(
            "hw-regression",
            {
                "key": k,
                "process": b.process,
                "ops": [a.index, b.index],
                "high_watermarks": [ah, bh],
                "explanation": f"process {b.process} saw the high watermark of key {_fmt(k)} "
                f"at {ah} in {a.describe()}, then at {bh} in {b.describe()}: it went down",
            },
        )

    def _hw_regression_rt(self, a: QueueOp, ah: int, b: QueueOp, k: Any, bh: int) -> None:
        self.anomalies.add(
            "hw-regression-realtime",
            {
                "key": k,
                "ops": [a.index, b.index],
                "high_watermarks": [ah, bh],
                "explanation": f"{a.describe()} reported high watermark {ah} for key "
                f"{_fmt(k)} and completed before {b.describe()} was invoked, which reported "
                f"{bh}: the cluster's high watermark went backwards in real time",
            },
        )

    def _inconsistent(
        self, k: Any, o: int, index: int, values: list[Any], writers: list[int]
    ) -> dict[str, Any]:
        return {
            "key": k,
            "offset": o,
            "index": index,
            "values": values,
            "writers": writers,
            "explanation": f"offset {o} of key {_fmt(k)} holds "
            f"{len(values)} different values {values}: clients were told "
            "different records live at the same position of the log",
        }

    def _duplicate_case(
        self, k: Any, v: Any, offsets: list[int], w: QueueOp | None
    ) -> dict[str, Any]:
        return {
            "key": k,
            "value": v,
            "offsets": offsets,
            "count": len(offsets),
            "writer": None if w is None else w.index,
            "explanation": f"value {_fmt(v)} of key {_fmt(k)} appears at "
            f"{len(offsets)} offsets {offsets}"
            + ("" if w is None else f"; it was sent once, by {w.describe()}"),
        }

    def _idem_case(self, case: dict[str, Any]) -> dict[str, Any]:
        return {
            **case,
            "explanation": case["explanation"] + " from an idempotent producer session, which "
            "must de-duplicate retried batches",
        }

    def _lost_write(
        self,
        k: Any,
        v: Any,
        li: int,
        offset: int,
        bound: int,
        bound_offset: int,
        bound_v: Any,
        w: QueueOp,
        reader: QueueOp | None,
    ) -> dict[str, Any]:
        return {
            "key": k,
            "value": v,
            "index": li,
            "offset": offset,
            "max_read_index": bound,
            "max_read_offset": bound_offset,
            "writer": w.index,
            "max_read": None if reader is None else reader.index,
            "explanation": f"{w.describe()} committed {_fmt(v)} to key "
            f"{_fmt(k)} at offset {offset}, at or below offset "
            f"{bound_offset} (value {_fmt(bound_v)}) which "
            + ("an ok op" if reader is None else reader.describe())
            + f" read, yet no ok op ever read {_fmt(v)}",
        }

    def _unseen(self, k: Any, count: int, items: list[tuple[Any, QueueOp]]) -> None:
        """`count` acknowledged values of `k` never read by an ok op; `items`: the first
        32 (value, writer)."""
        self.anomalies.add(
            "unseen",
            {
                "key": k,
                "count": count,
                "values": [v for v, _ in items[:32]],
                "writers": [r.index for _, r in items[:32]],
                "explanation": f"{count} value(s) acknowledged to key {_fmt(k)} "
                f"were never read by an ok op by the end of the history, e.g. "
                f"{_fmt(items[0][0])} sent by {items[0][1].describe()}",
            },
            count=count,
        )

    def _truncation_replaced(
        self, a: QueueOp, k: Any, o: int, v: Any, b: QueueOp, read: Any
    ) -> None:
        self._truncation(a, k, o, v, b, f"returned {_fmt(read)} there")

    def _truncation_gap(
        self, a: QueueOp, k: Any, mo: int, v: Any, b: QueueOp, prev_o: int, o: int
    ) -> None:
        self._truncation(a, k, mo, v, b, f"returned offsets {prev_o} and {o} but not {mo}")

    def _truncation(self, a: QueueOp, k: Any, o: int, v: Any, b: QueueOp, what: str) -> None:
        self.anomalies.add(
            "committed-truncation",
            {
                "key": k,
                "offset": o,
                "value": v,
                "ops": [a.index, b.index],
                "explanation": f"{a.describe()} saw {_fmt(v)} at offset {o} of key "
                f"{_fmt(k)} with a high watermark above {o} (committed); "
                f"{b.describe()}, invoked after that, {what}: committed data was "
                "replaced or vanished",
            },
        )
