"""Artefacts of a check for a run directory: a text summary and per-key offset diagrams.

`render_artifacts(ops, results, out_dir)` writes

- `summary.txt`: verdict, every anomaly type with its count (marked when it is not
  allowed), the first explanations of each, and the stats;
- `offsets-<key>.png` and `.svg` (queue histories, only for keys named by an anomaly,
  at most `max_keys`): offset over history position for every send ack and poll read of
  that key, and in subscribe mode every offset committed and every committed offset a
  rebalance fetched, coloured by completion type, with the offsets the anomalies name
  ringed in red and the values they name (an unseen or skipped value, the writes of a
  cycle's steps) ringed in magenta and labelled.

`summary_text(results)` is the same summary as a string (the CLI prints it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from isrlab.checkers.queue.codec import DATA_FS, entries_in

__all__ = ["not_allowed_types", "render_artifacts", "summary_text"]


def not_allowed_types(results: dict[str, Any]) -> set[str]:
    """The anomaly types that make `results` invalid: its `not_allowed`, or, in results
    written without that field (linearizability results before it was added), every type
    found, as no linearizability anomaly is ever allowed."""
    listed = results.get("not_allowed")
    if isinstance(listed, list | tuple | set):
        return {str(t) for t in listed}
    return {str(t) for t in results.get("anomaly_types") or results.get("anomalies") or ()}


def summary_text(results: dict[str, Any], per_type: int = 3) -> str:
    valid = results.get("valid")
    verdict = "VALID" if valid is True else "INVALID" if valid is False else "UNKNOWN"
    lines = [f"verdict: {verdict}"]
    bad = not_allowed_types(results)
    anomalies = results.get("anomalies", {})
    if not anomalies:
        lines.append("no anomalies found")
    for name in results.get("anomaly_types", sorted(anomalies)):
        a = anomalies.get(name, {})
        flag = "" if name not in bad else "  (not allowed)"
        lines.append(f"{name}: {a.get('count', 0)}{flag}")
        for ex in a.get("examples", [])[:per_type]:
            lines.append(f"    - {ex.get('explanation', ex)}")
    stats = results.get("stats") or {}
    if stats:
        lines.append("stats: " + ", ".join(f"{k}={v}" for k, v in stats.items()))
    if results.get("error"):
        lines.append(f"error: {results['error']}")
    return "\n".join(lines) + "\n"


def _safe(name: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)) or "_"


def _anomalous_offsets(results: dict[str, Any]) -> dict[Any, set[int]]:
    marks: dict[Any, set[int]] = {}
    for a in results.get("anomalies", {}).values():
        for ex in a.get("examples", []):
            if not isinstance(ex, dict) or "key" not in ex:
                continue
            try:
                hash(ex["key"])
            except TypeError:
                continue
            s = marks.setdefault(ex["key"], set())
            for field in ("offset", "max_read_offset"):
                if isinstance(ex.get(field), int):
                    s.add(ex[field])
            for field in ("offsets",):
                s.update(o for o in ex.get(field) or () if isinstance(o, int))
    return marks


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _anomalous_values(results: dict[str, Any]) -> dict[Any, set[Any]]:
    """Per key, the values the anomaly examples are about: `value`, `values`, `skipped` of an
    example with a `key`, and of each step (with its own `key`) of a cycle's `steps`."""
    marks: dict[Any, set[Any]] = {}
    for a in results.get("anomalies", {}).values():
        for ex in a.get("examples", []):
            if not isinstance(ex, dict):
                continue
            steps: list[Any] = ex["steps"] if isinstance(ex.get("steps"), list) else []
            for part in (ex, *steps):
                if not isinstance(part, dict) or not _hashable(part.get("key", [])):
                    continue
                s = marks.setdefault(part["key"], set())
                if "value" in part and _hashable(part["value"]):
                    s.add(part["value"])
                for field in ("values", "skipped"):
                    if isinstance(part.get(field), list):
                        s.update(v for v in part[field] if _hashable(v))
    return {k: v for k, v in marks.items() if v}


_COLORS = {"ok": "tab:blue", "info": "tab:orange", "fail": "tab:gray"}
_MARKERS = {"send": "^", "poll": "o", "commit": "s", "fetched committed": "D"}


def _points(
    ops: Iterable[dict[str, Any]], key: Any, values: dict[tuple[int, int], Any] | None = None
) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """Points (history index, offset) per (what, completion type); `values`, when given, gets
    the value of each send and read point."""
    pts: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for pos, op in enumerate(ops):
        typ = op.get("type")
        if typ == "invoke":
            continue
        f = op.get("f")
        x = op.get("index", pos)
        # Consumer groups: the offsets committed, and the committed offsets fetched.
        reb = op.get("rebalance")
        fetched = reb.get("committed") if isinstance(reb, dict) else None
        if isinstance(fetched, dict) and isinstance(fetched.get(key), int):
            pts.setdefault(("fetched committed", str(typ)), []).append((x, fetched[key]))
        if f == "commit":
            for mop in op.get("value") or ():
                offsets = mop[1] if isinstance(mop, list) and len(mop) == 2 else None
                if isinstance(offsets, dict) and isinstance(offsets.get(key), int):
                    pts.setdefault(("commit", str(typ)), []).append((x, offsets[key]))
            continue
        if f not in DATA_FS:
            continue
        for _, what, k, offset, v in entries_in(op.get("value")):
            if k == key and isinstance(offset, int):
                pts.setdefault(("send" if what == "send" else "poll", str(typ)), []).append(
                    (x, offset)
                )
                if values is not None:
                    values[(x, offset)] = v
    return pts


def _plot_key(
    ops: Iterable[dict[str, Any]],
    key: Any,
    marked: set[int],
    out: Path,
    marked_values: set[Any] | None = None,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    point_values: dict[tuple[int, int], Any] = {}
    pts = _points(ops, key, point_values)
    fig, ax = plt.subplots(figsize=(10, 5))
    for (what, typ), xy in sorted(pts.items()):
        xs, ys = zip(*xy, strict=True)
        ax.scatter(
            xs,
            ys,
            s=8,
            marker=_MARKERS.get(what, "o"),
            color=_COLORS.get(typ, "black"),
            label=f"{what} ({typ})",
            alpha=0.7,
        )
    if marked:
        hits = [(x, o) for xy in pts.values() for x, o in xy if o in marked]
        if hits:
            xs, ys = zip(*hits, strict=True)
            ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="red", label="anomaly offsets")
        for o in sorted(marked)[:50]:
            ax.axhline(o, color="red", linewidth=0.4, alpha=0.4)
    if marked_values:
        # The values the anomalies name (an unseen or skipped value, a cycle's writes):
        # ringed in magenta and labelled with the value, wherever they were sent or read.
        vhits = sorted(
            {xy for xy, v in point_values.items() if _hashable(v) and v in marked_values}
        )
        if vhits:
            xs, ys = zip(*vhits, strict=True)
            ax.scatter(
                xs,
                ys,
                s=110,
                facecolors="none",
                edgecolors="magenta",
                lw=1.4,
                label="anomaly values",
            )
            labelled: set[Any] = set()
            for x, o in vhits:
                v = point_values[(x, o)]
                if v not in labelled and len(labelled) < 30:
                    labelled.add(v)
                    ax.annotate(
                        f"{v}",
                        (x, o),
                        xytext=(4, 4),
                        textcoords="offset points",
                        fontsize=7,
                        color="magenta",
                    )
    ax.set_xlabel("history index")
    ax.set_ylabel("offset")
    ax.set_title(f"key {key}: offsets sent and read")
    if pts:
        ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    written = []
    for ext in ("png", "svg"):
        path = out / f"offsets-{_safe(key)}.{ext}"
        fig.savefig(path)
        written.append(path)
    plt.close(fig)
    return written


def render_artifacts(
    ops: Iterable[dict[str, Any]],
    results: dict[str, Any],
    out_dir: Path,
    *,
    max_keys: int = 16,
) -> list[Path]:
    """Write summary.txt and offset diagrams into out_dir; return the paths written.

    `ops` is iterated once per diagram, so it may re-read a file each time (a
    `checkers.queue.load.QueueHistory` does).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    summary = out / "summary.txt"
    summary.write_text(summary_text(results, per_type=8))
    written.append(summary)
    marks = _anomalous_offsets(results)
    value_marks = _anomalous_values(results)
    queue_like = any(op.get("f") in DATA_FS for op in islice(ops, 1000))
    if queue_like:
        for key in sorted(set(marks) | set(value_marks), key=str)[:max_keys]:
            written.extend(_plot_key(ops, key, marks.get(key, set()), out, value_marks.get(key)))
    return written
