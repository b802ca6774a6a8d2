"""The client's transaction and error paths, with scripted stand-ins for librdkafka.

The reference broker has no transactions yet, so these paths cannot run against it; the
stand-ins implement just the confluent-kafka calls the client makes, and raise the
KafkaErrors librdkafka raises.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from isrlab.harness.workloads.queue.client import QueueClient


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        self._t, self._p, self._o, self._v = topic, partition, offset, value

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes:
        return self._v

    def error(self) -> None:
        return None


class FakeProducer:
    def __init__(self, deliver: list[KafkaError | None], commit: KafkaError | None = None):
        self.deliver = list(deliver)
        self.commit_error = commit
        self.abort_error: KafkaError | None = None
        self.calls: list[str] = []
        self._waiting: list[Any] = []
        self.offset = 0

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: Any) -> None:
        self.calls.append(f"produce {value.decode()}")
        self._waiting.append((topic, partition, value, on_delivery))

    def poll(self, timeout: float) -> int:
        while self._waiting:
            topic, partition, value, cb = self._waiting.pop(0)
            err = self.deliver.pop(0) if self.deliver else None
            if isinstance(err, str):  # "never": no delivery report at all
                continue
            cb(err, FakeMessage(topic, partition, self.offset, value))
            self.offset += 1
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        if self.abort_error is not None:
            raise KafkaException(self.abort_error)

    def purge(self, **kw: Any) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0


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


def client(producer: FakeProducer, records: list[FakeMessage] | None = None, **test: Any):  # type: ignore[no-untyped-def]
    c = QueueClient({"op_timeout_ms": 300, "watermark_p": 0, **test}, "fake:9092", 0)
    c.producer = producer  # type: ignore[assignment]
    c.consumer = FakeConsumer(records or [])  # type: ignore[assignment]
    c.assigned = {"t0/0"}
    return c


TXN = {"f": "txn", "value": [["poll"], ["send", "t1/0", 7], ["send", "t1/0", 8]]}


def polled() -> list[FakeMessage]:
    return [FakeMessage("t0", 0, 5, b"50"), FakeMessage("t0", 0, 6, b"60")]


def test_txn_commits() -> None:
    p = FakeProducer([None, None])
    done = client(p, polled(), txn=True).invoke(TXN)
    assert done["type"] == "ok"
    assert done["value"] == [
        ["poll", {"t0/0": [[5, 50], [6, 60]]}],
        ["send", "t1/0", [0, 7]],
        ["send", "t1/0", [1, 8]],
    ]
    assert p.calls == ["begin", "produce 7", "produce 8", "commit"]


def test_failed_send_aborts_and_rewinds_the_consumer() -> None:
    p = FakeProducer([None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)])
    c = client(p, polled(), txn=True)
    done = c.invoke(TXN)
    assert done["type"] == "fail"
    assert p.calls[-1] == "abort"
    # what was read is still reported; the consumer goes back to the first offset read
    assert done["value"][0] == ["poll", {"t0/0": [[5, 50], [6, 60]]}]
    assert done["value"][2] == ["send", "t1/0", 8]
    assert c.consumer.seeks == [("t0", 0, 5)]  # type: ignore[union-attr]
    assert not c.broken


def test_commit_timeout_is_indefinite() -> None:
    p = FakeProducer([None, None], commit=KafkaError(KafkaError._TIMED_OUT, retriable=True))
    c = client(p, polled(), txn=True)
    done = c.invoke(TXN)
    assert done["type"] == "info" and "abort" not in p.calls
    assert c.broken  # the producer is in an unknown transaction state


class HangingProducer(FakeProducer):
    """commit_transaction / abort_transaction block until ``release`` is set, as librdkafka
    was seen to block past its timeouts while the transaction coordinator was killed."""

    def __init__(self, deliver: list[KafkaError | None]) -> None:
        super().__init__(deliver)
        import threading

        self.release = threading.Event()

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        self.release.wait()

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        self.release.wait()


@pytest.mark.parametrize(
    ("deliver", "call"), [([None, None], "commit"), ([None, KafkaError(1)], "abort")]
)
def test_a_commit_or_abort_that_never_returns_is_given_up(
    monkeypatch: pytest.MonkeyPatch, deliver: list[Any], call: str
) -> None:
    from isrlab.harness.workloads.queue import client as queue_client

    monkeypatch.setattr(queue_client, "TXN_GRACE_S", 0.05)
    p = HangingProducer(deliver)
    c = client(p, polled(), txn=True)
    try:
        done = c.invoke(TXN)
        assert done["type"] == "info" and c.broken, done
        assert [call, "timeout"] in (done["error"] if call == "abort" else [done["error"]]), done
        assert p.calls[-1] == call
    finally:
        p.release.set()


def test_commit_that_requires_abort_is_a_fail() -> None:
    err = KafkaError(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)
    p = FakeProducer([None, None], commit=err)
    assert client(p, polled(), txn=True).invoke(TXN)["type"] == "fail"
    assert p.calls[-1] == "abort"


def test_failed_abort_is_indefinite_and_breaks_the_client() -> None:
    p = FakeProducer([None, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)])
    p.abort_error = KafkaError(KafkaError._TRANSPORT)
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
    p = FakeProducer(deliveries)
    done = client(p).invoke({"f": "send", "value": [["send", "t1/0", 1], ["send", "t1/0", 2]]})
    assert done["type"] == kind
    assert done["value"][0] == ["send", "t1/0", [0, 1] if deliveries[0] is None else 1]


def test_fenced_producer_breaks_the_client() -> None:
    p = FakeProducer([KafkaError(KafkaError.PRODUCER_FENCED)])
    c = client(p)
    done = c.invoke({"f": "send", "value": [["send", "t1/0", 1]]})
    assert done["type"] == "fail" and c.broken


def test_garbage_record_is_reported_as_read() -> None:
    c = client(FakeProducer([]), [FakeMessage("t0", 0, 0, b"not-a-number")])
    done = c.invoke({"f": "poll", "value": [["poll"]]})
    assert done["value"] == [["poll", {"t0/0": [[0, "not-a-number"]]}]]
