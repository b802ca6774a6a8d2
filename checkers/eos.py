"""Exactly-once (consume-transform-produce) result check: eos-duplicate and eos-missing.

Transactional copiers read values from input keys and send them verbatim to output keys.
Given the version orders of a queue history (`checkers.queue.version_order`), this
module compares the multiset of values in the input logs with the multiset of records in
the output logs (every record any poll observed or any committed send was acked at):

- `eos-duplicate`: a value appears more often among output records than among input
  records (copied twice: the copier's transaction was not atomic with its consumption);
- `eos-missing`: an input value that never reached any output although the copiers have
  demonstrably moved past it: for each input key, the bound is the highest offset a
  committed copier transaction consumed (it read the input key and sent to an output
  key), and every input value at or below that bound must be in some output. After a
  final copy of everything, the bound is the whole log; a lagging copier is not a loss.

Values are compared by value alone (they are copied verbatim, without their key), within
groups of input and output keys that copier transactions link (an op that read input
key i and sent to output key o links them); where values repeat across the input keys
of one group, multiplicities are compared.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from isrlab.checkers.queue.version_order import VersionOrder

__all__ = ["check_eos"]


def _records(vo: VersionOrder) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for o in vo.offsets:
        for v in vo.values_at(o):
            out.append((o, v))
    return out


def _check_group(
    orders: Mapping[Any, VersionOrder],
    input_keys: Sequence[Any],
    output_keys: Sequence[Any],
    consumed: Mapping[Any, int] | None,
    found: dict[str, list[dict[str, Any]]],
) -> None:
    inputs = {k: _records(orders[k]) for k in input_keys if k in orders}
    in_count: Counter[Any] = Counter(v for recs in inputs.values() for _o, v in recs)
    out_where: dict[Any, list[tuple[Any, int]]] = {}
    for k in output_keys:
        vo = orders.get(k)
        if vo is None:
            continue
        for o, v in _records(vo):
            out_where.setdefault(v, []).append((k, o))
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
        if consumed is not None:
            last = consumed.get(k)
            if last is not None:
                j = bisect_right(vo.offsets, last) - 1
                bound = j
        else:
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


def _groups(
    input_keys: Sequence[Any], output_keys: Sequence[Any], links: Iterable[tuple[Any, Any]]
) -> list[tuple[list[Any], list[Any]]]:
    """Split keys into groups connected by copier links; unlinked keys form one group."""
    parent: dict[Any, Any] = {}

    def find(x: Any) -> Any:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    ins, outs = set(input_keys), set(output_keys)
    linked: set[Any] = set()
    for i, o in links:
        if i in ins and o in outs:
            parent[find(("in", i))] = find(("out", o))
            linked.update((("in", i), ("out", o)))
    groups: dict[Any, tuple[list[Any], list[Any]]] = {}
    for side, keys in (("in", input_keys), ("out", output_keys)):
        for k in keys:
            node = (side, k)
            root = find(node) if node in linked else "unlinked"
            g = groups.setdefault(root, ([], []))
            (g[0] if side == "in" else g[1]).append(k)
    return list(groups.values())


def check_eos(
    orders: Mapping[Any, VersionOrder],
    input_keys: Sequence[Any],
    output_keys: Sequence[Any],
    consumed: Mapping[Any, int] | None = None,
    links: Iterable[tuple[Any, Any]] = (),
) -> dict[str, list[dict[str, Any]]]:
    """Return {"eos-duplicate": [...], "eos-missing": [...]} (absent names: none found).

    consumed maps an input key to the highest offset that committed copier transactions
    (ops that read the key and sent to an output key) consumed; without it the bound is
    the highest input index whose value reached an output. links are (input key, output
    key) pairs some copier transaction connected; values are only compared within a
    group of linked keys, so equal values in unrelated keys do not mask each other.
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for ins, outs in _groups(input_keys, output_keys, links):
        _check_group(orders, ins, outs, consumed, found)
    return found
