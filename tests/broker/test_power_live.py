"""Power loss of a live single broker (issue 17): produce with acks=1, kill -9, `isrlab-broker
power-loss` on its log dir, start again. With the default flush policy (never: Kafka's) the
records past the last flush are gone, exactly those, the broker recovers to a consistent log
(offsets contiguous from 0, every record what was produced at its offset, the next produce
right after it) and the truncation journal names what the loss cut. With
log.flush.interval.messages=1 nothing acknowledged is lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from isrlab.broker.log.durable import read_journal
from isrlab.broker.log.inventory import TRUNCATION_JOURNAL, whole_batches
from tests.broker.conftest import BrokerProcess
from tests.broker.rawclient import RawClient, build_batch, produce_req
from tests.broker.test_bad_input import create, end_offset, fetch_all
from tests.log.batches import decode_values

pytestmark = pytest.mark.integration

TOPIC = "power"
BATCHES, PER_BATCH = 12, 50
# segments of ~5 batches (~700 bytes each): the rolls flush the segments before the active one (Kafka's
# flush-on-roll), the active segment's batches stay in the page cache only
BASE = {"log.segment.bytes": "4000", "log.level": "INFO"}


def value(i: int) -> bytes:
    return f"{i:06d}".encode()


def produce_acks1(port: int) -> None:
    create(port, TOPIC)
    for b in range(BATCHES):
        c = RawClient(port)
        try:
            resp = c.call(
                produce_req(
                    TOPIC, build_batch([value(b * PER_BATCH + i) for i in range(PER_BATCH)])
                )
            )
        finally:
            c.close()
        part = resp.responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset) == (0, b * PER_BATCH), part


def synced_records(part: Path, log_dir: Path) -> int:
    """Records in whole batches within each segment's synced length (the journal's view)."""
    state = read_journal(log_dir)
    kept = 0
    for seg in sorted(part.glob("*.log")):
        n = state.synced.get(f"{part.name}/{seg.name}", 0)
        kept += sum(h.records_count for h in whole_batches(seg.read_bytes()) if h.end_position <= n)
    return kept


def power_loss(log_dir: Path) -> str:
    cli = subprocess.run(
        [sys.executable, "-m", "isrlab.broker", "power-loss", "--log-dirs", str(log_dir)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr
    return cli.stdout


def power_entries(log_dir: Path) -> list[dict[str, object]]:
    path = log_dir / TRUNCATION_JOURNAL
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == "power-loss"]


def test_default_flush_policy_loses_exactly_the_unflushed_tail(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(BASE)
    produce_acks1(broker.port)
    total = BATCHES * PER_BATCH
    broker.kill9()
    part = broker.log_dir / f"{TOPIC}-0"
    kept = synced_records(part, broker.log_dir)
    assert 0 < kept < total  # some segments flushed by rolls, the active one not
    assert "cut back" in power_loss(broker.log_dir)
    # the journal names every record the loss cut, offsets kept..total-1
    cut = [r for e in power_entries(broker.log_dir) for r in e["records"]]  # type: ignore[attr-defined]
    assert [(r[0], r[3]) for r in cut] == [(o, value(o).decode()) for o in range(kept, total)]

    log = broker.log_dir.parent / "restart.log"
    before = len(broker.log_text())
    broker.start()
    text = broker.log_text()[before:]
    log.write_text(text)
    assert "ERROR" not in text and "Traceback" not in text, text[-3000:]
    assert end_offset(broker.port, TOPIC) == kept
    assert decode_values(fetch_all(broker.port, TOPIC)) == [(o, value(o)) for o in range(kept)]
    c = RawClient(broker.port)
    try:
        resp = c.call(produce_req(TOPIC, build_batch([b"after"])))
    finally:
        c.close()
    assert resp.responses[0].partition_responses[0].base_offset == kept


def test_flush_on_every_message_loses_nothing_acknowledged(broker_factory) -> None:
    broker: BrokerProcess = broker_factory({**BASE, "log.flush.interval.messages": "1"})
    produce_acks1(broker.port)
    total = BATCHES * PER_BATCH
    broker.kill9()
    power_loss(broker.log_dir)
    assert all(not e["records"] for e in power_entries(broker.log_dir))
    broker.start()
    assert end_offset(broker.port, TOPIC) == total
    assert decode_values(fetch_all(broker.port, TOPIC)) == [(o, value(o)) for o in range(total)]
