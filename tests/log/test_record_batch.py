import struct

import pytest

from isrlab.broker.log.errors import CorruptRecordError, InvalidRecordError
from isrlab.broker.log.record_batch import (
    HEADER_SIZE,
    check_crc,
    iter_batches,
    parse_header,
    stamp,
    validate,
)
from tests.log.batches import make_batch


def test_header_fields_of_a_kafka_python_batch() -> None:
    data = make_batch(5, timestamp=7_000)
    header = parse_header(data)
    assert header.size == len(data)
    assert header.magic == 2
    assert header.records_count == 5
    assert header.last_offset_delta == 4
    assert header.base_timestamp == 7_000
    assert header.max_timestamp == 7_004
    assert header.last_offset == 4 and header.next_offset == 5
    assert not header.is_transactional and not header.is_control
    assert header.timestamp_type == 0
    assert HEADER_SIZE == 61


def test_transactional_flag_and_sequences() -> None:
    header = parse_header(make_batch(4, producer_id=9, transactional=True))
    assert header.is_transactional
    assert header.producer_id == 9
    assert header.base_sequence == 0 and header.last_sequence == 3


def test_iter_batches_positions() -> None:
    first, second = make_batch(2, tag=1), make_batch(3, tag=2)
    headers = list(iter_batches(first + second))
    assert [(h.position, h.size) for h in headers] == [(0, len(first)), (len(first), len(second))]


def test_validate_accepts_good_batches() -> None:
    data = make_batch(2) + make_batch(3)
    assert [h.records_count for h in validate(data)] == [2, 3]


def test_bad_crc_is_corrupt() -> None:
    data = bytearray(make_batch(3))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        validate(bytes(data))
    assert info.value.code == 2


def test_bad_magic_is_invalid() -> None:
    data = bytearray(make_batch(3))
    data[16] = 1
    with pytest.raises(InvalidRecordError, match="magic") as info:
        validate(bytes(data))
    assert info.value.code == 87


def test_truncated_batch_is_corrupt() -> None:
    data = make_batch(3)
    with pytest.raises(CorruptRecordError, match="torn"):
        validate(data[:-5])
    with pytest.raises(CorruptRecordError, match="torn"):
        validate(data + data[:7])


def test_batch_length_below_header_is_invalid() -> None:
    data = bytearray(make_batch(3))
    struct.pack_into(">i", data, 8, 20)
    with pytest.raises(InvalidRecordError, match="batchLength"):
        validate(bytes(data))


def test_batch_length_past_buffer_is_torn() -> None:
    data = bytearray(make_batch(3))
    struct.pack_into(">i", data, 8, len(data))
    with pytest.raises(CorruptRecordError, match="torn"):
        validate(bytes(data))


def test_empty_and_zero_records_are_invalid() -> None:
    with pytest.raises(InvalidRecordError, match="empty"):
        validate(b"")
    data = bytearray(make_batch(1))
    struct.pack_into(">i", data, 57, 0)
    with pytest.raises(InvalidRecordError, match="recordsCount"):
        validate(bytes(data))


def test_inconsistent_offset_delta_rejected_only_when_strict() -> None:
    data = bytearray(make_batch(3))
    struct.pack_into(">i", data, 23, 5)  # lastOffsetDelta is inside the CRC: recompute it
    from crc32c import crc32c

    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    with pytest.raises(InvalidRecordError, match="inconsistent"):
        validate(bytes(data))
    assert validate(bytes(data), strict_offsets=False)[0].last_offset == 5


def test_stamp_rewrites_offset_and_epoch_and_keeps_crc_valid() -> None:
    data = bytearray(make_batch(2) + make_batch(3))
    headers = validate(data)
    stamp(data, headers[1].position, 1_000_000, 7)
    restamped = validate(data)[1]
    assert restamped.base_offset == 1_000_000
    assert restamped.partition_leader_epoch == 7
    check_crc(data, restamped)


def test_at_position_moves_the_header_and_keeps_every_field() -> None:
    from isrlab.broker.log.record_batch import BatchHeader, at_position

    header = BatchHeader(*range(1, 15))
    moved = at_position(header, 99)
    assert moved == header._replace(position=99) and moved.position == 99
    assert moved[1:] == header[1:]
