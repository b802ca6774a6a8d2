"""Crash consistency: kill -9 a standalone broker while clients produce, many times over.

Each round a confluent-kafka producer (acks=1 or acks=all, alternating) sends to a topic with tiny
segments (`log.segment.bytes`), so the log rolls while the broker is killed. Once the round has some
acknowledged records, the broker is killed (SIGKILL) at a random moment, mid-production; the
producer's unanswered messages are dropped (they may or may not be in the log: never acknowledged).
After every restart, every record ever acknowledged must be read back at the offset its
acknowledgement named, with its value, and the broker must have logged the recovery of the segments
it did not close.

A killed process loses nothing the kernel already has (the page cache survives it, with Kafka's
default of no fsync per write); a machine crash is another matter and is not what this tests.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.admin import CreateTopicsRequest

from tests.broker.conftest import BrokerProcess, free_port
from tests.broker.rawclient import RawClient, fetch_records

pytestmark = pytest.mark.integration

TOPIC = "crash"
PARTITIONS = 2
RECOVERY_LINE = "Recovering unflushed segment"
SEGMENT_BYTES = 8192  # tiny: the log rolls every few batches, so kills land around rolls
BATCH_BYTES = 4096
MAX_IN_FLIGHT = 500  # unanswered messages a producer may have (the kill finds them in flight)


def create_topic(port: int) -> None:
    C = CreateTopicsRequest[4]
    topic = C.CreatableTopic(
        name=TOPIC, num_partitions=PARTITIONS, replication_factor=1, assignments=[], configs=[]
    )
    c = RawClient(port)
    try:
        result = c.call(C(topics=[topic], timeout_ms=10000, validate_only=False)).topics[0]
        assert result.error_code == 0, result
    finally:
        c.close()


class Acked:
    """What the producer's delivery reports acknowledged: (partition, offset) -> value."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], bytes] = {}
        self.this_round = 0
        self.reports = 0  # acknowledgements and errors

    def on_delivery(self, err: Any, msg: Any) -> None:
        self.reports += 1
        if err is not None:
            return
        key = (msg.partition(), msg.offset())
        assert key not in self.records, f"offset {key} acknowledged twice"
        self.records[key] = msg.value()
        self.this_round += 1


def produce_until_killed(
    broker: BrokerProcess, acks: str, round_: int, acked: Acked, rng: random.Random
) -> int:
    """Produce until the round has a random number of acks, keep producing for a random while,
    kill -9 the broker mid-flight; returns how many records were sent."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": acks,
            "linger.ms": rng.choice([0, 1, 5]),
            "batch.num.messages": rng.choice([1, 10, 100]),
            "batch.size": BATCH_BYTES,  # a batch must fit a segment (else RECORD_LIST_TOO_LARGE)
            "message.timeout.ms": 20000,
            "enable.idempotence": False,
        }
    )
    acked.this_round = acked.reports = 0
    sent = 0
    kill_after: float | None = None
    acks_before_kill = rng.randrange(1, 1500)
    deadline = time.monotonic() + 30
    while True:
        now = time.monotonic()
        assert now < deadline, (
            f"round {round_}: {acked.this_round} acks in 30 s, {acks_before_kill} wanted; the "
            f"broker stopped answering:\n{broker.log_text()[-3000:]}"
        )
        if kill_after is None and acked.this_round >= acks_before_kill:
            kill_after = now + rng.uniform(0.0, 0.2)
        if kill_after is not None and now >= kill_after:
            break
        if sent - acked.reports >= MAX_IN_FLIGHT:
            producer.poll(0.001)  # the broker is behind: let acknowledgements come in
            continue
        value = f"r{round_}-{sent}-".encode() + b"v" * rng.randrange(10, 300)
        producer.produce(TOPIC, value, partition=sent % PARTITIONS, on_delivery=acked.on_delivery)
        sent += 1
        producer.poll(0)
    assert broker.proc is not None and broker.proc.poll() is None, (
        f"round {round_}: the broker exited by itself before the kill:\n{broker.log_text()[-3000:]}"
    )
    broker.kill9()
    producer.poll(0.05)  # reports that had already arrived
    producer.purge()  # the rest never got an answer: not acknowledged
    producer.flush(5)
    return sent


def check_everything_acked_is_there(broker: BrokerProcess, acked: Acked) -> None:
    c = RawClient(broker.port)
    try:
        for p in range(PARTITIONS):
            records = fetch_records(c, TOPIC, p)
            offsets = [o for o, _ in records]
            assert offsets == sorted(set(offsets)), f"partition {p}: offsets not increasing"
            stored = dict(records)
            for (partition, offset), value in acked.records.items():
                if partition != p:
                    continue
                assert offset in stored, f"acknowledged {TOPIC}-{p}@{offset} is lost"
                assert stored[offset] == value, f"{TOPIC}-{p}@{offset} holds another value"
    finally:
        c.close()


def run_rounds(tmp_path: Path, rounds: int, seed: int) -> Acked:
    rng = random.Random(seed)
    broker = BrokerProcess(
        tmp_path / "logs",
        free_port(),
        {"log.segment.bytes": str(SEGMENT_BYTES), "log.index.interval.bytes": "512"},
    )
    broker.start()
    acked = Acked()
    try:
        create_topic(broker.port)
        for round_ in range(rounds):
            acks = "all" if round_ % 2 else "1"
            produce_until_killed(broker, acks, round_, acked, rng)
            assert acked.this_round > 0
            logged_before = len(broker.log_text())
            broker.start(timeout=60)  # recovery rescans what was written since the last start
            restart_log = broker.log_text()[logged_before:]
            assert RECOVERY_LINE in restart_log, (
                f"round {round_} (seed {seed}): the restart after kill -9 did not log "
                f"'{RECOVERY_LINE}':\n{restart_log[-3000:]}"
            )
            check_everything_acked_is_there(broker, acked)
        segments = len(list((tmp_path / "logs" / f"{TOPIC}-0").glob("*.log")))
        assert segments > rounds, f"too few rolls: {segments} segments in {rounds} rounds"
    finally:
        broker.stop()
    return acked


def test_kill9_mid_production_loses_no_acknowledged_record(tmp_path: Path) -> None:
    acked = run_rounds(tmp_path, rounds=6, seed=12)
    assert len(acked.records) > 6


@pytest.mark.slow
def test_kill9_mid_production_soak(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    acked = run_rounds(tmp_path, rounds=60, seed=seed)
    assert len(acked.records) > 60, seed
