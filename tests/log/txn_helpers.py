"""Transactional batches and a minimal partition writer for the log tests: appends as the
broker's LogAdapter does (log append, then producer state, .txnindex entry on an abort)."""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatchBuilder

from isrlab.broker.log.control import build_control_batch
from isrlab.broker.log.log import AppendOrigin, Log
from isrlab.broker.log.producer_state import CompletedTxn, ProducerStateManager
from isrlab.broker.log.record_batch import iter_batches


def txn_batch(
    pid: int,
    epoch: int,
    seq: int,
    count: int = 1,
    *,
    transactional: bool = True,
    key: bytes | None = None,
    tag: str = "",
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i in range(count):
        value = f"{pid}:{seq + i}:{tag}".encode()
        assert builder.append(i, 1_000 + i, key, value, []) is not None
    return bytes(builder.build())


class Writer:
    """A leader's append path without the replication core."""

    def __init__(self, log: Log, state: ProducerStateManager | None = None) -> None:
        self.log = log
        self.state = state or ProducerStateManager(log.dir)
        self.seq: dict[int, int] = {}

    def _index(self, txn: CompletedTxn, lso: int) -> None:
        self.log.append_aborted_txn(txn.producer_id, txn.first_offset, txn.last_offset, lso)

    def _append(self, records: bytes, origin: AppendOrigin) -> int:
        (header,) = list(iter_batches(records))
        info = self.log.append_as_leader(records, 0, origin=origin)
        self.state.apply(records, [header._replace(base_offset=info.first_offset)], self._index)
        return info.first_offset

    def data(self, pid: int, count: int = 1, *, key: bytes | None = None, tag: str = "") -> int:
        seq = self.seq.get(pid, 0)
        self.seq[pid] = seq + count
        return self._append(txn_batch(pid, 0, seq, count, key=key, tag=tag), AppendOrigin.CLIENT)

    def marker(self, pid: int, commit: bool, coordinator_epoch: int = 0) -> int:
        batch = build_control_batch(pid, 0, commit, coordinator_epoch, 1_000)
        return self._append(batch, AppendOrigin.COORDINATOR)

    def entries(self) -> list[tuple[int, int, int, int]]:
        return [
            (e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
            for s in self.log.segments
            for e in s.txn_index.entries
        ]
