"""Per-node sshd of the embedded cluster: key material, config, start and stop.

Each node runs ``/usr/sbin/sshd -f <run_dir>/sshd-<node>.conf`` inside its network namespace
(``ip netns exec``) and its own UTS namespace (``unshare --uts``, so ``hostname`` is the node
name), daemonised, with a pid file. The config allows root login by key only, with the cluster's
per-run client key in ``<run_dir>/authorized_keys`` and a per-node ed25519 host key; the harness
connects with a strict ``<run_dir>/known_hosts`` written from those host keys. Sessions start
with ``SHLVL=1`` so Debian's bash does not source root's ``~/.bashrc`` for every command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from isrlab.harness.cluster import state as st
from isrlab.harness.cluster.keys import generate_keypair, known_hosts_lines
from isrlab.harness.cluster.network import ClusterError, hosts_file, netns_pids, pid_in_netns, run

SSHD = "/usr/sbin/sshd"


def sshd_config(s: st.ClusterState, n: st.NodeState, host_key: str) -> str:
    """The sshd_config of node ``n``: key-only root login on its address, port 22."""
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


def write_ssh_files(s: st.ClusterState) -> None:
    """Fresh client and host keys, authorized_keys, known_hosts and sshd configs; also each
    node's /etc/netns hosts file and working directory, which sshd sessions rely on."""
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
        Path(n.sshd_config).write_text(sshd_config(s, n, str(host_key)))
        etc = Path(n.etc_netns_dir)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file(s, n))
        Path(n.workdir).mkdir(parents=True, exist_ok=True)
    Path(s.known_hosts).write_text(known_hosts_lines(entries))


def sshd_alive(n: st.NodeState) -> bool:
    """The recorded sshd of ``n`` runs in ``n``'s namespace (and is ours, not a reused pid)."""
    pid = n.sshd_pid
    return bool(pid) and pid_in_netns(pid or 0, n.netns) and is_our_sshd(pid or 0, n.sshd_config)


def start_sshd(s: st.ClusterState, node: str) -> int:
    """(Re)start sshd on ``node``; returns its pid. Records it in the state file."""
    n = next(x for x in s.nodes if x.name == node)
    if n.sshd_pid and sshd_alive(n):
        return n.sshd_pid
    # a listener we lost track of (pid file rewritten, state restored) would hold the port
    for pid in netns_pids(n.netns):
        if is_our_sshd(pid, n.sshd_config):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # sshd refuses to start without its privilege-separation directory
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        Path(n.sshd_pidfile).unlink()
    inner = f"hostname {n.name} && exec {SSHD} -f {n.sshd_config} -E {n.sshd_log}"
    # sshd daemonises only after binding its socket, so the port is open once this returns
    run(["ip", "netns", "exec", n.netns, "unshare", "--uts", "sh", "-c", inner])
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
    if n.sshd_pid and sshd_alive(n):
        os.kill(n.sshd_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_in_netns(n.sshd_pid, n.netns) and time.monotonic() < deadline:
            time.sleep(0.02)
    n.sshd_pid = None
    st.save_state(s)


def read_pid(path: str) -> int | None:
    """The pid in a pid file, or None."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def is_our_sshd(pid: int, config: str) -> bool:
    """``pid`` is an sshd started with config file ``config``."""
    try:
        # sshd rewrites its title to "sshd: /usr/sbin/sshd -f <config> ... [listener] ..."
        words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return False
    return config.encode() in words


def kill_recorded_sshd(s: st.ClusterState) -> list[int]:
    """SIGKILL any sshd of ``s`` still running outside its namespace (e.g. netns deleted)."""
    killed = []
    for n in s.nodes:
        for pid in {n.sshd_pid, read_pid(n.sshd_pidfile)}:
            if pid and is_our_sshd(pid, n.sshd_config):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
    return killed
