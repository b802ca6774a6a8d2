"""Idempotent-producer state of one partition and its `.snapshot` files (Kafka's ProducerStateManager).

Per producer id the partition remembers the producer epoch and the metadata of its last five batches
(first/last sequence, first/last offset), exactly what KIP-98 needs:

- a batch whose epoch is older than the known one is rejected with INVALID_PRODUCER_EPOCH (47);
- a batch with the current epoch and the same (first, last) sequence as a remembered batch is a
  retry of an append that already happened: it is not appended again and the client gets the
  original offsets (`DuplicateBatch`);
- with the current epoch, the first sequence must follow the last one (wrapping at 2^31-1), else
  OUT_OF_ORDER_SEQUENCE_NUMBER (45); a new epoch must start at sequence 0; a producer the partition
  has no state for (new, or expired) may start anywhere, as in Kafka.

Snapshot file `<20-digit offset>.snapshot` in the partition directory: the state after every batch
below that offset, as one JSON object `{"version": 1, "offset": N, "producers": [...], "crc": C}`
where C is the CRC-32C of the same object without "crc" (sorted keys, compact). Written atomically.
On load the newest valid snapshot at or below the log end offset is read and the log is replayed from
there; snapshots past a truncation point are deleted.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from isrlab.broker.log.log import AppendOrigin
from isrlab.broker.log.record_batch import BatchHeader

RETAINED_BATCHES = 5
INT32_MAX = (1 << 31) - 1
SNAPSHOT_SUFFIX = ".snapshot"

log = logging.getLogger(__name__)

INVALID_PRODUCER_EPOCH = 47
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


class ProducerStateError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class DuplicateBatch(Exception):
    """The batch was appended before; answer with its original offsets."""

    def __init__(self, first_offset: int, last_offset: int):
        super().__init__(f"duplicate of the batch at offsets {first_offset}..{last_offset}")
        self.first_offset = first_offset
        self.last_offset = last_offset


@dataclass
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=RETAINED_BATCHES))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.producer_id,
            "epoch": self.epoch,
            "ts": self.last_timestamp,
            "batches": [
                [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                for b in self.batches
            ],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProducerEntry:
        e = cls(int(d["pid"]), int(d["epoch"]), last_timestamp=int(d["ts"]))
        for b in d["batches"]:
            e.batches.append(BatchMetadata(*map(int, b)))
        return e


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class ProducerStateManager:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.producers: dict[int, ProducerEntry] = {}
        self.map_end_offset = 0  # state covers every batch below this offset
        self._dirty = False

    # ----- append path -----------------------------------------------------------------------

    def check(self, batch: BatchHeader, origin: AppendOrigin = AppendOrigin.CLIENT) -> None:
        """Validate a batch before a leader append; raise DuplicateBatch or
        ProducerStateError. Batches without a producer id are not checked; the batches of the
        broker's coordinators (``AppendOrigin.COORDINATOR``) have their epoch checked but no
        sequence."""
        pid = batch.producer_id
        if pid < 0 or batch.is_control:
            return
        entry = self.producers.get(pid)
        if entry is None:
            return
        if batch.producer_epoch < entry.epoch:
            raise ProducerStateError(
                INVALID_PRODUCER_EPOCH,
                f"producer {pid}: epoch {batch.producer_epoch} is older than {entry.epoch}",
            )
        if origin is AppendOrigin.COORDINATOR:
            return
        first, last = batch.base_sequence, batch.last_sequence
        if batch.producer_epoch == entry.epoch:
            for b in entry.batches:
                if b.first_seq == first and b.last_seq == last:
                    raise DuplicateBatch(b.first_offset, b.last_offset)
            if entry.batches and not in_sequence(entry.last_seq, first):
                raise ProducerStateError(
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {pid} epoch {entry.epoch}: sequence {first} does not follow "
                    f"{entry.last_seq}",
                )
        elif first != 0:
            raise ProducerStateError(
                OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid}: new epoch {batch.producer_epoch} must start at sequence 0, "
                f"not {first}",
            )

    def update(self, batch: BatchHeader) -> None:
        """Record an appended batch (offsets already assigned); leader and follower alike."""
        if batch.base_offset + batch.last_offset_delta + 1 > self.map_end_offset:
            self.map_end_offset = batch.base_offset + batch.last_offset_delta + 1
        pid = batch.producer_id
        if pid < 0 or batch.is_control:
            return
        entry = self.producers.get(pid)
        if entry is None or batch.producer_epoch > entry.epoch:
            entry = ProducerEntry(pid, batch.producer_epoch)
            self.producers[pid] = entry
        entry.batches.append(
            BatchMetadata(
                batch.base_sequence,
                batch.last_sequence,
                batch.base_offset,
                batch.base_offset + batch.last_offset_delta,
                batch.max_timestamp,
            )
        )
        entry.last_timestamp = max(entry.last_timestamp, batch.max_timestamp)
        self._dirty = True

    def update_all(self, batches: Iterable[BatchHeader]) -> None:
        for b in batches:
            self.update(b)

    # ----- snapshots ---------------------------------------------------------------------------

    def snapshot_files(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.dir.glob("*" + SNAPSHOT_SUFFIX):
            stem = p.name[: -len(SNAPSHOT_SUFFIX)]
            if stem.isdigit():
                out.append((int(stem), p))
        return sorted(out)

    def take_snapshot(self, keep: int = 2) -> Path | None:
        """Write the state at map_end_offset if it changed; keep the newest `keep` snapshots."""
        if not self._dirty:
            return None
        body = {
            "version": 1,
            "offset": self.map_end_offset,
            "producers": [e.to_json() for e in self.producers.values()],
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        body["crc"] = crc32c.crc32c(raw)
        path = self.dir / f"{self.map_end_offset:020d}{SNAPSHOT_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._dirty = False
        for _, old in self.snapshot_files()[:-keep]:
            old.unlink(missing_ok=True)
        return path

    def load_latest_snapshot(self, log_start: int, log_end: int) -> int:
        """Load the newest valid snapshot within [log_start, log_end]; return its offset (or
        log_start when none is usable: the caller replays the log from there)."""
        self.producers.clear()
        self.map_end_offset = log_start
        for offset, path in reversed(self.snapshot_files()):
            if offset > log_end:
                path.unlink(missing_ok=True)
                continue
            if offset < log_start:
                continue
            try:
                body = json.loads(path.read_bytes())
                crc = body.pop("crc")
                raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                if crc32c.crc32c(raw) != crc or body["offset"] != offset:
                    raise ValueError("checksum mismatch")
                self.producers = {
                    int(d["pid"]): ProducerEntry.from_json(d) for d in body["producers"]
                }
                self.map_end_offset = offset
                return offset
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                # a torn or corrupt snapshot: fall back to an older one, or replay the log
                log.warning(
                    "Deleting corrupt producer state snapshot %s (%s); rebuilding the state "
                    "from an older snapshot or the log",
                    path,
                    exc,
                )
                path.unlink(missing_ok=True)
        return log_start

    def truncate_snapshots_after(self, offset: int) -> None:
        for off, path in self.snapshot_files():
            if off > offset:
                path.unlink(missing_ok=True)
