"""report.html for one run: what a person looks at after `isrlab test`.

Contents, top to bottom: the verdict and the test's settings; the anomalies found, each case with
its explanation (op indexes, key, offsets, why); throughput and latency over time with every fault
period shaded and labelled; a timeline of operations per process (ok / fail / info); links to the
checker's artefacts (per-key offset diagrams, summary.txt), history.jsonl and node logs.

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

from isrlab.checkers.history import load_history

NS = 1e9
COLORS = {"ok": "#2a9d4b", "fail": "#d1495b", "info": "#edae49"}
FAULT_COLORS = ["#f4a259", "#8cb369", "#5b8e7d", "#bc4b51", "#6d597a", "#355070"]


def fault_periods(ops: Sequence[dict[str, Any]], end_s: float) -> list[tuple[str, float, float]]:
    """(fault kind, start s, end s) from nemesis `start-X` / `stop-X` info ops; `heal-all` ends
    every open fault; a fault still active at the end of the history runs to its end. Other
    nemesis ops are instants."""
    open_: dict[str, float] = {}
    out: list[tuple[str, float, float]] = []
    for op in ops:
        if op.get("process") != "nemesis" or op.get("type") != "info":
            continue
        f = str(op.get("f", ""))
        t = op["time"] / NS
        kind = f.split("-", 1)[1] if "-" in f else f
        if f == "heal-all":
            for k, start in open_.items():
                out.append((k, start, t))
            open_.clear()
        if f.startswith("start-"):
            open_.setdefault(kind, t)
        elif f.startswith("stop-") and kind in open_:
            out.append((kind, open_.pop(kind), t))
        elif not f.startswith(("start-", "stop-")):
            out.append((f, t, t + max(end_s / 400, 0.05)))
    for kind, start in open_.items():
        out.append((kind, start, end_s))
    return sorted(out, key=lambda x: x[1])


def _pairs(ops: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(invoke, completion) pairs of client ops."""
    pending: dict[Any, dict[str, Any]] = {}
    out = []
    for op in ops:
        p = op.get("process")
        if p == "nemesis":
            continue
        if op["type"] == "invoke":
            pending[p] = op
        elif p in pending:
            out.append((pending.pop(p), op))
    return out


def _shade(ax: Any, periods: list[tuple[str, float, float]]) -> None:
    kinds = sorted({k for k, _, _ in periods})
    color = {k: FAULT_COLORS[i % len(FAULT_COLORS)] for i, k in enumerate(kinds)}
    seen: set[str] = set()
    for kind, a, b in periods:
        ax.axvspan(a, b, color=color[kind], alpha=0.18, label=kind if kind not in seen else None)
        seen.add(kind)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def throughput_latency_svg(ops: Sequence[dict[str, Any]], end_s: float) -> str:
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
    _shade(ax1, periods)
    ax1.legend(loc="upper right", fontsize=8, ncol=6)
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
    _shade(ax, fault_periods(ops, end_s))
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
{% for ex in a.examples %}<div class="case"><pre>{{ ex }}</pre></div>{% endfor %}
{% if a.count > a.examples|length %}<p>… and {{ a.count - a.examples|length }} more in results.json</p>{% endif %}
{% endfor %}
{% else %}<p>None found.</p>{% endif %}
<h2>Throughput and latency</h2>
<p>Shaded: fault periods from the nemesis operations in the history.</p>
{{ throughput_svg }}
<h2>Operations per process</h2>
<p>Each bar is one operation from invoke to completion: green ok, red fail, yellow info (unknown).</p>
{{ timeline_svg }}
<h2>Faults</h2>
<table><tr><th>time (s)</th><th>f</th><th>value</th></tr>
{% for t, f, v in faults %}<tr><td>{{ '%.2f' % t }}</td><td>{{ f }}</td><td><code>{{ v }}</code></td></tr>{% endfor %}
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
                "examples": [
                    _example_text(e) for e in info.get("examples", [])[:examples_per_type]
                ],
            }
        )
    stats = results.get("stats", {})
    client_ops = [o for o in ops if o.get("process") != "nemesis" and o["type"] != "invoke"]
    counts = {k: sum(1 for o in client_ops if o["type"] == k) for k in ("ok", "fail", "info")}
    summary_line = (
        f"{len(client_ops)} client operations in {end_s:.1f} s "
        f"({counts['ok']} ok, {counts['fail']} fail, {counts['info']} info)"
        + (f"; checker stats: {json.dumps(stats)[:400]}" if stats else "")
    )
    settings = [
        (k, json.dumps(v) if not isinstance(v, str) else v)
        for k, v in test.items()
        if k not in ("ssh", "inventory") and not isinstance(v, dict)
    ]
    faults = [
        (o["time"] / NS, o["f"], json.dumps(o.get("value"), default=str)[:300])
        for o in ops
        if o.get("process") == "nemesis" and o["type"] == "info"
    ]
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
        throughput_svg=jinja2.filters.Markup(throughput_latency_svg(ops, end_s)),
        timeline_svg=jinja2.filters.Markup(timeline_svg(ops, end_s)),
        faults=faults,
        files=files,
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out
