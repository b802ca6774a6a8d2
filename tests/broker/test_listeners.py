"""Listeners as Kafka has them: every listener in `listeners` is bound, each name's security
protocol comes from listener.security.protocol.map, a protocol this broker does not serve (only
PLAINTEXT) stops the start with one line naming the listener, and a client is given the
addresses (advertised.listeners) of the listener it connected to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from isrlab.broker.config import BrokerConfig, ConfigError
from tests.broker.conftest import BrokerProcess, free_port
from tests.broker.rawclient import RawClient
from tests.broker.rawgroup import find_coordinator

pytestmark = pytest.mark.integration

TWO_LISTENERS_MAP = "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"


def start_fails(tmp_path: Path, overrides: dict[str, str]) -> str:
    args = [sys.executable, "-m", "isrlab.broker", "start"]
    for k, v in {"log.dirs": str(tmp_path / "logs"), **overrides}.items():
        args += ["--override", f"{k}={v}"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("scheme", ["SSL", "SASL_SSL", "SASL_PLAINTEXT"])
def test_a_listener_with_a_protocol_not_served_stops_the_start(tmp_path, scheme) -> None:  # type: ignore[no-untyped-def]
    url = f"{scheme}://127.0.0.1:{free_port()}"
    line = start_fails(tmp_path, {"listeners": url})
    assert url in line
    assert f"security protocol {scheme}" in line
    assert "PLAINTEXT only" in line


def test_an_unknown_listener_name_stops_the_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"CLIENT://127.0.0.1:{free_port()}"
    line = start_fails(tmp_path, {"listeners": url})
    assert url in line
    assert "listener.security.protocol.map" in line
    assert "CLIENT:PLAINTEXT" in line


def test_the_error_shows_an_explicit_protocol_map(tmp_path) -> None:  # type: ignore[no-untyped-def]
    line = start_fails(
        tmp_path,
        {
            "listeners": f"PLAINTEXT://:{free_port()},EXTERNAL://:{free_port()}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:SSL",
        },
    )
    assert "EXTERNAL://" in line
    assert "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:SSL" in line


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9093"}, "used twice"),
        ({"listeners": "PLAINTEXT://:9092,INTERNAL://:9092"}, "same port"),
        ({"listeners": "PLAINTEXT://:99999"}, "not between 0 and 65535"),
        ({"listeners": "PLAINTEXT://:9092", "advertised.listeners": "OTHER://h:1"}, "OTHER"),
        ({"listeners": "INTERNAL://:9093"}, "inter.broker.listener.name"),
        (
            {"listeners": "PLAINTEXT://:9092", "inter.broker.listener.name": "INTERNAL"},
            "inter.broker.listener.name must be one of the advertised listener names",
        ),
    ],
)
def test_listener_config_errors(overrides: dict[str, str], expected: str) -> None:
    raw = {"listener.security.protocol.map": TWO_LISTENERS_MAP, **overrides}
    with pytest.raises(ConfigError, match=expected):
        BrokerConfig(raw)


def metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    c = RawClient(port)
    try:
        M = MetadataRequest[9]
        resp = c.call(
            M(topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        )
        return [(b.node_id, b.host, b.port) for b in resp.brokers]
    finally:
        c.close()


def two_listeners(tmp_path: Path, extra: dict[str, str]) -> tuple[BrokerProcess, int, int]:
    """A started broker with listeners PLAINTEXT (p1) and INTERNAL (p2, the inter-broker one)."""
    p1, p2 = free_port(), free_port()
    b = BrokerProcess(
        tmp_path / "logs",
        p1,
        {
            "listeners": f"PLAINTEXT://127.0.0.1:{p1},INTERNAL://127.0.0.1:{p2}",
            "listener.security.protocol.map": TWO_LISTENERS_MAP,
            "inter.broker.listener.name": "INTERNAL",
            **{k: v.format(p1=p1, p2=p2) for k, v in extra.items()},
        },
    )
    b.start()
    return b, p1, p2


def test_every_listener_is_bound_and_clients_get_their_listeners_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b, p1, p2 = two_listeners(
        tmp_path, {"advertised.listeners": "PLAINTEXT://localhost:{p1},INTERNAL://127.0.0.1:{p2}"}
    )
    try:
        assert metadata_brokers(p1) == [(0, "localhost", p1)]
        assert metadata_brokers(p2) == [(0, "127.0.0.1", p2)]
        c = RawClient(p2)
        coordinator = find_coordinator(c, "g")
        c.close()
        assert (coordinator.error_code, coordinator.host, coordinator.port) == (0, "127.0.0.1", p2)
        # a real client bootstrapped on the second listener stays on it
        p = Producer({"bootstrap.servers": f"127.0.0.1:{p2}"})
        for i in range(5):
            p.produce("l", f"v{i}".encode(), partition=0)
        assert p.flush(30) == 0
        consumer = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{p1}", "group.id": "x", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("l", 0, 0)])
        got = [m.value() for m in consumer.consume(5, timeout=20)]
        consumer.close()
        assert got == [f"v{i}".encode() for i in range(5)]
        assert "listening on PLAINTEXT://127.0.0.1" in b.log_text()
        assert "listening on INTERNAL://127.0.0.1" in b.log_text()
    finally:
        b.stop()


def test_max_connections_lets_the_inter_broker_listener_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Kafka's protected listener: with several listeners, a connection on the inter-broker
    one is accepted past max.connections and the least recently active other one closed."""
    b, p1, p2 = two_listeners(tmp_path, {"max.connections": "2"})
    try:
        clients = [RawClient(p1), RawClient(p1)]
        for c in clients:
            assert c.call(ApiVersionsRequest[0]()).error_code == 0
        clients[1].call(ApiVersionsRequest[0]())  # clients[0] is now the least recent
        internal = RawClient(p2)
        assert internal.call(ApiVersionsRequest[0]()).error_code == 0
        assert clients[0].is_closed()
        assert clients[1].call(ApiVersionsRequest[0]()).error_code == 0
        for c in [*clients, internal]:
            c.close()
    finally:
        b.stop()


def test_a_listeners_own_max_connections_makes_its_connections_wait(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """listener.name.<l>.max.connections (Kafka's per-listener limit): past it, that listener's
    new connections wait to be accepted, even on the inter-broker listener, while the other
    listener still accepts."""
    b, p1, p2 = two_listeners(
        tmp_path,
        {
            "listener.name.plaintext.max.connections": "1",
            "listener.name.internal.max.connections": "1",
        },
    )
    try:
        first = RawClient(p1)
        assert first.call(ApiVersionsRequest[0]()).error_code == 0
        internal = RawClient(p2)  # the other listener has its own slot
        assert internal.call(ApiVersionsRequest[0]()).error_code == 0
        waiting = [RawClient(p1), RawClient(p2)]  # connected (backlog) but not accepted
        for c in waiting:
            c.send_frame(c.encode(ApiVersionsRequest[0]()))
            c.sock.settimeout(1.0)
            with pytest.raises(TimeoutError):
                c.sock.recv(1)
        first.close()
        internal.close()  # slots free: each waiting connection is accepted and served
        for c in waiting:
            c.sock.settimeout(10)
            assert len(c.recv_frame()) > 8
            c.close()
    finally:
        b.stop()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("listener.name.external.max.connections", "5", "no listener named EXTERNAL"),
        ("listener.name.INTERNAL.max.connections", "5", "lower case"),
        ("listener.name.internal.max.connections", "-1", "must be >= 0"),
        ("listener.name.internal.max.connections", "x", "listener.name.internal.max.connections"),
        ("listener.name.internal.ssl.keystore.location", "/k", "max.connections only"),
    ],
)
def test_per_listener_key_errors(key: str, value: str, expected: str) -> None:
    raw = {
        "listeners": "PLAINTEXT://:9092,INTERNAL://:9093",
        "listener.security.protocol.map": TWO_LISTENERS_MAP,
        "inter.broker.listener.name": "INTERNAL",
        key: value,
    }
    with pytest.raises(ConfigError, match=expected):
        BrokerConfig(raw)
