"""What a replica holds, record by record, and what it truncated away.

Two uses, both for explaining writes a client could not find (the harness's reconciliation of
unseen and lost acknowledged writes, `checkers/unseen.py`):

- `stored_records(partition_dir)`: every data record of a partition directory's live segments,
  in offset order, with the leader epoch and producer id of its batch. Whole batches only (a
  live broker may be writing the last one); a batch whose CRC does not match is skipped and
  counted, never returned as data. Control batches (transaction markers) are left out.
- The truncation journal `isrlab-truncations.jsonl` in each log directory: one JSON line per
  truncation of a partition's log (a follower truncating to its leader's epoch end offset or
  to its high watermark, a replica reset to a new start offset), written by
  `record_truncation` before the records are cut, holding the records cut; and the segments a
  power loss cuts or deletes (`record_power_loss`, kind ``power-loss``, written by
  ``durable.apply_power_loss``). It is isrlab's own file (Kafka only logs "Truncating to
  offset N"): the observer's notes, written with a plain append, not fsynced, and left alone
  by the power-loss model (as the journal of synced lengths is).

`isrlab-broker replica-records` prints `stored_records` of every partition of a log directory
as JSON lines; the harness runs it on every node after a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isrlab.broker import clock
from isrlab.broker.log.durable import TRUNCATION_JOURNAL
from isrlab.broker.log.errors import LogError
from isrlab.broker.log.record_batch import BatchHeader, check_crc, iter_batches
from isrlab.broker.log.segment import LOG_SUFFIX

__all__ = [
    "TRUNCATION_JOURNAL",
    "Inventory",
    "StoredRecord",
    "is_segment",
    "record_power_loss",
    "record_truncation",
    "replica_records",
    "segment_files",
    "show_value",
    "stored_records",
    "whole_batches",
]


@dataclass(frozen=True)
class StoredRecord:
    """One data record as a replica holds it on disk."""

    offset: int
    leader_epoch: int  # the batch's partitionLeaderEpoch: which leader wrote it
    producer_id: int
    value: bytes | None


def segment_files(partition_dir: Path) -> list[Path]:
    """The live segments (20 digits + .log; not .deleted/.cleaned/.swap), by base offset."""
    logs = [
        p
        for p in partition_dir.iterdir()
        if p.name.endswith(LOG_SUFFIX) and p.name[: -len(LOG_SUFFIX)].isdigit()
    ]
    return sorted(logs, key=lambda p: int(p.name[: -len(LOG_SUFFIX)]))


def whole_batches(data: bytes) -> list[BatchHeader]:
    """The batches of a segment file up to the first torn one."""
    headers: list[BatchHeader] = []
    try:
        for header in iter_batches(data):
            headers.append(header)
    except LogError:
        pass
    return headers


class Inventory:
    """`stored_records` of one partition directory, with the count of corrupt batches met."""

    def __init__(self, partition_dir: Path, from_offset: int = 0, whole: bool = False) -> None:
        self.partition_dir = partition_dir
        self.from_offset = from_offset
        self.whole = whole  # every record of a batch reaching from_offset (what a cut removes)
        self.corrupt_batches = 0

    def __iter__(self) -> Iterator[StoredRecord]:
        from kafka.record.default_records import DefaultRecordBatch

        for path in segment_files(self.partition_dir):
            data = path.read_bytes()
            for header in whole_batches(data):
                if header.last_offset < self.from_offset or header.is_control:
                    continue
                try:
                    check_crc(data, header)
                except LogError:
                    self.corrupt_batches += 1
                    continue
                batch = DefaultRecordBatch(data[header.position : header.end_position])
                for record in batch:
                    if record.offset < self.from_offset and not self.whole:
                        continue
                    value = None if record.value is None else bytes(record.value)
                    yield StoredRecord(
                        record.offset, header.partition_leader_epoch, header.producer_id, value
                    )


def stored_records(partition_dir: Path, from_offset: int = 0) -> list[StoredRecord]:
    return list(Inventory(partition_dir, from_offset))


def show_value(value: bytes | None) -> Any:
    """A record value for JSON: the text it holds (the harness's values are decimal
    integers), or its hex when it is not UTF-8."""
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}


def record_truncation(
    partition_dir: Path,
    topic: str,
    partition: int,
    log_end_offset: int,
    to_offset: int,
    leader_epoch: int,
    kind: str,
) -> None:
    """Append one truncation to the log directory's journal, with the records about to be cut
    (the whole batches from the one holding `to_offset`: a log is cut at batch boundaries).
    Call it before truncating. Never raises: the journal
    explains, it must not stop a truncation."""
    try:
        cut = [
            [r.offset, r.leader_epoch, r.producer_id, show_value(r.value)]
            for r in Inventory(partition_dir, to_offset, whole=True)
        ]
        entry = {
            "time_ms": clock.now_ms(),
            "topic": topic,
            "partition": partition,
            "kind": kind,
            "log_end_offset": log_end_offset,
            "to_offset": to_offset,
            "leader_epoch": leader_epoch,
            "records": cut,
        }
        with open(partition_dir.parent / TRUNCATION_JOURNAL, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")
    except (OSError, ValueError, LogError):
        pass


def _latest_epoch(partition_dir: Path) -> int:
    """The last epoch of a partition's leader-epoch-checkpoint (-1 when there is none)."""
    try:
        lines = (partition_dir / "leader-epoch-checkpoint").read_text().split()
        return int(lines[-2]) if len(lines) >= 4 else -1
    except (OSError, ValueError, IndexError):
        return -1


def is_segment(path: Path) -> bool:
    """A live segment of a partition directory: ``<topic>-<p>/<20 digits>.log``."""
    topic, _, part = path.parent.name.rpartition("-")
    stem = path.name[: -len(LOG_SUFFIX)]
    return (
        bool(topic)
        and part.isdigit()
        and path.name.endswith(LOG_SUFFIX)
        and len(stem) == 20
        and stem.isdigit()
    )


def record_power_loss(segment: Path, keep: int) -> None:
    """Before a power loss cuts the segment file `segment` back to its first `keep` bytes
    (``keep`` 0 when it is emptied or deleted), append to the log directory's truncation
    journal the records it loses, with kind ``power-loss``: every whole batch that does not
    end within the bytes kept (a batch cut through is lost whole: recovery drops a torn tail).
    ``leader_epoch`` is the last epoch of the partition's leader-epoch-checkpoint as the
    page cache held it. Never raises, as `record_truncation`."""
    from kafka.record.default_records import DefaultRecordBatch

    try:
        partition_dir = segment.parent
        topic, _, part = partition_dir.name.rpartition("-")
        data = segment.read_bytes()
        headers = whole_batches(data)
        lost = [h for h in headers if h.end_position > keep and not h.is_control]
        if not lost:
            return
        cut = []
        for header in lost:
            try:
                check_crc(data, header)
            except LogError:
                continue
            batch = DefaultRecordBatch(data[header.position : header.end_position])
            for r in batch:
                value = None if r.value is None else bytes(r.value)
                cut.append(
                    [r.offset, header.partition_leader_epoch, header.producer_id, show_value(value)]
                )
        entry = {
            "time_ms": clock.now_ms(),
            "topic": topic,
            "partition": int(part),
            "kind": "power-loss",
            "log_end_offset": headers[-1].last_offset + 1,
            "to_offset": lost[0].base_offset,
            "leader_epoch": _latest_epoch(partition_dir),
            "segment": segment.name,
            "bytes": [len(data), keep],
            "records": cut,
        }
        with open(partition_dir.parent / TRUNCATION_JOURNAL, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")
    except (OSError, ValueError, LogError):
        pass


def replica_records(log_dir: Path, topics: set[str] | None = None) -> Iterator[dict[str, Any]]:
    """`stored_records` of every partition directory in `log_dir` (of `topics` only, when
    given) as JSON-ready dicts; a directory with corrupt batches ends with a
    ``{"topic", "partition", "corrupt_batches": n}`` line."""
    for d in sorted(p for p in log_dir.iterdir() if p.is_dir() and "-" in p.name):
        topic, _, part = d.name.rpartition("-")
        if not part.isdigit() or (topics is not None and topic not in topics):
            continue
        inventory = Inventory(d)
        for r in inventory:
            yield {
                "topic": topic,
                "partition": int(part),
                "offset": r.offset,
                "leader_epoch": r.leader_epoch,
                "producer_id": r.producer_id,
                "value": show_value(r.value),
            }
        if inventory.corrupt_batches:
            yield {
                "topic": topic,
                "partition": int(part),
                "corrupt_batches": inventory.corrupt_batches,
            }
