"""Running Debian's ZooKeeper: a config file, a command line, and a local process for tests.

ZooKeeper comes from Debian's `zookeeper` package (`/usr/share/java/zookeeper.jar`); we never use
its init scripts, so several ensembles can run side by side. `zoo_cfg` writes a config for a
standalone server or one member of an ensemble (`server.N=host:2888:3888` lines plus `myid`);
`command` is the java command line that runs it in the foreground. The harness ships both to
nodes over SSH; `LocalZooKeeper` runs a standalone server as a child process on 127.0.0.1 for
tests and for a broker cluster on one machine.

Settings chosen for fault-injection work: a short tickTime (500 ms) so sessions of a few seconds
are possible, the admin HTTP server off (it would need port 8080 on every node), four-letter
words on (`ruok` is the readiness probe), no client connection limit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
LOGGER_JARS = [Path("/usr/share/java/slf4j-api.jar"), Path("/usr/share/java/slf4j-simple.jar")]
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


class ZooKeeperMissing(RuntimeError):
    pass


def check_installed() -> None:
    if not ZOOKEEPER_JAR.exists():
        raise ZooKeeperMissing(
            f"{ZOOKEEPER_JAR} not found: install Debian's ZooKeeper with "
            "`apt-get install zookeeper` (make test / make demo do this for you)"
        )
    if shutil.which("java") is None:
        raise ZooKeeperMissing(
            "java not found: install a JRE (`apt-get install default-jre-headless`)"
        )


def zoo_cfg(
    data_dir: Path | str,
    client_port: int = 2181,
    client_address: str | None = None,
    servers: Sequence[str] = (),
    tick_ms: int = 500,
) -> str:
    """The text of zoo.cfg. `servers`: ensemble member hosts in myid order (1-based); empty for
    a standalone server."""
    lines = [
        f"tickTime={tick_ms}",
        "initLimit=20",
        "syncLimit=10",
        f"dataDir={data_dir}",
        f"clientPort={client_port}",
        "admin.enableServer=false",
        "4lw.commands.whitelist=*",
        "maxClientCnxns=0",
        "autopurge.purgeInterval=1",
    ]
    if client_address:
        lines.append(f"clientPortAddress={client_address}")
    for i, host in enumerate(servers, 1):
        lines.append(f"server.{i}={host}:2888:3888")
    return "\n".join(lines) + "\n"


def classpath() -> str:
    parts = [str(ZOOKEEPER_JAR)] + [str(p) for p in LOGGER_JARS if p.exists()]
    return ":".join(parts)


def command(cfg_path: Path | str, heap_mb: int = 256) -> list[str]:
    return [
        "java",
        f"-Xmx{heap_mb}m",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath(),
        MAIN_CLASS,
        str(cfg_path),
    ]


def ruok(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


def is_serving(host: str, port: int, timeout: float = 1.0) -> bool:
    """`srvr` answers with a mode line only once the server is part of a working quorum."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"srvr")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            return b"Mode:" in data
    except OSError:
        return False


class LocalZooKeeper:
    """A standalone ZooKeeper on 127.0.0.1 as a child process (tests, one-machine clusters)."""

    def __init__(self, directory: Path, port: int | None = None):
        check_installed()
        self.dir = Path(directory)
        self.port = port or _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> LocalZooKeeper:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "zoo.cfg"
        cfg.write_text(zoo_cfg(data, self.port, "127.0.0.1"))
        log = open(self.dir / "zookeeper.log", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            command(cfg), stdout=log, stderr=log, cwd=self.dir, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self.proc.returncode}; see {self.dir / 'zookeeper.log'}"
                )
            if is_serving("127.0.0.1", self.port):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not start within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["LocalZooKeeper", "ZooKeeperMissing", "command", "ruok", "zoo_cfg"]
