"""The client's transaction and error paths, with stand-ins for librdkafka: the in-memory
Kafka's producer (tests/workload/fakekafka.py, its faults scripted) and a consumer that hands
out given records; they raise the KafkaErrors librdkafka raises.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from isrlab.harness.workloads.queue.client import QueueClient
from tests.workload.fakekafka import FakeKafka, FakeMessage, FakeProducer


class FakeConsumer:
    def __init__(self, records: list[FakeMessage]) -> None:
        self.records = records
        self.seeks: list[tuple[str, int, int]] = []

    def assignment(self) -> list[Any]:
        return ["t0/0"]

    def poll(self, timeout: float) -> FakeMessage | None:
        return self.records.pop(0) if self.records else None

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        out, self.records = self.records, []
        return out

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def close(self) -> None:
        pass


def producer(
    deliver: list[Any] | None = None, txn: bool = True, **faults: list[KafkaError]
) -> tuple[FakeKafka, FakeProducer]:
    """The in-memory Kafka and its producer (transactional, initialised, unless not `txn`):
    `deliver` are the delivery reports of the sends (None: delivered, a KafkaError, "never"),
    `faults` its other error lists (commit_errors=[...], abort_errors=[...])."""
    kafka = FakeKafka(["t1/0"])
    kafka.send_errors = list(deliver or [])
    for name, errors in faults.items():
        setattr(kafka, name, list(errors))
    p = FakeProducer(kafka, {"transactional.id": "tx"} if txn else {})
    if txn:
        p.init_transactions(1)
    return kafka, p


def client(producer: FakeProducer, records: list[FakeMessage] | None = None, **test: Any):  # type: ignore[no-untyped-def]
    c = QueueClient({"op_timeout_ms": 300, "watermark_p": 0, **test}, "fake:9092", 0)
    c.producer = producer  # type: ignore[assignment]
    c.consumer = FakeConsumer(records or [])  # type: ignore[assignment]
    c.assigned = {"t0/0"}
    return c


TXN = {"f": "txn", "value": [["poll"], ["send", "t1/0", 7], ["send", "t1/0", 8]]}


def polled() -> list[FakeMessage]:
    return [FakeMessage("t0", 0, 5, b"50"), FakeMessage("t0", 0, 6, b"60")]


def aborted(kafka: FakeKafka) -> bool:
    return any(call.startswith("abort") for call in kafka.calls)


def test_txn_commits() -> None:
    kafka, p = producer([None, None])
    done = client(p, polled(), txn=True).invoke(TXN)
    assert done["type"] == "ok"
    assert done["value"] == [
        ["poll", {"t0/0": [[5, 50], [6, 60]]}],
        ["send", "t1/0", [0, 7]],
        ["send", "t1/0", [1, 8]],
    ]
    assert kafka.calls == ["init tx 0", "commit tx 2"]
    assert kafka.values("t1") == [7, 8]


def test_failed_send_aborts_and_rewinds_the_consumer() -> None:
    kafka, p = producer([None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)])
    c = client(p, polled(), txn=True)
    done = c.invoke(TXN)
    assert done["type"] == "fail"
    assert kafka.calls[-1] == "abort tx 1"
    assert kafka.values("t1") == []
    # what was read is still reported; the consumer goes back to the first offset read
    assert done["value"][0] == ["poll", {"t0/0": [[5, 50], [6, 60]]}]
    assert done["value"][2] == ["send", "t1/0", 8]
    assert c.consumer.seeks == [("t0", 0, 5)]  # type: ignore[union-attr]
    assert not c.broken


def test_commit_timeout_is_indefinite() -> None:
    timeout = KafkaError(KafkaError._TIMED_OUT, retriable=True)
    kafka, p = producer([None, None], commit_errors=[timeout])
    c = client(p, polled(), txn=True)
    done = c.invoke(TXN)
    assert done["type"] == "info" and not aborted(kafka)
    assert c.broken  # the producer is in an unknown transaction state


@pytest.mark.parametrize(
    ("deliver", "call"), [([None, None], "commit"), ([None, KafkaError(1)], "abort")]
)
def test_a_commit_or_abort_that_never_returns_is_given_up(
    monkeypatch: pytest.MonkeyPatch, deliver: list[Any], call: str
) -> None:
    """commit_transaction / abort_transaction block until released, as librdkafka was seen to
    block past its timeouts while the transaction coordinator was killed."""
    from isrlab.harness.workloads.queue import client as queue_client

    monkeypatch.setattr(queue_client, "TXN_GRACE_S", 0.05)
    kafka, p = producer(deliver)
    kafka.hang.set()
    c = client(p, polled(), txn=True)
    try:
        done = c.invoke(TXN)
        assert done["type"] == "info" and c.broken, done
        assert [call, "timeout"] in (done["error"] if call == "abort" else [done["error"]]), done
        assert kafka.calls == ["init tx 0"]  # the call never returned
    finally:
        kafka.released.set()


def test_commit_that_requires_abort_is_a_fail() -> None:
    err = KafkaError(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)
    kafka, p = producer([None, None], commit_errors=[err])
    assert client(p, polled(), txn=True).invoke(TXN)["type"] == "fail"
    assert kafka.calls[-1] == "abort tx 2"


def test_failed_abort_is_indefinite_and_breaks_the_client() -> None:
    _, p = producer(
        [None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)],
        abort_errors=[KafkaError(KafkaError._TRANSPORT)],
    )
    c = client(p, polled(), txn=True)
    done = c.invoke(TXN)
    assert done["type"] == "info" and c.broken
    assert ["abort", "transport"] in done["error"]


@pytest.mark.parametrize(
    ("deliveries", "kind"),
    [
        ([None, None], "ok"),
        ([KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)] * 2, "fail"),
        ([None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)], "info"),  # half happened
        ([None, KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)], "info"),
        ([None, "never"], "info"),  # no delivery report before the op timeout
    ],
)
def test_multi_send_outcomes_without_txn(deliveries: list[Any], kind: str) -> None:
    _, p = producer(deliveries, txn=False)
    done = client(p).invoke({"f": "send", "value": [["send", "t1/0", 1], ["send", "t1/0", 2]]})
    assert done["type"] == kind
    assert done["value"][0] == ["send", "t1/0", [0, 1] if deliveries[0] is None else 1]


def test_fenced_producer_breaks_the_client() -> None:
    _, p = producer([KafkaError(KafkaError.PRODUCER_FENCED)], txn=False)
    c = client(p)
    done = c.invoke({"f": "send", "value": [["send", "t1/0", 1]]})
    assert done["type"] == "fail" and c.broken


def test_garbage_record_is_reported_as_read() -> None:
    c = client(producer()[1], [FakeMessage("t0", 0, 0, b"not-a-number")])
    done = c.invoke({"f": "poll", "value": [["poll"]]})
    assert done["value"] == [["poll", {"t0/0": [[0, "not-a-number"]]}]]
