"""`isrlab serve`: browse the run store in a web browser.

Serves the store directory read-only over HTTP on 127.0.0.1 (by default) with an index page that
lists every run (test name, time, verdict, anomaly types, link to its report.html); everything
else is the run directories' own files (report.html, history.jsonl, node logs, ...).
"""

from __future__ import annotations

import functools
import html
import http.server
import json
from pathlib import Path
from typing import Annotated, Any

import typer


def list_runs(store: Path) -> list[dict[str, Any]]:
    runs = []
    for test_json in sorted(store.glob("*/*/test.json")):
        run = test_json.parent
        if run.is_symlink():
            continue
        row: dict[str, Any] = {"name": run.parent.name, "time": run.name, "path": run}
        results = run / "results.json"
        if results.exists():
            try:
                r = json.loads(results.read_text())
                row["valid"] = r.get("valid")
                row["anomalies"] = ", ".join(r.get("anomaly_types", []))
            except ValueError:
                row["valid"] = "unreadable"
        else:
            row["valid"] = "incomplete"
        runs.append(row)
    return sorted(runs, key=lambda r: r["time"], reverse=True)


def index_html(store: Path) -> str:
    rows = []
    for r in list_runs(store):
        rel = r["path"].relative_to(store)
        report = rel / "report.html"
        link = (
            f'<a href="/{report}">{html.escape(r["name"])}</a>'
            if (store / report).exists()
            else html.escape(r["name"])
        )
        valid = r.get("valid")
        color = "#d8f3dc" if valid is True else "#ffccd5" if valid is False else "#fff3b0"
        rows.append(
            f'<tr style="background:{color}"><td>{link}</td><td>{html.escape(r["time"])}</td>'
            f"<td>{html.escape(str(r.get('valid')))}</td>"
            f"<td>{html.escape(r.get('anomalies', ''))}</td>"
            f'<td><a href="/{rel}/">files</a></td></tr>'
        )
    body = (
        "\n".join(rows) or '<tr><td colspan="5">no runs yet: run <code>isrlab test</code></td></tr>'
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>isrlab store</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em}td,th{padding:4px 10px;"
        "border-bottom:1px solid #ddd;text-align:left}</style></head><body>"
        f"<h1>isrlab runs in {html.escape(str(store))}</h1><table><tr><th>test</th><th>time</th>"
        f"<th>valid</th><th>anomalies</th><th></th></tr>{body}</table></body></html>"
    )


class StoreHandler(http.server.SimpleHTTPRequestHandler):
    store: Path

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

    def log_message(self, format: str, *args: Any) -> None:  # quieter than the default
        pass


def make_server(store: Path, host: str, port: int) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(StoreHandler, directory=str(store))
    StoreHandler.store = store
    return http.server.ThreadingHTTPServer((host, port), handler)


def serve_command(
    store: Annotated[Path, typer.Argument(help="the run store")] = Path("store"),
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8080,
) -> None:
    """Browse the run store (reports, histories, logs) in a web browser."""
    if not 0 <= port <= 65535:
        typer.echo(f"isrlab serve: --port must be 0-65535 (0: any free port), not {port}", err=True)
        raise typer.Exit(2)
    if not store.is_dir():
        typer.echo(f"isrlab serve: no store at {store}: run `isrlab test` first", err=True)
        raise typer.Exit(2)
    try:
        server = make_server(store.resolve(), host, port)
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
