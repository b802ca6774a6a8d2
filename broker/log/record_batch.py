"""RecordBatch v2 headers: parsing, validation and offset stamping, without decoding records.

A batch on disk and on the wire is a 61-byte header followed by the (possibly compressed)
records, all big-endian::

    offset  size  field
         0     8  baseOffset            i64   rewritten by the broker (outside the CRC)
         8     4  batchLength           i32   bytes after this field: total size = batchLength + 12
        12     4  partitionLeaderEpoch  i32   rewritten by the broker (outside the CRC)
        16     1  magic                 i8    must be 2
        17     4  crc                   u32   CRC-32C of bytes 21 (attributes) .. end of batch
        21     2  attributes            i16   bits 0-2 compression, 3 timestamp type,
                                              4 transactional, 5 control
        23     4  lastOffsetDelta       i32
        27     8  baseTimestamp         i64
        35     8  maxTimestamp          i64
        43     8  producerId            i64
        51     2  producerEpoch         i16
        53     4  baseSequence          i32
        57     4  recordsCount          i32
        61        records

The broker stores batches exactly as produced and only rewrites baseOffset and
partitionLeaderEpoch, which is why both sit outside the CRC. This module is the hot path of
produce and recovery: it touches only headers (``struct``) and checksums (``crc32c``);
decoding individual records is left to kafka-python's ``DefaultRecordBatch`` (dump-log,
timestamp search).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from isrlab.broker.log.errors import CorruptRecordError, InvalidRecordError

#: Anything the header parser reads from: wire buffers, file contents, a mapped segment.
ByteBuffer = bytes | bytearray | memoryview | mmap.mmap

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
#: baseOffset + batchLength: the prefix that tells where the next batch starts.
LOG_OVERHEAD = 12
#: Smallest legal batchLength: the header without the LOG_OVERHEAD prefix.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
MAGIC_V2 = 2
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
#: baseOffset at 0 (i64) and partitionLeaderEpoch at 12 (i32); batchLength is between them.
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """One batch's header fields plus where the batch sits in its buffer or file.

    A named tuple (immutable, hashable) rather than a frozen dataclass: a frozen dataclass
    costs about ten times as much to build, and every append, read and recovery scan builds
    these."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def end_position(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression_type(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """CREATE_TIME (0) or LOG_APPEND_TIME (1)."""
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        # Sequences wrap at Int32.MAX like Kafka's DefaultRecordBatch.incrementSequence.
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def at_position(header: BatchHeader, position: int) -> BatchHeader:
    """``header`` at another position (``header._replace(position=...)``, faster)."""
    return BatchHeader(position, *header[1:])


def parse_header(buf: ByteBuffer, position: int = 0) -> BatchHeader:
    """Parse the header at ``position``; the caller guarantees HEADER_SIZE bytes are there."""
    return BatchHeader(position, *HEADER.unpack_from(buf, position))


def check_header(buf: ByteBuffer, position: int, end: int) -> BatchHeader:
    """Parse and check the structure of the batch at ``position`` in ``buf[:end]`` (not its CRC).

    Raises CorruptRecordError if the batch is cut short, InvalidRecordError if the header is
    malformed (batchLength too small, magic not 2, no records).
    """
    remaining = end - position
    if remaining >= HEADER_SIZE:
        # the whole header is there: one unpack, then the same checks in the same order
        header = BatchHeader(position, *HEADER.unpack_from(buf, position))
        batch_length = header.batch_length
        if batch_length < MIN_BATCH_LENGTH or header.magic != MAGIC_V2:
            _check_prefix(buf, position, remaining)  # raises, with its message
        if batch_length + LOG_OVERHEAD > remaining:
            raise CorruptRecordError(
                f"torn batch at position {position}: batchLength {batch_length} needs "
                f"{batch_length + LOG_OVERHEAD} bytes, only {remaining} present"
            )
        _check_counts(header, position)
        return header
    # Fewer bytes than a header: the prefix check raises (a legal batchLength needs more).
    _check_prefix(buf, position, remaining)
    raise AssertionError(f"a batch header cut to {remaining} bytes passed the prefix check")


def _check_prefix(buf: ByteBuffer, position: int, remaining: int) -> None:
    """`check_header`'s checks of the length prefix and magic of a batch with ``remaining``
    bytes left: raises for a bad one (a header cut short always raises here)."""
    if remaining < LOG_OVERHEAD:
        raise CorruptRecordError(
            f"torn batch at position {position}: {remaining} bytes left, "
            f"fewer than the {LOG_OVERHEAD}-byte offset and length prefix"
        )
    batch_length = struct.unpack_from(">i", buf, position + 8)[0]
    if batch_length < MIN_BATCH_LENGTH:
        raise InvalidRecordError(
            f"batch at position {position} has batchLength {batch_length}, "
            f"less than the {MIN_BATCH_LENGTH}-byte v2 header"
        )
    if remaining > MAGIC_OFFSET:
        magic = struct.unpack_from(">b", buf, position + MAGIC_OFFSET)[0]
        if magic != MAGIC_V2:
            raise InvalidRecordError(
                f"batch at position {position} has magic {magic}; only RecordBatch v2 "
                "(magic 2, Kafka >= 0.11 clients) is supported"
            )
    if batch_length + LOG_OVERHEAD > remaining:
        raise CorruptRecordError(
            f"torn batch at position {position}: batchLength {batch_length} needs "
            f"{batch_length + LOG_OVERHEAD} bytes, only {remaining} present"
        )


def _check_counts(header: BatchHeader, position: int) -> None:
    if header.records_count < 1:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset} (position {position}) has recordsCount "
            f"{header.records_count}; a batch must hold at least one record"
        )
    if header.last_offset_delta < 0:
        raise InvalidRecordError(
            f"batch at position {position} has negative lastOffsetDelta {header.last_offset_delta}"
        )


def compute_crc(buf: ByteBuffer, header: BatchHeader) -> int:
    """CRC-32C of the batch from its attributes to its end, as stored in the crc field."""
    # Release the views at once: a mapped segment cannot be closed while views are exported.
    with (
        memoryview(buf) as whole,
        whole[header.position + ATTRIBUTES_OFFSET : header.end_position] as view,
    ):
        return crc32c(view)


def check_crc(buf: ByteBuffer, header: BatchHeader) -> None:
    """Raise CorruptRecordError if the batch's stored CRC does not match its bytes."""
    actual = compute_crc(buf, header)
    if actual != header.crc:
        raise _crc_mismatch(header, actual)


def _crc_mismatch(header: BatchHeader, actual: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"batch at offset {header.base_offset} (position {header.position}) is corrupt: "
        f"stored CRC {header.crc} != computed {actual}"
    )


def iter_batches(buf: ByteBuffer, start: int = 0) -> Iterator[BatchHeader]:
    """Yield the header of every batch in ``buf`` from ``start``, checking structure only.

    Raises as ``check_header`` does when a batch is malformed or cut short; CRCs are not
    verified (use ``validate`` or ``check_crc``).
    """
    end = len(buf)
    position = start
    while position < end:
        header = check_header(buf, position, end)
        yield header
        position = header.end_position


def validate(buf: ByteBuffer, *, strict_offsets: bool = True) -> list[BatchHeader]:
    """Fully validate a buffer of batches (a produce or fetch payload) and return their headers.

    Checks: at least one batch, magic 2, batchLength consistent with the buffer, CRC-32C, at
    least one record. With ``strict_offsets`` (client produce, as Kafka's LogValidator does) the
    offset range must equal the record count, since only compaction leaves gaps.
    """
    end = len(buf)
    if end == 0:
        raise InvalidRecordError("no record batches: the records field is empty")
    headers: list[BatchHeader] = []
    position = 0
    # (`iter_batches` and `check_crc` inlined: this is every produce's path)
    with memoryview(buf) as whole:
        while position < end:
            header = check_header(buf, position, end)
            batch_end = position + header.batch_length + LOG_OVERHEAD
            with whole[position + ATTRIBUTES_OFFSET : batch_end] as view:
                actual = crc32c(view)
            if actual != header.crc:
                raise _crc_mismatch(header, actual)
            if strict_offsets and header.last_offset_delta + 1 != header.records_count:
                raise InvalidRecordError(
                    f"batch at position {position} is inconsistent: lastOffsetDelta "
                    f"{header.last_offset_delta} but recordsCount {header.records_count}"
                )
            headers.append(header)
            position = batch_end
    return headers


def stamp(
    buf: bytearray | memoryview, position: int, base_offset: int, partition_leader_epoch: int
) -> None:
    """Rewrite the batch at ``position`` in place with a new baseOffset and partitionLeaderEpoch.

    Both fields are outside the CRC, so the batch stays valid.
    """
    _BASE_OFFSET.pack_into(buf, position, base_offset)
    _LEADER_EPOCH.pack_into(buf, position + 12, partition_leader_epoch)
