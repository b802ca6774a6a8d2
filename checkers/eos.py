"""Exactly-once (consume-transform-produce) result check: eos-duplicate and eos-missing.

Transactional copiers read values from input keys and send them verbatim to output keys.
Given the version orders of a queue history (`checkers.queue.version_order`), this
module compares the multiset of values in the input logs with the multiset of records in
the output logs (every record any poll observed or any committed send was acked at):

- `eos-duplicate`: a value appears more often among output records than among input
  records (copied twice: the copier's transaction was not atomic with its consumption);
- `eos-missing`: an input value that never reached any output although the copiers have
  demonstrably moved past it: for each input key, the bound is the highest index of any
  of its values that did reach an output, and every input value at or below that bound
  must be there. After a final drain that copied everything, the bound is the whole log;
  a lagging copier is not a loss.

Values are compared by value alone (they are copied verbatim, without their key), so input
values should be unique across input keys; when they are not, multiplicities are compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from checkers.queue.version_order import VersionOrder

__all__ = ["check_eos"]


def _records(vo: VersionOrder) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for o in vo.offsets:
        for v in vo.values_at(o):
            out.append((o, v))
    return out


def check_eos(
    orders: Mapping[Any, VersionOrder],
    input_keys: Sequence[Any],
    output_keys: Sequence[Any],
) -> dict[str, list[dict[str, Any]]]:
    """Return {"eos-duplicate": [...], "eos-missing": [...]} (absent names: none found)."""
    inputs = {k: _records(orders[k]) for k in input_keys if k in orders}
    in_count: Counter[Any] = Counter(v for recs in inputs.values() for _o, v in recs)
    out_where: dict[Any, list[tuple[Any, int]]] = {}
    for k in output_keys:
        vo = orders.get(k)
        if vo is None:
            continue
        for o, v in _records(vo):
            out_where.setdefault(v, []).append((k, o))
    found: dict[str, list[dict[str, Any]]] = {}
    for v, where in out_where.items():
        n_in = in_count.get(v, 0)
        if n_in and len(where) > n_in:
            found.setdefault("eos-duplicate", []).append(
                {
                    "value": v,
                    "output": [[k, o] for k, o in where],
                    "input_count": n_in,
                    "explanation": f"input value {v!r} was read {n_in} time(s) from the "
                    f"input but appears {len(where)} times among committed output "
                    f"records {where[:8]}: it was copied more than once",
                }
            )
    for k, recs in inputs.items():
        vo = orders[k]
        bound = -1
        for o, v in recs:
            if v in out_where:
                bound = max(bound, vo.oidx[o])
        if bound < 0:
            continue
        bound_offset = vo.offsets[bound]
        for o, v in recs:
            if vo.oidx[o] <= bound and v not in out_where:
                found.setdefault("eos-missing", []).append(
                    {
                        "key": k,
                        "value": v,
                        "offset": o,
                        "explanation": f"input value {v!r} at offset {o} of key {k!r} "
                        "never appears in any output key, although copiers moved input "
                        f"up to offset {bound_offset} of that key into the output",
                    }
                )
    return found
