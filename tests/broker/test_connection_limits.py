"""Connection limits against a live broker: Kafka's max.connections (new connections wait to be
accepted), max.connections.per.ip and its overrides (extra connections are closed),
connections.max.idle.ms (idle connections are closed) and isrlab's request.read.timeout.ms (a
request started but not finished in time closes its connection). queued.max.request.bytes is
tested in test_process_faults.py."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest

from isrlab.broker.config import BrokerConfig, ConfigError
from tests.broker.rawclient import RawClient

pytestmark = pytest.mark.integration


def api_versions_ok(c: RawClient) -> bool:
    return c.call(ApiVersionsRequest[0]()).error_code == 0


def connect_from(source_ip: str, port: int) -> RawClient:
    c = RawClient.__new__(RawClient)
    c.sock = socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=(source_ip, 0)
    )
    c.correlation_id = 0
    return c


def test_kafka_defaults() -> None:
    cfg = BrokerConfig()
    assert cfg["max.connections"] == 2147483647
    assert cfg["max.connections.per.ip"] == 2147483647
    assert cfg["connections.max.idle.ms"] == 600000
    assert cfg["max.connections.per.ip.overrides"] == ""
    with pytest.raises(ConfigError, match=r"max\.connections\.per\.ip\.overrides"):
        BrokerConfig({"max.connections.per.ip.overrides": "127.0.0.1"})


def test_max_connections_makes_new_connections_wait_for_a_slot(broker_factory) -> None:
    b = broker_factory({"max.connections": "2"})
    first, second = RawClient(b.port), RawClient(b.port)
    assert api_versions_ok(first) and api_versions_ok(second)
    third = RawClient(b.port)  # TCP connects (the listen backlog) but is not accepted
    third.send_frame(third.encode(ApiVersionsRequest[0]()))
    third.sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        third.sock.recv(1)
    first.close()  # a slot frees: the waiting connection is accepted and served
    third.sock.settimeout(10)
    assert len(third.recv_frame()) > 8
    assert api_versions_ok(second)
    second.close()
    third.close()


def test_max_connections_per_ip_closes_the_extra_connection(broker_factory) -> None:
    b = broker_factory(
        {"max.connections.per.ip": "2", "max.connections.per.ip.overrides": "127.0.0.3:3"}
    )
    # from 127.0.0.2: the fixture's start-up probe (from 127.0.0.1) cannot take a slot
    kept = [connect_from("127.0.0.2", b.port) for _ in range(2)]
    assert all(api_versions_ok(c) for c in kept)
    extra = connect_from("127.0.0.2", b.port)
    assert extra.is_closed()
    extra.close()
    # another address has its own count, and an override raises its limit
    others = [connect_from("127.0.0.3", b.port) for _ in range(3)]
    assert all(api_versions_ok(c) for c in others)
    extra = connect_from("127.0.0.3", b.port)
    assert extra.is_closed()
    extra.close()
    assert api_versions_ok(RawClient(b.port))  # 127.0.0.1 is not limited by the others
    # a closed connection gives its slot back
    kept[0].close()
    deadline = time.monotonic() + 10
    while True:
        again = connect_from("127.0.0.2", b.port)
        try:
            if api_versions_ok(again):
                break
        except ConnectionError:
            pass
        again.close()
        assert time.monotonic() < deadline, "the slot was never given back"
        time.sleep(0.05)
    assert "max.connections.per.ip=2" in b.log_text()
    assert "max.connections.per.ip.overrides=3" in b.log_text()
    for c in [*kept[1:], *others, again]:
        c.close()


def test_connections_max_idle_ms_closes_idle_connections(broker_factory) -> None:
    b = broker_factory({"connections.max.idle.ms": "600"})
    idle, busy = RawClient(b.port), RawClient(b.port)
    assert api_versions_ok(idle)
    for _ in range(8):  # 1.6 s of a request every 200 ms: never idle for 600 ms
        assert api_versions_ok(busy)
        time.sleep(0.2)
    assert idle.is_closed(timeout=5)
    assert api_versions_ok(busy)
    idle.close()
    busy.close()


def test_a_request_trickled_slower_than_request_read_timeout_is_closed(broker_factory) -> None:
    b = broker_factory({"request.read.timeout.ms": "500"})
    c = RawClient(b.port)
    payload = c.encode(ApiVersionsRequest[0]())
    frame = struct.pack(">i", len(payload)) + payload
    closed = False
    try:
        for byte in frame:  # one byte every 100 ms: the whole frame would take > 1.5 s
            c.send_bytes(bytes([byte]))
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    assert closed or c.is_closed(timeout=5)
    c.close()
    assert "request.read.timeout.ms" in b.log_text()
    # a request sent at once is served; a pause between requests is not a timeout
    fast = RawClient(b.port)
    assert api_versions_ok(fast)
    time.sleep(0.8)
    assert api_versions_ok(fast)
    fast.close()
