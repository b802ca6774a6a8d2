"""`isrlab serve` (issue 15): only files under the store's real path are served (a symlink in
the store to anywhere else is refused), and the index, built from the harness's template, gives
each run's verdict, name, time and a link to its report that resolves."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from isrlab.harness.serve import make_server


def make_run(store: Path, name: str, stamp: str, valid: object, anomalies: list[str]) -> Path:
    run = store / name / stamp
    run.mkdir(parents=True)
    (run / "test.json").write_text(json.dumps({"name": name}))
    (run / "results.json").write_text(json.dumps({"valid": valid, "anomaly_types": anomalies}))
    (run / "report.html").write_text(f"<html>report of {name}</html>")
    return run


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    store = tmp_path / "store"
    good = make_run(store, "acks-all_kill", "20261124T055840", True, [])
    make_run(store, "acks-1_<partition>", "20261124T060102", False, ["lost-write"])
    (store / "latest").symlink_to(good.resolve())  # inside the store: served
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    (store / "passwd").symlink_to(secret)
    (good / "etc").symlink_to(tmp_path)  # a directory outside the store
    server = make_server(store, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_symlinks_out_of_the_store_are_not_followed(site: tuple[str, Path]) -> None:
    base, _ = site
    for path in ("/passwd", "/acks-all_kill/20261124T055840/etc/secret.txt", "/../secret.txt"):
        code, body = get(base + path)
        assert code == 404 and "root:x" not in body, path
    # what is in the store is served, through an in-store symlink too
    assert get(base + "/latest/report.html") == (200, "<html>report of acks-all_kill</html>")


def test_the_index_has_verdict_name_time_and_a_working_report_link(
    site: tuple[str, Path],
) -> None:
    base, _ = site
    code, page = get(base + "/")
    assert code == 200
    assert "VALID" in page and "INVALID" in page and "lost-write" in page
    assert "2026-11-24 05:58:40" in page and "acks-1_&lt;partition&gt;" in page
    assert "<partition>" not in page  # escaped by the template
    links = re.findall(r'href="([^"]+report\.html)"', page)
    assert len(links) == 2
    for link in links:
        code, body = get(base + link)
        assert code == 200 and body.startswith("<html>report of")


def test_an_empty_store_says_how_to_fill_it(tmp_path: Path) -> None:
    from isrlab.harness.serve import index_html

    assert "isrlab test" in index_html(tmp_path)
