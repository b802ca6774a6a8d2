"""report.html for one run: what a person looks at after `isrlab test`.

Contents, top to bottom: the verdict, the op counts (`checkers.availability.op_counts`, what the
queue checker's stats count) and the test's settings; the anomalies found, each case with its
explanation (op indexes, key, offsets, why); throughput and latency over time with every fault
period shaded in its kind's colour (legend) and the pre-fault ok baseline; availability per fault
window and after each heal, and the stuck processes (`checkers.availability`, also written to
results.json as the optional `availability` field); a timeline of operations per process (ok /
fail / info); the nemesis ops, one row each; links to the checker's artefacts (per-key offset
diagrams, summary.txt), history.jsonl and node logs.

Plots are matplotlib SVGs embedded in a single self-contained HTML file (jinja2 template), so a
report can be mailed or published as one file. Inputs are the run directory's files only
(test.json, history.jsonl, results.json): a report can be regenerated for any stored run with
`render_report(run_dir)`.
"""

from __future__ import annotations

import html
import io
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from isrlab.checkers.availability import (
    NOT_OPS,
    availability,
    fault_windows,
    nemesis_ops,
    op_counts,
)
from isrlab.checkers.history import load_history
from isrlab.checkers.unseen import OFFSET_ANOMALIES

NS = 1e9
COLORS = {"ok": "#2a9d4b", "fail": "#d1495b", "info": "#edae49"}
#: One colour per fault kind, far apart in hue and none close to the ok/fail/info colours.
FAULT_COLORS = {
    "partition": "#1f77b4",
    "partition-iptables": "#17becf",
    "kill": "#9467bd",
    "pause": "#8c564b",
    "clock": "#e377c2",
    "packet": "#7f7f7f",
}
OTHER_FAULT_COLORS = ["#bcbd22", "#393b79", "#637939", "#843c39"]


def fault_color(kind: str, others: Sequence[str] = ()) -> str:
    """The shading colour of a fault kind; kinds not in FAULT_COLORS take the next spare one,
    in the order of `others`."""
    if kind in FAULT_COLORS:
        return FAULT_COLORS[kind]
    extra = sorted(k for k in set(others) | {kind} if k not in FAULT_COLORS)
    return OTHER_FAULT_COLORS[extra.index(kind) % len(OTHER_FAULT_COLORS)]


def fault_periods(ops: Sequence[dict[str, Any]], end_s: float) -> list[tuple[str, float, float]]:
    """(fault kind, start s, end s): `checkers.availability.fault_windows`, with instant faults
    widened so that they show on a plot."""
    width = max(end_s / 400, 0.05)
    return [(k, a, max(b, a + width)) for k, a, b in fault_windows(ops, end_s)]


def _pairs(ops: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(invoke, completion) pairs of client ops."""
    pending: dict[Any, dict[str, Any]] = {}
    out = []
    for op in ops:
        p = op.get("process")
        if p == "nemesis" or op.get("f") in NOT_OPS:
            continue
        if op["type"] == "invoke":
            pending[p] = op
        elif p in pending:
            out.append((pending.pop(p), op))
    return out


def _shade(ax: Any, periods: list[tuple[str, float, float]]) -> list[Any]:
    """Shade each fault period in its kind's colour; returns one legend handle per kind."""
    from matplotlib.patches import Patch

    kinds = sorted({k for k, _, _ in periods})
    for kind, a, b in periods:
        ax.axvspan(a, b, color=fault_color(kind, kinds), alpha=0.15, lw=0)
    return [Patch(color=fault_color(k, kinds), alpha=0.35, label=f"fault: {k}") for k in kinds]


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def throughput_latency_svg(
    ops: Sequence[dict[str, Any]], end_s: float, avail: dict[str, Any] | None = None
) -> str:
    """Completions per second by type and latency over time, faults shaded by kind; with
    `avail` (checkers.availability), the pre-fault baseline ok rate and half of it."""
    pairs = _pairs(ops)
    periods = fault_periods(ops, end_s)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    width = max(end_s / 120, 0.25)
    nbins = int(end_s / width) + 1
    for kind in ("ok", "fail", "info"):
        counts = [0] * nbins
        for _inv, comp in pairs:
            if comp["type"] == kind:
                counts[min(int(comp["time"] / NS / width), nbins - 1)] += 1
        ax1.plot(
            [i * width for i in range(nbins)],
            [c / width for c in counts],
            color=COLORS[kind],
            label=kind,
            lw=1.2,
        )
    ax1.set_ylabel("completions / s")
    handles = _shade(ax1, periods)
    base = (avail or {}).get("baseline_ok_per_s")
    if base:
        ax1.axhline(base, color=COLORS["ok"], ls="--", lw=0.8, label="ok baseline (pre-fault)")
        ax1.axhline(base / 2, color=COLORS["ok"], ls=":", lw=0.8, label="half the baseline")
    lines, _ = ax1.get_legend_handles_labels()
    ax1.legend(handles=lines + handles, loc="upper right", fontsize=8, ncol=4)
    by_f: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for inv, comp in pairs:
        by_f[str(inv.get("f"))].append(
            (comp["time"] / NS, (comp["time"] - inv["time"]) / 1e6, comp["type"])
        )
    markers = {"send": "o", "poll": "s", "txn": "^"}
    for f, pts in sorted(by_f.items()):
        for kind in ("ok", "fail", "info"):
            sel = [(x, y) for x, y, k in pts if k == kind]
            if sel:
                ax2.scatter(
                    [x for x, _ in sel],
                    [max(y, 0.01) for _, y in sel],
                    s=4,
                    marker=markers.get(f, "."),
                    color=COLORS[kind],
                    alpha=0.5,
                    label=f"{f} {kind}",
                )
    ax2.set_yscale("log")
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel("seconds since start")
    _shade(ax2, periods)
    ax2.legend(loc="upper right", fontsize=7, ncol=4, markerscale=3)
    ax1.set_xlim(0, end_s)
    return _svg(fig)


def timeline_svg(ops: Sequence[dict[str, Any]], end_s: float, max_processes: int = 40) -> str:
    pairs = _pairs(ops)
    threads: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for inv, comp in pairs:
        threads[inv["process"]].append((inv["time"] / NS, comp["time"] / NS, comp["type"]))
    procs = sorted(threads, key=lambda p: (min(t for t, _, _ in threads[p]), str(p)))[
        :max_processes
    ]
    fig, ax = plt.subplots(figsize=(11, 0.22 * len(procs) + 1.5))
    for row, p in enumerate(procs):
        for kind in ("ok", "fail", "info"):
            bars = [(a, max(b - a, 1e-3)) for a, b, k in threads[p] if k == kind]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), color=COLORS[kind])
    handles = _shade(ax, fault_periods(ops, end_s))
    if handles:
        ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))
    ax.set_yticks(range(len(procs)))
    ax.set_yticklabels([str(p) for p in procs], fontsize=6)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("process")
    ax.set_xlim(0, end_s)
    return _svg(fig)


TEMPLATE = jinja2.Template(
    """<!doctype html>
<html><head><meta charset="utf-8"><title>isrlab: {{ name }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
.verdict{font-size:1.6em;font-weight:bold;padding:.4em .8em;border-radius:6px;display:inline-block}
.valid{background:#d8f3dc;color:#1b4332}.invalid{background:#ffccd5;color:#800f2f}
.unknown{background:#fff3b0;color:#7f5539}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
code,pre{background:#f4f4f4;padding:1px 4px}pre{padding:8px;overflow-x:auto;white-space:pre-wrap}
.allowed{color:#777}.case{margin:.3em 0 .8em 1em}
</style></head><body>
<h1>{{ name }}</h1>
<div class="verdict {{ verdict_class }}">{{ verdict_text }}</div>
<p>{{ summary_line }}</p>
<h2>Configuration</h2>
<table>{% for k, v in settings %}<tr><th>{{ k }}</th><td><code>{{ v }}</code></td></tr>{% endfor %}</table>
<h2>Anomalies</h2>
{% if anomalies %}
<table><tr><th>anomaly</th><th>count</th><th>allowed?</th></tr>
{% for a in anomalies %}<tr class="{{ 'allowed' if a.allowed else '' }}"><td><a href="#{{ a.name }}">{{ a.name }}</a></td><td>{{ a.count }}</td><td>{{ 'allowed' if a.allowed else 'NOT allowed' }}</td></tr>{% endfor %}
</table>
{% for a in anomalies %}<h3 id="{{ a.name }}">{{ a.name }} ({{ a.count }})</h3>
{% if a.classes and a.name in offset_anomalies %}<p class="classes">What the replicas hold at the
offsets of these cases (the nodes' logs and truncation journals after the run), per value the
cases name: {% for c, n in a.classes.items() %}<b>{{ c }}</b> {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}.
<i>kept</i>: every replica holding the offset holds the value there; <i>diverged</i>: replicas
disagree at the offset; <i>replaced</i>: another value there now, and a truncation cut the value
(node, epoch, kind in the examples); <i>truncated</i>: nothing there now, and a truncation cut
it; <i>vanished</i>: not there, and no truncation journal cut it.</p>
{% elif a.classes %}<p class="classes">What the replicas hold of these writes (the nodes' logs and
truncation journals after the run): {% for c, n in a.classes.items() %}<b>{{ c }}</b> {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}.
<i>not-yet-read</i>: on a replica past every offset read; <i>present-not-served</i>: on a replica
where reads went past it; <i>truncated</i>: cut by a truncation (node, epoch in the examples);
<i>never-reached-a-replica</i>: on no replica and in no journal.</p>{% endif %}
{% for ex in a.examples %}<div class="case"><pre>{{ ex }}</pre></div>{% endfor %}
{% if a.count > a.examples|length %}<p>… and {{ a.count - a.examples|length }} more in results.json</p>{% endif %}
{% endfor %}
{% else %}<p>None found.</p>{% endif %}
<h2>Throughput and latency</h2>
<p>Shaded: fault periods from the nemesis operations in the history, one colour per kind of
fault (legend). Dashed: the ok rate before the first fault (baseline); dotted: half of it.</p>
{{ throughput_svg }}
<h2 id="availability">Availability</h2>
{% if avail.baseline_ok_per_s is none %}<p>No baseline: no time before the first fault
(rates relative to it are not known).</p>
{% else %}<p>Baseline: {{ '%.1f' % avail.baseline_ok_per_s }} ok ops/s from
{{ '%.1f' % avail.baseline_s[0] }} s to {{ '%.1f' % avail.baseline_s[1] }} s (before the first
fault). "Back to half" is the time from the heal until the ok rate (in {{ avail.bin_s }} s
bins) is at least half the baseline again, before the next fault starts.</p>{% endif %}
{% if avail.windows %}
<table><tr><th>fault</th><th>from (s)</th><th>healed (s)</th><th>ok/s during</th>
<th>vs baseline</th><th>after heal, until (s)</th><th>ok/s after</th><th>vs baseline</th>
<th>back to half after</th></tr>
{% for w in avail.windows %}<tr><td>{{ w.fault }}</td><td>{{ '%.2f' % w.start_s }}</td>
<td>{{ '%.2f' % w.end_s }}</td><td>{{ fmt(w.ok_per_s) }}</td><td>{{ pct(w.relative) }}</td>
{% if w.after_heal %}<td>{{ '%.2f' % w.after_heal.until_s }}</td>
<td>{{ fmt(w.after_heal.ok_per_s) }}</td><td>{{ pct(w.after_heal.relative) }}{% if w.after_heal.other_fault_active %} (another fault active){% endif %}</td>
<td>{% if w.after_heal.recovery_s is not none %}{{ '%.1f s' % w.after_heal.recovery_s }}{% elif avail.baseline_ok_per_s %}<b>not recovered</b>{% else %}?{% endif %}</td>
{% else %}<td colspan="4">still active at the end</td>{% endif %}</tr>
{% endfor %}</table>
{% else %}<p>No faults in this run.</p>{% endif %}
<h3>Stuck processes</h3>
{% if avail.stuck %}<p>{{ avail.stuck_count }} stretch(es) of {{ avail.stuck_s }} s or more in
which a process completed no ok op while the others completed at least one per second
(liveness: a client that stops making progress while the system serves others).</p>
<table><tr><th>process</th><th>from (s)</th><th>to (s)</th><th>seconds</th><th>ok ops by others</th></tr>
{% for st in avail.stuck %}<tr><td>{{ st.process }}</td><td>{{ '%.2f' % st.from_s }}</td>
<td>{{ '%.2f' % st.to_s }}{% if st.open_at_end %} (op still open at the end){% endif %}</td>
<td>{{ '%.1f' % st.seconds }}</td><td>{{ st.others_ok }}</td></tr>{% endfor %}
</table>{% if avail.stuck_count > avail.stuck|length %}<p>… {{ avail.stuck_count - avail.stuck|length }} more</p>{% endif %}
{% else %}<p>None: no process went {{ avail.stuck_s }} s without an ok op while others progressed.</p>{% endif %}
<h3>Stuck consumers</h3>
{% if avail.stuck_consumers %}<p>{{ avail.stuck_consumer_count }} stretch(es) of {{ avail.stuck_s }} s or
more in which a process's polls all came back empty although a key it was assigned had records
past its position that were readable (another poll returned them): a consumer that stopped
reading while the log moved on.</p>
<table><tr><th>process</th><th>from (s)</th><th>to (s)</th><th>seconds</th><th>empty polls</th>
<th>behind on (next offset → readable up to)</th><th>inside a fault</th></tr>
{% for st in avail.stuck_consumers %}<tr><td>{{ st.process }}</td><td>{{ '%.2f' % st.from_s }}</td>
<td>{{ '%.2f' % st.to_s }}</td><td>{{ '%.1f' % st.seconds }}</td><td>{{ st.empty_polls }}</td>
<td>{% for k, b in st.behind.items() %}<code>{{ k }}</code> {{ b.position }} → {{ b.readable_up_to }}{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td>{{ 'yes' if st.in_fault else '<b>no</b>'|safe }}</td></tr>{% endfor %}
</table>{% if avail.stuck_consumer_count > avail.stuck_consumers|length %}<p>… {{ avail.stuck_consumer_count - avail.stuck_consumers|length }} more</p>{% endif %}
{% else %}<p>None: no process polled empty for {{ avail.stuck_s }} s while records it was assigned were readable.</p>{% endif %}
<h2>Operations per process</h2>
<p>Each bar is one operation from invoke to completion: green ok, red fail, yellow info (unknown).</p>
{{ timeline_svg }}
<h2>Faults</h2>
<p>One row per nemesis operation: when it was invoked and completed, and what it did (the
completion's value, or what was asked when the completion has none).</p>
<table><tr><th>invoked (s)</th><th>completed (s)</th><th>f</th><th>value</th></tr>
{% for n in faults %}<tr><td>{{ '%.2f' % n.start_s }}</td><td>{{ '%.2f' % n.end_s }}</td><td>{{ n.f }}</td><td><code>{{ n.value }}</code></td></tr>
{% endfor %}
</table>
<h2>Files</h2>
<ul>{% for href, label in files %}<li><a href="{{ href }}">{{ label }}</a></li>{% endfor %}</ul>
</body></html>
""",
    autoescape=True,
)


def _example_text(ex: Any) -> str:
    if isinstance(ex, dict):
        text = ex.get("explanation") or ""
        rest = {k: v for k, v in ex.items() if k != "explanation"}
        return (text + "\n" if text else "") + json.dumps(rest, default=str)[:1500]
    return json.dumps(ex, default=str)[:1500]


def render_report(run_dir: Path, examples_per_type: int = 5) -> Path:
    run_dir = Path(run_dir)
    test = json.loads((run_dir / "test.json").read_text())
    results = json.loads((run_dir / "results.json").read_text())
    ops = load_history(run_dir / "history.jsonl")
    end_s = (ops[-1]["time"] / NS) if ops else 1.0
    end_s = max(end_s, 1.0)
    valid = results.get("valid")
    verdict_class = {True: "valid", False: "invalid"}.get(valid, "unknown")
    verdict_text = {True: "VALID", False: "INVALID"}.get(valid, "UNKNOWN")
    nothing = (results.get("stats") or {}).get("nothing-checked")
    if nothing:
        verdict_text += f": nothing checked ({nothing})"
    # results.json names the types that invalidate the run; the others found are allowed.
    not_allowed = set(results.get("not_allowed", results.get("anomaly_types", [])))
    anomalies = []
    for name, info in sorted(results.get("anomalies", {}).items()):
        allowed = name not in not_allowed
        anomalies.append(
            {
                "name": name,
                "count": info.get("count", 0),
                "allowed": allowed,
                "classes": info.get("classes"),
                "examples": [
                    _example_text(e) for e in info.get("examples", [])[:examples_per_type]
                ],
            }
        )
    stats = results.get("stats", {})
    counts = op_counts(ops)
    summary_line = (
        f"{counts['ops']} client operations in {end_s:.1f} s "
        f"({counts['ok']} ok, {counts['fail']} fail, {counts['info']} info)"
        + (f"; checker stats: {json.dumps(stats)[:400]}" if stats else "")
    )
    avail = availability(ops)
    if results.get("availability") != avail:
        # An optional results.json field (docs/history-format.md): written with the report, so
        # that regenerating the report of an older run adds it too.
        results["availability"] = avail
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    settings = [
        (k, json.dumps(v) if not isinstance(v, str) else v)
        for k, v in test.items()
        if k not in ("ssh", "inventory") and not isinstance(v, dict)
    ]
    faults = [n | {"value": json.dumps(n["value"], default=str)[:300]} for n in nemesis_ops(ops)]
    files = [
        ("history.jsonl", "history.jsonl"),
        ("results.json", "results.json"),
        ("test.json", "test.json"),
    ]
    for extra in sorted(run_dir.glob("*.svg")) + sorted(run_dir.glob("*.png")):
        files.append((extra.name, extra.name))
    if (run_dir / "summary.txt").exists():
        files.append(("summary.txt", "checker summary"))
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        for f in sorted(d.rglob("*"))[:50]:
            if f.is_file():
                rel = f.relative_to(run_dir)
                files.append((str(rel), html.escape(str(rel))))
    page = TEMPLATE.render(
        name=test.get("name", run_dir.name),
        verdict_class=verdict_class,
        verdict_text=verdict_text,
        summary_line=summary_line,
        settings=settings,
        anomalies=anomalies,
        offset_anomalies=OFFSET_ANOMALIES,
        throughput_svg=jinja2.filters.Markup(throughput_latency_svg(ops, end_s, avail)),
        avail=avail,
        fmt=lambda x: "?" if x is None else f"{x:.1f}",
        pct=lambda x: "?" if x is None else f"{x:.0%}",
        timeline_svg=jinja2.filters.Markup(timeline_svg(ops, end_s)),
        faults=faults,
        files=files,
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out
