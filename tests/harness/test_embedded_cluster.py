"""The embedded cluster for real: namespaces, bridge, sshd, and harness.remote over SSH.

Uses cluster names ``itest*`` on 10.77.20x.0/24 so a user's ``default`` cluster is untouched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from isrlab.harness.cluster import embedded, embedded_cluster, network, sshd
from isrlab.harness.cluster import state as st
from isrlab.harness.cluster.cli import app
from isrlab.harness.cluster.embedded import EmbeddedCluster
from isrlab.harness.inventory import SshOptions
from isrlab.harness.remote import ConnectionLost, Remote, RemoteTimeout, exec_on_nodes, on_nodes
from isrlab.harness.ssh import ConnectionPool, SshConnectError

from .conftest import leftovers

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

NAME, SUBNET = "itest", "10.77.201.0/24"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with embedded_cluster(3, name=NAME, subnet=SUBNET) as c:
        yield c
    assert leftovers(NAME, SUBNET) == []


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool() -> Iterator[ConnectionPool]:
    p = ConnectionPool()
    yield p
    p.close()


def test_nodes_run_commands_in_parallel_and_see_their_own_address(
    cluster: EmbeddedCluster, pool: ConnectionPool, tmp_path: Path
) -> None:
    # each node announces itself in a shared directory, then waits for the others: only
    # succeeds if the three commands really run at the same time
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    cmd = (
        f'touch {barrier}/$(hostname); i=0; while [ "$(ls {barrier} | wc -l)" -lt 3 ]; do '
        f"i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.05; done; hostname; hostname -I"
    )
    out = exec_on_nodes(list(cluster.nodes), cmd, ssh=cluster.ssh, pool=pool)
    for node in cluster.nodes:
        name, addr = out[node.name].stdout.split()
        assert (name, addr) == (node.name, node.host)
    assert cluster.host_address == "10.77.201.1"
    assert [n.host for n in cluster.nodes] == ["10.77.201.11", "10.77.201.12", "10.77.201.13"]


def test_nodes_resolve_and_reach_each_other_by_name_only_inside_the_subnet(
    cluster: EmbeddedCluster, pool: ConnectionPool
) -> None:
    def probe(r: Remote) -> list[str]:
        lines = []
        for other in cluster.names:
            res = r.exec(
                f"getent hosts {other} | cut -d' ' -f1; "
                f"timeout 3 bash -c 'exec 3<>/dev/tcp/{other}/22 && head -c 4 <&3'",
            )
            lines.append(res.stdout.split()[0] + " " + res.stdout.split()[1])
        # no default route: nothing outside the cluster's subnet is reachable
        routes = r.exec("ip route").stdout
        assert "default" not in routes and "eth0" in routes
        return lines

    out = on_nodes(list(cluster.nodes), probe, ssh=cluster.ssh, pool=pool)
    expected = [f"{n.host} SSH-" for n in cluster.nodes]
    assert out == {n: expected for n in cluster.names}


def test_project_checkout_and_venv_are_usable_on_nodes(
    cluster: EmbeddedCluster, pool: ConnectionPool
) -> None:
    r = cluster.remote("n2", pool)
    res = r.exec(
        f"{REPO}/.venv/bin/python -c 'import isrlab.harness.remote, sys; print(sys.prefix)'"
    )
    assert res.stdout.strip() == str(REPO / ".venv")
    assert r.exec("pwd", cwd=cluster.workdir("n2")).stdout.strip() == "/var/lib/isrlab/itest/n2"


def test_exec_env_stdin_errors_and_timeouts(cluster: EmbeddedCluster, pool: ConnectionPool) -> None:
    r = cluster.remote("n1", pool)
    assert r.exec('echo "$A|$B"', env={"A": "x y", "B": "it's"}).stdout == "x y|it's\n"
    assert r.exec("tr a-z A-Z", stdin="hello\n").stdout == "HELLO\n"
    res = r.exec("echo out; echo err >&2; exit 4", check=False)
    assert (res.exit_status, res.stdout, res.stderr) == (4, "out\n", "err\n")
    assert r.exec("kill -9 $$", check=False).exit_status == -1  # died of a signal
    # a background child holding stdout open does not make exec wait for it
    assert r.exec("sleep 20 & echo bg", timeout=10).stdout == "bg\n"
    big = r.exec("head -c 3000000 /dev/zero | tr '\\0' x").stdout
    assert len(big) == 3_000_000
    with pytest.raises(RemoteTimeout) as ei:
        r.exec("sleep 10", timeout=0.3)
    assert ei.value.node == "n1" and "timed out" in str(ei.value)


def test_upload_and_download_files_and_trees(
    cluster: EmbeddedCluster, pool: ConnectionPool, tmp_path: Path
) -> None:
    r = cluster.remote("n3", pool)
    wd = cluster.workdir("n3")
    src = tmp_path / "src"
    (src / "sub" / "__pycache__").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    (src / "sub" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    r.upload_tree(src, f"{wd}/tree")
    listing = r.exec(f"cd {wd}/tree && find . -type f | sort").stdout.split()
    assert listing == ["./a.txt", "./sub/b.bin"]
    r.upload(src / "a.txt", f"{wd}/one/a.txt", mode=0o640)
    assert r.exec(f"stat -c %a {wd}/one/a.txt").stdout.strip() == "640"
    r.write_file(f"{wd}/w.txt", "written\n")
    assert r.read_file(f"{wd}/w.txt") == b"written\n"
    r.download(f"{wd}/tree/sub/b.bin", tmp_path / "back" / "b.bin")
    assert (tmp_path / "back" / "b.bin").read_bytes() == (src / "sub" / "b.bin").read_bytes()
    r.download_tree(f"{wd}/tree", tmp_path / "back-tree")
    assert (tmp_path / "back-tree" / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "back-tree" / "sub" / "b.bin").stat().st_size == 25600


def test_daemon_lifecycle_with_pidfile_port_and_signals(
    cluster: EmbeddedCluster, pool: ConnectionPool
) -> None:
    n1, n2 = cluster.remote("n1", pool), cluster.remote("n2", pool)
    wd = cluster.workdir("n1")
    pidfile, logfile = f"{wd}/http.pid", f"{wd}/http.log"
    pid = n1.start_daemon(
        "http",
        f"python3 -m http.server 8000 --bind {cluster.node('n1').host}",
        pidfile=pidfile,
        logfile=logfile,
        cwd=wd,
    )
    try:
        # starting again is a no-op that reports the same daemon
        assert n1.start_daemon("http", "false", pidfile=pidfile, logfile=logfile) == pid
        n2.wait_for_port(8000, host="n1", timeout=15)
        fetch = "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://n1:8000/\", timeout=1).status)'"
        assert n2.exec(fetch).stdout.strip() == "200"
        assert n1.daemon_pid(pidfile) == pid

        assert n1.signal_daemon(pidfile, "STOP")
        assert n1.exec(f"grep State /proc/{pid}/status").stdout.split()[1] == "T"
        assert not n2.exec(fetch, check=False).ok  # a paused server times out
        assert n1.signal_daemon(pidfile, "CONT")
        assert n2.exec(fetch).stdout.strip() == "200"

        # pattern signals only reach processes in the node's own network namespace
        assert n2.signal_pattern("http.server 8000", "0") == []
        assert n1.signal_pattern("http.server 8000", "0") == [pid]
    finally:
        assert n1.stop_daemon(pidfile)
    assert not n1.daemon_running(pidfile)
    assert not n1.stop_daemon(pidfile)
    assert _gone(pid)
    assert "starting http" in n1.read_file(logfile).decode()
    with pytest.raises(RemoteTimeout):
        n2.wait_for_port(8000, host="n1", timeout=1)


def test_clock_skew_hook_daemons_under_libfaketime_see_a_shifted_clock(
    cluster: EmbeddedCluster, pool: ConnectionPool
) -> None:
    status = embedded.status(NAME, probe_ssh=False)
    if status.libfaketime is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    r = cluster.remote("n3", pool)
    wd = cluster.workdir("n3")
    offset_file = f"{wd}/clock-offset"
    env = {
        "LD_PRELOAD": status.libfaketime,
        "FAKETIME_TIMESTAMP_FILE": offset_file,
        "FAKETIME_NO_CACHE": "1",
    }
    clock = "python3 -c 'import time; print(int(time.time()))'"
    r.write_file(offset_file, "+1d\n")
    skewed, real = int(r.exec(clock, env=env).stdout), int(r.exec(clock).stdout)
    assert 86400 - 60 < skewed - real <= 86400 + 60
    r.write_file(offset_file, "+0\n")  # heal: same file, no restart
    assert abs(int(r.exec(clock, env=env).stdout) - int(r.exec(clock).stdout)) < 60


def test_daemon_that_dies_at_once_reports_its_log(
    cluster: EmbeddedCluster, pool: ConnectionPool
) -> None:
    wd = cluster.workdir("n2")
    with pytest.raises(Exception) as ei:
        cluster.remote("n2", pool).start_daemon(
            "bad",
            "sh -c 'echo cannot bind port >&2; exit 1'",
            pidfile=f"{wd}/bad.pid",
            logfile=f"{wd}/bad.log",
        )
    assert "bad exited right after starting" in str(ei.value)
    assert "cannot bind port" in str(ei.value)


def test_host_key_policies(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    node = cluster.node("n1")
    learned = tmp_path / "known_hosts"
    accept_new = SshOptions(host_key_policy="accept-new", known_hosts=str(learned))
    assert Remote(node, accept_new, ConnectionPool()).exec("hostname").stdout == "n1\n"
    assert node.host in learned.read_text()  # remembered on first contact
    # all nodes at once, from parallel threads: every key is kept
    on_nodes(list(cluster.nodes), lambda r: r.exec("true"), ssh=accept_new, pool=ConnectionPool())
    assert sorted(line.split()[0] for line in learned.read_text().splitlines()) == sorted(
        n.host for n in cluster.nodes
    )
    strict = SshOptions(host_key_policy="strict", known_hosts=str(learned))
    assert Remote(node, strict, ConnectionPool()).exec("true").ok

    # n2's key filed under n1's address: a changed host key is refused by every policy
    n2_key = Path(cluster.known_hosts).read_text().splitlines()[1].split(None, 1)[1]
    learned.write_text(f"{node.host} {n2_key}\n")
    for policy in ("strict", "accept-new", "warn"):
        opts = SshOptions(host_key_policy=policy, known_hosts=str(learned))  # type: ignore[arg-type]
        with pytest.raises(SshConnectError, match="host key mismatch"):
            Remote(node, opts, ConnectionPool()).exec("true")
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    opts = SshOptions(host_key_policy="strict", known_hosts=str(unknown))
    with pytest.raises(SshConnectError, match="unknown host key"):
        Remote(node, opts, ConnectionPool()).exec("true")


def test_retries_while_sshd_is_briefly_down(cluster: EmbeddedCluster) -> None:
    node = cluster.node("n2")
    quick = SshOptions(host_key_policy="strict", known_hosts=cluster.known_hosts, connect_retries=0)
    patient = SshOptions(
        host_key_policy="strict",
        known_hosts=cluster.known_hosts,
        connect_retries=8,
        backoff_initial=0.1,
        backoff_max=0.5,
    )
    embedded.sshd_stop(NAME, "n2")
    try:
        with pytest.raises(SshConnectError, match="n2: cannot connect"):
            Remote(node, quick, ConnectionPool()).exec("true")
        restart = threading.Timer(0.6, embedded.sshd_start, args=(NAME, "n2"))
        restart.start()
        pool = ConnectionPool()
        assert Remote(node, patient, pool).exec("hostname").stdout == "n2\n"
        restart.join()
        pool.close()
    finally:
        embedded.sshd_start(NAME, "n2")


def test_dead_pooled_connection_is_replaced(cluster: EmbeddedCluster, pool: ConnectionPool) -> None:
    r = cluster.remote("n3", pool)
    errors: list[Exception] = []

    def long_command() -> None:
        try:
            r.exec("echo started; sleep 30")
        except Exception as e:
            errors.append(e)

    worker = threading.Thread(target=long_command)
    worker.start()
    r.exec("while ! pgrep -f 'sleep 30' >/dev/null; do sleep 0.05; done", timeout=10)
    # kill every sshd of n3, the one serving our pooled connection included
    for pid in network.netns_pids(cluster.netns["n3"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.join(timeout=20)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionLost), errors
    assert "n3: SSH connection lost" in str(errors[0])
    time.sleep(0.2)
    embedded.sshd_start(NAME, "n3")
    assert r.exec("hostname").stdout == "n3\n"


def test_up_is_idempotent_and_repairs_a_dead_sshd(cluster: EmbeddedCluster) -> None:
    before = st.load_state(NAME)
    assert before is not None
    again = embedded.up(NAME, 3, SUBNET)
    assert again == cluster
    assert embedded.up(NAME, 3) == cluster  # no subnet given: keep the cluster's own
    assert st.load_state(NAME) == before  # same sshd pids: nothing rebuilt
    embedded.sshd_stop(NAME, "n1")
    assert not embedded.status(NAME, probe_ssh=False).healthy
    embedded.up(NAME, 3, SUBNET)
    s = embedded.status(NAME)
    assert s.healthy, s
    after = st.load_state(NAME)
    assert after is not None and after.nodes[1].sshd_pid == before.nodes[1].sshd_pid
    assert s.libfaketime is not None and s.libfaketime.endswith("libfaketime.so.1")
    # a state file that lost track of a live sshd (pid 1 is never ours): up restarts it
    lost = st.load_state(NAME)
    assert lost is not None
    lost.nodes[2].sshd_pid = 1
    st.save_state(lost)
    embedded.up(NAME, 3, SUBNET)
    assert embedded.status(NAME).healthy


# ---------------------------------------------------------------------------------- lifecycle

LIFE, LIFE_NET = "itest-life", "10.77.202.0/24"


def _run_harness_script(body: str) -> subprocess.Popen[str]:
    script = f"import sys, time\nsys.path.insert(0, {str(REPO)!r})\n{body}"
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_down_removes_everything_including_processes_and_is_idempotent() -> None:
    c = embedded.up(LIFE, 2, LIFE_NET)
    try:
        r = c.remote("n1", ConnectionPool())
        pid = r.start_daemon(
            "sleeper", "sleep 1000", pidfile=f"{c.workdir('n1')}/s.pid", logfile="/dev/null"
        )
        r.pool.close()
        assert leftovers(LIFE, LIFE_NET) != []
    finally:
        removed = embedded.down(LIFE)
    assert any(x.startswith("killed") for x in removed)
    assert _gone(pid)
    assert leftovers(LIFE, LIFE_NET) == []
    assert embedded.down(LIFE) == []


def test_kill_9_of_the_harness_then_down_or_up_cleans_up() -> None:
    proc = _run_harness_script(
        "from isrlab.harness.cluster import up\n"
        f"up({LIFE!r}, 2, {LIFE_NET!r})\n"
        "print('UP', flush=True)\ntime.sleep(600)\n"
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "UP"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the cluster outlived its creator; the next up reuses it, down removes it
    c = embedded.up(LIFE, 2, LIFE_NET)
    pool = ConnectionPool()
    assert c.remote("n2", pool).exec("hostname").stdout == "n2\n"
    pool.close()
    embedded.down(LIFE)
    assert leftovers(LIFE, LIFE_NET) == []


def test_kill_9_in_the_middle_of_up_then_down_cleans_up() -> None:
    # the harness dies after n1's sshd started and before n2's: a half-built cluster
    proc = _run_harness_script(
        "import os, signal\n"
        "from isrlab.harness.cluster import embedded, sshd\n"
        "real = sshd.start_sshd\n"
        "def dying(s, node):\n"
        "    if node == 'n2':\n"
        "        print('DYING', flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(s, node)\n"
        "sshd.start_sshd = dying\n"
        f"embedded.up({LIFE!r}, 3, {LIFE_NET!r})\n"
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "DYING"
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert any(x.startswith("process") for x in leftovers(LIFE, LIFE_NET))
    assert not embedded.status(LIFE, probe_ssh=False).complete
    embedded.down(LIFE)
    assert leftovers(LIFE, LIFE_NET) == []


def test_a_failing_up_removes_what_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(s: st.ClusterState, node: str) -> int:
        raise embedded.ClusterError(f"sshd on {node} did not start: simulated")

    monkeypatch.setattr(sshd, "start_sshd", broken)
    with pytest.raises(embedded.ClusterError, match="simulated"):
        embedded.up(LIFE, 2, LIFE_NET)
    assert leftovers(LIFE, LIFE_NET) == []


def test_a_lost_state_file_does_not_leak_the_cluster() -> None:
    embedded.up(LIFE, 2, LIFE_NET)
    st.state_path(LIFE).unlink()  # as if /run/isrlab had been wiped mid-run
    embedded.down(LIFE)
    assert leftovers(LIFE, LIFE_NET) == []


def test_half_built_cluster_is_rebuilt_by_up() -> None:
    embedded.up(LIFE, 2, LIFE_NET)
    s = st.load_state(LIFE)
    assert s is not None
    subprocess.run(["ip", "link", "del", s.nodes[0].veth_host], check=True)
    assert not embedded.status(LIFE, probe_ssh=False).healthy
    c = embedded.up(LIFE, 2, LIFE_NET)
    assert embedded.status(LIFE).healthy
    pool = ConnectionPool()
    assert c.remote("n1", pool).exec("hostname").stdout == "n1\n"
    pool.close()
    embedded.down(LIFE)
    assert leftovers(LIFE, LIFE_NET) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_context_manager_tears_down_on_signals(sig: signal.Signals) -> None:
    proc = _run_harness_script(
        "from isrlab.harness.cluster import embedded_cluster\n"
        f"with embedded_cluster(2, name={LIFE!r}, subnet={LIFE_NET!r}):\n"
        "    print('IN', flush=True)\n    time.sleep(600)\n"
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "IN"
    assert leftovers(LIFE, LIFE_NET) != []
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert leftovers(LIFE, LIFE_NET) == []

    with (
        pytest.raises(RuntimeError, match="test body failed"),
        embedded_cluster(2, name=LIFE, subnet=LIFE_NET),
    ):
        raise RuntimeError("test body failed")
    assert leftovers(LIFE, LIFE_NET) == []


def test_subnet_clash_is_refused_and_leaves_nothing(cluster: EmbeddedCluster) -> None:
    with pytest.raises(embedded.ClusterError, match="overlaps cluster 'itest'"):
        embedded.up("itest-clash", 1, SUBNET)
    assert leftovers("itest-clash", SUBNET) == []
    assert embedded.status(NAME, probe_ssh=False).healthy


def test_cli_up_status_down() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["up", "--node-count", "2", "--name", LIFE, "--subnet", LIFE_NET])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["status", "--name", LIFE])
    assert res.exit_code == 0, res.output
    assert "isrlab-itest-life-n2" in res.output and "10.77.202.12" in res.output
    assert "healthy" in res.output and "libfaketime" in res.output
    res = runner.invoke(app, ["down", "--name", LIFE])
    assert res.exit_code == 0 and "removed" in res.output
    assert leftovers(LIFE, LIFE_NET) == []
    res = runner.invoke(app, ["status", "--name", LIFE])
    assert res.exit_code == 1 and "not up" in res.output
    assert "nothing to remove" in runner.invoke(app, ["down", "--name", LIFE]).output
