"""The database under test on its nodes: ZooKeeper and the reference broker, deployed over SSH.

``KafkaDB(test, inventory, run_dir)`` owns the whole life of the system under test on a set of
nodes, and reaches them only through ``harness.remote`` (SSH), so the embedded netns cluster and
real VMs take the same code path.

Shipping the code (``setup`` step 1)
    ``harness.wheelhouse`` builds (or finds cached) the wheels for the current sources. On each
    node, in parallel: if ``<workdir>/venv/.isrlab-build`` holds the same build hash nothing is
    done ("up to date"); if only the build hash differs (``.isrlab-deps`` matches) just the
    isrlab wheel is uploaded and reinstalled ("updated"); otherwise the wheelhouse is uploaded, a
    venv is created with the node's ``python3.X`` (same X as the control host's: the binary
    wheels are built for it) without pip, and filled by running pip from its wheel with
    ``--no-index --find-links`` ("installed"). ZooKeeper and a JRE come from apt (``apt-get
    install -y zookeeper default-jre-headless``) when ``/usr/share/java/zookeeper.jar`` or
    ``java`` are missing.

Node layout (``<workdir>`` per node: ``workdirs[node]``, default ``/var/lib/isrlab/node-<host>``)::

    <workdir>/venv/                      the broker's virtualenv (+ .isrlab-build, the hash)
    <workdir>/wheelhouse/                the uploaded wheels
    <workdir>/zk/zoo.cfg, zk/data/myid   ZooKeeper member config and data (first 3 nodes)
    <workdir>/broker/server.properties   the broker's config
    <workdir>/broker/data/               log.dirs
    <workdir>/run/broker.pid, zk.pid     pid files
    <workdir>/run/clock-offset           the broker's wall-clock offset in s ("+0", "+12.5", "-3")
    <workdir>/logs/broker.log, zookeeper.log

Cluster (``setup`` steps 2-4)
    ZooKeeper runs as an ensemble on the first three nodes (one node if there are fewer than
    three) on port 2181, chroot ``/isrlab``; it is up once every member answers ``srvr`` with a
    mode. A broker runs on every node with ``broker.id`` = the node's 1-based index, listening on
    ``PLAINTEXT://<node host>:9092``; the settings under test come from the test config
    (``testconfig.BROKER_SETTINGS`` maps test keys to broker keys; ``broker_config`` adds raw keys). A
    broker runs as a daemon with a pid file and the cluster is ready when a metadata request
    lists every broker (a broker that dies before registering is restarted twice).

Clock skew (``clock_mode``)
    ``"process"`` (default): the broker's venv has ``isrlab_clockshim`` (``nemeses.clockshim``,
    loaded by a .pth file) and the broker runs with ``ISRLAB_CLOCK_OFFSET_FILE`` =
    ``clock_offset_file(node)``; clock nemeses rewrite that file and only that broker's wall
    clock moves. This replaces libfaketime, which breaks CPython 3.11 (see the shim's doc), and
    works on embedded nodes, which share one kernel clock. ``"date"``: clock nemeses step the
    node's system clock with ``date -s`` (real hosts only). ZooKeeper is never skewed: it is
    the coordinator, not the system under test.

Every step prints one progress line through ``progress`` (default: ``print`` with ``[db]``).
For an embedded cluster pass ``workdirs=cluster.workdirs`` so ``isrlab cluster down`` removes
everything; the default work dir outlives the cluster, which keeps the venv for the next run.

Faults the nemeses use: ``kill(node)`` (SIGKILL), ``start(node)``, ``pause(node)`` (SIGSTOP of
the process group), ``resume(node)``; ``clock_offset_file(node)`` / ``clock_mode``.
Cluster queries go through a confluent-kafka AdminClient from the control host, as clients do:
``bootstrap_servers()``, ``leader_of(topic, partition)``, ``controller()``, ``coordinator(group)``,
``txn_coordinator(transactional_id)``, ``create_topics(keys, rf, min_insync)``. ``collect_logs(run_dir)`` copies each node's logs and
configs plus a listing of its data dir into ``run_dir/<node>/``; ``teardown()`` stops every
process and wipes data and logs (the venv stays, so the next run skips the install).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from isrlab.broker.log.inventory import TRUNCATION_JOURNAL
from isrlab.harness import zookeeper
from isrlab.harness.inventory import Inventory, Node
from isrlab.harness.remote import Remote, RemoteCommandError, on_nodes
from isrlab.harness.ssh import ConnectionPool, ControlError
from isrlab.harness.testconfig import (
    BROKER_SETTINGS,
    ConfigError,
    flush_policy_properties,
    option,
    render_broker_value,
)
from isrlab.harness.wheelhouse import (
    PROJECT_ROOT,
    Wheelhouse,
    build_wheelhouse,
    node_requirements,
)

log = logging.getLogger(__name__)

CLOCK_SHIM = PROJECT_ROOT / "nemeses" / "clockshim.py"
FSYNC_SHIM = PROJECT_ROOT / "nemeses" / "fsyncshim.py"

CREATE_ATTEMPT_S = 10.0  # one CreateTopics attempt before asking again with a fresh client
ZK_PORT = 2181
BROKER_PORT = 9092

#: what every test's brokers get beyond their addresses (real runs here, simulated runs in
#: harness/sim/run.py): a 6 s ZooKeeper session and a 10 s replica lag (faults show within a
#: short run), no auto-created topics (the harness creates its keys), and 10 partitions of
#: __consumer_offsets and __transaction_state where Kafka has 50 (a follower batches a leader's
#: partitions into one fetch, but without fetch sessions, KIP-227, the leader reads every
#: partition of that fetch each time one of them wakes it). `broker_config` overrides them.
BASE_BROKER_SETTINGS: dict[str, str] = {
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "10000",
    "auto.create.topics.enable": "false",
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
}
ZK_CHROOT = "/isrlab"
ZK_ENSEMBLE_SIZE = 3

Progress = Callable[[str], None]


class DBError(ControlError):
    """Deploying or running the system under test failed; the message says what to do."""


def _print_progress(msg: str) -> None:
    print(f"[db] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Keys


def parse_key(key: str) -> tuple[str, int]:
    """``"t0/3"`` -> ``("t0", 3)``."""
    topic, _, part = key.rpartition("/")
    if not topic or not part.isdigit():
        raise ValueError(f"bad key {key!r}: keys are 'topic/partition', e.g. 't0/0'")
    return topic, int(part)


# FindCoordinator key types (Kafka's CoordinatorType)
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1


def find_coordinator(
    host: str, port: int, group: str, timeout: float = 5.0, key_type: int = KEY_TYPE_GROUP
) -> int | None:
    """The broker id a FindCoordinator (v1) request to ``host:port`` names as the coordinator
    of ``group`` (key type group), or of a transactional id (``key_type`` 1,
    `KEY_TYPE_TRANSACTION`); None when the broker answers with an error. Raises OSError when
    the broker cannot be reached and ValueError on a malformed answer."""
    client = b"isrlab-harness"
    key = group.encode()
    body = struct.pack(">hhih", 10, 1, 1, len(client)) + client
    body += struct.pack(">h", len(key)) + key + struct.pack(">b", key_type)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        answer = _recv_exactly(sock, size)
    correlation, _throttle, error, msg_len = struct.unpack_from(">iihh", answer, 0)
    if correlation != 1:
        raise ValueError(f"FindCoordinator answer for correlation id {correlation}, not 1")
    if error != 0:
        return None
    at = 12 + max(msg_len, 0)
    (node_id,) = struct.unpack_from(">i", answer, at)
    return node_id if node_id >= 0 else None


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ValueError("the broker closed the connection mid-answer")
        buf += chunk
    return buf


def _retriable(error: str) -> bool:
    # "available broker(s)": the broker that took the CreateTopics had not yet seen every
    # registration the harness waited for (its /brokers/ids watch lags a moment after start)
    return any(
        s in error
        for s in (
            "live broker",
            "available broker(s)",
            "NOT_CONTROLLER",
            "_TIMED_OUT",
            "REQUEST_TIMED_OUT",
            "_TRANSPORT",
        )
    )


# --------------------------------------------------------------------------------------------
# The DB


class KafkaDB:
    """ZooKeeper + the reference broker on ``inventory``'s nodes. See the module docstring."""

    def __init__(
        self,
        test: Mapping[str, Any],
        inventory: Inventory,
        run_dir: Path | str,
        *,
        workdirs: Mapping[str, str] | None = None,
        pool: ConnectionPool | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.test = dict(test)
        self.inventory = inventory
        self.run_dir = Path(run_dir)
        wanted = test.get("nodes")
        self.nodes: list[Node] = (
            [n for n in inventory.nodes if n.name in wanted] if wanted else list(inventory.nodes)
        )
        if not self.nodes:
            raise DBError(f"none of the test's nodes {wanted} is in the inventory")
        given = dict(workdirs or test.get("workdirs") or {})
        self.workdirs = {
            n.name: given.get(n.name, f"/var/lib/isrlab/node-{n.host}") for n in self.nodes
        }
        self.pool = pool or ConnectionPool()
        self.progress: Progress = progress or _print_progress
        self.zk_nodes = self.nodes[: ZK_ENSEMBLE_SIZE if len(self.nodes) >= ZK_ENSEMBLE_SIZE else 1]
        self.broker_ids = {n.name: i for i, n in enumerate(self.nodes, 1)}
        try:
            self.clock_mode: str = option("clock_mode").check(test.get("clock_mode") or "process")
        except ConfigError as e:
            raise DBError(str(e)) from None
        self._admin: Any = None
        self._zk: Any = None  # a kazoo client, opened by partition_state

    # ---------------------------------------------------------------- helpers

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} (nodes: {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def remote(self, name: str) -> Remote:
        return Remote(self.node(name), self.inventory.ssh, self.pool)

    def _on(self, nodes: Iterable[Node], fn: Callable[[Remote], Any]) -> dict[str, Any]:
        return on_nodes(list(nodes), fn, ssh=self.inventory.ssh, pool=self.pool)

    def path(self, node: str, *parts: str) -> str:
        return "/".join([self.workdirs[node], *parts])

    def broker_pidfile(self, node: str) -> str:
        return self.path(node, "run", "broker.pid")

    def zk_pidfile(self, node: str) -> str:
        return self.path(node, "run", "zk.pid")

    def clock_offset_file(self, node: str) -> str:
        """The wall-clock offset file the node's broker follows (``+0`` when not skewed)."""
        return self.path(node, "run", "clock-offset")

    def fsync_fail_file(self, node: str) -> str:
        """While this file exists, every fsync of the node's broker fails with EIO
        (``nemeses.fsyncshim``, the ``fsync-fail`` nemesis)."""
        return self.path(node, "run", "fsync-fail")

    def set_fsync_failing(self, node: str, failing: bool) -> bool:
        """Make the node's broker's fsyncs fail (EIO) or work again: True if the flag was set,
        or, when removing it, if there was one."""
        path = shlex.quote(self.fsync_fail_file(node))
        command = f"touch {path}" if failing else f"test -e {path} && rm -f {path}"
        return self.remote(node).exec(command, check=False).ok

    def zk_connect(self) -> str:
        return ",".join(f"{n.host}:{ZK_PORT}" for n in self.zk_nodes) + ZK_CHROOT

    def bootstrap_servers(self, nodes: Iterable[str] | None = None) -> str:
        names = list(nodes) if nodes is not None else self.names
        return ",".join(f"{self.node(n).host}:{BROKER_PORT}" for n in names)

    def broker_node(self, broker_id: int) -> str | None:
        for name, bid in self.broker_ids.items():
            if bid == broker_id:
                return name
        return None

    # ---------------------------------------------------------------- install

    def install(self, wheelhouse: Wheelhouse | None = None) -> dict[str, str]:
        """Venvs (and ZooKeeper/JRE where missing) on every node in parallel.

        Returns ``{node: "installed" | "updated" | "up to date"}`` ("updated": only the
        isrlab wheel was swapped because the dependency wheels were already there).
        """
        wh = wheelhouse or build_wheelhouse(progress=self.progress)
        started = time.monotonic()
        result = self._on(self.nodes, lambda r: self._install_node(r, wh))
        counts = {k: sum(1 for v in result.values() if v == k) for k in set(result.values())}
        self.progress(
            f"nodes ready in {time.monotonic() - started:.1f}s ("
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            + ")"
        )
        return result

    def _install_node(self, r: Remote, wh: Wheelhouse) -> str:
        name = r.node.name
        venv = self.path(name, "venv")
        self._ensure_packages(r)
        build_marker, deps_marker = f"{venv}/.isrlab-build", f"{venv}/.isrlab-deps"
        cur = r.exec(
            f"test -x {venv}/bin/python && cat {build_marker} {deps_marker} 2>/dev/null",
            check=False,
        ).stdout.split()
        if cur[:1] == [wh.build_hash]:
            return "up to date"
        house = self.path(name, "wheelhouse")
        pip = f"{venv}/bin/python {house}/{wh.pip_wheel.name}/pip --disable-pip-version-check -q"
        project = wh.project_wheel.name
        if len(cur) == 2 and cur[1] == wh.deps_key:
            # only our code changed: swap the isrlab wheel, keep the dependencies
            r.exec(f"rm -f {house}/isrlab-*.whl")
            r.upload(wh.project_wheel, f"{house}/{project}")
            r.exec(
                f"set -e\nrm -f {build_marker}\n"
                f"{pip} install --no-index --no-deps --force-reinstall {house}/{project}",
                timeout=600,
            )
            self._install_clock_shim(r, wh.python)
            r.exec(f"echo {wh.build_hash} > {build_marker}")
            return "updated"
        python = self._node_python(r, wh.python)
        r.exec(f"rm -rf {house} && mkdir -p {house}")
        for f in wh.files:
            r.upload(f, f"{house}/{f.name}")
        reqs = " ".join(shlex.quote(x) for x in node_requirements())
        r.exec(
            f"""set -e
rm -rf {venv}
{python} -m venv --without-pip {venv}
{pip} install --no-index --find-links {house} {reqs}
{pip} install --no-index --no-deps {house}/{project}
{venv}/bin/python -c 'import isrlab.broker.cli'
echo {wh.deps_key} > {deps_marker}
""",
            timeout=600,
        )
        self._install_clock_shim(r, wh.python)
        r.exec(f"echo {wh.build_hash} > {build_marker}")
        return "installed"

    def _node_python(self, r: Remote, version: str) -> str:
        wanted = str(self.test.get("node_python") or "")
        for cand in [wanted] if wanted else [f"python{version}", "python3"]:
            res = r.exec(
                f"command -v {cand} >/dev/null && {cand} -c "
                "'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
                check=False,
            )
            if res.ok and res.stdout.strip() == version:
                return cand
        raise DBError(
            f"{r.node.name}: no Python {version} found (the wheels are built for the control "
            f"host's Python {version}); install python{version} on the node or set node_python"
        )

    def _ensure_packages(self, r: Remote) -> None:
        have = r.exec(
            f"test -f {zookeeper.ZOOKEEPER_JAR} && command -v java >/dev/null", check=False
        )
        if have.ok:
            return
        self.progress(f"{r.node.name}: installing zookeeper and a JRE with apt-get")
        try:
            r.exec(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                "zookeeper default-jre-headless || (apt-get update -q && "
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                "zookeeper default-jre-headless)",
                timeout=900,
            )
        except RemoteCommandError as e:
            raise DBError(
                f"{r.node.name}: could not install ZooKeeper and a JRE with apt-get; install "
                f"them by hand (apt-get install zookeeper default-jre-headless).\n{e}"
            ) from None

    def clock_via_file(self, node: str) -> bool:
        """Whether clock faults on ``node`` rewrite its offset file (else ``date -s``)."""
        return self.clock_mode == "process"

    def _install_clock_shim(self, r: Remote, python_version: str) -> None:
        """The process-level fault shims, loaded by .pth files at the broker's start: the
        clock offset (``nemeses.clockshim``) and failing fsyncs (``nemeses.fsyncshim``)."""
        site = self.path(r.node.name, "venv", "lib", f"python{python_version}", "site-packages")
        r.write_file(f"{site}/isrlab_clockshim.py", CLOCK_SHIM.read_bytes())
        r.write_file(f"{site}/isrlab_clockshim.pth", "import isrlab_clockshim\n")
        r.write_file(f"{site}/isrlab_fsyncshim.py", FSYNC_SHIM.read_bytes())
        r.write_file(f"{site}/isrlab_fsyncshim.pth", "import isrlab_fsyncshim\n")

    # ---------------------------------------------------------------- configs

    def broker_properties(self, node: str) -> str:
        n = self.node(node)
        props: dict[str, str] = {
            "broker.id": str(self.broker_ids[node]),
            "listeners": f"PLAINTEXT://{n.host}:{BROKER_PORT}",
            "log.dirs": self.path(node, "broker", "data"),
            "zookeeper.connect": self.zk_connect(),
            **BASE_BROKER_SETTINGS,
            "default.replication.factor": str(min(3, len(self.nodes))),
        }
        for key, prop in BROKER_SETTINGS.items():
            if self.test.get(key) is not None:
                props[prop] = render_broker_value(self.test[key])
        if self.test.get("flush_policy"):
            props.update(flush_policy_properties(str(self.test["flush_policy"])))
        for k, v in (self.test.get("broker_config") or {}).items():
            props[str(k)] = str(v)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _write_configs(self, r: Remote) -> None:
        name = r.node.name
        r.exec(
            "mkdir -p "
            + " ".join(self.path(name, d) for d in ("run", "logs", "broker/data", "zk/data"))
        )
        r.write_file(self.path(name, "broker", "server.properties"), self.broker_properties(name))
        r.exec(
            f"test -f {self.clock_offset_file(name)} || echo +0 > {self.clock_offset_file(name)}"
        )
        r.exec(f"rm -f {self.fsync_fail_file(name)}")  # a run that ended mid-fault
        if r.node in self.zk_nodes:
            myid = self.zk_nodes.index(r.node) + 1
            servers = [n.host for n in self.zk_nodes] if len(self.zk_nodes) > 1 else []
            cfg = zookeeper.zoo_cfg(self.path(name, "zk", "data"), ZK_PORT, None, servers)
            r.write_file(self.path(name, "zk", "zoo.cfg"), cfg)
            r.write_file(self.path(name, "zk", "data", "myid"), f"{myid}\n")

    # ---------------------------------------------------------------- lifecycle

    def setup(self) -> None:
        """Install, configure, start ZooKeeper and every broker; returns when all are registered.

        Like Jepsen's ``cycle!`` it first stops and wipes whatever an earlier run left on the
        nodes, so a test never inherits another's processes or data.
        """
        t0 = time.monotonic()
        self.install()
        t1 = time.monotonic()
        self._on(self.nodes, self._stop_and_wipe)
        self._on(self.nodes, self._write_configs)
        self.progress(f"configs written on {len(self.nodes)} nodes")
        # the broker gives up at startup when ZooKeeper drops it (as a member without a quorum
        # does), so brokers start only once the quorum serves
        self.start_zookeeper()
        self._on(self.nodes, lambda r: self._start_broker(r))
        self.progress(f"{len(self.nodes)} brokers started")
        self.wait_for_brokers()
        now = time.monotonic()
        self.progress(
            f"cluster up in {now - t1:.1f}s (ZooKeeper x{len(self.zk_nodes)} + "
            f"{len(self.nodes)} brokers; {now - t0:.1f}s with install)"
        )

    def start_zookeeper(self, wait: bool = True, timeout: float = 60.0) -> None:
        """Start the ensemble's members; with ``wait``, until the quorum serves."""

        def start(r: Remote) -> int:
            name = r.node.name
            return r.start_daemon(
                "zookeeper",
                shlex.join(zookeeper.command(self.path(name, "zk", "zoo.cfg"))),
                pidfile=self.zk_pidfile(name),
                logfile=self.path(name, "logs", "zookeeper.log"),
                cwd=self.path(name, "zk"),
                verify=0.0,
            )

        self._on(self.zk_nodes, start)
        self.progress(f"ZooKeeper started on {', '.join(n.name for n in self.zk_nodes)}")
        if wait:
            self.wait_for_zookeeper(timeout)

    def wait_for_zookeeper(self, timeout: float = 60.0) -> None:
        """Until every ensemble member answers ``srvr`` with a mode (a quorum is serving)."""
        deadline = time.monotonic() + timeout
        waiting = {n.name for n in self.zk_nodes}
        while waiting:
            for name in sorted(waiting):
                if self._zk_serving(self.remote(name)):
                    waiting.discard(name)
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise DBError(
                    f"ZooKeeper did not form a quorum within {timeout:.0f}s "
                    f"(not serving: {', '.join(sorted(waiting))}); see logs/zookeeper.log"
                )
            time.sleep(0.2)
        self.progress(f"ZooKeeper quorum of {len(self.zk_nodes)} serving")

    def _zk_serving(self, r: Remote) -> bool:
        res = r.exec(
            f"timeout 2 bash -c 'exec 3<>/dev/tcp/{r.node.host}/{ZK_PORT}; "
            "echo srvr >&3; cat <&3' 2>/dev/null",
            check=False,
        )
        return "Mode:" in res.stdout

    def _broker_env(self, name: str) -> dict[str, str]:
        env = {"PYTHONUNBUFFERED": "1", "ISRLAB_FSYNC_FAIL_FILE": self.fsync_fail_file(name)}
        if self.clock_via_file(name):
            env["ISRLAB_CLOCK_OFFSET_FILE"] = self.clock_offset_file(name)
        return env

    def _start_broker(self, r: Remote) -> int:
        name = r.node.name
        return r.start_daemon(
            "broker",
            f"{self.path(name, 'venv', 'bin', 'python')} -m isrlab.broker start "
            f"--config {self.path(name, 'broker', 'server.properties')}",
            pidfile=self.broker_pidfile(name),
            logfile=self.path(name, "logs", "broker.log"),
            env=self._broker_env(name),
            cwd=self.path(name, "broker"),
        )

    def wait_for_brokers(
        self, nodes: Iterable[str] | None = None, timeout: float = 60.0, restarts: int = 2
    ) -> None:
        """Until metadata (asked of those brokers) lists every broker of ``nodes``.

        A broker that exits before registering (it gives up when its first ZooKeeper session
        is lost, which happens on an overloaded host) is started again, up to ``restarts``
        times per node, with a progress line quoting its last log line.
        """
        names = list(nodes) if nodes is not None else self.names
        want = {self.broker_ids[n] for n in names}
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        restarted: dict[str, int] = {}
        next_check = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                md = self._admin_for(names).list_topics(timeout=2)
                seen = set(md.brokers)
                if want <= seen:
                    self.progress(f"brokers registered: {sorted(seen)}")
                    return
            except Exception:
                pass
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 3.0
                for name in names:
                    if self.broker_ids[name] in seen or restarted.get(name, 0) >= restarts:
                        continue
                    r = self.remote(name)
                    if r.daemon_running(self.broker_pidfile(name)):
                        continue
                    tail = r.exec(
                        f"grep -v '^[│╭╰ ]' {self.path(name, 'logs', 'broker.log')} | tail -n1",
                        check=False,
                    ).stdout.strip()
                    restarted[name] = restarted.get(name, 0) + 1
                    self.progress(f"{name}: broker exited during startup ({tail}); restarting")
                    self._start_broker(r)
            time.sleep(0.2)
        missing = sorted(self.broker_node(b) or str(b) for b in want - seen)
        raise DBError(
            f"brokers on {', '.join(missing)} did not register within {timeout:.0f}s; "
            "see logs/broker.log on those nodes (collect_logs copies them)"
        )

    def teardown(self) -> None:
        """Stop every broker and ZooKeeper, wipe their data, logs and configs (not the venv)."""

        self._on(self.nodes, self._stop_and_wipe)
        self.close()
        self.progress(f"torn down on {len(self.nodes)} nodes")

    def _stop_and_wipe(self, r: Remote) -> None:
        name = r.node.name
        r.stop_daemon(self.broker_pidfile(name), wait=5)
        r.stop_daemon(self.zk_pidfile(name), wait=5)
        r.exec("rm -rf " + " ".join(self.path(name, d) for d in ("broker", "zk", "run", "logs")))

    def partition_state(self, topic: str, partition: int) -> tuple[str | None, list[str], int]:
        """(leader node, ISR nodes, leader epoch) of ``topic/partition`` as the controller last
        wrote them in the partition's state znode in ZooKeeper (Kafka's
        ``/brokers/topics/<t>/partitions/<p>/state``), read directly from the ensemble: what
        the targeted schedules watch. Raises (kazoo's errors, KeyError) when unreadable."""
        if self._zk is None:
            from kazoo.client import KazooClient

            hosts, _, chroot = self.zk_connect().partition("/")
            zk = KazooClient(hosts=hosts + "/" + chroot, timeout=5.0)
            zk.start(timeout=10)
            self._zk = zk
        data, _ = self._zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")
        state = json.loads(data)
        leader = int(state["leader"])
        isr = [n for n in (self.broker_node(int(b)) for b in state["isr"]) if n]
        return (self.broker_node(leader) if leader >= 0 else None), isr, int(state["leader_epoch"])

    def assignment(self, topic: str, partition: int) -> list[str]:
        """The assigned replicas of ``topic/partition`` in order (the first is the preferred
        leader), as the topic znode (``/brokers/topics/<t>``) holds them: the order the
        controller elects from."""
        self.partition_state(topic, partition)  # connects
        assert self._zk is not None
        data, _ = self._zk.get(f"/brokers/topics/{topic}")
        replicas = json.loads(data)["partitions"][str(partition)]
        return [n for n in (self.broker_node(int(b)) for b in replicas) if n]

    def close(self) -> None:
        self._admin = None
        if self._zk is not None:
            with contextlib.suppress(Exception):
                self._zk.stop()
                self._zk.close()
            self._zk = None

    # ---------------------------------------------------------------- process faults

    def kill(self, node: str, wait: float = 10.0) -> bool:
        """SIGKILL the broker's process group and wait until it is gone; True if it was running.

        Waiting matters: a process with many threads takes a moment to die after SIGKILL, and
        a ``start`` in that moment would find it still alive and do nothing.
        """
        if not self.remote(node).signal_daemon(self.broker_pidfile(node), "KILL"):
            return False
        deadline = time.monotonic() + wait
        while self.broker_state(node) != "down" and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    def start(self, node: str) -> int:
        """Start the broker (no-op if it runs); returns its pid."""
        if self.broker_state(node) == "down":
            # a killed broker can linger as a zombie when nothing reaps orphans (containers
            # without an init); kill -0 still succeeds on it, so forget its pid file
            self.remote(node).exec(f"rm -f {self.broker_pidfile(node)}")
        return self._start_broker(self.remote(node))

    def power_loss(self, node: str, torn_seed: int | None = None) -> str:
        """Cut the (dead) broker's log dir back to what reached disk (``isrlab-broker
        power-loss``, from the broker's fsync journal; with ``torn_seed``, torn tails:
        ``--torn-seed``); returns its one-line summary."""
        torn = "" if torn_seed is None else f" --torn-seed {int(torn_seed)}"
        res = self.remote(node).exec(
            f"{self.path(node, 'venv', 'bin', 'python')} -m isrlab.broker power-loss "
            f"--log-dirs {self.path(node, 'broker', 'data')}{torn}",
            check=False,
        )
        if not res.ok:
            raise DBError(f"{node}: power loss failed: {(res.stderr or res.stdout).strip()}")
        return res.stdout.strip()

    def zookeeper_nodes(self) -> list[str]:
        return [n.name for n in self.zk_nodes]

    def kill_zookeeper(self, node: str) -> bool:
        """SIGKILL the node's ZooKeeper server and wait (up to 10 s) until it is gone; True if
        it was running."""
        r = self.remote(node)
        if not r.signal_daemon(self.zk_pidfile(node), "KILL"):
            return False
        deadline = time.monotonic() + 10.0
        while r.daemon_running(self.zk_pidfile(node)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    def start_zookeeper_on(self, node: str) -> int:
        """Start the node's ZooKeeper server again (no-op if it runs)."""
        return self.remote(node).start_daemon(
            "zookeeper",
            shlex.join(zookeeper.command(self.path(node, "zk", "zoo.cfg"))),
            pidfile=self.zk_pidfile(node),
            logfile=self.path(node, "logs", "zookeeper.log"),
            cwd=self.path(node, "zk"),
            verify=0.0,
        )

    def pause(self, node: str) -> bool:
        return self.remote(node).signal_daemon(self.broker_pidfile(node), "STOP")

    def resume(self, node: str) -> bool:
        return self.remote(node).signal_daemon(self.broker_pidfile(node), "CONT")

    def broker_pid(self, node: str) -> int | None:
        return self.remote(node).daemon_pid(self.broker_pidfile(node))

    def broker_state(self, node: str) -> str:
        """``running``, ``paused``, ``down`` (crashed or killed: its pid file is still there, its
        process is gone or a zombie) or ``stopped`` (no pid file: never started, or stopped)."""
        pidfile = self.broker_pidfile(node)
        res = self.remote(node).exec(
            f"test -f {pidfile} || {{ echo stopped; exit 0; }}\n"
            f"p=$(cat {pidfile}) && kill -0 \"$p\" 2>/dev/null && awk '{{print $3}}' /proc/$p/stat",
            check=False,
        )
        state = res.stdout.strip()
        if state == "stopped":
            return state
        if not res.ok or not state or state == "Z":
            return "down"
        return "paused" if state == "T" else "running"

    # ---------------------------------------------------------------- cluster queries

    def _admin_for(self, nodes: Iterable[str] | None = None) -> Any:
        from confluent_kafka.admin import AdminClient

        from isrlab.harness.workloads.queue.client import LIBRDKAFKA_LOG

        # librdkafka's own lines (refused connections while brokers restart) go to logging at
        # DEBUG, not straight to stderr between the progress lines.
        quiet: dict[str, Any] = {"logger": LIBRDKAFKA_LOG, "log_level": 4}
        if nodes is not None:
            # a one-off client asking only these brokers (e.g. the majority side of a partition)
            return AdminClient(
                {
                    "bootstrap.servers": self.bootstrap_servers(nodes),
                    "socket.timeout.ms": 5000,
                    **quiet,
                }
            )
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers(), **quiet})
        return self._admin

    def metadata(
        self, via: Iterable[str] | None = None, topic: str | None = None, timeout: float = 5.0
    ) -> Any:
        """Cluster metadata asked of the brokers on ``via`` (default: any broker)."""
        return self._admin_for(via).list_topics(topic=topic, timeout=timeout)

    def leader_of(self, topic: str, partition: int, via: Iterable[str] | None = None) -> str | None:
        """The node the metadata names as leader of ``topic/partition`` (None: no leader)."""
        md = self.metadata(via, topic)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            return None
        leader = t.partitions[partition].leader
        return self.broker_node(leader) if leader >= 0 else None

    def replicas_of(
        self, topic: str, partition: int, via: Iterable[str] | None = None
    ) -> tuple[str | None, list[str]]:
        """The leader of ``topic/partition`` and its in-sync followers, as the metadata names
        them ((None, []) when it names no leader)."""
        md = self.metadata(via, topic)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            return None, []
        p = t.partitions[partition]
        if p.leader < 0:
            return None, []
        leader = self.broker_node(p.leader)
        followers = [self.broker_node(b) for b in p.isrs if b != p.leader]
        return leader, [f for f in followers if f]

    def controller(self, via: Iterable[str] | None = None) -> str | None:
        md = self.metadata(via)
        return self.broker_node(md.controller_id) if md.controller_id >= 0 else None

    def coordinator(self, group: str, via: Iterable[str] | None = None) -> str | None:
        """The node coordinating consumer group ``group``: the leader of the group's
        ``__consumer_offsets`` partition, as a FindCoordinator request to the brokers on
        ``via`` (default: every node) names it; the first broker that answers decides. None
        when none does (no leader yet: COORDINATOR_NOT_AVAILABLE, or unreachable).

        The request is sent on a socket of its own: confluent-kafka's only way to it,
        describe_consumer_groups, aborts the process (a librdkafka 2.x assertion in
        rd_kafka_enq_once_del_source_return) after a FindCoordinator that timed out."""
        return self._find_coordinator(group, KEY_TYPE_GROUP, via)

    def txn_coordinator(
        self, transactional_id: str, via: Iterable[str] | None = None
    ) -> str | None:
        """The node coordinating ``transactional_id``'s transactions: the leader of its
        ``__transaction_state`` partition, as a FindCoordinator request (key type
        TRANSACTION) names it; None as for `coordinator`."""
        return self._find_coordinator(transactional_id, KEY_TYPE_TRANSACTION, via)

    def _find_coordinator(self, key: str, key_type: int, via: Iterable[str] | None) -> str | None:
        for address in self.bootstrap_servers(via).split(","):
            host, _, port = address.rpartition(":")
            try:
                node_id = find_coordinator(host, int(port), key, key_type=key_type)
            except (OSError, ValueError, struct.error) as e:
                log.debug("FindCoordinator(%s, type %s) on %s: %s", key, key_type, address, e)
                continue
            if node_id is not None:
                return self.broker_node(node_id)
        return None

    def create_topics(
        self,
        keys: Iterable[str],
        rf: int | None = None,
        min_insync: int | None = None,
        timeout: float = 30.0,
    ) -> dict[str, int]:
        """Create the topics ``keys`` name (``"t0/0"``...) and wait until every key has a leader.

        Returns ``{topic: partitions}``. Existing topics are left alone.
        """
        from confluent_kafka.admin import NewTopic

        parts: dict[str, int] = {}
        for k in keys:
            topic, p = parse_key(k)
            parts[topic] = max(parts.get(topic, 0), p + 1)
        rf = rf or int(self.test.get("replication_factor") or min(3, len(self.nodes)))
        config = {} if min_insync is None else {"min.insync.replicas": str(min_insync)}
        admin = self._admin_for()
        deadline = time.monotonic() + timeout
        pending = dict(parts)
        while pending:
            futures = admin.create_topics(
                [NewTopic(t, n, rf, config=config) for t, n in sorted(pending.items())],
                operation_timeout=timeout,
            )
            # One attempt waits at most CREATE_ATTEMPT_S: a client whose first Metadata answer named
            # no controller (brokers that started before the election) can wait for one far
            # longer than the whole deadline; a fresh client asks again.
            attempt_end = min(deadline, time.monotonic() + CREATE_ATTEMPT_S)
            for topic, fut in futures.items():
                try:
                    fut.result(max(0.5, attempt_end - time.monotonic()))
                    pending.pop(topic)
                except FutureTimeout:
                    if time.monotonic() > deadline:
                        raise DBError(
                            f"creating topic {topic} failed within {timeout:.0f}s: no answer "
                            "from the controller; see the controller's logs/broker.log"
                        ) from None
                    self._admin = None
                    admin = self._admin_for()
                    break
                except Exception as e:
                    msg = f"{type(e).__name__}: {e}"
                    if "TOPIC_ALREADY_EXISTS" in msg or "already exists" in msg:
                        pending.pop(topic)
                    elif not _retriable(msg) or time.monotonic() > deadline:
                        raise DBError(
                            f"creating topic {topic} failed within {timeout:.0f}s: {msg}; "
                            "see the controller's logs/broker.log"
                        ) from None
            if pending:
                # a new controller can count no live brokers for a moment after a failover
                time.sleep(0.5)
        deadline = time.monotonic() + timeout
        while True:
            md = self.metadata()
            waiting = [
                f"{t}/{p}"
                for t, n in parts.items()
                for p in range(n)
                if t not in md.topics
                or p not in md.topics[t].partitions
                or md.topics[t].partitions[p].leader < 0
            ]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise DBError(f"no leader within {timeout:.0f}s for {', '.join(waiting)}")
            time.sleep(0.1)
        self.progress(f"topics ready: {', '.join(f'{t} x{n}' for t, n in sorted(parts.items()))}")
        return parts

    # ---------------------------------------------------------------- logs

    def collect_logs(self, run_dir: Path | str | None = None) -> dict[str, Path]:
        """Copy each node's logs, configs and a data-dir listing into ``run_dir/<node>/``, and
        what its replicas of the test's topics hold (``replica-records.jsonl``, from
        `isrlab-broker replica-records`) and its truncation journal (``truncations.jsonl``):
        the reconciliation of unseen writes reads both (checkers/unseen.py)."""
        base = Path(run_dir or self.run_dir)
        topics = sorted({str(k).rsplit("/", 1)[0] for k in self.test.get("keys") or []})

        def grab(r: Remote) -> Path:
            name = r.node.name
            dest = base / name
            dest.mkdir(parents=True, exist_ok=True)
            w = self.workdirs[name]
            listing = r.exec(
                f"cd {w} 2>/dev/null && find broker/data zk/data -printf "
                "'%M %10s %TY-%Tm-%TdT%TH:%TM:%TS %p\\n' 2>/dev/null | sort -k4",
                check=False,
            )
            (dest / "data-listing.txt").write_text(listing.stdout)
            data = self.path(name, "broker", "data")
            records = r.exec(
                f"{self.path(name, 'venv', 'bin', 'python')} -m isrlab.broker replica-records "
                f"--log-dir {data} --topics {','.join(topics) or 'none'} 2>/dev/null",
                check=False,
            )
            (dest / "replica-records.jsonl").write_text(records.stdout)
            journal = r.exec(f"cat {data}/{TRUNCATION_JOURNAL} 2>/dev/null", check=False)
            (dest / "truncations.jsonl").write_text(journal.stdout)
            res = r.exec(
                f"cd {w} 2>/dev/null && tar -czf - --ignore-failed-read logs "
                "broker/server.properties zk/zoo.cfg run/clock-offset 2>/dev/null",
                check=False,
            )
            if res.stdout_bytes:
                import io
                import tarfile

                with tarfile.open(fileobj=io.BytesIO(res.stdout_bytes), mode="r:gz") as tar:
                    tar.extractall(dest, filter="data")
            return dest

        out = {}
        for name, v in self._try_on(grab).items():
            if isinstance(v, Exception):
                self.progress(f"{name}: could not collect logs: {v}")
            else:
                out[name] = v
        self.progress(f"logs collected into {base}")
        return out

    def _try_on(self, fn: Callable[[Remote], Any]) -> dict[str, Any]:
        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as ex:
            futs = {n.name: ex.submit(fn, self.remote(n.name)) for n in self.nodes}
        out: dict[str, Any] = {}
        for name, f in futs.items():
            exc = f.exception()
            out[name] = exc if exc is not None else f.result()
        return out


__all__ = [
    "BROKER_PORT",
    "KEY_TYPE_GROUP",
    "KEY_TYPE_TRANSACTION",
    "DBError",
    "KafkaDB",
    "find_coordinator",
    "parse_key",
]
