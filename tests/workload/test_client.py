"""QueueClient against a real broker process: op shapes, positions, error mapping."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from isrlab.harness.workloads.queue.client import (
    ClientError,
    QueueClient,
    classify,
    error_name,
    parse_key,
)
from tests.broker.conftest import BrokerProcess

Keys = Callable[[int], list[str]]


@pytest.fixture
def client_for(module_broker: BrokerProcess) -> Iterator[Callable[..., QueueClient]]:
    made: list[QueueClient] = []

    def make(process: int = 0, node: str | None = None, **test: Any) -> QueueClient:
        conf = {"op_timeout_ms": 5000, **test}
        c = QueueClient(conf, module_broker.bootstrap, process, node=node)
        made.append(c.open())
        return c

    yield make
    for c in made:
        c.close()


def send(k: str, *vs: int) -> dict[str, Any]:
    return {"f": "send", "value": [["send", k, v] for v in vs]}


POLL = {"f": "poll", "value": [["poll"]], "_poll_ms": 2000}


def poll_until(c: QueueClient, n: int, timeout: float = 10) -> dict[str, list[list[Any]]]:
    """Poll until n records arrived; merge the reads per key."""
    got: dict[str, list[list[Any]]] = {}
    deadline = time.monotonic() + timeout
    while sum(map(len, got.values())) < n and time.monotonic() < deadline:
        done = c.invoke(POLL)
        assert done["type"] == "ok"
        [[tag, read]] = done["value"]
        assert tag == "poll"
        for k, pairs in read.items():
            got.setdefault(k, []).extend(pairs)
    return got


def test_send_then_poll(client_for: Callable[..., QueueClient], fresh_keys: Keys) -> None:
    [k] = fresh_keys(1)
    c = client_for(node="n1")
    done = c.invoke(send(k, 10, 11, 12))
    assert done["type"] == "ok", done
    assert done["value"] == [["send", k, [0, 10]], ["send", k, [1, 11]], ["send", k, [2, 12]]]
    assert done["node"] == "n1"
    assert done["producer"] == {
        "id": -1,
        "epoch": -1,
        "idempotent": False,
        "transactional_id": "",
    }
    assert c.invoke({"f": "assign", "value": [k]}) == {
        "f": "assign",
        "value": [k],
        "node": "n1",
        "type": "ok",
    }
    assert poll_until(c, 3) == {k: [[0, 10], [1, 11], [2, 12]]}


def test_reassign_keeps_positions_of_kept_keys(
    client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    a, b = fresh_keys(2)
    c = client_for()
    assert c.invoke(send(a, 1, 2))["type"] == "ok"
    assert c.invoke(send(b, 1))["type"] == "ok"
    assert c.invoke({"f": "assign", "value": [a]})["type"] == "ok"
    assert poll_until(c, 2) == {a: [[0, 1], [1, 2]]}
    assert c.invoke({"f": "assign", "value": [a, b]})["type"] == "ok"
    assert c.invoke(send(a, 3))["type"] == "ok"
    # a continues after offset 1 (no re-read); b, newly assigned, starts at its beginning
    assert poll_until(c, 2) == {a: [[2, 3]], b: [[0, 1]]}
    # dropped then re-added: read again from the beginning (a fresh position)
    assert c.invoke({"f": "assign", "value": [b]})["type"] == "ok"
    assert c.invoke({"f": "assign", "value": [a, b]})["type"] == "ok"
    assert poll_until(c, 3) == {a: [[0, 1], [1, 2], [2, 3]]}


def test_poll_with_nothing_assigned_is_an_empty_ok(
    client_for: Callable[..., QueueClient],
) -> None:
    done = client_for().invoke({"f": "poll", "value": [["poll"]]})
    assert done["type"] == "ok" and done["value"] == [["poll", {}]]


def test_watermarks_are_queried_within_the_op(
    client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    [k] = fresh_keys(1)
    c = client_for(watermark_p=1.0)
    done = c.invoke(send(k, 5, 6))
    assert done["watermarks"] == {k: {"low": 0, "high": 2}}
    assert c.invoke({"f": "assign", "value": [k]})["type"] == "ok"
    done = c.invoke(POLL)
    assert done["value"] == [["poll", {k: [[0, 5], [1, 6]]}]]
    assert done["watermarks"] == {k: {"low": 0, "high": 2}}
    assert "watermarks" not in client_for(process=1, watermark_p=0.0).invoke(send(k, 7))


def test_idempotent_producer_reports_its_id(
    client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    [k] = fresh_keys(1)
    c = client_for(idempotence=True)
    assert c.invoke(send(k, 1))["producer"]["idempotent"] is True
    time.sleep(1.3)  # librdkafka publishes the producer id in its statistics every second
    producer = c.invoke(send(k, 2))["producer"]
    assert producer["id"] >= 0 and producer["epoch"] >= 0


def test_unknown_topic_is_a_definite_failure(client_for: Callable[..., QueueClient]) -> None:
    c = client_for(op_timeout_ms=5000, producer_config={"topic.metadata.propagation.max.ms": 1000})
    done = c.invoke(send("no-such-topic/0", 1))
    assert done["type"] == "fail", done.get("error")
    assert done["value"] == [["send", "no-such-topic/0", 1]]
    assert "unknown" in str(done["error"])


def test_paused_broker_makes_a_send_info(
    module_broker: BrokerProcess, client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    [k] = fresh_keys(1)
    c = client_for(op_timeout_ms=1500)
    assert c.invoke(send(k, 1))["type"] == "ok"
    module_broker.signal(signal.SIGSTOP)
    try:
        done = c.invoke(send(k, 2, 3))
    finally:
        module_broker.signal(signal.SIGCONT)
    assert done["type"] == "info", done
    # nothing came back: the bare values
    assert done["value"] == [["send", k, 2], ["send", k, 3]]
    assert done["error"]


def test_crash_tears_the_client_down(
    client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    [k] = fresh_keys(1)
    c = client_for()
    assert c.invoke({"f": "assign", "value": [k]})["type"] == "ok"
    assert c.invoke({"f": "crash", "value": None}) == {
        "f": "crash",
        "value": None,
        "node": c.node,
        "type": "info",
    }
    assert c.producer is None and c.consumer is None and c.assigned == set()
    assert c.invoke(send(k, 1))["type"] == "fail"


def test_bad_keys_fail(client_for: Callable[..., QueueClient]) -> None:
    done = client_for().invoke({"f": "assign", "value": ["no-partition"]})
    assert done["type"] == "fail" and done["error"][0] == "bad-keys"
    with pytest.raises(ValueError, match="topic/partition"):
        parse_key("t0")
    assert parse_key("a/b/3") == ("a/b", 3)


def test_transactions_need_broker_support(monkeypatch: pytest.MonkeyPatch) -> None:
    # a broker without transactions (init_transactions: _UNSUPPORTED_FEATURE), faked: the
    # reference broker has them
    from tests.workload.fakekafka import FakeKafka

    FakeKafka(["t0/0"], transactions=False).install(monkeypatch)
    c = QueueClient({"txn": True, "op_timeout_ms": 3000}, "fake:9092", 0)
    with pytest.raises(ClientError, match="transactions"):
        c.open()
    assert c.producer is None


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (KafkaError.UNKNOWN_TOPIC_OR_PART, "fail"),
        (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "fail"),
        (KafkaError.PRODUCER_FENCED, "fail"),
        (KafkaError._PURGE_QUEUE, "fail"),
        (KafkaError.NOT_LEADER_FOR_PARTITION, "info"),  # KAFKA-13574
        (KafkaError._MSG_TIMED_OUT, "info"),
        (KafkaError.REQUEST_TIMED_OUT, "info"),
        (KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, "info"),
        (KafkaError._TRANSPORT, "info"),
        (KafkaError._PURGE_INFLIGHT, "info"),
    ],
)
def test_error_mapping(code: int, kind: str) -> None:
    err = KafkaError(code)
    assert classify(err) == kind
    assert not error_name(err).startswith("-") and "_" not in error_name(err)


def test_factory_binds_threads_to_nodes_round_robin() -> None:
    make = QueueClient.factory({}, {"n1": "10.0.0.1:9092", "n2": "10.0.0.2:9092"})
    c0, c1, c2 = make(0, 0), make(21, 1), make(2, 2)
    assert (c0.node, c0.bootstrap) == ("n1", "10.0.0.1:9092,10.0.0.2:9092")
    assert (c1.node, c1.bootstrap, c1.process) == ("n2", "10.0.0.2:9092,10.0.0.1:9092", 21)
    assert c2.node == "n1"
    with pytest.raises(ValueError):
        QueueClient.factory({}, {})


def test_subscribe_then_assign_again(
    client_for: Callable[..., QueueClient], fresh_keys: Keys
) -> None:
    [k] = fresh_keys(1)
    c = client_for()
    assert c.invoke(send(k, 1))["type"] == "ok"
    assert c.invoke({"f": "assign", "value": [k]})["type"] == "ok"
    # The broker has no group coordinator yet: subscribing is accepted, nothing arrives.
    assert c.invoke({"f": "subscribe", "value": [k]})["type"] == "ok"
    assert c.subscribed and c.assigned == set()
    assert c.invoke({"f": "assign", "value": [k]})["type"] == "ok"
    assert not c.subscribed
    assert poll_until(c, 1) == {k: [[0, 1]]}
