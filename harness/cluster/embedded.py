"""An N-node cluster on one Linux host: network namespaces on a bridge, each with its own sshd.

Topology (cluster ``default``; other names get their own bridge and subnet, see ``plan``)::

    host: bridge isrlab0 10.77.0.1/24 ─┬─ veth ─ netns isrlab-default-n1: eth0 10.77.0.11, lo
                                       ├─ veth ─ netns isrlab-default-n2: eth0 10.77.0.12, lo
                                       └─ ...

Nodes have no default route: they reach each other and the host, nothing else. Each node runs
``/usr/sbin/sshd`` in its namespace (started with ``ip netns exec``, in its own UTS namespace so
``hostname`` prints the node name) listening on ``<address>:22``: root login by key only, a
per-run ed25519 client key and per-run host keys, so the harness connects with a strict
known_hosts it wrote itself (``EmbeddedCluster.ssh``). ``/etc/netns/<netns>/hosts`` maps every
node name to its address; ``ip netns exec`` bind-mounts it over ``/etc/hosts`` for sshd and
everything started through it, so nodes resolve each other by name. Each node gets a working
directory ``/var/lib/isrlab/<cluster>/<node>``.

The namespaces share the host's filesystem (the checkout and its .venv are usable on every node),
its pid namespace (use pid files, or ``Remote.signal_pattern`` which filters by network
namespace) and its kernel clock. Clock faults on embedded nodes therefore start daemons under
libfaketime: ``start_daemon(..., env={"LD_PRELOAD": libfaketime_path(),
"FAKETIME_TIMESTAMP_FILE": <file holding e.g. "+2s">, "FAKETIME_NO_CACHE": "1"})`` and rewrite
the file to skew; ``status`` reports whether libfaketime is installed.

This module owns the cluster's shape and lifecycle; ``network`` does the namespaces, links and
rules, ``sshd`` the per-node sshd and its keys (``keys``), ``state`` the state file.

Lifecycle (all under a per-cluster file lock, all recorded in the state file, see ``state``):

``up(name, n, subnet)``
    reuses a healthy cluster of the same size; restarts sshd where only sshd died; otherwise
    tears down whatever is recorded and builds afresh.
``down(name)``
    kills every process in the cluster's namespaces (brokers and ZooKeeper run in there), then
    removes the iptables rules, veths, namespaces, bridge, /etc/netns entries, run and data
    directories that the state file lists. Idempotent; works after the creating process died.
``status(name)``
    per-node namespace, address, sshd pid, sshd alive, SSH reachable; faketime availability.
``embedded_cluster(n, name)``
    a context manager around up/down that also tears down on SIGINT/SIGTERM and at exit.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2, openssh-server, iptables and
util-linux; otherwise ``ClusterError`` says what is missing and how to use real hosts instead.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import ipaddress
import os
import shutil
import signal
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from isrlab.harness.cluster import network, sshd
from isrlab.harness.cluster import state as st
from isrlab.harness.cluster.network import ClusterError
from isrlab.harness.inventory import Inventory, Node, SshOptions
from isrlab.harness.remote import Remote
from isrlab.harness.ssh import ConnectionPool

DEFAULT_NAME = "default"
DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_BRIDGE = "isrlab0"
FIRST_NODE_HOST = 11  # n1 = .11, n2 = .12, ...
MAX_NODES = 200

# tool -> Debian package that provides it
REQUIRED_TOOLS: dict[str, str] = {
    "ip": "iproute2",
    "iptables": "iptables",
    "unshare": "util-linux",
    "hostname": "hostname",
}


CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


# --------------------------------------------------------------------------------------------
# Preflight


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def has_admin_privileges() -> bool:
    """Root, or both CAP_NET_ADMIN (links, addresses) and CAP_SYS_ADMIN (namespaces, mounts)."""
    if os.geteuid() == 0:
        return True
    caps = _effective_caps()
    return bool(caps >> CAP_NET_ADMIN & 1) and bool(caps >> CAP_SYS_ADMIN & 1)


def find_tool(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + network.SBIN_PATH)


def preflight() -> None:
    """Raise ClusterError unless this process can build an embedded cluster."""
    if not has_admin_privileges():
        raise ClusterError(
            "the embedded cluster needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) to create "
            "network namespaces, a bridge and veth pairs.\n"
            "  Run it as root (e.g. `sudo .venv/bin/isrlab cluster up`), or test against real "
            "hosts or Vagrant VMs instead with `--nodes-file nodes.yaml` (see vagrant/README.md)."
        )
    missing = [(t, p) for t, p in REQUIRED_TOOLS.items() if find_tool(t) is None]
    if not os.access(sshd.SSHD, os.X_OK):
        missing.append((sshd.SSHD, "openssh-server"))
    if missing:
        pkgs = sorted({p for _, p in missing})
        raise ClusterError(
            f"missing tools for the embedded cluster: {', '.join(t for t, _ in missing)}.\n"
            f"  Install them with: apt-get install -y {' '.join(pkgs)}   (or run `make setup`)"
        )


def libfaketime_path() -> str | None:
    """Where libfaketime.so.1 lives (for LD_PRELOAD clock skew), or None."""
    hits = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + sorted(
        glob.glob("/usr/lib/faketime/libfaketime.so.1")
    )
    return hits[0] if hits else None


# --------------------------------------------------------------------------------------------
# The cluster as the harness sees it


@dataclass(frozen=True)
class EmbeddedCluster:
    """A running embedded cluster: its nodes (as inventory.Node) and how to reach them."""

    name: str
    subnet: str
    bridge: str
    host_address: str
    nodes: tuple[Node, ...]
    ssh: SshOptions
    workdirs: dict[str, str]
    netns: dict[str, str]
    key_file: str
    known_hosts: str

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in cluster {self.name} ({', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def workdir(self, name: str) -> str:
        return self.workdirs[name]

    def remote(self, name: str, pool: ConnectionPool | None = None) -> Remote:
        return Remote(self.node(name), self.ssh, pool)

    @property
    def inventory(self) -> Inventory:
        """The same shape ``inventory.load_inventory`` gives for real hosts."""
        return Inventory(list(self.nodes), self.ssh)

    @classmethod
    def from_state(cls, s: st.ClusterState) -> EmbeddedCluster:
        nodes = tuple(
            Node(name=n.name, host=n.address, port=22, user="root", key_file=s.key_file)
            for n in s.nodes
        )
        return cls(
            name=s.name,
            subnet=s.subnet,
            bridge=s.bridge,
            host_address=s.host_address,
            nodes=nodes,
            ssh=SshOptions(
                host_key_policy="strict", known_hosts=s.known_hosts, connect_timeout=5.0
            ),
            workdirs={n.name: n.workdir for n in s.nodes},
            netns={n.name: n.netns for n in s.nodes},
            key_file=s.key_file,
            known_hosts=s.known_hosts,
        )


# --------------------------------------------------------------------------------------------
# Planning


def _tag(name: str) -> str:
    return f"{zlib.crc32(name.encode()):08x}"[:6]


def default_subnet(name: str) -> str:
    """10.77.0.0/24 for the default cluster, 10.77.X.0/24 (X in 1..199 from a hash of the name)
    otherwise; 10.77.200-255.0/24 are never picked, for tests and explicit ``--subnet``s."""
    if name == DEFAULT_NAME:
        return DEFAULT_SUBNET
    return f"10.77.{1 + zlib.crc32(name.encode()) % 199}.0/24"


def _validate_name(name: str) -> None:
    if not name or len(name) > 32 or not all(c.isalnum() or c in "-_" for c in name):
        raise ClusterError(f"bad cluster name {name!r}: use 1-32 letters, digits, '-' or '_'")


def plan(name: str = DEFAULT_NAME, n: int = 5, subnet: str | None = None) -> st.ClusterState:
    """The full inventory a cluster will have, derived only from its name, size and subnet."""
    _validate_name(name)
    if not 1 <= n <= MAX_NODES:
        raise ClusterError(f"node count must be between 1 and {MAX_NODES}, not {n}")
    try:
        net = ipaddress.ip_network(subnet or default_subnet(name))
    except ValueError as e:
        raise ClusterError(f"bad subnet {subnet!r}: {e}") from None
    if not isinstance(net, ipaddress.IPv4Network) or net.num_addresses < FIRST_NODE_HOST + n + 1:
        raise ClusterError(f"subnet {net} must be IPv4 and hold .1 and .{FIRST_NODE_HOST}..")
    if not net.is_private:
        raise ClusterError(f"subnet {net} is not a private range; pick e.g. 10.77.0.0/24")
    tag = _tag(name)
    bridge = DEFAULT_BRIDGE if name == DEFAULT_NAME else f"isrb{tag}"
    run_dir = st.STATE_DIR / name
    data_dir = st.DATA_ROOT / name
    nodes = []
    for i in range(1, n + 1):
        node = f"n{i}"
        ns = f"isrlab-{name}-{node}"
        nodes.append(
            st.NodeState(
                name=node,
                netns=ns,
                address=str(net.network_address + FIRST_NODE_HOST + i - 1),
                veth_host=f"isv{tag}{i}",
                etc_netns_dir=f"/etc/netns/{ns}",
                workdir=str(data_dir / node),
                sshd_config=str(run_dir / f"sshd-{node}.conf"),
                sshd_pidfile=str(run_dir / f"sshd-{node}.pid"),
                sshd_log=str(run_dir / f"sshd-{node}.log"),
            )
        )
    comment = f"isrlab:{name}"
    return st.ClusterState(
        name=name,
        subnet=str(net),
        bridge=bridge,
        host_address=str(net.network_address + 1),
        run_dir=str(run_dir),
        data_dir=str(data_dir),
        key_file=str(run_dir / "id_ed25519"),
        known_hosts=str(run_dir / "known_hosts"),
        nodes=nodes,
        # br_netfilter passes bridged frames through FORWARD; a DROP policy (Docker sets one)
        # would otherwise cut nodes off from each other
        iptables=[
            [
                "FORWARD",
                *f"-i {bridge} -o {bridge} -m comment --comment {comment}".split(),
                "-j",
                "ACCEPT",
            ],
        ],
        created_by_pid=os.getpid(),
        created_at=time.time(),
    )


# --------------------------------------------------------------------------------------------
# Health


@dataclass(frozen=True)
class NodeHealth:
    name: str
    netns: str
    address: str
    netns_ok: bool
    link_ok: bool
    sshd_pid: int | None
    sshd_up: bool
    ssh_port_open: bool
    ssh_ok: bool | None  # None: not probed


def _node_health(s: st.ClusterState, n: st.NodeState, probe_ssh: bool) -> NodeHealth:
    netns_ok = network.netns_exists(n.netns)
    link_ok = network.link_exists(n.veth_host)
    sshd_up = sshd.sshd_alive(n)
    port_open = sshd_up and network.tcp_banner(n.address)
    ssh_ok: bool | None = None
    if probe_ssh:
        ssh_ok = False
        if port_open:
            c = EmbeddedCluster.from_state(s)
            pool = ConnectionPool()
            try:
                opts = SshOptions(
                    host_key_policy="strict",
                    known_hosts=s.known_hosts,
                    connect_timeout=3.0,
                    connect_retries=1,
                )
                res = Remote(c.node(n.name), opts, pool).exec("hostname", check=False, timeout=5)
                ssh_ok = res.ok and res.stdout.strip() == n.name
            except Exception:
                ssh_ok = False
            finally:
                pool.close()
    return NodeHealth(
        n.name, n.netns, n.address, netns_ok, link_ok, n.sshd_pid, sshd_up, port_open, ssh_ok
    )


# --------------------------------------------------------------------------------------------
# up / down / status


def up(name: str = DEFAULT_NAME, n: int = 5, subnet: str | None = None) -> EmbeddedCluster:
    """Bring cluster ``name`` up with ``n`` nodes (idempotent; see the module docstring)."""
    preflight()
    wanted = plan(name, n, subnet)
    with st.cluster_lock(name):
        cur = st.load_state(name)
        if subnet is None and cur is not None:
            # `up --name x` after `up --name x --subnet y` means the same cluster, not a move
            wanted = plan(name, n, cur.subnet)
        if (
            cur is not None
            and cur.complete
            and cur.subnet == wanted.subnet
            and [x.name for x in cur.nodes] == [x.name for x in wanted.nodes]
            and Path(cur.key_file).is_file()
            and Path(cur.known_hosts).is_file()
            and network.network_ok(cur)
        ):
            # the network is intact: reuse it, restarting any sshd that died
            for node in cur.nodes:
                if not sshd.sshd_alive(node):
                    sshd.start_sshd(cur, node.name)
            for node in cur.nodes:
                if not network.wait_banner(node.address):
                    break
            else:
                return EmbeddedCluster.from_state(cur)
        if cur is not None:
            _teardown(cur, keep_data=False)
        # remove leftovers of a crashed run whose state file is gone too
        _teardown(wanted, keep_data=False)
        network.check_conflicts(wanted)
        st.save_state(wanted)  # record the plan before creating anything
        try:
            sshd.write_ssh_files(wanted)
            st.save_state(wanted)
            network.build_network(wanted)
            for node in wanted.nodes:
                sshd.start_sshd(wanted, node.name)
            for node in wanted.nodes:
                if not network.wait_banner(node.address):
                    raise ClusterError(
                        f"sshd on {node.name} ({node.address}:22) does not answer; "
                        f"see {node.sshd_log}"
                    )
            wanted.complete = True
            st.save_state(wanted)
        except BaseException:
            _teardown(wanted, keep_data=False)
            raise
        return EmbeddedCluster.from_state(wanted)


def _teardown(s: st.ClusterState, keep_data: bool) -> list[str]:
    removed: list[str] = []
    killed = network.kill_netns_processes([n.netns for n in s.nodes])
    killed += sshd.kill_recorded_sshd(s)
    if killed:
        removed.append(f"killed {len(set(killed))} process(es)")
    removed += network.teardown_network(s)
    if Path(s.run_dir).exists():
        shutil.rmtree(s.run_dir, ignore_errors=True)
        removed.append(s.run_dir)
    if not keep_data and Path(s.data_dir).exists():
        shutil.rmtree(s.data_dir, ignore_errors=True)
        removed.append(s.data_dir)
    st.remove_state(s.name)
    return removed


def down(name: str = DEFAULT_NAME, *, keep_data: bool = False) -> list[str]:
    """Remove everything cluster ``name`` created; returns what was removed (empty if nothing)."""
    preflight()
    _validate_name(name)
    with st.cluster_lock(name):
        cur = st.load_state(name)
        removed = []
        if cur is not None:
            removed += _teardown(cur, keep_data)
        # names are derived from the cluster name, so a lost state file still gets cleaned;
        # the node count is unknown then, so sweep every possible node
        subnet = cur.subnet if cur else None
        capacity = ipaddress.ip_network(subnet or default_subnet(name)).num_addresses
        sweep = plan(name, min(MAX_NODES, capacity - FIRST_NODE_HOST - 1), subnet)
        sweep.nodes = [
            x
            for x in sweep.nodes
            if network.netns_exists(x.netns) or network.link_exists(x.veth_host)
        ]
        removed += _teardown(sweep, keep_data)
        return removed


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    exists: bool
    complete: bool
    subnet: str
    bridge: str
    bridge_up: bool
    nodes: list[NodeHealth]
    faketime: str | None
    libfaketime: str | None

    @property
    def healthy(self) -> bool:
        return (
            self.exists
            and self.complete
            and self.bridge_up
            and all(
                h.netns_ok and h.link_ok and h.sshd_up and h.ssh_port_open and h.ssh_ok is not False
                for h in self.nodes
            )
        )


def status(name: str = DEFAULT_NAME, *, probe_ssh: bool = True) -> ClusterStatus:
    """Health of cluster ``name`` (does not need the lock; only reads)."""
    _validate_name(name)
    cur = st.load_state(name)
    faketime = find_tool("faketime")
    lib = libfaketime_path()
    if cur is None:
        return ClusterStatus(name, False, False, "", "", False, [], faketime, lib)
    return ClusterStatus(
        name=name,
        exists=True,
        complete=cur.complete,
        subnet=cur.subnet,
        bridge=cur.bridge,
        bridge_up=network.link_exists(cur.bridge),
        nodes=[_node_health(cur, n, probe_ssh) for n in cur.nodes],
        faketime=faketime,
        libfaketime=lib,
    )


def get(name: str = DEFAULT_NAME) -> EmbeddedCluster:
    """The running cluster ``name`` (from its state file), without touching it."""
    cur = st.load_state(name)
    if cur is None or not cur.complete:
        raise ClusterError(f"cluster {name!r} is not up; run `isrlab cluster up --name {name}`")
    return EmbeddedCluster.from_state(cur)


def sshd_stop(name: str, node: str) -> None:
    """Kill ``node``'s listening sshd (a fault, or a test of SSH retries)."""
    cur = st.load_state(name)
    if cur is None:
        raise ClusterError(f"cluster {name!r} is not up")
    sshd.stop_sshd(cur, node)


def sshd_start(name: str, node: str) -> int:
    """Start ``node``'s sshd again; returns its pid."""
    cur = st.load_state(name)
    if cur is None:
        raise ClusterError(f"cluster {name!r} is not up")
    return sshd.start_sshd(cur, node)


# --------------------------------------------------------------------------------------------
# Context manager


@contextlib.contextmanager
def embedded_cluster(
    n: int = 5, name: str = DEFAULT_NAME, subnet: str | None = None, *, keep: bool = False
) -> Iterator[EmbeddedCluster]:
    """Bring the cluster up (reusing a healthy one), yield it, tear it down afterwards.

    Teardown also happens on an exception, on SIGINT/SIGTERM (turned into KeyboardInterrupt /
    SystemExit while inside the block, when running in the main thread) and at interpreter exit.
    ``keep=True`` leaves the cluster running.
    """
    import threading

    def teardown() -> None:
        with contextlib.suppress(Exception):
            down(name)

    previous: dict[int, Any] = {}
    in_main = threading.current_thread() is threading.main_thread()

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if in_main:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_term)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    run = st.run_lock(name)
    try:
        run.__enter__()  # before anything is torn down: the cluster may be another run's
    except st.ClusterBusy as e:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise ClusterError(str(e)) from None
    if not keep:
        atexit.register(teardown)
    try:
        yield up(name, n, subnet)
    finally:
        try:
            if not keep:
                # a second Ctrl-C during teardown must not leave half a cluster behind
                masked: dict[int, Any] = {}
                if in_main:
                    for mask in (signal.SIGINT, signal.SIGTERM):
                        masked[mask] = signal.signal(mask, signal.SIG_IGN)
                try:
                    down(name)
                finally:
                    for num, handler in masked.items():
                        signal.signal(num, handler)
                atexit.unregister(teardown)
        finally:
            run.__exit__(None, None, None)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
