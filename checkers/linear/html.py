"""The HTML visualisation of a linearizability result (``linear.html``).

One self-contained page (inline SVG, CSS and a little JS; nothing fetched from the network):
for each partition, not-linearizable ones first, one row per process with a bar per operation
from its call to its return.  Bars of the longest linearizable prefix (or of the full
linearization) are green and numbered in linearization order; the operation that cannot be
placed is red; other operations are grey; indeterminate ones run off to the right with a
dashed outline.  Hovering a bar shows the operation, its times and history indexes, and the
model state after it in the linearization.  Time is drawn by rank (each distinct call or return
time gets the next slot), so short operations stay visible in long histories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from isrlab.checkers.linear.checker import LinearizabilityResult, PartitionResult
from isrlab.checkers.linear.model import Model, Operation

__all__ = ["render_html", "write_html"]

_ROW_HEIGHT = 26
_SLOT = 14
_LEFT = 90
_TOP = 24
_CHAR = 7  # width of one character of the 11px monospace labels
_CALLOUT_ROOM = 400


@dataclass
class _Bar:
    x: float
    y: float
    width: float
    label: str
    callout: str | None
    css: str
    title: str
    dashed: bool


def _window(part: PartitionResult, max_ops: int) -> list[Operation]:
    """The operations to draw: all, or the ``max_ops`` calls nearest the blocked one."""
    ops = part.operations
    if len(ops) <= max_ops:
        return list(ops)
    centre = part.blocked.call if part.blocked is not None else ops[0].call
    nearest = sorted(ops, key=lambda op: abs(op.call - centre))[:max_ops]
    return sorted(nearest, key=lambda op: op.call)


def _states_after(model: Model, part: PartitionResult) -> dict[int, str]:
    """The model state after each operation of the (prefix) linearization, described."""
    state = model.init()
    described: dict[int, str] = {}
    for op in part.linearization:
        ok, state = model.step(state, op.input, op.output)
        described[op.id] = model.describe_state(state) if ok else "(rejected?)"
    return described


def _partition_view(model: Model, part: PartitionResult, max_ops: int) -> dict[str, Any]:
    ops = _window(part, max_ops)
    times = sorted({t for op in ops for t in (op.call, op.ret) if not math.isinf(t)})
    slot = {t: i for i, t in enumerate(times)}
    end_slot = len(times) + 1
    processes: list[Any] = []
    for op in ops:
        if op.process not in processes:
            processes.append(op.process)
    row = {p: i for i, p in enumerate(processes)}
    order = {op.id: i + 1 for i, op in enumerate(part.linearization)}
    states = _states_after(model, part)
    blocked_id = part.blocked.id if part.blocked is not None else None
    bars = []
    for op in ops:
        start = slot[op.call]
        stop = end_slot if math.isinf(op.ret) else slot[op.ret]
        description = model.describe_operation(op.input, op.output)
        width = max(_SLOT * (stop - start), 6)
        callout = None
        if op.id == blocked_id:
            css, label, short = "blocked", "✗ " + description, "✗"
            # The op the reader is looking for gets its description beside the bar.
            callout = "✗ " + description
        elif op.id in order:
            css, label, short = "linearized", f"{order[op.id]}: {description}", str(order[op.id])
        else:
            css, label, short = "other", description, ""
        if width < _CHAR * len(label) + 6:
            label = short if width >= _CHAR * len(short) + 4 else ""
        lines = [
            description,
            f"process {op.process}",
            f"history index {op.invoke_index} -> "
            + ("never completed" if op.complete_index is None else str(op.complete_index)),
            f"call {op.call:g}, return " + ("unknown" if math.isinf(op.ret) else f"{op.ret:g}"),
        ]
        if op.error is not None:
            lines.append(f"error {op.error}")
        if op.id in order:
            lines.append(f"linearized #{order[op.id]}; state after: {states.get(op.id, '?')}")
        if op.id == blocked_id:
            lines.append("cannot be linearized after the longest prefix")
        bars.append(
            _Bar(
                x=_LEFT + start * _SLOT,
                y=_TOP + row[op.process] * _ROW_HEIGHT,
                width=width,
                label=label,
                callout=callout,
                css=css,
                title="\n".join(lines),
                dashed=math.isinf(op.ret),
            )
        )
    return {
        "key": part.key,
        "verdict": part.verdict,
        "explanation": part.explanation(model),
        "operations": len(part.operations),
        "shown": len(ops),
        "prefix": len(part.linearization),
        "processes": [(str(p), _TOP + i * _ROW_HEIGHT) for i, p in enumerate(processes)],
        "bars": bars,
        "width": _LEFT + (end_slot + 2) * _SLOT + _CALLOUT_ROOM,
        "height": _TOP + len(processes) * _ROW_HEIGHT + 10,
        "row_height": _ROW_HEIGHT - 6,
        "blocked": (
            None
            if part.blocked is None
            else model.describe_operation(part.blocked.input, part.blocked.output)
        ),
    }


_TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
).get_template("linear.html.j2")


def render_html(
    result: LinearizabilityResult,
    title: str = "Linearizability",
    max_partitions: int = 50,
    max_ops: int = 1500,
) -> str:
    """The page for ``result``: illegal partitions first, then unknown, then ok ones."""
    rank = {"illegal": 0, "unknown": 1, "ok": 2}
    checked = [p for p in result.partitions if p.checked]
    parts = sorted(checked, key=lambda p: rank[p.verdict])[:max_partitions]
    return _TEMPLATE.render(
        title=title,
        result=result,
        model=result.model.name,
        partitions=[_partition_view(result.model, p, max_ops) for p in parts],
        hidden=len(checked) - len(parts),
        unchecked=len(result.partitions) - len(checked),
    )


def write_html(
    result: LinearizabilityResult, path: str | Path, title: str = "Linearizability"
) -> Path:
    """Write :func:`render_html` to ``path`` and return it."""
    path = Path(path)
    path.write_text(render_html(result, title), encoding="utf-8")
    return path
