"""Publishing an `Analysis`: index.html, plots, summary.csv and summary.json.

Files written into the analysis's out directory (anomalies.parquet is written by Spark
in `pipeline.analyze`):

- ``index.html`` (jinja2, templates/index.html.j2): per switch setting a heatmap of
  acks x fault (invalid anomalies, and acked writes never read after the final drain,
  per 10,000 acked writes), the
  configuration table with rates and 95 % intervals, a table per switch (idempotence, txn
  and isolation level among them) and one each for the workload and the consumer mode (value
  x acks, pooled over everything else), worst runs and every run with a link to its own
  report.html, and the malformed runs with their reasons;
- ``plots/*.png`` (matplotlib, Agg backend);
- ``summary.csv``: one row per configuration, a count column per anomaly type;
- ``summary.json``: the whole `Analysis` (configurations, runs, malformed, timings).
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import re
import shutil
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape

from isrlab.checkers.unseen import CLASSES as UNSEEN_CLASSES
from isrlab.checkers.unseen import OFFSET_CLASSES
from isrlab.harness.testconfig import CONSUMER_MODES, option
from isrlab.pipeline.aggregate import rate_interval
from isrlab.pipeline.store import ABSENT, MODES, SWITCHES

if TYPE_CHECKING:
    from isrlab.pipeline.analyze import Analysis

__all__ = [
    "ACKS_ORDER",
    "NEMESIS_ORDER",
    "contested_by_acks",
    "heatmap_figure",
    "publish_run",
    "storage_rows",
    "switch_tables",
    "unseen_by_acks",
    "write_report",
]

ACKS_ORDER = option("acks").choices
WORKLOADS = option("workload").choices
NEMESIS_ORDER = ("none", "partition", "kill", "pause", "clock", "combined")


def _order(values: Sequence[Any], preferred: Sequence[Any]) -> list[Any]:
    known = [v for v in preferred if v in values]
    return known + sorted((v for v in values if v not in preferred), key=str)


def _setting(c: dict[str, Any]) -> str:
    """A switch combination as text, e.g. ``min.insync=2, unclean`` (with the workload first
    unless queue, e.g. ``eos`` for consume-transform-produce runs, then ``subscribe`` or
    ``mixed`` for queue runs whose processes joined the consumer group)."""
    workload = c.get("workload", "queue")
    parts = [] if workload == "queue" else [str(workload)]
    if c.get("mode", "real") != "real":
        parts.insert(0, str(c["mode"]))  # `isrlab sim`'s runs: "sim, min.insync=2, ..."
    if workload == "queue" and c.get("consumer", "assign") != "assign":
        parts.append(str(c["consumer"]))
    parts.append(f"min.insync={c['min_insync_replicas']}")
    if c["idempotence"]:
        parts.append("idempotence")
    if c["txn"]:
        parts.append("txn")
    if c.get("isolation_level", "read_uncommitted") != "read_uncommitted":
        parts.append(str(c["isolation_level"]))
    if c["unclean_leader_election"]:
        parts.append("unclean election")
    if c["truncation_mode"] != "leader-epoch":
        parts.append(f"truncation={c['truncation_mode']}")
    for name, label in (
        ("replica_lag_time_max_ms", "lag"),
        ("zk_session_timeout_ms", "zk session"),
    ):
        if c.get(name, ABSENT[name]) != ABSENT[name]:
            parts.append(f"{label} {c[name] / 1000:g} s")
    return ", ".join(parts)


def _pool(configs: Sequence[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Pool counts and acked writes of several configurations into one rate."""
    acked = sum(c["acked_writes"] for c in configs)
    if metric == "invalid":
        count = sum(c["invalid"]["count"] for c in configs)
    else:
        count = sum(c["anomalies"].get(metric, {}).get("count", 0) for c in configs)
    r = rate_interval(count, acked)
    return {
        "runs": sum(c["runs"] for c in configs),
        "acked_writes": acked,
        "count": count,
        "rate": r[0] if r else None,
        "low": r[1] if r else None,
        "high": r[2] if r else None,
    }


def unseen_by_acks(configs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """acks setting -> {class: count} of the acknowledged writes no ok op read, summed over
    every configuration with that acks (checkers.unseen's classes; runs without collected
    replica records add nothing)."""
    return _classes_by_acks(configs, "unseen_classes")


def contested_by_acks(configs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """acks setting -> {class: count} of the values committed-truncation and
    inconsistent-offsets cases name, classed at their offset from the replicas
    (checkers.unseen.classify_offsets), summed over every configuration with that acks."""
    return _classes_by_acks(configs, "contested_classes")


def _classes_by_acks(configs: Sequence[Mapping[str, Any]], field: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for c in configs:
        classes = c.get(field) or {}
        if not classes:
            continue
        slot = out.setdefault(str(c.get("acks")), {})
        for name, n in classes.items():
            slot[name] = slot.get(name, 0) + int(n)
    return dict(sorted(out.items()))


#: nemesis kinds that damage storage (nemeses.power, nemeses.corrupt)
STORAGE_FAULTS = ("power", "power-torn", "power-zookeeper", "corrupt", "fsync-fail")


def storage_rows(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The configurations whose faults include a storage fault (power loss, corruption), with
    their flush policy: the published report's storage-fault section."""
    rows = []
    for c in configs:
        kinds = str(c.get("nemesis") or "").replace("+", ",").split(",")
        if not any(k in STORAGE_FAULTS for k in kinds):
            continue
        lost = (c.get("anomalies") or {}).get("lost-write") or {}
        rows.append(
            {
                "acks": c.get("acks"),
                "nemesis": c.get("nemesis"),
                "flush_policy": c.get("flush_policy") or "never",
                # KIP-966's switch decides what a power loss of the last ISR member costs
                "eligible_leader_replicas": c.get("eligible_leader_replicas") is not False,
                "runs": c.get("runs"),
                "runs_invalid": c.get("runs_invalid"),
                "acked_writes": c.get("acked_writes"),
                "lost_writes": int(lost.get("count", 0)),
                "anomalies": {k: a.get("count", 0) for k, a in (c.get("anomalies") or {}).items()},
                "unseen_classes": c.get("unseen_classes") or {},
                "contested_classes": c.get("contested_classes") or {},
            }
        )
    return rows


def switch_tables(configs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per switch, per workload, per mode (real or sim) and per consumer mode: {value: {acks:
    pooled invalid rate}} over every other column."""
    acks = _order(sorted({c["acks"] for c in configs}), ACKS_ORDER)
    out: dict[str, dict[str, Any]] = {}
    for switch in ("workload", "mode", "consumer", *SWITCHES):
        values = _order(
            sorted(
                {c.get(switch, "real") if switch == "mode" else c[switch] for c in configs}, key=str
            ),
            (*WORKLOADS, *MODES, *CONSUMER_MODES),
        )
        rows = []
        for value in values:
            cells = {}
            for a in acks:
                members = [
                    c
                    for c in configs
                    if (c.get(switch, "real") if switch == "mode" else c[switch]) == value
                    and c["acks"] == a
                ]
                cells[a] = _pool(members, "invalid") if members else None
            rows.append({"value": value, "cells": cells})
        out[switch] = {"acks": acks, "rows": rows}
    return out


#: The heatmaps' colour scale, the same for every map so that maps compare: anomalies per 10,000
#: acked writes on a symmetric-log scale from 0 (white: nothing happened) to 10,000 (every acked
#: write); more than that (several anomalies per write) is drawn in the darkest colour.
SCALE_MAX = 10_000.0
NO_DATA = "#d9d9d9"


def _scale() -> tuple[Any, Any]:
    """(colormap, norm) of every heatmap: 0 is pure white, cells without runs are grey."""
    from matplotlib.colors import LinearSegmentedColormap, SymLogNorm

    cmap = LinearSegmentedColormap.from_list(
        "isrlab-reds", ["#ffffff", "#fcbba1", "#fb6a4a", "#cb181d", "#67000d"]
    ).with_extremes(bad=NO_DATA, over="#3f0008")
    return cmap, SymLogNorm(linthresh=1.0, vmin=0.0, vmax=SCALE_MAX, base=10)


def heatmap_figure(
    grid: Sequence[Sequence[float]],
    labels: Sequence[Sequence[str]],
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
) -> Any:
    """One acks x fault heatmap (matplotlib Figure) on the fixed scale of `_scale`; the title is
    wrapped to the figure's width so that none of it is cut off."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmap, norm = _scale()
    width = max(4.8, 1.8 + 1.5 * len(columns))
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.9 * len(rows)), dpi=100)
    im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    for i, lab in enumerate(labels):
        for j, text in enumerate(lab):
            v = grid[i][j]
            # Dark cells get white text so every figure stays readable.
            dark = v == v and float(norm(v)) > 0.6
            ax.text(
                j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black"
            )
    chars = int(width * 9)  # ~9 characters of 9 pt text per inch of figure
    ax.set_title("\n".join(textwrap.wrap(title, chars, break_on_hyphens=False) or [""]), fontsize=9)
    bar = fig.colorbar(im, ax=ax, fraction=0.04, extend="max")
    bar.set_ticks([0, 1, 10, 100, 1000, 10_000], labels=["0", "1", "10", "100", "1k", "10k"])
    fig.tight_layout()
    return fig


def _heatmaps(configs: Sequence[dict[str, Any]], plots: Path) -> list[dict[str, Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    settings: dict[str, list[dict[str, Any]]] = {}
    for c in configs:
        settings.setdefault(_setting(c), []).append(c)
    figures = []
    for n, (setting, members) in enumerate(sorted(settings.items())):
        acks = _order(sorted({c["acks"] for c in members}), ACKS_ORDER)
        nemeses = _order(sorted({c["nemesis"] for c in members}), NEMESIS_ORDER)
        for metric, title in (
            ("invalid", "invalid anomalies"),
            # After the final drain every acknowledged write should have been read: an
            # unseen one is a lost acknowledged write, with or without a known offset
            # (acks=0 reports none, so its losses never show as lost-write).
            ("unseen", "acked writes lost (unseen after the final drain)"),
        ):
            grid: list[list[float]] = []
            labels: list[list[str]] = []
            for a in acks:
                row, lab = [], []
                for nem in nemeses:
                    cell = [c for c in members if c["acks"] == a and c["nemesis"] == nem]
                    pooled = _pool(cell, metric) if cell else None
                    if pooled is None or pooled["rate"] is None:
                        row.append(float("nan"))
                        lab.append("no runs")
                    else:
                        row.append(pooled["rate"])
                        lab.append(f"{pooled['rate']:.1f}\n({pooled['runs']} runs)")
                grid.append(row)
                labels.append(lab)
            fig = heatmap_figure(
                grid,
                labels,
                [f"acks={a}" for a in acks],
                nemeses,
                f"{title} per 10k acked writes: {setting}",
            )
            slug = re.sub(r"[^a-z0-9]+", "-", f"{n}-{metric}".lower())
            fig.savefig(plots / f"heatmap-{slug}.png", bbox_inches="tight")
            plt.close(fig)
            figures.append(
                {"setting": setting, "metric": title, "file": f"plots/heatmap-{slug}.png"}
            )
    return figures


_HREF = re.compile(r'<a href="([^"]*)">(.*?)</a>', re.S)


def publish_run(out: Path, run_id: str, run_path: str, max_bytes: int = 1 << 20) -> str | None:
    """Copy a run's report.html into ``OUT/runs/<run>/`` with the files it links that are at
    most `max_bytes` (results.json, summary.txt, offset diagrams...); a link to anything not
    carried (history.jsonl when big, node logs...) becomes plain text marked "not published".
    Returns the copy's path relative to `out`, or None when the run has no report.html."""
    src_dir = Path(run_path)
    src = src_dir / "report.html"
    if not src.is_file():
        return None
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", run_id)
    rel = Path("runs") / f"{safe}-{zlib.crc32(run_id.encode()):08x}"
    dst_dir = out / rel
    if dst_dir.exists():
        shutil.rmtree(dst_dir)
    dst_dir.mkdir(parents=True)
    root = src_dir.resolve()

    def carry(m: re.Match[str]) -> str:
        href, label = html.unescape(m.group(1)), m.group(2)
        if href.startswith(("#", "http://", "https://", "mailto:")):
            return m.group(0)
        target = (src_dir / href).resolve()
        if (
            not Path(href).is_absolute()
            and target.is_relative_to(root)
            and target.is_file()
            and target.stat().st_size <= max_bytes
        ):
            copy = dst_dir / target.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, copy)
            return m.group(0)
        return f'{label} <span class="dim">(not published)</span>'

    page = _HREF.sub(carry, src.read_text(encoding="utf-8", errors="replace"))
    (dst_dir / "report.html").write_text(page, encoding="utf-8")
    return (rel / "report.html").as_posix()


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _write_csv(analysis: Analysis, path: Path) -> None:
    from isrlab.pipeline.store import CONFIG_COLUMNS

    types = sorted({t for c in analysis.configs for t in c["anomalies"]})
    head = [
        *CONFIG_COLUMNS,
        "runs",
        "runs_valid",
        "runs_invalid",
        "runs_unknown",
        "acked_writes",
        "invalid_count",
        "invalid_per_10k",
        "invalid_low",
        "invalid_high",
        "lost_write_per_10k",
        "lost_write_low",
        "lost_write_high",
        "unseen_per_10k",
        "unseen_low",
        "unseen_high",
        *[f"unseen_class:{k}" for k in UNSEEN_CLASSES],
        *[f"contested_class:{k}" for k in OFFSET_CLASSES],
        *[f"count:{t}" for t in types],
    ]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        for c in analysis.configs:
            lost = c["anomalies"].get("lost-write") or {}
            lost_r = rate_interval(int(lost.get("count", 0)), c["acked_writes"])
            unseen = c["anomalies"].get("unseen") or {}
            unseen_r = rate_interval(int(unseen.get("count", 0)), c["acked_writes"])
            w.writerow(
                [
                    *[c[col] for col in CONFIG_COLUMNS],
                    c["runs"],
                    c["runs_valid"],
                    c["runs_invalid"],
                    c["runs_unknown"],
                    c["acked_writes"],
                    c["invalid"]["count"],
                    _fmt(c["invalid"]["rate"], 4),
                    _fmt(c["invalid"]["low"], 4),
                    _fmt(c["invalid"]["high"], 4),
                    *[_fmt(x, 4) for x in (lost_r or (None, None, None))],
                    *[_fmt(x, 4) for x in (unseen_r or (None, None, None))],
                    *[(c.get("unseen_classes") or {}).get(k, 0) for k in UNSEEN_CLASSES],
                    *[(c.get("contested_classes") or {}).get(k, 0) for k in OFFSET_CLASSES],
                    *[c["anomalies"].get(t, {}).get("count", 0) for t in types],
                ]
            )


def write_report(analysis: Analysis) -> Path:
    """Write every published file into analysis.out; returns the index.html path."""
    out = analysis.out
    out.mkdir(parents=True, exist_ok=True)
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    summary = {
        "generated": generated,
        "store": str(analysis.store),
        "runs": analysis.runs,
        "checked": analysis.checked,
        "malformed": analysis.malformed,
        "configs": analysis.configs,
        "per_run": analysis.per_run,
        "seconds": analysis.seconds,
    }
    (out / "summary.json").write_bytes(
        orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    _write_csv(analysis, out / "summary.csv")
    figures = _heatmaps(analysis.configs, out / "plots") if analysis.configs else []
    shutil.rmtree(out / "runs", ignore_errors=True)
    published = {r["run_id"]: publish_run(out, r["run_id"], r["path"]) for r in analysis.per_run}
    runs = []
    for r in analysis.per_run:
        href = published.get(r["run_id"])
        runs.append(dict(r, href=href, has_report=href is not None))
    worst = []
    for c in analysis.configs:
        for w in c["worst"]:
            if w["run_id"] not in published:
                published[w["run_id"]] = publish_run(out, w["run_id"], w["path"])
            href = published[w["run_id"]]
            has_report = href is not None
            worst.append(
                dict(
                    w,
                    setting=_setting(c),
                    acks=c["acks"],
                    consumer=c["consumer"],
                    nemesis=c["nemesis"],
                    href=href,
                    has_report=has_report,
                )
            )
    worst.sort(key=lambda w: -(w["rate"] or 0))
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(["html", "j2"]),
    )
    env.filters["rate"] = _fmt
    html = env.get_template("index.html.j2").render(
        generated=generated,
        analysis=analysis,
        configs=[dict(c, setting=_setting(c)) for c in analysis.configs],
        figures=figures,
        switches=switch_tables(analysis.configs),
        unseen_by_acks=unseen_by_acks(analysis.configs),
        storage=storage_rows(analysis.configs),
        unseen_classes=UNSEEN_CLASSES,
        contested_by_acks=contested_by_acks(analysis.configs),
        contested_classes=OFFSET_CLASSES,
        runs=runs,
        worst=worst[:20],
    )
    index = out / "index.html"
    index.write_text(html, encoding="utf-8")
    return index
