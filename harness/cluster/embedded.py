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
namespace) and its kernel clock: clock faults on embedded nodes start daemons under libfaketime
(``status`` reports whether it is installed).

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
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from harness.cluster import state as st
from harness.cluster.keys import generate_keypair, known_hosts_lines
from harness.control import ConnectionPool, Node, Remote, SshOptions

DEFAULT_NAME = "default"
DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_BRIDGE = "isrlab0"
FIRST_NODE_HOST = 11  # n1 = .11, n2 = .12, ...
MAX_NODES = 200
SSHD = "/usr/sbin/sshd"

# tool -> Debian package that provides it
REQUIRED_TOOLS: dict[str, str] = {
    "ip": "iproute2",
    "iptables": "iptables",
    "unshare": "util-linux",
    "hostname": "hostname",
}

_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


class ClusterError(Exception):
    """Something the user can fix; the message says what and how."""


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
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + _SBIN_PATH)


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
    if not os.access(SSHD, os.X_OK):
        missing.append((SSHD, "openssh-server"))
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
# Shell helpers


def _run(
    args: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":" + _SBIN_PATH)
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


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _netns_inode(ns: str) -> int | None:
    try:
        return os.stat(Path("/run/netns", ns)).st_ino
    except OSError:
        return None


def _pid_in_netns(pid: int, ns: str) -> bool:
    """True if ``pid`` lives (not a zombie) inside network namespace ``ns``."""
    ino = _netns_inode(ns)
    if ino is None:
        return False
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino != ino:
            return False
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _netns_pids(ns: str) -> list[int]:
    if not _netns_exists(ns):
        return []
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _tcp_banner(address: str, port: int = 22, timeout: float = 2.0) -> bool:
    """True if something at address:port speaks SSH (sends an SSH- banner)."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# The cluster as the harness sees it


@dataclass(frozen=True)
class EmbeddedCluster:
    """A running embedded cluster: its nodes (as control.Node) and how to reach them."""

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
    """10.77.0.0/24 for the default cluster, 10.77.X.0/24 (X from a hash of the name) otherwise."""
    if name == DEFAULT_NAME:
        return DEFAULT_SUBNET
    return f"10.77.{1 + zlib.crc32(name.encode()) % 250}.0/24"


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


def _check_conflicts(p: st.ClusterState) -> None:
    net = ipaddress.ip_network(p.subnet)
    for other in st.all_states():
        if other.name != p.name and ipaddress.ip_network(other.subnet).overlaps(net):
            raise ClusterError(
                f"subnet {p.subnet} overlaps cluster {other.name!r} ({other.subnet}); "
                f"pass another --subnet or bring that cluster down"
            )
    res = _run(["ip", "-4", "-o", "addr", "show"], check=False)
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and parts[1] != p.bridge:
            iface = ipaddress.ip_interface(parts[3])
            if iface.network.overlaps(net):
                raise ClusterError(
                    f"subnet {p.subnet} overlaps {iface} on interface {parts[1]}; "
                    f"pass another --subnet"
                )


# --------------------------------------------------------------------------------------------
# Building


def _sshd_config(s: st.ClusterState, n: st.NodeState, host_key: str) -> str:
    return "\n".join(
        [
            f"# isrlab embedded cluster {s.name}, node {n.name}",
            f"ListenAddress {n.address}",
            "Port 22",
            f"HostKey {host_key}",
            f"PidFile {n.sshd_pidfile}",
            f"AuthorizedKeysFile {s.run_dir}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            # keys live under /run/isrlab/<name>, 0700 root; StrictModes would also demand
            # the same of every parent, which a custom ISRLAB_STATE_DIR may not satisfy
            "StrictModes no",
            # the harness multiplexes many channels (client threads) over one connection
            "MaxSessions 256",
            "MaxStartups 200:30:400",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
            # Debian's bash sources ~/.bashrc for `ssh host cmd` when SHLVL < 2; root's bashrc
            # on a dev box (pyenv, conda...) costs ~100 ms per command and varies per machine
            "SetEnv SHLVL=1",
            "",
        ]
    )


def _hosts_file(s: st.ClusterState, me: st.NodeState) -> str:
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{s.host_address}\tisrlab-host",
    ]
    lines += [f"{n.address}\t{n.name}" for n in s.nodes]
    return f"# isrlab embedded cluster {s.name}, seen from {me.name}\n" + "\n".join(lines) + "\n"


def _build_network(s: st.ClusterState) -> None:
    prefix = ipaddress.ip_network(s.subnet).prefixlen
    if not _link_exists(s.bridge):
        _run(["ip", "link", "add", s.bridge, "type", "bridge"])
    _run(["ip", "addr", "replace", f"{s.host_address}/{prefix}", "dev", s.bridge])
    _run(["ip", "link", "set", s.bridge, "up"])
    for rule in s.iptables:
        if _run(["iptables", "-w", "-C", *rule], check=False).returncode != 0:
            _run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
    for n in s.nodes:
        if not _netns_exists(n.netns):
            _run(["ip", "netns", "add", n.netns])
        if not _link_exists(n.veth_host):
            peer = "isp" + n.veth_host[3:]
            _run(["ip", "link", "add", n.veth_host, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", peer, "netns", n.netns])
            _run(["ip", "-n", n.netns, "link", "set", peer, "name", "eth0"])
        _run(["ip", "link", "set", n.veth_host, "master", s.bridge])
        _run(["ip", "link", "set", n.veth_host, "up"])
        _run(["ip", "-n", n.netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", n.netns, "addr", "replace", f"{n.address}/{prefix}", "dev", "eth0"])
        _run(["ip", "-n", n.netns, "link", "set", "eth0", "up"])


def _write_files(s: st.ClusterState) -> None:
    run_dir = Path(s.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    client_pub = generate_keypair(Path(s.key_file), f"isrlab-{s.name}")
    (run_dir / "authorized_keys").write_text(client_pub + "\n")
    os.chmod(run_dir / "authorized_keys", 0o600)
    entries = []
    for n in s.nodes:
        host_key = run_dir / f"ssh_host_ed25519_key-{n.name}"
        n.host_key_pub = generate_keypair(host_key, f"root@{n.name}")
        entries.append(([n.address, n.name], n.host_key_pub))
        Path(n.sshd_config).write_text(_sshd_config(s, n, str(host_key)))
        etc = Path(n.etc_netns_dir)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(_hosts_file(s, n))
        Path(n.workdir).mkdir(parents=True, exist_ok=True)
    Path(s.known_hosts).write_text(known_hosts_lines(entries))


def start_sshd(s: st.ClusterState, node: str) -> int:
    """(Re)start sshd on ``node``; returns its pid. Records it in the state file."""
    n = next(x for x in s.nodes if x.name == node)
    if n.sshd_pid and _pid_in_netns(n.sshd_pid, n.netns):
        return n.sshd_pid
    # sshd refuses to start without its privilege-separation directory
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        Path(n.sshd_pidfile).unlink()
    inner = f"hostname {n.name} && exec {SSHD} -f {n.sshd_config} -E {n.sshd_log}"
    # sshd daemonises only after binding its socket, so the port is open once this returns
    _run(["ip", "netns", "exec", n.netns, "unshare", "--uts", "sh", "-c", inner])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid = int(Path(n.sshd_pidfile).read_text().strip())
            break
        except (OSError, ValueError):
            time.sleep(0.02)
    else:
        log_tail = Path(n.sshd_log).read_text()[-1000:] if Path(n.sshd_log).exists() else ""
        raise ClusterError(f"sshd on {node} did not start: {log_tail.strip()}")
    n.sshd_pid = pid
    st.save_state(s)
    return pid


def stop_sshd(s: st.ClusterState, node: str) -> None:
    """Kill the listening sshd of ``node`` (its open sessions live on, as with a real sshd)."""
    n = next(x for x in s.nodes if x.name == node)
    if n.sshd_pid and _pid_in_netns(n.sshd_pid, n.netns):
        os.kill(n.sshd_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _pid_in_netns(n.sshd_pid, n.netns) and time.monotonic() < deadline:
            time.sleep(0.02)
    n.sshd_pid = None
    st.save_state(s)


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
    netns_ok = _netns_exists(n.netns)
    link_ok = _link_exists(n.veth_host)
    sshd_up = bool(n.sshd_pid) and _pid_in_netns(n.sshd_pid or 0, n.netns)
    port_open = sshd_up and _tcp_banner(n.address)
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


def _network_ok(s: st.ClusterState) -> bool:
    if not _link_exists(s.bridge):
        return False
    for rule in s.iptables:
        if _run(["iptables", "-w", "-C", *rule], check=False).returncode != 0:
            return False
    return all(_netns_exists(n.netns) and _link_exists(n.veth_host) for n in s.nodes)


# --------------------------------------------------------------------------------------------
# up / down / status


def up(name: str = DEFAULT_NAME, n: int = 5, subnet: str | None = None) -> EmbeddedCluster:
    """Bring cluster ``name`` up with ``n`` nodes (idempotent; see the module docstring)."""
    preflight()
    wanted = plan(name, n, subnet)
    with st.cluster_lock(name):
        cur = st.load_state(name)
        if (
            cur is not None
            and cur.complete
            and cur.subnet == wanted.subnet
            and [x.name for x in cur.nodes] == [x.name for x in wanted.nodes]
            and _network_ok(cur)
        ):
            # the network is intact: reuse it, restarting any sshd that died
            for node in cur.nodes:
                if not (node.sshd_pid and _pid_in_netns(node.sshd_pid, node.netns)):
                    start_sshd(cur, node.name)
            for node in cur.nodes:
                if not _wait_banner(node.address):
                    break
            else:
                return EmbeddedCluster.from_state(cur)
        if cur is not None:
            _teardown(cur, keep_data=False)
        # remove leftovers of a crashed run whose state file is gone too
        _teardown(wanted, keep_data=False)
        _check_conflicts(wanted)
        st.save_state(wanted)  # record the plan before creating anything
        try:
            _write_files(wanted)
            st.save_state(wanted)
            _build_network(wanted)
            for node in wanted.nodes:
                start_sshd(wanted, node.name)
            for node in wanted.nodes:
                if not _wait_banner(node.address):
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


def _wait_banner(address: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _tcp_banner(address, timeout=1.0):
            return True
        time.sleep(0.05)
    return False


def _kill_netns_processes(s: st.ClusterState) -> list[int]:
    killed = []
    for _ in range(20):
        pids = [p for n in s.nodes for p in _netns_pids(n.netns) if p != os.getpid()]
        if not pids:
            break
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
                killed.append(p)
        time.sleep(0.05)
    # an sshd recorded but somehow outside its namespace (should not happen) goes too
    for n in s.nodes:
        for pid in {n.sshd_pid, _read_pid(n.sshd_pidfile)}:
            if pid and _is_our_sshd(pid, n.sshd_config):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
    return sorted(set(killed))


def _read_pid(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_sshd(pid: int, config: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return config.encode() in cmdline


def _teardown(s: st.ClusterState, keep_data: bool) -> list[str]:
    removed: list[str] = []
    killed = _kill_netns_processes(s)
    if killed:
        removed.append(f"killed {len(killed)} process(es)")
    for rule in s.iptables:
        while _run(["iptables", "-w", "-C", *rule], check=False).returncode == 0:
            _run(["iptables", "-w", "-D", *rule])
            removed.append("iptables " + " ".join(rule))
    for n in s.nodes:
        if _link_exists(n.veth_host):
            _run(["ip", "link", "del", n.veth_host], check=False)
            removed.append(f"veth {n.veth_host}")
        if _netns_exists(n.netns):
            _run(["ip", "netns", "del", n.netns], check=False)
            removed.append(f"netns {n.netns}")
        etc = Path(n.etc_netns_dir)
        if etc.exists():
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(str(etc))
    with contextlib.suppress(OSError):
        Path("/etc/netns").rmdir()  # only if empty: other tools may use it
    if _link_exists(s.bridge):
        _run(["ip", "link", "del", s.bridge], check=False)
        removed.append(f"bridge {s.bridge}")
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
    with st.cluster_lock(name, remove=True):
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
            x for x in sweep.nodes if _netns_exists(x.netns) or _link_exists(x.veth_host)
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
        bridge_up=_link_exists(cur.bridge),
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
    stop_sshd(cur, node)


def sshd_start(name: str, node: str) -> int:
    """Start ``node``'s sshd again; returns its pid."""
    cur = st.load_state(name)
    if cur is None:
        raise ClusterError(f"cluster {name!r} is not up")
    return start_sshd(cur, node)


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
            for sig, handler in previous.items():
                signal.signal(sig, handler)
