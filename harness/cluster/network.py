"""Host-side network plumbing of the embedded cluster: namespaces, bridge, veths, iptables.

Every function here takes the cluster's recorded state (``state.ClusterState``) and touches only
what it lists: the bridge with the host address, one veth pair per node (host end on the bridge,
the other end renamed ``eth0`` inside the node's namespace), ``lo`` up in each namespace, the
FORWARD accept rule for the bridge, and ``/etc/netns/<netns>/hosts`` (bind-mounted over
``/etc/hosts`` by ``ip netns exec``). Creation is idempotent (existing pieces are reused) and so
is removal (missing pieces are skipped). Nodes get no default route: traffic stays inside the
cluster's subnet. Also here: processes by network namespace (``ip netns pids``), since the
nodes share the host's pid namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from isrlab.harness.cluster import state as st

SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ClusterError(Exception):
    """Something the user can fix; the message says what and how."""


def run(
    args: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run a host command (sbin dirs on PATH); ClusterError with its stderr if it fails."""
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    try:
        res = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except FileNotFoundError:
        raise ClusterError(f"command not found: {args[0]} (run `make setup`)") from None
    if check and res.returncode != 0:
        raise ClusterError(
            f"`{' '.join(args)}` failed with status {res.returncode}: {res.stderr.strip()}"
        )
    return res


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def netns_inode(ns: str) -> int | None:
    try:
        return os.stat(Path("/run/netns", ns)).st_ino
    except OSError:
        return None


def pid_in_netns(pid: int, ns: str) -> bool:
    """True if ``pid`` lives (not a zombie) inside network namespace ``ns``."""
    ino = netns_inode(ns)
    if ino is None:
        return False
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino != ino:
            return False
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def netns_pids(ns: str) -> list[int]:
    """Pids of the processes inside namespace ``ns`` (the nodes share the host's pid space)."""
    if not netns_exists(ns):
        return []
    res = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def tcp_banner(address: str, port: int = 22, timeout: float = 2.0) -> bool:
    """True if something at address:port speaks SSH (sends an SSH- banner)."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_banner(address: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tcp_banner(address, timeout=1.0):
            return True
        time.sleep(0.05)
    return False


def hosts_file(s: st.ClusterState, me: st.NodeState) -> str:
    """The /etc/hosts a node sees: every node by name, and the host as ``isrlab-host``."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{s.host_address}\tisrlab-host",
    ]
    lines += [f"{n.address}\t{n.name}" for n in s.nodes]
    return f"# isrlab embedded cluster {s.name}, seen from {me.name}\n" + "\n".join(lines) + "\n"


def check_conflicts(p: st.ClusterState) -> None:
    """ClusterError if ``p``'s subnet overlaps another cluster's or a host interface's."""
    net = ipaddress.ip_network(p.subnet)
    for other in st.all_states():
        if other.name != p.name and ipaddress.ip_network(other.subnet).overlaps(net):
            raise ClusterError(
                f"subnet {p.subnet} overlaps cluster {other.name!r} ({other.subnet}); "
                f"pass another --subnet or bring that cluster down"
            )
    res = run(["ip", "-4", "-o", "addr", "show"], check=False)
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and parts[1] != p.bridge:
            iface = ipaddress.ip_interface(parts[3])
            if iface.network.overlaps(net):
                raise ClusterError(
                    f"subnet {p.subnet} overlaps {iface} on interface {parts[1]}; "
                    f"pass another --subnet"
                )


GUARD_METRIC = "4242"


def build_network(s: st.ClusterState) -> None:
    """Create (or complete) the bridge, rules, namespaces and veths of ``s``."""
    prefix = ipaddress.ip_network(s.subnet).prefixlen
    # Guard: an unreachable route for the subnet under the bridge's own route. While the bridge
    # exists its route wins; once it is gone (after `down`), packets for node addresses from a
    # client still alive in the harness fail here with EHOSTUNREACH instead of leaving the
    # machine by its default route. The guard stays after teardown on purpose (it is inert).
    run(["ip", "route", "replace", "unreachable", s.subnet, "metric", GUARD_METRIC])
    if not link_exists(s.bridge):
        run(["ip", "link", "add", s.bridge, "type", "bridge"])
    run(["ip", "addr", "replace", f"{s.host_address}/{prefix}", "dev", s.bridge])
    run(["ip", "link", "set", s.bridge, "up"])
    for rule in s.iptables:
        if run(["iptables", "-w", "-C", *rule], check=False).returncode != 0:
            run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
    for n in s.nodes:
        if not netns_exists(n.netns):
            run(["ip", "netns", "add", n.netns])
        if not link_exists(n.veth_host):
            peer = "isp" + n.veth_host[3:]
            run(["ip", "link", "add", n.veth_host, "type", "veth", "peer", "name", peer])
            run(["ip", "link", "set", peer, "netns", n.netns])
            run(["ip", "-n", n.netns, "link", "set", peer, "name", "eth0"])
        run(["ip", "link", "set", n.veth_host, "master", s.bridge])
        run(["ip", "link", "set", n.veth_host, "up"])
        run(["ip", "-n", n.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", n.netns, "addr", "replace", f"{n.address}/{prefix}", "dev", "eth0"])
        run(["ip", "-n", n.netns, "link", "set", "eth0", "up"])


def network_ok(s: st.ClusterState) -> bool:
    """Bridge, rules, namespaces, veths and node addresses are all in place."""
    if not link_exists(s.bridge):
        return False
    for rule in s.iptables:
        if run(["iptables", "-w", "-C", *rule], check=False).returncode != 0:
            return False
    for n in s.nodes:
        if not (netns_exists(n.netns) and link_exists(n.veth_host)):
            return False
        addrs = run(["ip", "-n", n.netns, "-4", "-o", "addr", "show", "dev", "eth0"], check=False)
        if f" {n.address}/" not in addrs.stdout:
            return False
    return True


def kill_netns_processes(namespaces: Sequence[str]) -> list[int]:
    """SIGKILL every process in the given namespaces (brokers, ZooKeeper, sshd); their pids."""
    killed: set[int] = set()
    for _ in range(20):
        pids = [p for ns in namespaces for p in netns_pids(ns) if p != os.getpid()]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
                killed.add(p)
        time.sleep(0.05)
    return sorted(killed)


def teardown_network(s: st.ClusterState) -> list[str]:
    """Remove the rules, veths, namespaces, /etc/netns entries and bridge of ``s``."""
    removed: list[str] = []
    for rule in s.iptables:
        while run(["iptables", "-w", "-C", *rule], check=False).returncode == 0:
            run(["iptables", "-w", "-D", *rule])
            removed.append("iptables " + " ".join(rule))
    for n in s.nodes:
        if link_exists(n.veth_host):
            run(["ip", "link", "del", n.veth_host], check=False)
            removed.append(f"veth {n.veth_host}")
        if netns_exists(n.netns):
            run(["ip", "netns", "del", n.netns], check=False)
            removed.append(f"netns {n.netns}")
        etc = Path(n.etc_netns_dir)
        if etc.exists():
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(str(etc))
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only if empty: other tools may use it
    if link_exists(s.bridge):
        run(["ip", "link", "del", s.bridge], check=False)
        removed.append(f"bridge {s.bridge}")
    return removed
