"""`isrlab serve`: browse the run store in a web browser.

Serves the store directory read-only over HTTP on 127.0.0.1 (by default). The index page
(`index_html`, rendered from ``serve_index.html.j2``) lists every run, newest first: its verdict,
test name, time, anomaly types, a link to its report.html and to its folder; everything else is
the run directories' own files (report.html, history.jsonl, node logs, ...). Only files whose
real path is under the store's real path are served: a symlink in the store that leads
elsewhere (``/etc/passwd``) is answered 404, while the store's own ``latest`` links, which
point at runs in the store, work.
"""

from __future__ import annotations

import functools
import http.server
import json
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import jinja2
import typer

TEMPLATE = "serve_index.html.j2"


def _inside(path: Path, root: Path) -> bool:
    """``path``'s real path (symlinks followed) exists and is ``root`` or under it."""
    try:
        return path.resolve(strict=True).is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def _time(stamp: str) -> str:
    """A run folder's name (``20261124T055840`` or ``...-2``) as a readable UTC time."""
    try:
        return datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return stamp


def list_runs(store: Path) -> list[dict[str, Any]]:
    """Every run folder of ``store`` (``<name>/<time>/test.json``), newest first."""
    root = store.resolve()
    runs = []
    for test_json in sorted(store.glob("*/*/test.json")):
        run = test_json.parent
        if run.is_symlink() or not _inside(test_json, root):
            continue
        row: dict[str, Any] = {"name": run.parent.name, "time": run.name, "path": run}
        results = run / "results.json"
        if results.exists() and _inside(results, root):
            try:
                r = json.loads(results.read_text())
                row["valid"] = r.get("valid")
                row["anomalies"] = ", ".join(str(a) for a in r.get("anomaly_types", []))
            except (ValueError, AttributeError, OSError):
                row["valid"] = "unreadable"
        else:
            row["valid"] = "incomplete"
        runs.append(row)
    return sorted(runs, key=lambda r: r["time"], reverse=True)


def _href(rel: Path, trailing: str = "") -> str:
    return "/" + urllib.parse.quote(rel.as_posix()) + trailing


def index_html(store: Path) -> str:
    """The index page: one row per run (verdict, name, time, anomalies, report, files)."""
    root = store.resolve()
    rows = []
    for r in list_runs(store):
        rel = r["path"].relative_to(store)
        valid = r.get("valid")
        verdict = "VALID" if valid is True else "INVALID" if valid is False else str(valid).upper()
        report = store / rel / "report.html"
        rows.append(
            {
                "verdict": verdict,
                "verdict_class": verdict.lower() if valid in (True, False) else "unknown",
                "name": r["name"],
                "time": _time(r["time"]),
                "anomalies": r.get("anomalies", ""),
                "report": _href(rel / "report.html") if _inside(report, root) else None,
                "files": _href(rel, "/"),
            }
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )
    return env.get_template(TEMPLATE).render(store=str(store), runs=rows)


class StoreHandler(http.server.SimpleHTTPRequestHandler):
    store: Path  # the store's real path

    def do_GET(self) -> None:
        if self.path in ("/", "/index.html"):
            data = index_html(self.store).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()

    def send_head(self) -> Any:
        # Everything served (files, directory listings, GET and HEAD) is checked here: the
        # real path must be under the store's real path.
        if not _inside(Path(self.translate_path(self.path)), self.store):
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:  # quieter than the default
        pass


def make_server(store: Path, host: str, port: int) -> http.server.ThreadingHTTPServer:
    root = store.resolve()
    handler = functools.partial(StoreHandler, directory=str(root))
    StoreHandler.store = root
    return http.server.ThreadingHTTPServer((host, port), handler)


def serve_command(
    store: Annotated[Path, typer.Argument(help="the run store")] = Path("store"),
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0-65535; 0: any free port)")] = 8080,
) -> None:
    """Browse the run store (reports, histories, logs) in a web browser: an index of every
    run (verdict, name, time, report); only files under the store's real path are served."""
    if not 0 <= port <= 65535:
        typer.echo(f"isrlab serve: --port must be 0-65535 (0: any free port), not {port}", err=True)
        raise typer.Exit(2)
    if not store.is_dir():
        typer.echo(f"isrlab serve: no store at {store}: run `isrlab test` first", err=True)
        raise typer.Exit(2)
    try:
        server = make_server(store, host, port)
    except OSError as e:
        typer.echo(f"isrlab serve: cannot listen on {host}:{port}: {e.strerror}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"serving {store} at http://{host}:{server.server_address[1]}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
