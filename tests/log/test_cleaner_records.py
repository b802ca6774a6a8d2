"""The cleaner's record scan: the compiled twin (_cleaner_scan.pyx) answers as the Python one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrlab.broker.log import cleaner_records
from isrlab.broker.log.cleaner_records import (
    PyOffsetMap,
    any_key_tombstoned,
    encode_varint,
    py_filter_records,
    py_first_keyless,
    py_map_records,
    rebase_timestamps,
)
from isrlab.broker.log.record_batch import HEADER_SIZE
from tests.log.compaction import keyed_batch

ROOT = Path(__file__).resolve().parents[2]
native = pytest.importorskip("isrlab.broker.log._cleaner_scan")


def test_the_scan_is_built_from_the_current_source() -> None:
    assert cleaner_records.NATIVE, "the cleaner's record scan is not built: run `make build`"
    src = ROOT / "broker/log/_cleaner_scan.pyx"
    built = list((ROOT / "broker/log").glob("_cleaner_scan.*.so"))
    assert built and max(p.stat().st_mtime for p in built) >= src.stat().st_mtime, (
        "broker/log/_cleaner_scan.pyx changed since it was compiled: run `make build`"
    )


records_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=3)),
        st.one_of(st.none(), st.binary(max_size=200)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(records_strategy, min_size=1, max_size=4),
    drop=st.booleans(),
    base=st.integers(0, 1 << 40),
)
def test_native_and_python_scans_agree(
    batches: list[list[tuple[bytes | None, bytes | None]]], drop: bool, base: int
) -> None:
    encoded = [keyed_batch(records) for records in batches]
    py_map, c_map = PyOffsetMap(), native.OffsetMap()
    for i, batch in enumerate(encoded):
        args = (batch, HEADER_SIZE, len(batch), base + 100 * i)
        assert py_map_records(*args, py_map) == native.map_records(*args, c_map)
    assert len(py_map) == len(c_map)
    keys = {key for records in batches for key, _ in records if key is not None}
    for key in keys:
        assert py_map.get(key) == c_map.get(key)
        assert py_map.is_tombstone(key) == c_map.is_tombstone(key)
    for i, batch in enumerate(encoded):
        args = (batch, HEADER_SIZE, len(batch), base + 100 * i)
        assert py_filter_records(*args, py_map, drop) == native.filter_records(*args, c_map, drop)
        assert any_key_tombstoned(batch, HEADER_SIZE, len(batch), py_map) == any_key_tombstoned(
            batch, HEADER_SIZE, len(batch), c_map
        )
        assert py_first_keyless(batch, HEADER_SIZE, len(batch)) == native.first_keyless(
            batch, HEADER_SIZE, len(batch)
        )


def test_filtering_keeps_the_latest_record_of_each_key_byte_for_byte() -> None:
    for offsets_map, map_fn, filter_fn in (
        (PyOffsetMap(), py_map_records, py_filter_records),
        (native.OffsetMap(), native.map_records, native.filter_records),
    ):
        batch = keyed_batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (None, b"x"), (b"b", None)])
        assert map_fn(batch, HEADER_SIZE, len(batch), 10, offsets_map) == 5
        assert offsets_map.get(b"a") == 12 and offsets_map.is_tombstone(b"b")
        kept, count, tombstones = filter_fn(batch, HEADER_SIZE, len(batch), 10, offsets_map, False)
        whole = keyed_batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (None, b"x"), (b"b", None)])
        assert (count, tombstones) == (3, 1)
        assert kept in whole  # the kept records are the original bytes, in one run here
        _, count, tombstones = filter_fn(batch, HEADER_SIZE, len(batch), 10, offsets_map, True)
        assert (count, tombstones) == (2, 0)


@pytest.mark.parametrize(
    "bad",
    [
        encode_varint(200) + b"\x00",  # a record longer than the batch
        encode_varint(7) + b"\x00\x00\x00" + encode_varint(-5) + b"\x00\x00\x00",  # key length -5
        b"\xff" * 11,  # a varint that never ends
    ],
)
def test_malformed_records_are_a_value_error_in_both(bad: bytes) -> None:
    for offsets_map, map_fn, filter_fn in (
        (PyOffsetMap(), py_map_records, py_filter_records),
        (native.OffsetMap(), native.map_records, native.filter_records),
    ):
        with pytest.raises(ValueError):
            map_fn(bad, 0, len(bad), 0, offsets_map)
        with pytest.raises(ValueError):
            filter_fn(bad, 0, len(bad), 0, offsets_map, False)


def test_rebased_timestamps_keep_every_record_timestamp() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    batch = keyed_batch([(b"a", b"1"), (b"b", None), (b"c", b"3")], timestamp=5_000)
    records = batch[HEADER_SIZE:]
    rebased = rebase_timestamps(records, 5_000, 1_000_000_000)
    assert rebased != records
    assert rebase_timestamps(rebased, 1_000_000_000, 5_000) == records
    for value in (0, 1, -1, 63, -64, 1 << 40, -(1 << 62)):
        encoded = encode_varint(value)
        assert cleaner_records._varint(encoded, 0) == (value, len(encoded))
    assert [r.timestamp for r in DefaultRecordBatch(batch)] == [5_000, 5_001, 5_002]


def _segment_bytes(
    batches: list[tuple[list[tuple[bytes | None, bytes | None]], int, int]],
) -> bytes:
    """Batches back to back with offsets assigned, as in a segment: (records, producer id,
    compression) each; a compression of -1 makes a control batch."""
    import struct

    from crc32c import crc32c

    out = bytearray()
    offset = 0
    for records, producer_id, compression in batches:
        batch = bytearray(
            keyed_batch(records, producer_id=producer_id, compression=max(compression, 0))
        )
        struct.pack_into(">q", batch, 0, offset)
        if compression < 0:
            attributes = struct.unpack_from(">h", batch, 21)[0] | 0x30
            struct.pack_into(">h", batch, 21, attributes)
            struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
        out += batch
        offset += len(records) + 2  # gaps between batches, as after a cleaning
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.tuples(
                    st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])),
                    st.one_of(st.none(), st.binary(max_size=20)),
                ),
                min_size=1,
                max_size=8,
            ),
            st.sampled_from([-1, 3, 4]),
            st.sampled_from([0, 0, 0, 1, -1]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 10),
    st.integers(1, 4000),
)
def test_native_and_python_batch_passes_agree(
    batches: list[tuple[list[tuple[bytes | None, bytes | None]], int, int]],
    cut: int,
    chunk: int,
) -> None:
    from crc32c import crc32c

    data = _segment_bytes(batches)
    data = data[: max(len(data) - cut, 0)] if cut > 5 else data  # sometimes a torn tail
    data = data[:chunk] if chunk < len(data) else data
    py_map, c_map = PyOffsetMap(), native.OffsetMap()
    py_last: dict[int, int] = {}
    c_last: dict[int, int] = {}
    assert cleaner_records.py_map_batches(data, py_map, py_last) == native.map_batches(
        data, c_map, c_last
    )
    assert py_last == c_last and len(py_map) == len(c_map)
    for now in (0, 1 << 62):
        assert cleaner_records.py_filter_batches(
            data, py_map, py_last, now, crc32c
        ) == native.filter_batches(data, c_map, c_last, now, crc32c)
