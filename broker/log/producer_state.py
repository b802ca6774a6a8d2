"""Producer state of one partition and its `.snapshot` files (Kafka's ProducerStateManager and
ProducerAppendInfo): idempotence (KIP-98) and transactions.

Per producer id the partition remembers the producer epoch, the metadata of its last five batches
(first/last sequence, first/last offset), the coordinator epoch of its last transaction marker and
the first offset of its ongoing transaction:

- a batch whose epoch is older than the known one is rejected with INVALID_PRODUCER_EPOCH (47)
  (unless ``transaction.producer.epoch.fencing.enable=false``, the historic unsafe switch: then a
  zombie's batch is accepted);
- a client batch with the current epoch and the same (first, last) sequence as a remembered batch
  is a retry of an append that already happened: it is not appended again and the client gets
  the original offsets (`DuplicateBatch`);
- with the current epoch, the first sequence must follow the last one (wrapping at 2^31-1), else
  OUT_OF_ORDER_SEQUENCE_NUMBER (45); a new epoch must start at sequence 0; a producer the
  partition has no state for (new, or expired) may start anywhere, as in Kafka;
- the broker's coordinators (origin "coordinator": transactional offset commits, markers) get the
  epoch check only, no sequence check; followers (replication) get no check at all;
- transactions: a transactional data batch opens a transaction for its producer when none is
  open (`current_txn_first_offset`); a non-transactional batch while one is open is
  INVALID_TXN_STATE (48). A transaction marker (control batch) closes it: an older producer epoch
  is INVALID_PRODUCER_EPOCH, an older coordinator epoch than the producer's last marker is
  TRANSACTION_COORDINATOR_FENCED (52). A closed non-empty transaction becomes a `CompletedTxn`
  (producer id, first offset, marker offset, aborted?) and stays "unreplicated" until the high
  watermark passes its marker (`on_high_watermark_updated`).
- `first_unstable_offset()`: the smallest first offset of an ongoing or unreplicated
  transaction; the partition's LSO is min(that, HW).

Snapshot file `<20-digit offset>.snapshot` in the partition directory: the state after every batch
below that offset, as one JSON object `{"version": 2, "offset": N, "producers": [...], "crc": C}`
where C is the CRC-32C of the same object without "crc" (sorted keys, compact). Each producer
holds "pid", "epoch", "ts", "batches", and since version 2 "coord_epoch" and "txn_first" (-1: no
transaction open); version 1 files are still read. Written atomically. On load the newest valid
snapshot at or below the log end offset is read and the log is replayed from there (`load`);
snapshots past a truncation point are deleted.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import crc32c

from isrlab.broker.log import durable
from isrlab.broker.log.control import EndTxnMarker, parse_end_txn_marker
from isrlab.broker.log.errors import LogError
from isrlab.broker.log.record_batch import BatchHeader, ByteBuffer, iter_batches

if TYPE_CHECKING:
    from isrlab.broker.log.log import AppendOrigin, Log

RETAINED_BATCHES = 5
INT32_MAX = (1 << 31) - 1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
READABLE_SNAPSHOT_VERSIONS = (1, 2)

log = logging.getLogger(__name__)

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52

# AppendOrigin values, compared by value so this module does not need the log module at run time
_CLIENT = "client"
_COORDINATOR = "coordinator"


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
    coordinator_epoch: int = -1
    #: first offset of the producer's ongoing transaction in this partition, -1 if none
    current_txn_first_offset: int = -1

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
            "coord_epoch": self.coordinator_epoch,
            "txn_first": self.current_txn_first_offset,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProducerEntry:
        e = cls(
            int(d["pid"]),
            int(d["epoch"]),
            last_timestamp=int(d["ts"]),
            coordinator_epoch=int(d.get("coord_epoch", -1)),
            current_txn_first_offset=int(d.get("txn_first", -1)),
        )
        for b in d["batches"]:
            e.batches.append(BatchMetadata(*map(int, b)))
        return e


@dataclass(frozen=True, slots=True)
class ProducerView:
    """One producer as DescribeProducers shows it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass
class TxnMetadata:
    producer_id: int
    first_offset: int
    #: the marker's offset once completed (unreplicated), None while ongoing
    last_offset: int | None = None


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def batch_marker(buf: ByteBuffer, header: BatchHeader) -> EndTxnMarker | None:
    """The transaction marker of a control batch (None for data batches and other control
    types); InvalidRecordError if the control record is malformed."""
    if not header.is_control:
        return None
    return parse_end_txn_marker(buf, header)


class ProducerStateManager:
    def __init__(self, directory: Path, *, epoch_fencing: bool = True):
        self.dir = Path(directory)
        #: transaction.producer.epoch.fencing.enable: False accepts older epochs (unsafe)
        self.epoch_fencing = epoch_fencing
        self.producers: dict[int, ProducerEntry] = {}
        self.map_end_offset = 0  # state covers every batch below this offset
        #: first offset -> transaction, for transactions without a marker yet
        self.ongoing: dict[int, TxnMetadata] = {}
        #: first offset -> completed transaction whose marker the HW has not passed yet
        self.unreplicated: dict[int, TxnMetadata] = {}
        self._dirty = False

    # ----- append path -----------------------------------------------------------------------

    def check(
        self,
        batch: BatchHeader,
        origin: AppendOrigin | str = _CLIENT,
        marker: EndTxnMarker | None = None,
    ) -> None:
        """Validate a batch before a leader append; raise DuplicateBatch or
        ProducerStateError. Batches without a producer id are not checked; the batches of the
        broker's coordinators (origin "coordinator") have their epoch checked but no sequence;
        a transaction marker (``marker``, a control batch) its producer and coordinator
        epochs."""
        pid = batch.producer_id
        if pid < 0:
            return
        entry = self.producers.get(pid)
        if entry is None:
            return
        origin = getattr(origin, "value", origin)
        if batch.producer_epoch < entry.epoch and self.epoch_fencing:
            what = "transaction marker" if batch.is_control else "batch"
            raise ProducerStateError(
                INVALID_PRODUCER_EPOCH,
                f"producer {pid}: {what} epoch {batch.producer_epoch} is older than {entry.epoch}",
            )
        if batch.is_control:
            if marker is not None and marker.coordinator_epoch < entry.coordinator_epoch:
                raise ProducerStateError(
                    TRANSACTION_COORDINATOR_FENCED,
                    f"producer {pid}: transaction marker from coordinator epoch "
                    f"{marker.coordinator_epoch}, older than {entry.coordinator_epoch} (a "
                    "zombie coordinator)",
                )
            return
        if entry.current_txn_first_offset >= 0 and not batch.is_transactional:
            raise ProducerStateError(
                INVALID_TXN_STATE,
                f"producer {pid} has a transaction open since offset "
                f"{entry.current_txn_first_offset}: expected a transactional write",
            )
        if origin != _CLIENT or batch.producer_epoch < entry.epoch:
            return  # a coordinator's batch, or a zombie's accepted without fencing
        first, last = batch.base_sequence, batch.last_sequence
        if batch.producer_epoch == entry.epoch:
            for b in entry.batches:
                if b.first_seq == first and b.last_seq == last:
                    open_since = entry.current_txn_first_offset
                    if batch.is_transactional and (open_since < 0 or b.first_offset < open_since):
                        # Not a retry within the open transaction: the sequence was used by a
                        # batch of a transaction that has ended (a client that reset its
                        # sequences after an abort without bumping its epoch). Answering with
                        # that batch's offsets would acknowledge a write that is not in the log
                        # (isrlab's rule; Kafka 3.x answers as for any duplicate).
                        raise ProducerStateError(
                            OUT_OF_ORDER_SEQUENCE_NUMBER,
                            f"producer {pid} epoch {entry.epoch}: sequence {first}..{last} was "
                            f"written at offset {b.first_offset} by a transaction that has "
                            "ended; a new transaction must continue the sequence or bump the "
                            "epoch",
                        )
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

    def update(self, batch: BatchHeader, marker: EndTxnMarker | None = None) -> CompletedTxn | None:
        """Record an appended batch (offsets already assigned); leader and follower alike.
        Returns the transaction a marker completed, if it had data here (the caller indexes
        an aborted one, then calls `complete_txn`)."""
        if batch.next_offset > self.map_end_offset:
            self.map_end_offset = batch.next_offset
        pid = batch.producer_id
        if pid < 0:
            return None
        entry = self.producers.get(pid)
        if batch.is_control:
            if marker is None:
                return None  # not a transaction marker (an unknown control type)
            if entry is None:
                entry = self.producers[pid] = ProducerEntry(pid, batch.producer_epoch)
            elif batch.producer_epoch > entry.epoch:
                entry.epoch = batch.producer_epoch
                entry.batches.clear()
            completed = None
            if entry.current_txn_first_offset >= 0:
                completed = CompletedTxn(
                    pid, entry.current_txn_first_offset, batch.base_offset, not marker.commit
                )
            entry.coordinator_epoch = max(entry.coordinator_epoch, marker.coordinator_epoch)
            entry.current_txn_first_offset = -1
            entry.last_timestamp = max(entry.last_timestamp, batch.max_timestamp)
            self._dirty = True
            return completed
        if entry is None or batch.producer_epoch > entry.epoch:
            old = entry
            entry = ProducerEntry(pid, batch.producer_epoch)
            if old is not None:  # a bumped epoch keeps the transaction and coordinator state
                entry.coordinator_epoch = old.coordinator_epoch
                entry.current_txn_first_offset = old.current_txn_first_offset
                entry.last_timestamp = old.last_timestamp
            self.producers[pid] = entry
        if batch.producer_epoch == entry.epoch and batch.base_sequence >= 0:
            entry.batches.append(
                BatchMetadata(
                    batch.base_sequence,
                    batch.last_sequence,
                    batch.base_offset,
                    batch.last_offset,
                    batch.max_timestamp,
                )
            )
        if batch.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = batch.base_offset
            self.ongoing[batch.base_offset] = TxnMetadata(pid, batch.base_offset)
        entry.last_timestamp = max(entry.last_timestamp, batch.max_timestamp)
        self._dirty = True
        return None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO right after ``completed``'s marker: the first offset of the oldest other
        ongoing transaction, else just past the marker (what the .txnindex entry records)."""
        others = [
            t.first_offset for t in self.ongoing.values() if t.producer_id != completed.producer_id
        ]
        return min(others) if others else completed.last_offset + 1

    def complete_txn(self, completed: CompletedTxn) -> None:
        txn = self.ongoing.pop(completed.first_offset, None)
        if txn is None:
            txn = TxnMetadata(completed.producer_id, completed.first_offset)
        txn.last_offset = completed.last_offset
        self.unreplicated[completed.first_offset] = txn

    def apply(
        self,
        buf: ByteBuffer,
        headers: Iterable[BatchHeader],
        on_aborted: Callable[[CompletedTxn, int], None] | None = None,
    ) -> list[CompletedTxn]:
        """Update with appended batches (their bytes in ``buf``); for every aborted
        transaction call ``on_aborted(txn, lso)`` (the .txnindex append) before completing it.
        A malformed marker of a replicated batch is logged and not tracked."""
        done: list[CompletedTxn] = []
        for header in headers:
            try:
                marker = batch_marker(buf, header)
            except LogError as exc:
                log.warning("%s: ignoring a malformed control batch: %s", self.dir.name, exc)
                marker = None
            completed = self.update(header, marker)
            if completed is None:
                continue
            if completed.is_aborted and on_aborted is not None:
                on_aborted(completed, self.last_stable_offset(completed))
            self.complete_txn(completed)
            done.append(completed)
        return done

    def update_all(self, batches: Iterable[BatchHeader]) -> None:
        """Update with data batches only (no marker bytes at hand: control batches skipped)."""
        for b in batches:
            self.update(b)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Forget completed transactions whose marker is below the HW (replicated)."""
        if not self.unreplicated:
            return
        for first, txn in list(self.unreplicated.items()):
            if txn.last_offset is not None and txn.last_offset < high_watermark:
                del self.unreplicated[first]

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest ongoing or not yet replicated transaction."""
        if not self.ongoing and not self.unreplicated:  # (no transaction: every fetch asks)
            return None
        return min(itertools.chain(self.ongoing, self.unreplicated))

    # ----- queries ---------------------------------------------------------------------------

    def has_ongoing_txn(self, producer_id: int, producer_epoch: int) -> bool:
        """The producer has a transaction open here at this epoch (KIP-890 verification)."""
        entry = self.producers.get(producer_id)
        return (
            entry is not None
            and entry.epoch == producer_epoch
            and entry.current_txn_first_offset >= 0
        )

    def active_producers(self) -> list[ProducerView]:
        """Every producer the partition remembers (DescribeProducers), by producer id."""
        return [
            ProducerView(
                e.producer_id,
                e.epoch,
                e.last_seq,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
            )
            for _, e in sorted(self.producers.items())
        ]

    # ----- loading and replay ----------------------------------------------------------------

    def _rebuild_txns(self) -> None:
        self.ongoing = {
            e.current_txn_first_offset: TxnMetadata(e.producer_id, e.current_txn_first_offset)
            for e in self.producers.values()
            if e.current_txn_first_offset >= 0
        }
        self.unreplicated = {}

    def load(self, lg: Log) -> None:
        """Newest snapshot, then replay the log past it (after open or truncation).

        Where recovery at open rescanned segments (``lg.txn_index_rebuild_from``), the replay
        starts no later than that and writes their .txnindex entries again."""
        rebuild_from = lg.txn_index_rebuild_from
        limit = lg.log_end_offset if rebuild_from is None else min(lg.log_end_offset, rebuild_from)
        offset = self.load_latest_snapshot(lg.log_start_offset, lg.log_end_offset, at_most=limit)
        on_aborted = None
        if rebuild_from is not None:
            lg.truncate_txn_indexes(rebuild_from)
            index_from = rebuild_from

            def on_aborted(txn: CompletedTxn, lso: int) -> None:
                if txn.last_offset >= index_from:
                    lg.append_aborted_txn(txn.producer_id, txn.first_offset, txn.last_offset, lso)

        while offset < lg.log_end_offset:
            data = lg.read(offset, 8 << 20, min_one_message=True)
            if data.size == 0:
                break
            raw = data.read_bytes()
            headers = list(iter_batches(raw))
            self.apply(raw, headers, on_aborted)
            offset = headers[-1].next_offset
        lg.txn_index_rebuild_from = None

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
            "version": SNAPSHOT_VERSION,
            "offset": self.map_end_offset,
            "producers": [e.to_json() for e in self.producers.values()],
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        body["crc"] = crc32c.crc32c(raw)
        path = self.dir / f"{self.map_end_offset:020d}{SNAPSHOT_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with durable.batched():
            with open(tmp, "wb") as f:
                f.write(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
                f.flush()
                durable.fsync_fd(f.fileno(), tmp)
            durable.replace(tmp, path)
        self._dirty = False
        for _, old in self.snapshot_files()[:-keep]:
            durable.unlink(old, missing_ok=True)
        return path

    def load_latest_snapshot(
        self, log_start: int, log_end: int, *, at_most: int | None = None
    ) -> int:
        """Load the newest valid snapshot within [log_start, min(log_end, at_most)]; return its
        offset (or log_start when none is usable: the caller replays the log from there).
        Snapshots past ``log_end`` are deleted, corrupt ones too; valid ones past ``at_most``
        are kept but not used."""
        self.producers.clear()
        self.ongoing.clear()
        self.unreplicated.clear()
        self.map_end_offset = log_start
        limit = log_end if at_most is None else min(log_end, at_most)
        for offset, path in reversed(self.snapshot_files()):
            if offset > log_end:
                durable.unlink(path, missing_ok=True)
                continue
            if offset < log_start:
                continue
            try:
                producers = self._read_snapshot(path, offset)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                # a torn or corrupt snapshot: fall back to an older one, or replay the log
                log.warning(
                    "Deleting corrupt producer state snapshot %s (%s); rebuilding the state "
                    "from an older snapshot or the log",
                    path,
                    exc,
                )
                durable.unlink(path, missing_ok=True)
                continue
            if offset > limit:
                continue
            self.producers = producers
            self._rebuild_txns()
            self.map_end_offset = offset
            return offset
        return log_start

    @staticmethod
    def _read_snapshot(path: Path, offset: int) -> dict[int, ProducerEntry]:
        body = json.loads(path.read_bytes())
        crc = body.pop("crc")
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        if crc32c.crc32c(raw) != crc or body["offset"] != offset:
            raise ValueError("checksum mismatch")
        if body.get("version") not in READABLE_SNAPSHOT_VERSIONS:
            raise ValueError(f"unknown snapshot version {body.get('version')!r}")
        return {int(d["pid"]): ProducerEntry.from_json(d) for d in body["producers"]}

    def truncate_snapshots_after(self, offset: int) -> None:
        for off, path in self.snapshot_files():
            if off > offset:
                durable.unlink(path, missing_ok=True)
