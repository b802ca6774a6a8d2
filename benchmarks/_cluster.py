"""A ZooKeeper and three brokers on 127.0.0.1-3 of this machine, for the benchmarks that need a
replicated cluster (bench_replication, bench_offset_commits, bench_txn).

    with running_cluster("bench-txn-", {"offsets.topic.replication.factor": "3"}) as c:
        ... c.bootstrap ...

The brokers listen on 127.0.0.1-3, as the cluster tests' brokers do: run the benchmark under
`flock /tmp/isrlab-cluster.lock` when tests may run at the same time. Each broker logs to
<temporary dir>/broker<N>.log (WARNING and above).
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from isrlab.harness.zookeeper import LocalZooKeeper  # noqa: E402


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def progress(what: str) -> None:
    """A timestamped line on stderr (stdout keeps the results table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    base: Path
    zk: LocalZooKeeper
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    bootstrap: str = ""


def start_cluster(
    base: Path, overrides: Mapping[str, str] | None = None, brokers: int = 3
) -> Cluster:
    """ZooKeeper (data in base/zk) and `brokers` brokers (ids 1.., on 127.0.0.<id>, logs in
    base/b<id>) with `overrides` as broker config; returns once every broker is in the metadata.
    On failure everything started is stopped again."""
    zk = LocalZooKeeper(base / "zk").start()
    cluster = Cluster(base, zk)
    try:
        addrs = []
        for i in range(1, brokers + 1):
            host = f"127.0.0.{i}"
            port = free_port(host)
            addrs.append(f"{host}:{port}")
            conf = {
                "broker.id": str(i),
                "listeners": f"PLAINTEXT://{host}:{port}",
                "log.dirs": f"{base}/b{i}",
                "zookeeper.connect": f"{zk.connect}/bench",
                "log.level": "WARNING",
                **(overrides or {}),
            }
            args = [a for k, v in conf.items() for a in ("-o", f"{k}={v}")]
            log = open(base / f"broker{i}.log", "wb")  # noqa: SIM115 - lives with the process
            cluster.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "isrlab.broker", "start", *args],
                    cwd=ROOT,
                    stdout=log,
                    stderr=log,
                )
            )
        cluster.bootstrap = ",".join(addrs)
        wait_for_brokers(cluster, brokers)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def wait_for_brokers(cluster: Cluster, brokers: int, timeout: float = 30) -> None:
    # log_level 2: errors reach us as exceptions, and this client's reconnect warnings do not
    # outlive it
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in cluster.procs):
            raise RuntimeError(f"a broker exited; see {cluster.base}/broker*.log")
        try:
            if len(admin.list_topics(timeout=2).brokers) == brokers:
                return
        except KafkaException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"cluster did not come up within {timeout:g} s")


def stop_cluster(cluster: Cluster) -> None:
    """Stops the brokers (SIGTERM, SIGKILL after 30 s) and ZooKeeper. Drop the benchmark's
    librdkafka clients first: they are collected here, before the brokers go, else they log
    every refused reconnect."""
    gc.collect()
    for pr in cluster.procs:
        pr.terminate()
    for pr in cluster.procs:
        try:
            pr.wait(30)
        except subprocess.TimeoutExpired:
            pr.kill()
            pr.wait()
    cluster.zk.stop()


@contextmanager
def running_cluster(
    prefix: str, overrides: Mapping[str, str] | None = None, brokers: int = 3
) -> Iterator[Cluster]:
    """start_cluster in a temporary directory (removed afterwards), stopped on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        cluster = start_cluster(Path(d), overrides, brokers)
        try:
            yield cluster
        finally:
            stop_cluster(cluster)
