"""KafkaDB without a cluster: build hashes, requirements, per-node configs, keys."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from isrlab.harness import db as dbmod
from isrlab.harness import wheelhouse
from isrlab.harness.db import DBError, KafkaDB, parse_key
from isrlab.harness.inventory import Inventory, Node, SshOptions
from isrlab.harness.wheelhouse import build_hash, node_requirements


def inventory(n: int = 5) -> Inventory:
    return Inventory([Node(f"n{i}", f"10.0.0.{10 + i}") for i in range(1, n + 1)], SshOptions())


def test_build_hash_follows_sources_and_pyproject(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "broker").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname='x'\n")
    (root / "broker" / "a.py").write_text("x = 1\n")
    h1 = build_hash(root)
    (root / "broker" / "__pycache__").mkdir()
    (root / "broker" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    (root / "broker" / "notes.txt").write_text("not shipped")
    assert build_hash(root) == h1
    (root / "broker" / "a.py").write_text("x = 2\n")
    h2 = build_hash(root)
    assert h2 != h1
    (root / "pyproject.toml").write_text("[project]\nname='y'\n")
    assert build_hash(root) != h2
    shutil.move(root / "broker" / "a.py", root / "broker" / "b.py")
    assert build_hash(root) not in (h1, h2)


def test_node_requirements_come_from_pyproject() -> None:
    reqs = node_requirements()
    names = {r.split(">")[0].split("=")[0].lower() for r in reqs}
    assert names == {n.lower() for n in wheelhouse.NODE_REQUIREMENTS}
    assert not any("matplotlib" in r or "confluent" in r for r in reqs)


def test_broker_properties_take_the_settings_under_test() -> None:
    test = {
        "min_insync_replicas": 2,
        "unclean_leader_election": True,
        "truncation_mode": "high-watermark",
        "replica_lag_time_max_ms": 4000,
        "zk_session_timeout_ms": 3000,
        "flush_interval_messages": 1,
        "replication_factor": 3,
        "broker_config": {"log.segment.bytes": 1048576},
    }
    d = KafkaDB(test, inventory(), "/tmp/run", workdirs={"n2": "/w/n2"})
    props = dict(
        line.split("=", 1) for line in d.broker_properties("n2").splitlines() if line.strip()
    )
    assert props["broker.id"] == "2"
    assert props["listeners"] == "PLAINTEXT://10.0.0.12:9092"
    assert props["log.dirs"] == "/w/n2/broker/data"
    assert props["zookeeper.connect"] == "10.0.0.11:2181,10.0.0.12:2181,10.0.0.13:2181/isrlab"
    assert props["min.insync.replicas"] == "2"
    assert props["unclean.leader.election.enable"] == "true"
    assert props["replica.truncation.mode"] == "high-watermark"
    assert props["replica.lag.time.max.ms"] == "4000"
    assert props["zookeeper.session.timeout.ms"] == "3000"
    assert props["log.flush.interval.messages"] == "1"
    assert props["log.segment.bytes"] == "1048576"
    assert d.clock_offset_file("n2") == "/w/n2/run/clock-offset"
    assert d.broker_pidfile("n2").startswith("/w/n2/")
    assert d.workdirs["n1"] == "/var/lib/isrlab/node-10.0.0.11"


def test_small_clusters_run_a_single_zookeeper_and_nodes_filter_the_inventory() -> None:
    d = KafkaDB({"nodes": ["n1", "n2"]}, inventory(), "/tmp/run")
    assert d.names == ["n1", "n2"] and [n.name for n in d.zk_nodes] == ["n1"]
    assert d.bootstrap_servers() == "10.0.0.11:9092,10.0.0.12:9092"
    assert d.broker_node(2) == "n2" and d.broker_node(9) is None
    with pytest.raises(DBError, match="none of the test's nodes"):
        KafkaDB({"nodes": ["x9"]}, inventory(), "/tmp/run")
    with pytest.raises(DBError, match="clock_mode"):
        KafkaDB({"clock_mode": "ntp"}, inventory(), "/tmp/run")


def test_keys() -> None:
    assert parse_key("t0/3") == ("t0", 3)
    assert parse_key("a/b/1") == ("a/b", 1)
    for bad in ("t0", "t0/x", "/1"):
        with pytest.raises(ValueError, match="topic/partition"):
            parse_key(bad)


class _Admin:
    """Stands in for confluent-kafka's AdminClient: the first client never answers (it waits
    for a controller it was told does not exist); later clients create the topics."""

    made = 0

    def __init__(self) -> None:
        _Admin.made += 1
        self.answers = _Admin.made > 1
        self.created: list[str] = []

    def create_topics(self, topics, operation_timeout):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future

        out = {}
        for t in topics:
            fut: Future[None] = Future()
            if self.answers:
                self.created.append(t.topic)
                fut.set_result(None)
            out[t.topic] = fut
        return out


def test_create_topics_asks_again_with_a_fresh_client_when_nobody_answers(monkeypatch) -> None:
    d = KafkaDB({"name": "t", "keys": ["t0/0"]}, inventory(), Path("/nonexistent"))
    _Admin.made = 0
    clients: list[_Admin] = []

    def admin_for(nodes=None):  # type: ignore[no-untyped-def]
        if d._admin is None:
            d._admin = _Admin()
            clients.append(d._admin)
        return d._admin

    monkeypatch.setattr(d, "_admin_for", admin_for)
    monkeypatch.setattr(dbmod, "CREATE_ATTEMPT_S", 0.2)
    monkeypatch.setattr(d, "metadata", lambda *a, **k: _Metadata({"t0": {0: 1}, "t1": {0: 2}}))
    assert d.create_topics(["t0/0", "t1/0"], rf=3, timeout=5) == {"t0": 1, "t1": 1}
    assert len(clients) == 2 and sorted(clients[1].created) == ["t0", "t1"]
    # and a deadline nobody answers within is a clear error, not a hang
    _Admin.made = -100
    d._admin = None
    with pytest.raises(DBError, match="no answer from the controller"):
        d.create_topics(["t2/0"], rf=3, timeout=0.5)


class _Metadata:
    def __init__(self, leaders: dict[str, dict[int, int]]) -> None:
        from types import SimpleNamespace as NS

        self.topics = {
            t: NS(partitions={p: NS(leader=lead) for p, lead in ps.items()})
            for t, ps in leaders.items()
        }


def _fake_broker(answer: bytes | None) -> tuple[int, list[bytes], Any]:
    """A one-connection server: records the request, replies with ``answer`` (framed), or
    closes at once when None."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            size = int.from_bytes(conn.recv(4), "big")
            got.append(conn.recv(size))
            if answer is not None:
                conn.sendall(len(answer).to_bytes(4, "big") + answer)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], got, t


def test_find_coordinator_speaks_find_coordinator_v1() -> None:
    import struct

    from isrlab.harness.db import find_coordinator

    host = b"10.0.0.3"
    ok = struct.pack(">iihh", 1, 0, 0, -1) + struct.pack(">ih", 3, len(host)) + host
    ok += struct.pack(">i", 9092)
    port, got, t = _fake_broker(ok)
    assert find_coordinator("127.0.0.1", port, "g1") == 3
    t.join(5)
    # api key 10, version 1, correlation id 1, client id; key "g1", key type 0 (group)
    assert got[0].startswith(struct.pack(">hhi", 10, 1, 1))
    assert got[0].endswith(struct.pack(">h", 2) + b"g1" + b"\x00")
    # COORDINATOR_NOT_AVAILABLE (15), with an error message: no coordinator
    msg = b"no leader"
    busy = struct.pack(">iihh", 1, 0, 15, len(msg)) + msg + struct.pack(">ih", -1, 0)
    busy += struct.pack(">i", -1)
    port, _, t = _fake_broker(busy)
    assert find_coordinator("127.0.0.1", port, "g1") is None
    t.join(5)
    port, _, t = _fake_broker(None)
    with pytest.raises(ValueError, match="closed the connection"):
        find_coordinator("127.0.0.1", port, "g1")
    t.join(5)
