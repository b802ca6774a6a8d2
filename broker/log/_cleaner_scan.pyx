# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The log cleaner's record scan in C: ``OffsetMap``, ``map_records``, ``filter_records`` and
``first_keyless`` of ``cleaner_records.py``, with the same arguments, answers and errors
(tests/log/test_cleaner_records.py holds the two to each other). See cleaner_records.py for the
record format.

The offset map is an open-addressing table of (64-bit key hash, offset << 1 | tombstone), as
Kafka's SkimpyOffsetMap keeps an MD5 of each key: the hash is Python's hash of the key bytes
(SipHash, seeded per process), so the scan allocates nothing per record."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset


cdef extern from "Python.h":
    Py_ssize_t _Py_HashBytes(const void* src, Py_ssize_t length)


cdef inline uint64_t _slot_hash(const unsigned char* key, Py_ssize_t length):
    cdef uint64_t h = <uint64_t>_Py_HashBytes(key, length)
    return h if h != 0 else 1  # 0 marks an empty slot


cdef class OffsetMap:
    cdef uint64_t* _hashes
    cdef int64_t* _values  # offset << 1 | tombstone
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _size

    def __cinit__(self):
        self._capacity = 0
        self._size = 0
        self._hashes = NULL
        self._values = NULL
        self._allocate(1 << 12)

    def __dealloc__(self):
        PyMem_Free(self._hashes)
        PyMem_Free(self._values)

    cdef int _allocate(self, Py_ssize_t capacity) except -1:
        self._hashes = <uint64_t*>PyMem_Malloc(capacity * sizeof(uint64_t))
        self._values = <int64_t*>PyMem_Malloc(capacity * sizeof(int64_t))
        if self._hashes == NULL or self._values == NULL:
            raise MemoryError()
        memset(self._hashes, 0, capacity * sizeof(uint64_t))
        self._capacity = capacity
        return 0

    cdef int _grow(self) except -1:
        cdef uint64_t* old_hashes = self._hashes
        cdef int64_t* old_values = self._values
        cdef Py_ssize_t old_capacity = self._capacity
        cdef Py_ssize_t i
        self._allocate(old_capacity * 2)
        self._size = 0
        for i in range(old_capacity):
            if old_hashes[i] != 0:
                self._put(old_hashes[i], old_values[i])
        PyMem_Free(old_hashes)
        PyMem_Free(old_values)
        return 0

    cdef inline Py_ssize_t _slot(self, uint64_t h) noexcept:
        cdef Py_ssize_t mask = self._capacity - 1
        cdef Py_ssize_t i = <Py_ssize_t>(h & mask)
        while self._hashes[i] != 0 and self._hashes[i] != h:
            i = (i + 1) & mask
        return i

    cdef inline int _put(self, uint64_t h, int64_t value) except -1:
        cdef Py_ssize_t i
        if 2 * (self._size + 1) > self._capacity:
            self._grow()
        i = self._slot(h)
        if self._hashes[i] == 0:
            self._hashes[i] = h
            self._size += 1
        self._values[i] = value
        return 0

    cdef inline int64_t _get(self, uint64_t h) noexcept:
        """The stored value, or -1."""
        cdef Py_ssize_t i = self._slot(h)
        return self._values[i] if self._hashes[i] != 0 else -1

    def __len__(self):
        return self._size

    def put(self, bytes key, int64_t offset, bint tombstone):
        self._put(_slot_hash(<const unsigned char*>PyBytes_AS_STRING(key), len(key)), (offset << 1) | tombstone)

    def get(self, bytes key):
        cdef int64_t value = self._get(_slot_hash(<const unsigned char*>PyBytes_AS_STRING(key), len(key)))
        return None if value < 0 else value >> 1

    def is_tombstone(self, bytes key):
        cdef int64_t value = self._get(_slot_hash(<const unsigned char*>PyBytes_AS_STRING(key), len(key)))
        return value >= 0 and (value & 1) == 1


cdef inline int64_t _varint(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end) except? -0x7FFFFFFFFFFFFFFF:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end:
            raise ValueError(f"record at position {pos[0]} is cut short")
        b = buf[pos[0]]
        pos[0] += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes before position {pos[0]}")
    return <int64_t>((result >> 1) ^ (-(result & 1)))


cdef struct Record:
    Py_ssize_t end
    int64_t offset_delta
    Py_ssize_t key_start
    int64_t key_length
    bint null_value


cdef int _record(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, Record* out) except -1:
    cdef Py_ssize_t start = pos
    cdef Py_ssize_t p = pos
    cdef int64_t length = _varint(buf, &p, end)
    cdef Py_ssize_t record_end = p + length
    cdef int64_t value_length
    if length < 6 or record_end > end:
        raise ValueError(f"record at position {start} has length {length} past the batch end")
    p += 1  # attributes
    _varint(buf, &p, record_end)  # timestampDelta
    out.offset_delta = _varint(buf, &p, record_end)
    out.key_length = _varint(buf, &p, record_end)
    out.key_start = p
    if out.key_length >= 0:
        p += out.key_length
    elif out.key_length != -1:
        raise ValueError(f"record at position {start} has key length {out.key_length}")
    value_length = _varint(buf, &p, record_end)
    if p > record_end or value_length < -1 or p + (value_length if value_length > 0 else 0) > record_end:
        raise ValueError(f"record at position {start} overruns its length {length}")
    out.null_value = value_length < 0
    out.end = record_end
    return 0


def map_records(bytes data, Py_ssize_t start, Py_ssize_t end, int64_t base_offset, OffsetMap offsets):
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = start
    cdef Py_ssize_t count = 0
    cdef Record record
    if start < 0 or end > len(data):
        raise ValueError("records outside the buffer")
    while pos < end:
        _record(buf, pos, end, &record)
        if record.key_length >= 0:
            offsets._put(
                _slot_hash(buf + record.key_start, record.key_length),
                ((base_offset + record.offset_delta) << 1) | record.null_value,
            )
        count += 1
        pos = record.end
    return count


def filter_records(bytes data, Py_ssize_t start, Py_ssize_t end, int64_t base_offset, OffsetMap offsets, bint drop_tombstones):
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = start
    cdef Py_ssize_t run_start = start
    cdef Py_ssize_t kept_count = 0
    cdef Py_ssize_t tombstones = 0
    cdef Py_ssize_t written = 0
    cdef Record record
    cdef int64_t latest
    cdef bint keep
    cdef bytes out
    cdef char* target
    if start < 0 or end > len(data):
        raise ValueError("records outside the buffer")
    out = PyBytes_FromStringAndSize(NULL, end - start)
    target = PyBytes_AS_STRING(out)
    while pos < end:
        _record(buf, pos, end, &record)
        keep = True
        if record.key_length >= 0:
            latest = offsets._get(_slot_hash(buf + record.key_start, record.key_length))
            if (latest >= 0 and (latest >> 1) > base_offset + record.offset_delta) or (
                record.null_value and drop_tombstones
            ):
                keep = False
        if keep:
            kept_count += 1
            if record.null_value:
                tombstones += 1
        else:
            if run_start < pos:
                memcpy(target + written, buf + run_start, pos - run_start)
                written += pos - run_start
            run_start = record.end
        pos = record.end
    if run_start < end:
        memcpy(target + written, buf + run_start, end - run_start)
        written += end - run_start
    if written == end - start:
        return out, kept_count, tombstones
    return out[:written], kept_count, tombstones


def first_keyless(bytes data, Py_ssize_t start, Py_ssize_t end):
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = start
    cdef Record record
    if start < 0 or end > len(data):
        raise ValueError("records outside the buffer")
    while pos < end:
        _record(buf, pos, end, &record)
        if record.key_length < 0:
            return record.offset_delta
        pos = record.end
    return -1


cdef inline int64_t _be64(const unsigned char* p) noexcept:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return <int64_t>v


cdef inline int32_t _be32(const unsigned char* p) noexcept:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


def map_batches(bytes data, OffsetMap offsets, dict last_batches):
    """The offset-map pass over the whole batches at the start of ``data`` (a segment read):
    maps the records of every uncompressed data batch and notes the last offset of each
    producer id's last batch. Stops before a batch that is cut short, malformed or compressed
    (the caller takes it); returns (bytes consumed, records mapped)."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = len(data)
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t size, records_end, rpos
    cdef Py_ssize_t mapped = 0
    cdef int64_t base_offset, producer_id
    cdef int32_t batch_length, last_delta, count
    cdef int attributes
    cdef Record record
    while pos + 61 <= end:
        batch_length = _be32(buf + pos + 8)
        size = <Py_ssize_t>batch_length + 12
        if batch_length < 49 or pos + size > end or buf[pos + 16] != 2:
            break
        attributes = (buf[pos + 21] << 8) | buf[pos + 22]
        last_delta = _be32(buf + pos + 23)
        count = _be32(buf + pos + 57)
        if count < 1 or last_delta < 0 or (attributes & 0x07) != 0:
            break
        base_offset = _be64(buf + pos)
        producer_id = _be64(buf + pos + 43)
        if producer_id >= 0:
            last_batches[producer_id] = base_offset + last_delta
        if (attributes & 0x20) == 0:
            rpos = pos + 61
            records_end = pos + size
            try:
                while rpos < records_end:
                    _record(buf, rpos, records_end, &record)
                    if record.key_length >= 0:
                        offsets._put(
                            _slot_hash(buf + record.key_start, record.key_length),
                            ((base_offset + record.offset_delta) << 1) | record.null_value,
                        )
                    mapped += 1
                    rpos = record.end
            except ValueError:
                pass  # malformed records: the rewrite keeps this batch whole
        pos += size
    return pos, mapped


cdef inline void _put_be32(unsigned char* p, uint32_t v) noexcept:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


def filter_batches(bytes data, OffsetMap offsets, dict last_batches, int64_t now_ms, object crc):
    """The rewrite pass over the whole batches at the start of ``data`` (a segment read): see
    ``cleaner_records.py_filter_batches``."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = len(data)
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t size, rpos, records_end, run_start, written = 0, batch_out
    cdef Py_ssize_t records_read = 0, records_kept = 0, rewritten = 0
    cdef int64_t base_offset, producer_id, base_timestamp, latest, last_offset
    cdef int32_t batch_length, last_delta, count, kept, tombstones
    cdef int attributes
    cdef bint drop_tombstones, keep, tombstoned
    cdef uint32_t stored_crc
    cdef Record record
    cdef bytes out = PyBytes_FromStringAndSize(NULL, end)
    cdef unsigned char* target = <unsigned char*>PyBytes_AS_STRING(out)
    cdef object view = memoryview(data)
    cdef object out_view = memoryview(out)
    while pos + 61 <= end:
        batch_length = _be32(buf + pos + 8)
        size = <Py_ssize_t>batch_length + 12
        if batch_length < 49 or pos + size > end or buf[pos + 16] != 2:
            break
        attributes = (buf[pos + 21] << 8) | buf[pos + 22]
        last_delta = _be32(buf + pos + 23)
        count = _be32(buf + pos + 57)
        if count < 1 or last_delta < 0 or (attributes & 0x27) != 0:
            break  # compressed or control: the caller's
        stored_crc = <uint32_t>_be32(buf + pos + 17)
        if <uint32_t>crc(view[pos + 21 : pos + size]) != stored_crc:
            break
        base_offset = _be64(buf + pos)
        base_timestamp = _be64(buf + pos + 27)
        producer_id = _be64(buf + pos + 43)
        last_offset = base_offset + last_delta
        drop_tombstones = (attributes & 0x40) != 0 and now_ms >= base_timestamp
        # Filter into the output after a 61-byte gap for the header.
        batch_out = written
        written += 61
        kept = 0
        tombstones = 0
        tombstoned = False
        rpos = pos + 61
        records_end = pos + size
        run_start = rpos
        try:
            while rpos < records_end:
                _record(buf, rpos, records_end, &record)
                keep = True
                if record.key_length >= 0:
                    latest = offsets._get(_slot_hash(buf + record.key_start, record.key_length))
                    if latest >= 0 and (latest & 1):
                        tombstoned = True
                    if (latest >= 0 and (latest >> 1) > base_offset + record.offset_delta) or (
                        record.null_value and drop_tombstones
                    ):
                        keep = False
                if keep:
                    kept += 1
                    if record.null_value:
                        tombstones += 1
                else:
                    if run_start < rpos:
                        memcpy(target + written, buf + run_start, rpos - run_start)
                        written += rpos - run_start
                    run_start = record.end
                rpos = record.end
        except ValueError:
            written = batch_out
            break  # malformed records: the caller keeps the batch whole
        if tombstones > 0 and (attributes & 0x40) == 0:
            written = batch_out
            break  # a first delete horizon to stamp: the caller's
        if run_start < records_end:
            memcpy(target + written, buf + run_start, records_end - run_start)
            written += records_end - run_start
        records_read += count
        if kept == count:
            memcpy(target + batch_out, buf + pos, size)
            written = batch_out + size
            records_kept += count
        elif kept == 0:
            written = batch_out
            if producer_id >= 0 and last_batches.get(producer_id, last_offset) == last_offset and not tombstoned:
                # The producer's last batch, kept whole (see cleaner.py).
                memcpy(target + batch_out, buf + pos, size)
                written = batch_out + size
                records_kept += count
        else:
            memcpy(target + batch_out, buf + pos, 61)
            _put_be32(target + batch_out + 8, <uint32_t>(written - batch_out - 12))
            _put_be32(target + batch_out + 57, <uint32_t>kept)
            _put_be32(target + batch_out + 17, <uint32_t>crc(out_view[batch_out + 21 : written]))
            records_kept += kept
            rewritten += 1
        pos += size
    view.release()
    out_view.release()
    return pos, out[:written], records_read, records_kept, rewritten
