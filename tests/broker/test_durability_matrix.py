"""The torn-file matrix of tests/log/test_torn_files.py on live broker processes (make soak).

Same partition (topic orders, 10 batches of 3 records from one idempotent producer, two
segments rolled and an active one), same damages, same outcomes (docs/durability.md), but
produced over the wire with acks=all, stopped with SIGTERM (clean) or SIGTERM, start, kill -9
(unclean, with every file the clean stop wrote still there), and started again as a process.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient
from tests.broker.test_bad_input import create, end_offset, fetch_all, produce_req
from tests.log.batches import decode_values
from tests.log.test_torn_files import (
    BATCH,
    BATCH_RECORDS,
    BATCHES,
    DAMAGES,
    KINDS,
    LOST_LAST_BATCH,
    TP,
    damage,
    expected_log,
    goes_offline,
    idempotent_batch,
    target,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = {
    "log.segment.bytes": str(4 * BATCH),
    "log.index.interval.bytes": str(BATCH),
    "log.level": "INFO",
}


def produce(port: int, data: bytes) -> int:
    c = RawClient(port)
    try:
        resp = c.call(produce_req(TP[0], data, acks=-1))
    finally:
        c.close()
    part = resp.responses[0].partition_responses[0]
    assert part.error_code == 0, part
    return int(part.base_offset)


def sigterm(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(30) == 0
    broker.proc = None


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_torn_file_matrix_live(broker_factory, kind: str, how: str, clean: bool) -> None:
    broker = broker_factory(OVERRIDES)
    create(broker.port, TP[0])
    sent = []
    for i in range(BATCHES):
        data = idempotent_batch(i)
        assert produce(broker.port, data) == i * BATCH_RECORDS
        sent.append(data)
    records = decode_values(fetch_all(broker.port, TP[0]))
    assert len(records) == BATCHES * BATCH_RECORDS
    sigterm(broker)
    if not clean:
        broker.start()
        broker.kill9()
    root = broker.log_dir
    damage(target(root, kind), kind, how)

    before = len(broker.log_text())
    refusal = goes_offline(kind, target(root, kind))
    if refusal is not None:  # Kafka's offline log dir: one line, exit status 2
        with pytest.raises(RuntimeError, match="broker exited"):
            broker.start()
        assert broker.proc is not None and broker.proc.wait(10) == 2
        broker.proc = None
        line = broker.log_text()[before:].strip().splitlines()[-1]
        assert re.search("isrlab-broker: cannot start: " + refusal, line), line
        return
    broker.start()
    log = broker.log_text()[before:]
    leo = BATCHES * BATCH_RECORDS - (BATCH_RECORDS if (kind, how) in LOST_LAST_BATCH else 0)
    assert end_offset(broker.port, TP[0]) == leo
    assert decode_values(fetch_all(broker.port, TP[0])) == records[:leo]
    pattern = expected_log(kind, how, clean)
    if pattern is not None:
        assert re.search(pattern, log), log
    if not clean:
        assert "Recovering unflushed segment 24 in " in log
    # the next record gets the next offset; the producer's sequence state survived
    assert produce(broker.port, idempotent_batch(BATCHES if leo == 30 else BATCHES - 1)) == leo
