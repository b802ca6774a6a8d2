"""``isrlab cluster up|down|status``: the embedded network-namespace cluster from the shell.

``app`` is a ``typer.Typer`` the top-level CLI mounts as ``cluster``; it also runs on its own
(``python -m isrlab.harness.cluster.cli``). Every user-fixable problem (not root, missing package,
subnet clash, a bad name or node count) prints one message and exits with status 2, as
every isrlab command's errors do; no tracebacks. ``status`` exits 1 on an unhealthy cluster.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from isrlab.harness.cluster import embedded
from isrlab.harness.cluster.embedded import DEFAULT_NAME, ClusterError, ClusterStatus

app = typer.Typer(
    help="The embedded cluster: N nodes as network namespaces with their own sshd.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # `-h` is `--help`
)
# piped output would default to 80 columns and cut namespace names and addresses short
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True)


def _fail(e: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(2)


@app.command()
def up(
    node_count: int = typer.Option(
        5, "--node-count", "-n", help="number of nodes (n1..nN), as `isrlab test --node-count`"
    ),
    name: str = typer.Option(DEFAULT_NAME, "--name", help="cluster name"),
    subnet: str | None = typer.Option(
        None, "--subnet", help="private IPv4 /24 or larger (default 10.77.0.0/24 for 'default')"
    ),
    old_nodes: str | None = typer.Option(None, "--nodes", hidden=True, help="now --node-count"),
) -> None:
    """Create (or reuse, or repair) the cluster and print its nodes."""
    if old_nodes is not None:
        _fail(
            ClusterError(
                f"--nodes is now --node-count (a count; --nodes is a host list in `isrlab "
                f"test`): give --node-count {old_nodes}"
            )
        )
    try:
        c = embedded.up(name, node_count, subnet)
    except ClusterError as e:
        _fail(e)
        return
    console.print(
        f"cluster [bold]{c.name}[/] up: {len(c.nodes)} nodes on {c.bridge} ({c.subnet}); "
        f"ssh key {c.key_file}, known_hosts {c.known_hosts}",
        highlight=False,
    )
    _print_status(embedded.status(name))


@app.command()
def down(
    name: str = typer.Option(DEFAULT_NAME, "--name", help="cluster name"),
    keep_data: bool = typer.Option(
        False, "--keep-data", help="keep the nodes' working directories"
    ),
) -> None:
    """Kill everything in the cluster's namespaces and remove all it created."""
    try:
        removed = embedded.down(name, keep_data=keep_data)
    except ClusterError as e:
        _fail(e)
        return
    if removed:
        console.print(f"cluster [bold]{name}[/] removed: " + ", ".join(removed), highlight=False)
    else:
        console.print(f"cluster [bold]{name}[/] was not up; nothing to remove", highlight=False)


@app.command()
def status(
    name: str = typer.Option(DEFAULT_NAME, "--name", help="cluster name"),
    no_ssh: bool = typer.Option(False, "--no-ssh", help="skip the SSH login probe"),
) -> None:
    """Show nodes, addresses, sshd and SSH reachability; exit 1 if the cluster is unhealthy."""
    try:
        s = embedded.status(name, probe_ssh=not no_ssh)
    except ClusterError as e:
        _fail(e)
        return
    _print_status(s)
    if not s.healthy:
        raise typer.Exit(1)


def _yes(v: bool | None) -> str:
    if v is None:
        return "[dim]-[/]"
    return "[green]yes[/]" if v else "[red]no[/]"


def _print_status(s: ClusterStatus) -> None:
    if not s.exists:
        console.print(f"cluster [bold]{s.name}[/] is not up", highlight=False)
        return
    table = Table(title=f"cluster {s.name} ({s.subnet}, bridge {s.bridge})")
    for col in ("node", "netns", "address", "link", "sshd pid", "sshd up", "port 22", "ssh"):
        table.add_column(col)
    for h in s.nodes:
        table.add_row(
            h.name,
            h.netns if h.netns_ok else f"[red]{h.netns} (missing)[/]",
            h.address,
            _yes(h.link_ok),
            str(h.sshd_pid or "-"),
            _yes(h.sshd_up),
            _yes(h.ssh_port_open),
            _yes(h.ssh_ok),
        )
    console.print(table)
    state = "healthy" if s.healthy else "[red]unhealthy[/] (run `isrlab cluster up` to repair)"
    if not s.complete:
        state = "[red]incomplete[/] (an `up` did not finish; run up or down)"
    console.print(f"state: {state}; bridge {'up' if s.bridge_up else '[red]missing[/]'}")
    if s.libfaketime:
        console.print(f"clock skew: libfaketime at {s.libfaketime}", highlight=False)
    else:
        console.print(
            "[yellow]clock skew unavailable:[/] libfaketime not found (apt-get install faketime)"
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
