"""The published matrix report (issue 15): zero looks like nothing happened, every map uses the
same colour scale, titles are whole, and every link resolves once the report is moved away from
the store (it carries the run reports it links to). No Spark: `write_report` on a hand-built
Analysis."""

from __future__ import annotations

import html
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from isrlab.harness.report import render_report
from isrlab.pipeline.analyze import Analysis
from isrlab.pipeline.report import heatmap_figure, write_report

matplotlib = pytest.importorskip("matplotlib")


def _cell_rgba(fig: Any, value: float) -> tuple[float, ...]:
    im = fig.axes[0].images[0]
    return tuple(round(float(x), 4) for x in im.cmap(im.norm(value)))


def test_zero_is_white_and_no_data_is_not() -> None:
    fig = heatmap_figure([[0.0, float("nan")]], [["0.0", "no runs"]], ["acks=all"], ["a", "b"], "t")
    assert _cell_rgba(fig, 0.0) == (1.0, 1.0, 1.0, 1.0)
    im = fig.axes[0].images[0]
    assert tuple(im.cmap.get_bad())[:3] != (1.0, 1.0, 1.0)
    matplotlib.pyplot.close(fig)


def test_the_scale_is_the_same_in_every_map() -> None:
    one = heatmap_figure([[5.0]], [["5.0"]], ["acks=1"], ["kill"], "one cell")
    many = heatmap_figure(
        [[5.0, 500.0], [0.0, 50.0]], [["", ""], ["", ""]], ["acks=1", "acks=all"], ["a", "b"], "x"
    )
    assert _cell_rgba(one, 5.0) == _cell_rgba(many, 5.0)
    # A lone small value is not drawn as the darkest colour.
    assert _cell_rgba(one, 5.0) != _cell_rgba(many, 500.0)
    for fig in (one, many):
        matplotlib.pyplot.close(fig)


def test_titles_fit_in_the_figure() -> None:
    title = (
        "acked writes lost (unseen after the final drain) per 10k acked writes: eos, subscribe, "
        "min.insync=2, idempotence, txn, read_committed, unclean election, lag 4 s, zk session 4 s"
    )
    fig = heatmap_figure([[1.0]], [["1.0"]], ["acks=all"], ["kill"], title)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.axes[0].title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1
    matplotlib.pyplot.close(fig)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value and not value.startswith("#"):
                self.targets.append(value)


def _targets(page: Path) -> list[str]:
    p = _Links()
    p.feed(page.read_text())
    return p.targets


def _run(store: Path, name: str, with_report: bool) -> dict[str, Any]:
    d = store / name / "1"
    (d / "n1").mkdir(parents=True)
    ops = []
    for i, (p, typ, t) in enumerate([(0, "invoke", 1), (0, "ok", 2), ("nemesis", "info", 3)]):
        value = [["send", "t/0", 1]] if typ == "invoke" else [["send", "t/0", [0, 1]]]
        ops.append(
            {"index": i, "time": t * 10**8, "process": p, "type": typ, "f": "send", "value": value}
        )
    ops[-1].update(f="kill", value=None)
    (d / "history.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
    (d / "test.json").write_text(json.dumps({"name": name}))
    (d / "results.json").write_text(json.dumps({"valid": True, "anomalies": {}}))
    (d / "n1" / "server.log").write_text("x" * (2 << 20))  # too big to publish
    (d / "summary.txt").write_text("verdict: VALID\n")
    if with_report:
        render_report(d)
    return {
        "run_id": f"{name}/1",
        "path": str(d),
        "valid": "true",
        "status": "checked",
        "ops": 1,
        "acked_writes": 1,
        "invalid_count": 0,
        "anomaly_counts": {},
        "acks": "all",
        "consumer": "assign",
        "nemesis": "kill",
    }


def test_every_link_of_a_published_report_resolves(tmp_path: Path) -> None:
    store = tmp_path / "store"
    runs = [_run(store, "with report", True), _run(store, "without", False)]
    out = tmp_path / "analysis"
    analysis = Analysis(
        store=store, out=out, runs=2, checked=2, malformed=[], configs=[], per_run=runs
    )
    write_report(analysis)
    # Publish: the report alone, somewhere the store is not.
    published = tmp_path / "docs" / "matrix"
    shutil.copytree(out, published)
    shutil.rmtree(store)
    pages = [published / "index.html", *published.glob("runs/*/report.html")]
    assert len(pages) == 2
    for page in pages:
        for target in _targets(page):
            assert (page.parent / html.unescape(target)).is_file(), (page, target)
    index = (published / "index.html").read_text()
    assert "without/1 <span" in index and "(no report.html)" in index
    run_page = next(published.glob("runs/*/report.html")).read_text()
    assert 'href="summary.txt"' in run_page and 'href="results.json"' in run_page
    assert "n1/server.log <span" in run_page and "(not published)" in run_page
