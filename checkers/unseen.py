"""What became of every acknowledged write no client read: the reconciliation of `lost-write` and
`unseen` with what the replicas hold.

Jepsen cannot tell a lost write from a very late one (its `unseen` is a heuristic). isrlab owns
the broker: after a run the harness collects from every node what its replicas of the test's
topics hold (`<node>/replica-records.jsonl`, `isrlab-broker replica-records`: offset, leader
epoch of the batch, producer id, value) and its truncation journal (`<node>/truncations.jsonl`:
every log truncation with the records it cut; broker/log/inventory.py). Each acknowledged write
(a send in an `ok` op) that no `ok` op read is put in one class:

- ``not-yet-read``: a replica holds it at an offset past everything any `ok` poll read of its
  key: the data is there, the clients' final reads stopped short of it.
- ``present-not-served``: a replica holds it at or below an offset that `ok` polls read past:
  it is on disk, yet the reads went by it (a replica holding what the leader served without
  it: a diverged log).
- ``truncated``: no replica holds it, and a truncation journal shows it cut: which node, at
  which offset range, under which leader epoch (the epoch the truncating replica followed), and
  by what (`kind`: ``truncate`` / ``truncate-fully``, a replica following its leader;
  ``power-loss``, the `power` nemesis cutting files back to what reached disk).
- ``never-reached-a-replica``: no replica holds it and no journal has it: it never reached a
  log that kept it (acknowledged by a leader that lost it before writing it, or with acks=0
  never written at all).

Values a client read (or was acknowledged) at an offset that the checker later found replaced
or gone are classed from the same evidence, at that offset: each value a `committed-truncation`
case names (the committed value that was replaced or vanished) and each value of an
`inconsistent-offsets` case (two or more values at one offset of a key). What each replica
holds at that offset now (``at_offset``) and which journal entries cut that offset
(``truncations``, each with the ``value`` it cut) put it in one class of OFFSET_CLASSES:

- ``kept``: every replica holding that offset holds the value there (another value a client
  was served there came from a log that no longer has it: see ``truncations``);
- ``diverged``: replicas disagree at that offset: some hold the value there, some another;
- ``replaced``: no replica holds the value there, some hold another value there, and a
  truncation journal cut the value at that offset (node, leader epoch, range, kind);
- ``truncated``: no replica holds anything at that offset, and a journal cut the value there;
- ``vanished``: no replica holds the value there and no journal cut it there: the log that
  had it lost it by other means (a data directory put back from an old copy, a segment lost
  without a journal entry, retention), or the node that cut it was not collected.

A `lost-write` is a value no `ok` op read (checkers/queue/analysis.py), so it keeps the
classes of unread writes above.

Values are compared as the text the harness writes (decimal integers). A value sent to a key is
looked for in that key's partition only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from isrlab.checkers.queue.analysis import offset_cases
from isrlab.checkers.queue.codec import polls_in, sends_in

__all__ = [
    "CLASSES",
    "OFFSET_ANOMALIES",
    "OFFSET_CLASSES",
    "annotate",
    "classify",
    "classify_offset",
    "classify_offsets",
    "load_replicas",
]

CLASSES = ("not-yet-read", "present-not-served", "truncated", "never-reached-a-replica")
#: the classes of a value an anomaly names at an offset (`classify_offsets`)
OFFSET_CLASSES = ("kept", "diverged", "replaced", "truncated", "vanished")
#: the anomalies whose values are classed at their offset
OFFSET_ANOMALIES = ("committed-truncation", "inconsistent-offsets")
#: at most this many classified writes are listed in results.json (the counts cover all)
MAX_LISTED = 200


def _sends(op: Mapping[str, Any]) -> Iterable[tuple[str, Any, int | None]]:
    if op.get("f") in ("send", "txn"):
        for _, k, offset, v in sends_in(op.get("value")):
            yield k, v, offset if isinstance(offset, int) else None


def _reads(op: Mapping[str, Any]) -> Iterable[tuple[str, Any, int | None]]:
    """Every record a poll of the op returned: ``[offset, v]`` pairs, and bare values (no
    offset) as Jepsen-format histories may hold them."""
    if op.get("f") not in ("poll", "txn"):
        return
    for _, reads in polls_in(op.get("value")):
        for k, records in reads.items():
            for r in records or []:
                if isinstance(r, list) and len(r) == 2:
                    yield k, r[1], r[0] if isinstance(r[0], int) else None
                else:
                    yield k, r, None


class Replicas:
    """What the nodes' replicas hold and cut, by key and value text."""

    def __init__(self) -> None:
        #: (key, value text) -> [(node, offset, leader epoch)]
        self.held: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
        #: (key, value text) -> [truncation facts]
        self.cut: dict[tuple[str, str], list[dict[str, Any]]] = {}
        #: (key, offset) -> [(node, value text, leader epoch)]: what each replica holds there
        self.at: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
        #: (key, offset) -> [truncation facts, with the `value` text cut there]
        self.cut_at: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.nodes: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.nodes)


def load_replicas(run_dir: Path) -> Replicas:
    """Read every ``<node>/replica-records.jsonl`` and ``<node>/truncations.jsonl`` of a run."""
    reps = Replicas()
    for node_dir in sorted(p for p in Path(run_dir).iterdir() if p.is_dir()):
        records = node_dir / "replica-records.jsonl"
        if not records.exists():
            continue
        node = node_dir.name
        reps.nodes.append(node)
        for line in records.read_text().splitlines():
            try:
                row = json.loads(line)
                key = f"{row['topic']}/{row['partition']}"
                if "offset" in row:
                    offset, epoch = int(row["offset"]), int(row["leader_epoch"])
                    reps.held.setdefault((key, str(row["value"])), []).append((node, offset, epoch))
                    reps.at.setdefault((key, offset), []).append((node, str(row["value"]), epoch))
            except (ValueError, KeyError, TypeError):
                continue
        journal = node_dir / "truncations.jsonl"
        if journal.exists():
            for line in journal.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    key = f"{entry['topic']}/{entry['partition']}"
                    fact = {
                        "node": node,
                        "to_offset": entry["to_offset"],
                        "log_end_offset": entry["log_end_offset"],
                        "leader_epoch": entry["leader_epoch"],
                        "kind": entry.get("kind"),
                        "time_ms": entry.get("time_ms"),
                    }
                    for offset, epoch, _pid, value in entry["records"]:
                        cut = dict(fact, offset=offset, written_in_epoch=epoch)
                        reps.cut.setdefault((key, str(value)), []).append(cut)
                        if isinstance(offset, int):
                            at = dict(cut, value=str(value))
                            reps.cut_at.setdefault((key, offset), []).append(at)
                except (ValueError, KeyError, TypeError):
                    continue
    return reps


class _Seen:
    """One pass over the history: what `ok` ops read (values, and the highest offset per
    key) and the offset each acknowledged write was given."""

    def __init__(self, ops: Sequence[Mapping[str, Any]]) -> None:
        self.read: set[tuple[str, Any]] = set()
        self.max_read: dict[str, int] = {}
        self.acked: dict[tuple[str, Any], int | None] = {}
        for op in ops:
            if op.get("type") != "ok" or op.get("process") == "nemesis":
                continue
            for k, v, o in _reads(op):
                self.read.add((k, v))
                if o is not None and o > self.max_read.get(k, -1):
                    self.max_read[k] = o
            for k, v, o in _sends(op):
                self.acked.setdefault((k, v), o)


def classify(
    ops: Sequence[Mapping[str, Any]], replicas: Replicas, seen: _Seen | None = None
) -> list[dict[str, Any]]:
    """One entry per acknowledged write no `ok` op read: key, value, acknowledged offset,
    class, and where it is (``held``: [[node, offset, leader epoch]]) or what cut it
    (``truncations``)."""
    seen = seen or _Seen(ops)
    read, max_read, acked = seen.read, seen.max_read, seen.acked
    out = []
    for (k, v), offset in acked.items():
        if (k, v) in read:
            continue
        text = str(v)
        held = replicas.held.get((k, text), [])
        entry: dict[str, Any] = {"key": k, "value": v, "offset": offset}
        if held:
            past = all(o > max_read.get(k, -1) for _, o, _ in held)
            entry["class"] = "not-yet-read" if past else "present-not-served"
            entry["held"] = [list(h) for h in sorted(held)]
        elif (k, text) in replicas.cut:
            entry["class"] = "truncated"
            entry["truncations"] = replicas.cut[(k, text)]
        else:
            entry["class"] = "never-reached-a-replica"
        out.append(entry)
    out.sort(key=lambda e: (str(e["key"]), e["offset"] if e["offset"] is not None else -1))
    return out


def classify_offset(replicas: Replicas, key: str, offset: int, value: Any) -> dict[str, Any]:
    """The class of `value` at `offset` of `key` (OFFSET_CLASSES, see the module doc) with its
    facts: ``at_offset`` ([[node, value text, leader epoch]]: what each replica holds at that
    offset now), ``truncations`` (the journal entries that cut that offset, each with the
    ``value`` text it cut), ``held_elsewhere`` ([[node, offset, leader epoch]]: replicas holding
    the value at another offset); each only when not empty."""
    text = str(value)
    here = sorted(replicas.at.get((key, offset), []))
    cuts = replicas.cut_at.get((key, offset), [])
    holds = any(v == text for _, v, _ in here)
    others = any(v != text for _, v, _ in here)
    if holds:
        cls = "diverged" if others else "kept"
    elif any(c["value"] == text for c in cuts):
        cls = "replaced" if others else "truncated"
    else:
        cls = "vanished"
    entry: dict[str, Any] = {"key": key, "offset": offset, "value": value, "class": cls}
    if here:
        entry["at_offset"] = [list(h) for h in here]
    if cuts:
        entry["truncations"] = cuts
    elsewhere = sorted(h for h in replicas.held.get((key, text), []) if h[1] != offset)
    if elsewhere:
        entry["held_elsewhere"] = [list(h) for h in elsewhere]
    return entry


def classify_offsets(
    ops: Sequence[Mapping[str, Any]], replicas: Replicas
) -> dict[tuple[Any, int, str], dict[str, Any]]:
    """Every (key, offset, value) the history's `committed-truncation` and
    `inconsistent-offsets` cases name (all cases, not only a check's examples), classed at
    its offset (`classify_offset`), each with ``anomalies``: the names of those that name it.
    Keyed by (key, offset, value text)."""
    out: dict[tuple[Any, int, str], dict[str, Any]] = {}
    for name, cases in offset_cases(cast(Sequence[dict[str, Any]], ops)).items():
        for k, o, v in cases:
            entry = out.get((k, o, str(v)))
            if entry is None:
                entry = out[(k, o, str(v))] = classify_offset(replicas, k, o, v)
                entry["anomalies"] = []
            entry["anomalies"].append(name)
    for entry in out.values():
        entry["anomalies"].sort()
    return out


def _ordered(counts: Counter[str]) -> dict[str, int]:
    return {c: counts[c] for c in OFFSET_CLASSES if counts[c]}


def _annotate_offsets(
    results: dict[str, Any], ops: Sequence[Mapping[str, Any]], replicas: Replicas
) -> None:
    """`annotate`'s part for OFFSET_ANOMALIES: ``contested_values`` and, under each of those
    anomalies, ``classes`` (over every value its cases name) and the examples' classes."""
    anomalies = results.get("anomalies") or {}
    present = [n for n in OFFSET_ANOMALIES if isinstance(anomalies.get(n), dict)]
    if not present:
        return
    values = classify_offsets(ops, replicas)
    listed = sorted(values.values(), key=lambda e: (str(e["key"]), e["offset"], str(e["value"])))
    results["contested_values"] = {
        "nodes": replicas.nodes,
        "classes": _ordered(Counter(e["class"] for e in listed)),
        "count": len(listed),
        "values": listed[:MAX_LISTED],
    }
    facts = ("at_offset", "truncations", "held_elsewhere")
    for name in present:
        anomaly = anomalies[name]
        anomaly["classes"] = _ordered(Counter(e["class"] for e in listed if name in e["anomalies"]))
        for ex in anomaly.get("examples", []):
            if not isinstance(ex, dict) or not isinstance(ex.get("offset"), int):
                continue
            key: Any = ex.get("key")
            offset: int = ex["offset"]
            if name == "committed-truncation":
                e = values.get((key, offset, str(ex.get("value"))))
                if e is not None:
                    ex["class"] = e["class"]
                    ex.update((f, e[f]) for f in facts if f in e)
            else:
                per_value = []
                for v in ex.get("values") or []:
                    e = values.get((key, offset, str(v)))
                    if e is not None:
                        per_value.append(
                            {"value": v, "class": e["class"]} | {f: e[f] for f in facts if f in e}
                        )
                ex["value_classes"] = per_value


def annotate(results: dict[str, Any], ops: Sequence[Mapping[str, Any]], run_dir: Path) -> None:
    """Add the classification to `results` (optional fields, docs/history-format.md):
    ``unseen_writes`` ({"nodes", "classes": {class: count}, "writes": [...]}), and under the
    `lost-write` and `unseen` anomalies their ``classes`` counts; each `lost-write` example
    gets its write's ``class`` and facts. With a `committed-truncation` or `inconsistent-offsets`
    anomaly also ``contested_values`` ({"nodes", "count", "classes", "values": [...]}: every
    value those cases name, classed at its offset, `classify_offsets`), and under each of the
    two its ``classes`` (over every value its cases name); each `committed-truncation` example
    gets its value's ``class`` and facts, each `inconsistent-offsets` example ``value_classes``
    (one per value of its ``values``). Does nothing when no node's replicas were collected."""
    replicas = load_replicas(run_dir)
    if not replicas:
        return
    _annotate_offsets(results, ops, replicas)
    seen = _Seen(ops)
    writes = classify(ops, replicas, seen)
    by_write = {(w["key"], str(w["value"])): w for w in writes}
    results["unseen_writes"] = {
        "nodes": replicas.nodes,
        "classes": dict(Counter(w["class"] for w in writes)),
        "count": len(writes),
        "writes": writes[:MAX_LISTED],
    }
    anomalies = results.get("anomalies") or {}
    lost = anomalies.get("lost-write")
    if isinstance(lost, dict):
        classes: Counter[str] = Counter()
        for ex in lost.get("examples", []):
            w = by_write.get((ex.get("key"), str(ex.get("value"))))
            if w is not None:
                ex["class"] = w["class"]
                for fact in ("held", "truncations"):
                    if fact in w:
                        ex[fact] = w[fact]
        # every lost write (not only the examples): unread, acknowledged at or below a read
        max_read = seen.max_read
        for w in writes:
            if w["offset"] is not None and w["offset"] <= max_read.get(w["key"], -1):
                classes[w["class"]] += 1
        lost["classes"] = dict(classes)
    unseen = anomalies.get("unseen")
    if isinstance(unseen, dict):
        unseen["classes"] = dict(Counter(w["class"] for w in writes))
        for ex in unseen.get("examples", []):
            key = ex.get("key")
            ex["classes"] = dict(Counter(w["class"] for w in writes if w["key"] == key))
