"""Run commands on nodes over SSH: the harness's only way to touch a node.

This module knows POSIX shells and the SSH layer (``harness.ssh``), nothing about Kafka or
ZooKeeper; the nodes come from ``harness.inventory``.

Commands
    ``Remote(node).exec(cmd, check=True, timeout=None, env=None, cwd=None, stdin=None)``
    runs ``cmd`` through ``sh -c`` (under ``sudo -n`` when ``node.sudo`` and the user is not
    root) and returns a ``Result`` (exit status, stdout, stderr, duration; exit status -1 when
    the command was killed by a signal). With ``check`` a non-zero exit raises
    ``RemoteCommandError`` naming the node, the command, the exit status and the tail of
    stderr; a command that outlives ``timeout`` raises ``RemoteTimeout`` (its channel is
    closed, but as with ``ssh host cmd`` the remote process is not killed: wrap it in
    ``timeout(1)`` for that). A connection that dies mid-command raises ``ConnectionLost``.
    Environment variables are passed inline (``env K=V``) so no ``AcceptEnv`` is needed.
    ``stdin`` is sent in full before output is read, so a command that echoes megabytes of its
    input back can stall; sudo means ``sudo -n``: the login user needs passwordless sudo.

Files
    ``upload(local, remote)`` / ``download(remote, local)`` use SFTP (through a temporary file and
    ``mv`` / ``cat`` for sudo nodes); ``upload_tree`` / ``download_tree`` stream a gzip tar over
    the exec channel; ``read_file`` / ``write_file`` move bytes.

Daemons
    ``start_daemon(name, cmd, pidfile, logfile, env=None, cwd=None)`` starts ``cmd`` detached
    (``nohup`` + ``setsid``, stdin from /dev/null, stdout and stderr appended to ``logfile``),
    writes its pid to ``pidfile`` and returns the pid; it raises with the log tail if the process
    is gone right after starting. A daemon is its own session and process group, so
    ``stop_daemon(pidfile, sig="TERM", wait=10.0)`` and ``signal_daemon(pidfile, sig)`` signal the
    whole group (a JVM and its children alike); ``stop_daemon`` escalates to KILL after ``wait``.
    ``daemon_running(pidfile)`` tells whether it lives (a stopped process still lives).
    ``signal_pattern(pattern, sig)`` signals processes whose command line matches ``pattern``
    but only those in the same network namespace as the SSH session: embedded-cluster nodes share
    the host's pid namespace, and a bare ``pkill -f`` would hit every node at once.
    ``wait_for_port(port, host="127.0.0.1", timeout=30.0)`` waits on the node until a TCP
    connect to ``host:port`` succeeds. Clock skew on embedded nodes (which share the kernel clock)
    is done by starting daemons with ``env={"LD_PRELOAD": <libfaketime.so.1>,
    "FAKETIME_TIMESTAMP_FILE": ..., "FAKETIME_NO_CACHE": "1"}``; nothing here is specific to it.

Many nodes
    ``on_nodes(nodes, fn, parallel=True)`` calls ``fn(Remote)`` for each node in a thread pool and
    returns ``{node name: value}``; if any node failed it raises ``NodesError`` carrying every
    per-node exception and the partial results. ``try_on_nodes`` returns exceptions as values;
    ``exec_on_nodes(nodes, cmd)`` is the common case of one command everywhere. All three take
    ``ssh=`` (SshOptions) and ``pool=`` (a ``ConnectionPool``; default: the module's pool).
"""

from __future__ import annotations

import io
import os
import posixpath
import select
import shlex
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from isrlab.harness.inventory import Node, SshOptions
from isrlab.harness.ssh import DEFAULT_POOL, ConnectionPool, ControlError, SshConnectError

T = TypeVar("T")

_STDERR_TAIL_CHARS = 2000
# how long to wait for EOF after a command's exit status when no more output arrives
_EOF_GRACE = 1.0


@dataclass(frozen=True)
class Result:
    """The outcome of one command on one node."""

    node: str
    cmd: str
    exit_status: int
    stdout: str
    stderr: str
    duration: float
    stdout_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def check(self) -> Result:
        if self.exit_status != 0:
            raise RemoteCommandError(self.node, self.cmd, self.exit_status, self.stderr)
        return self


class RemoteCommandError(ControlError):
    """A command exited non-zero. Names node, command, exit status and the stderr tail."""

    def __init__(self, node: str, cmd: str, exit_status: int | None, stderr: str) -> None:
        self.node = node
        self.cmd = cmd
        self.exit_status = exit_status
        self.stderr = stderr
        tail = stderr[-_STDERR_TAIL_CHARS:].strip()
        status = "timed out" if exit_status is None else f"exited with status {exit_status}"
        shown = cmd if len(cmd) <= 300 else cmd[:300] + " ..."
        msg = f"{node}: command {status}: {shown}"
        if tail:
            msg += "\n  stderr (tail):\n    " + "\n    ".join(tail.splitlines()[-20:])
        super().__init__(msg)


class RemoteTimeout(RemoteCommandError):
    """A command was still running when its timeout expired (its channel was closed)."""

    def __init__(self, node: str, cmd: str, timeout: float, stderr: str) -> None:
        self.timeout = timeout
        super().__init__(node, cmd, None, stderr)


class ConnectionLost(RemoteCommandError):
    """The SSH connection closed before the command reported its exit status.

    The command may or may not have run (or may still be running): the node crashed, its
    sshd was killed, or the network was cut.
    """

    def __init__(self, node: str, cmd: str, stderr: str) -> None:
        super().__init__(node, cmd, None, stderr)
        self.args = (f"{node}: SSH connection lost before the command finished: {cmd[:300]}",)

    def __str__(self) -> str:
        return str(self.args[0])


class NodesError(ControlError):
    """One or more nodes failed in ``on_nodes``; ``errors`` maps node name to its exception."""

    def __init__(self, errors: dict[str, BaseException], results: dict[str, Any]) -> None:
        self.errors = errors
        self.results = results
        lines = [f"{len(errors)} node(s) failed:"]
        lines += [f"  {name}: {err}" for name, err in sorted(errors.items())]
        super().__init__("\n".join(lines))


# --------------------------------------------------------------------------------------------
# Commands


def _q(s: str | os.PathLike[str]) -> str:
    return shlex.quote(str(s))


def _env_prefix(env: Mapping[str, str] | None) -> str:
    """``env K='v' ... `` (empty without variables); rejects names a shell would mangle."""
    if not env:
        return ""
    for k in env:
        if not k or not k.replace("_", "a").isalnum() or not k.isascii() or k[0].isdigit():
            raise ValueError(f"bad environment variable name {k!r}")
    return "env " + " ".join(f"{k}={_q(v)}" for k, v in env.items()) + " "


def wrap_command(
    cmd: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    sudo: bool = False,
) -> str:
    """The exact command line sent to the node: cd, env and sudo around ``sh -c cmd``."""
    inner = cmd
    if cwd is not None:
        inner = f"cd {_q(cwd)} && {inner}"
    wrapped = f"{_env_prefix(env)}sh -c {_q(inner)}"
    if sudo:
        wrapped = f"sudo -n -- {wrapped}"
    return wrapped


class Remote:
    """Commands, files and daemons on one node."""

    def __init__(
        self, node: Node, ssh: SshOptions | None = None, pool: ConnectionPool | None = None
    ) -> None:
        self.node = node
        self.ssh = ssh or SshOptions()
        self.pool = pool or DEFAULT_POOL

    def __repr__(self) -> str:
        return f"Remote({self.node.name}@{self.node.host}:{self.node.port})"

    @property
    def _sudo(self) -> bool:
        return self.node.sudo and self.node.user != "root"

    def _open_session(self) -> paramiko.Channel:
        stale: paramiko.SSHClient | None = None
        for _ in range(2):
            client = self.pool.client(self.node, self.ssh, stale=stale)
            try:
                t = client.get_transport()
                if t is None or not t.is_active():
                    raise paramiko.SSHException("transport is closed")
                return t.open_session(timeout=self.ssh.connect_timeout)
            except paramiko.ChannelException as e:
                # the connection is fine but sshd refused one more channel: reconnecting would
                # kill the other threads' commands
                raise SshConnectError(
                    self.node,
                    f"sshd refused a new session ({e}); raise MaxSessions in its sshd_config "
                    f"or run fewer commands at once on this node",
                ) from None
            except (paramiko.SSHException, EOFError, OSError):
                # the pooled transport died (sshd restarted, node rebooted): reconnect once;
                # nothing has run yet so this cannot run the command twice
                stale = client
        raise SshConnectError(self.node, "the connection closed again right after connecting")

    def exec(
        self,
        cmd: str,
        *,
        check: bool = True,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | Iterable[bytes] | None = None,
    ) -> Result:
        """Run ``cmd`` with ``sh -c`` on the node and wait for it. See the module docstring."""
        full = wrap_command(cmd, env=env, cwd=cwd, sudo=self._sudo)
        start = time.monotonic()
        chan = self._open_session()
        out = bytearray()
        err = bytearray()
        try:
            chan.exec_command(full)
            if stdin is not None:
                chunks: Iterable[bytes]
                if isinstance(stdin, str):
                    chunks = [stdin.encode()]
                elif isinstance(stdin, bytes | bytearray):
                    chunks = [bytes(stdin)]
                else:
                    chunks = stdin
                for chunk in chunks:
                    chan.sendall(chunk)
            chan.shutdown_write()
            deadline = None if timeout is None else start + timeout
            idle = 0.002
            quiet_since: float | None = None
            # poll, not select: the harness process holds many sockets (one librdkafka client
            # per logical process), and select() fails on descriptors above 1023
            poller = select.poll()
            poller.register(chan.fileno(), select.POLLIN)
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                # sshd may send the exit status before the last of the output, so read on
                # until EOF; but a background child still holding stdout open would delay EOF
                # forever (plain `ssh host cmd` hangs there), so give up after a quiet spell
                if chan.exit_status_ready():
                    now = time.monotonic()
                    if got or quiet_since is None:
                        quiet_since = now
                    if chan.eof_received or chan.closed or now - quiet_since > _EOF_GRACE:
                        break
                elif chan.closed and not got:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise RemoteTimeout(
                        self.node.name, cmd, timeout or 0.0, err.decode(errors="replace")
                    )
                # Channel.fileno() only signals stdout data, so poll with a growing interval
                idle = 0.002 if got else min(idle * 2, 0.05)
                poller.poll(idle * 1000)
            # whatever arrived together with the EOF
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            status = chan.recv_exit_status()
            transport = chan.get_transport()
            if status == -1 and not (transport is not None and transport.is_active()):
                # -1 means no exit status arrived: either the command died of a signal (sshd
                # then sends exit-signal, which paramiko does not surface) or the link died
                raise ConnectionLost(self.node.name, cmd, err.decode(errors="replace"))
        finally:
            chan.close()
        res = Result(
            node=self.node.name,
            cmd=cmd,
            exit_status=status,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration=time.monotonic() - start,
            stdout_bytes=bytes(out),
        )
        if check:
            res.check()
        return res

    # ---------------------------------------------------------------- files

    def _sftp(self) -> paramiko.SFTPClient:
        client = self.pool.client(self.node, self.ssh)
        try:
            return client.open_sftp()
        except (paramiko.SSHException, EOFError, OSError):
            return self.pool.client(self.node, self.ssh, stale=client).open_sftp()

    def upload(
        self, local: str | os.PathLike[str], remote: str, *, mode: int | None = None
    ) -> None:
        """Copy one local file to ``remote`` (parent directories are created)."""
        self.exec(f"mkdir -p {_q(posixpath.dirname(remote) or '.')}")
        sftp = self._sftp()
        try:
            if self._sudo:
                tmp = f"/tmp/.isrlab-upload-{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"
                sftp.put(str(local), tmp)
                self.exec(f"mv {_q(tmp)} {_q(remote)}")
            else:
                sftp.put(str(local), remote)
        finally:
            sftp.close()
        if mode is not None:
            self.exec(f"chmod {mode:o} {_q(remote)}")

    def write_file(self, remote: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write ``data`` to ``remote`` (parent directories are created)."""
        payload = data.encode() if isinstance(data, str) else data
        cmd = f"mkdir -p {_q(posixpath.dirname(remote) or '.')} && cat > {_q(remote)}"
        if mode is not None:
            cmd += f" && chmod {mode:o} {_q(remote)}"
        self.exec(cmd, stdin=payload)

    def read_file(self, remote: str) -> bytes:
        """The bytes of a remote file."""
        return self.exec(f"cat {_q(remote)}").stdout_bytes

    def download(self, remote: str, local: str | os.PathLike[str]) -> None:
        """Copy one remote file to ``local`` (parent directories are created)."""
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        if self._sudo:
            Path(local).write_bytes(self.read_file(remote))
            return
        sftp = self._sftp()
        try:
            sftp.get(remote, str(local))
        except FileNotFoundError:
            raise RemoteCommandError(
                self.node.name, f"download {remote}", 1, "no such file"
            ) from None
        finally:
            sftp.close()

    def upload_tree(
        self,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        *,
        exclude: Sequence[str] = ("__pycache__", ".git", ".mypy_cache", ".ruff_cache"),
    ) -> None:
        """Copy the contents of ``local_dir`` into ``remote_dir`` as a gzip tar stream."""
        src = Path(local_dir)
        if not src.is_dir():
            raise ValueError(f"{src} is not a directory")
        skip = set(exclude)

        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return None if skip & set(Path(info.name).parts) else info

        with tempfile.SpooledTemporaryFile(max_size=32 << 20) as buf:
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(str(src), arcname=".", filter=keep)
            buf.seek(0)

            def chunks() -> Iterable[bytes]:
                while block := buf.read(1 << 16):
                    yield block

            self.exec(
                f"mkdir -p {_q(remote_dir)} && tar -xzf - -C {_q(remote_dir)} --no-same-owner",
                stdin=chunks(),
            )

    def download_tree(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> None:
        """Copy the contents of ``remote_dir`` into ``local_dir`` (e.g. a node's logs)."""
        res = self.exec(f"tar -czf - -C {_q(remote_dir)} .")
        dest = Path(local_dir)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(res.stdout_bytes), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")

    # ---------------------------------------------------------------- daemons

    def start_daemon(
        self,
        name: str,
        cmd: str,
        *,
        pidfile: str,
        logfile: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        verify: float = 0.2,
    ) -> int:
        """Start ``cmd`` detached; returns its pid. No-op (returning the pid) if already running.

        ``verify`` seconds after starting, the process must still be alive, else the error
        carries the tail of ``logfile``.
        """
        inner = f"echo $$ > {_q(pidfile)}; exec {cmd}"
        launch = f"{_env_prefix(env)}setsid sh -c {_q(inner)}"
        script = f"""
set -e
mkdir -p {_q(posixpath.dirname(pidfile) or ".")} {_q(posixpath.dirname(logfile) or ".")}
if [ -s {_q(pidfile)} ] && kill -0 "$(cat {_q(pidfile)})" 2>/dev/null; then
  cat {_q(pidfile)}; exit 0
fi
rm -f {_q(pidfile)}
{f"cd {_q(cwd)}" if cwd else ":"}
echo "--- $(date -u +%FT%TZ) starting {name}" >> {_q(logfile)}
nohup {launch} >> {_q(logfile)} 2>&1 < /dev/null &
i=0
while [ ! -s {_q(pidfile)} ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
[ -s {_q(pidfile)} ] || {{ echo "{name}: no pid file after 5 s" >&2; exit 1; }}
sleep {max(verify, 0.0)}
pid=$(cat {_q(pidfile)})
if ! kill -0 "$pid" 2>/dev/null; then
  echo "{name} exited right after starting; log tail:" >&2
  tail -n 30 {_q(logfile)} >&2
  exit 1
fi
echo "$pid"
"""
        res = self.exec(script)
        return int(res.stdout.split()[-1])

    def daemon_pid(self, pidfile: str) -> int | None:
        """The pid in ``pidfile`` if that process is alive, else None."""
        res = self.exec(
            f'p=$(cat {_q(pidfile)} 2>/dev/null) && kill -0 "$p" 2>/dev/null && echo "$p"',
            check=False,
        )
        return int(res.stdout.strip()) if res.ok and res.stdout.strip() else None

    def daemon_running(self, pidfile: str) -> bool:
        return self.daemon_pid(pidfile) is not None

    def signal_daemon(self, pidfile: str, sig: str = "TERM", *, group: bool = True) -> bool:
        """Send ``sig`` (name like STOP or number) to the daemon (its process group by default).

        Returns False when there is no live daemon.
        """
        target = '-- "-$p"' if group else '"$p"'
        res = self.exec(
            f'p=$(cat {_q(pidfile)} 2>/dev/null) && kill -0 "$p" 2>/dev/null || exit 3\n'
            f'kill -{_q(sig)} {target} 2>/dev/null || kill -{_q(sig)} "$p"',
            check=False,
        )
        if res.exit_status == 3:
            return False
        res.check()
        return True

    def stop_daemon(self, pidfile: str, sig: str = "TERM", *, wait: float = 10.0) -> bool:
        """Signal the daemon's group, wait up to ``wait`` s, then KILL. Removes the pid file.

        Returns True if a daemon was running. A stopped (SIGSTOP) daemon is continued first so
        that it can act on ``sig``.
        """
        steps = max(int(wait / 0.1), 1)
        res = self.exec(
            f"""
p=$(cat {_q(pidfile)} 2>/dev/null) || exit 3
kill -0 "$p" 2>/dev/null || {{ rm -f {_q(pidfile)}; exit 3; }}
kill -{_q(sig)} -- "-$p" 2>/dev/null || kill -{_q(sig)} "$p" 2>/dev/null || true
kill -CONT -- "-$p" 2>/dev/null || true
i=0
while kill -0 "$p" 2>/dev/null && [ $i -lt {steps} ]; do
  # a zombie still answers kill -0; it is dead for our purposes
  [ "$(awk '{{print $3}}' /proc/$p/stat 2>/dev/null)" = Z ] && break
  sleep 0.1; i=$((i+1))
done
kill -9 -- "-$p" 2>/dev/null || true
kill -9 "$p" 2>/dev/null || true
rm -f {_q(pidfile)}
""",
            check=False,
            timeout=wait + 30,
        )
        if res.exit_status == 3:
            return False
        res.check()
        return True

    def signal_pattern(self, pattern: str, sig: str = "TERM") -> list[int]:
        """Signal processes matching ``pattern`` (pgrep -f) in this node's network namespace.

        The pattern travels on stdin so that the shell doing the matching does not match itself.
        Returns the pids signalled.
        """
        res = self.exec(
            """
read -r pat
me=$(readlink /proc/$$/ns/net)
for p in $(pgrep -f -- "$pat"); do
  [ "$p" = "$$" ] && continue
  [ "$(readlink /proc/$p/ns/net 2>/dev/null)" = "$me" ] || continue
  kill -"$1" "$p" 2>/dev/null && echo "$p"
done
exit 0
""".replace('"$1"', _q(sig)),
            stdin=pattern + "\n",
        )
        return [int(x) for x in res.stdout.split()]

    def wait_for_port(
        self, port: int, host: str = "127.0.0.1", timeout: float = 30.0, interval: float = 0.1
    ) -> None:
        """Wait on the node until ``host:port`` accepts TCP connections; RemoteTimeout if not."""
        res = self.exec(
            f"""
end=$(( $(date +%s) + {int(timeout + 0.999)} ))
while ! timeout 2 bash -c {_q(f"exec 3<>/dev/tcp/{host}/{int(port)}")} 2>/dev/null; do
  [ "$(date +%s)" -ge "$end" ] && exit 7
  sleep {interval}
done
""",
            check=False,
            timeout=timeout + 15,
        )
        if res.exit_status == 7:
            raise RemoteTimeout(
                self.node.name, f"wait for {host}:{port} to accept connections", timeout, ""
            )
        res.check()


# --------------------------------------------------------------------------------------------
# Many nodes


def try_on_nodes(
    nodes: Sequence[Node],
    fn: Callable[[Remote], T],
    *,
    parallel: bool = True,
    ssh: SshOptions | None = None,
    pool: ConnectionPool | None = None,
    max_workers: int | None = None,
) -> dict[str, T | Exception]:
    """``fn(Remote(node))`` for every node; a node's exception is its value."""

    def one(node: Node) -> T | Exception:
        try:
            return fn(Remote(node, ssh, pool))
        except Exception as e:
            return e

    if not parallel or len(nodes) <= 1:
        return {n.name: one(n) for n in nodes}
    with ThreadPoolExecutor(max_workers=max_workers or min(32, len(nodes))) as ex:
        values = list(ex.map(one, nodes))
    return {n.name: v for n, v in zip(nodes, values, strict=True)}


def on_nodes(
    nodes: Sequence[Node],
    fn: Callable[[Remote], T],
    *,
    parallel: bool = True,
    ssh: SshOptions | None = None,
    pool: ConnectionPool | None = None,
    max_workers: int | None = None,
) -> dict[str, T]:
    """``fn(Remote(node))`` for every node, in parallel; ``NodesError`` if any failed."""
    out = try_on_nodes(nodes, fn, parallel=parallel, ssh=ssh, pool=pool, max_workers=max_workers)
    errors: dict[str, BaseException] = {k: v for k, v in out.items() if isinstance(v, Exception)}
    ok: dict[str, T] = {k: v for k, v in out.items() if not isinstance(v, Exception)}
    if errors:
        raise NodesError(errors, ok)
    return ok


def exec_on_nodes(
    nodes: Sequence[Node],
    cmd: str,
    *,
    ssh: SshOptions | None = None,
    pool: ConnectionPool | None = None,
    **kwargs: Any,
) -> dict[str, Result]:
    """The same command on every node in parallel."""
    return on_nodes(nodes, lambda r: r.exec(cmd, **kwargs), ssh=ssh, pool=pool)
