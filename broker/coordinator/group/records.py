"""The records of ``__consumer_offsets``, byte for byte as Kafka 3.x writes them.

Every record's key and value start with a big-endian int16 version; the fields follow in the
order of Kafka's message definitions (group-coordinator's ``OffsetCommitKey.json``,
``OffsetCommitValue.json``, ``GroupMetadataKey.json``, ``GroupMetadataValue.json``)::

    key   v0/v1  OffsetCommitKey     group string, topic string, partition int32
    key   v2     GroupMetadataKey    group string
    value        OffsetCommitValue   offset int64, leaderEpoch int32 (v3+), metadata string,
                                     commitTimestamp int64, expireTimestamp int64 (v1 only)
    value        GroupMetadataValue  protocolType string, generation int32,
                                     protocol string?, leader string?,
                                     currentStateTimestamp int64 (v2+),
                                     members [memberId string, groupInstanceId string? (v3+),
                                              clientId string, clientHost string,
                                              rebalanceTimeout int32 (v1+), sessionTimeout int32,
                                              subscription bytes, assignment bytes]

Versions 0-3 of both values are "classic": string = int16 length + UTF-8 (-1 = null),
bytes = int32 length, array = int32 count. Version 4 is flexible (KIP-482): compact strings,
bytes and arrays (unsigned varint length + 1, 0 = null) and a tagged-field section closing
every struct (the value and each member), whose unknown tags a reader skips.

What Kafka 3.x writes, and so what this module writes by default: offset keys at version 1,
group keys at 2, offset values at 3 (at 1 when the commit carries an expire timestamp, the
OffsetCommit v1 retention of old clients), group values at 3. All versions 0-4 are read. A
record whose value is null is a tombstone: the offset or the group is deleted.

The module is pure (bytes in, dataclasses out). ``build_batch`` and ``iter_batch_records`` wrap
these records in RecordBatch v2 with kafka-python's builder and reader.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from isrlab.broker.log.errors import LogError
from isrlab.broker.log.record_batch import check_crc, iter_batches

#: The key version Kafka 3.x writes for offset commits (0 and 1 share one layout).
OFFSET_COMMIT_KEY_VERSION = 1
#: The key version of group metadata.
GROUP_METADATA_KEY_VERSION = 2
#: Value versions this module reads (and can write, for tests and downgrades).
OFFSET_VALUE_VERSIONS = (0, 1, 2, 3, 4)
GROUP_VALUE_VERSIONS = (0, 1, 2, 3, 4)
#: The value versions Kafka 3.x writes (inter.broker.protocol.version >= 2.3).
OFFSET_VALUE_VERSION = 3
OFFSET_VALUE_VERSION_WITH_EXPIRE = 1
GROUP_VALUE_VERSION = 3
#: First flexible version of both values.
FLEXIBLE_VALUE_VERSION = 4
#: Kafka's limit for any string field (Short.MAX_VALUE bytes of UTF-8), flexible or not.
MAX_STRING_BYTES = 0x7FFF
#: What Kafka's DumpLogSegments knows as the consumer protocol (its assignments are decoded).
CONSUMER_PROTOCOL_TYPE = "consumer"

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """Bytes that are not a ``__consumer_offsets`` key or value, or a value that cannot be
    written (a string over 32767 bytes, an int out of its field's range)."""


class UnknownRecordVersionError(RecordFormatError):
    """A key or value version this broker does not know (e.g. the KIP-848 group records that
    Kafka 3.7+ writes with key versions 3 and up)."""

    def __init__(self, what: str, version: int) -> None:
        super().__init__(f"unknown {what} version {version}")
        self.what = what
        self.version = version


@dataclass(frozen=True)
class OffsetKey:
    """The key of a committed offset: key versions 0 and 1."""

    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    """The key of a group's metadata: key version 2."""

    group: str


@dataclass
class OffsetValue:
    """A committed offset. ``leader_epoch`` is -1 when unknown (and in versions 0-2);
    ``expire_timestamp`` exists only in version 1 (None when absent or -1)."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = 0
    expire_timestamp: int | None = None


@dataclass
class MemberRecord:
    """One member of a group value. ``subscription`` is the member's metadata for the group's
    chosen protocol; ``assignment`` what the leader gave it (both opaque to the broker)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass
class GroupValue:
    """A group's metadata after a rebalance (or its state change to Empty).

    ``current_state_timestamp`` is -1 when absent (versions 0-1). Version 0 has no rebalance
    timeout: it reads as the session timeout, as Kafka's loader does.
    """

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: list[MemberRecord]


# --------------------------------------------------------------------------- writing


class _Writer:
    def __init__(self, flexible: bool) -> None:
        self.buf = bytearray()
        self.flexible = flexible

    def int16(self, value: int, name: str) -> None:
        self._pack(_I16, value, name)

    def int32(self, value: int, name: str) -> None:
        self._pack(_I32, value, name)

    def int64(self, value: int, name: str) -> None:
        self._pack(_I64, value, name)

    def _pack(self, fmt: struct.Struct, value: int, name: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise RecordFormatError(f"{name} must be an int, not {type(value).__name__}")
        try:
            self.buf += fmt.pack(value)
        except struct.error:
            raise RecordFormatError(
                f"{name} {value} does not fit its {fmt.size * 8}-bit field"
            ) from None

    def uvarint(self, value: int) -> None:
        while value > 0x7F:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)

    def string(self, value: str | None, name: str, nullable: bool = False) -> None:
        if value is None:
            if not nullable:
                raise RecordFormatError(f"{name} cannot be null")
            if self.flexible:
                self.uvarint(0)
            else:
                self.buf += _I16.pack(-1)
            return
        if not isinstance(value, str):
            raise RecordFormatError(f"{name} must be a str, not {type(value).__name__}")
        data = value.encode("utf-8")
        if len(data) > MAX_STRING_BYTES:
            raise RecordFormatError(
                f"{name} is {len(data)} bytes of UTF-8, over Kafka's {MAX_STRING_BYTES}-byte limit"
            )
        if self.flexible:
            self.uvarint(len(data) + 1)
        else:
            self.buf += _I16.pack(len(data))
        self.buf += data

    def bytes_(self, value: bytes, name: str) -> None:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise RecordFormatError(f"{name} must be bytes, not {type(value).__name__}")
        data = bytes(value)
        if self.flexible:
            self.uvarint(len(data) + 1)
        else:
            self.int32(len(data), f"{name} length")
        self.buf += data

    def array_length(self, count: int, name: str) -> None:
        if self.flexible:
            self.uvarint(count + 1)
        else:
            self.int32(count, f"{name} count")

    def end_struct(self) -> None:
        if self.flexible:
            self.uvarint(0)  # no tagged fields


def encode_key(key: OffsetKey | GroupMetadataKey) -> bytes:
    """The record key: OffsetCommitKey v1 for an offset, GroupMetadataKey v2 for a group."""
    w = _Writer(flexible=False)
    if isinstance(key, OffsetKey):
        w.int16(OFFSET_COMMIT_KEY_VERSION, "version")
        w.string(key.group, "group")
        w.string(key.topic, "topic")
        w.int32(key.partition, "partition")
    elif isinstance(key, GroupMetadataKey):
        w.int16(GROUP_METADATA_KEY_VERSION, "version")
        w.string(key.group, "group")
    else:
        raise RecordFormatError(f"not a __consumer_offsets key: {key!r}")
    return bytes(w.buf)


def encode_offset_value(v: OffsetValue, *, version: int | None = None) -> bytes:
    """The value of an offset commit: version 3, or 1 when ``expire_timestamp`` is set, as
    Kafka 3.x writes. ``version`` forces another (0-4); fields the version lacks are dropped,
    as Kafka drops its ignorable fields."""
    if version is None:
        version = (
            OFFSET_VALUE_VERSION_WITH_EXPIRE
            if v.expire_timestamp is not None
            else OFFSET_VALUE_VERSION
        )
    if version not in OFFSET_VALUE_VERSIONS:
        raise UnknownRecordVersionError("offset commit value", version)
    w = _Writer(flexible=version >= FLEXIBLE_VALUE_VERSION)
    w.int16(version, "version")
    w.int64(v.offset, "offset")
    if version >= 3:
        w.int32(v.leader_epoch, "leaderEpoch")
    w.string(v.metadata, "metadata")
    w.int64(v.commit_timestamp, "commitTimestamp")
    if version == 1:
        expire = -1 if v.expire_timestamp is None else v.expire_timestamp
        w.int64(expire, "expireTimestamp")
    w.end_struct()
    return bytes(w.buf)


def encode_group_value(v: GroupValue, *, version: int = GROUP_VALUE_VERSION) -> bytes:
    """The value of a group's metadata: version 3 (static membership), as Kafka 3.x writes.
    ``version`` forces another (0-4); fields the version lacks are dropped."""
    if version not in GROUP_VALUE_VERSIONS:
        raise UnknownRecordVersionError("group metadata value", version)
    w = _Writer(flexible=version >= FLEXIBLE_VALUE_VERSION)
    w.int16(version, "version")
    w.string(v.protocol_type, "protocolType")
    w.int32(v.generation, "generation")
    w.string(v.protocol, "protocol", nullable=True)
    w.string(v.leader, "leader", nullable=True)
    if version >= 2:
        w.int64(v.current_state_timestamp, "currentStateTimestamp")
    w.array_length(len(v.members), "members")
    for m in v.members:
        w.string(m.member_id, "memberId")
        if version >= 3:
            w.string(m.group_instance_id, "groupInstanceId", nullable=True)
        w.string(m.client_id, "clientId")
        w.string(m.client_host, "clientHost")
        if version >= 1:
            w.int32(m.rebalance_timeout, "rebalanceTimeout")
        w.int32(m.session_timeout, "sessionTimeout")
        w.bytes_(m.subscription, "subscription")
        w.bytes_(m.assignment, "assignment")
        w.end_struct()
    w.end_struct()
    return bytes(w.buf)


# --------------------------------------------------------------------------- reading


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self.data = bytes(data)
        self.pos = 0
        self.what = what
        self.flexible = False

    def _take(self, n: int, name: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise RecordFormatError(
                f"{self.what}: {name} needs {n} bytes at position {self.pos}, "
                f"only {len(self.data) - self.pos} left"
            )
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def int16(self, name: str) -> int:
        return int(_I16.unpack(self._take(2, name))[0])

    def int32(self, name: str) -> int:
        return int(_I32.unpack(self._take(4, name))[0])

    def int64(self, name: str) -> int:
        return int(_I64.unpack(self._take(8, name))[0])

    def uvarint(self, name: str) -> int:
        value = 0
        for shift in range(0, 35, 7):
            byte = self._take(1, name)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > 0xFFFFFFFF:
                    break
                return value
        raise RecordFormatError(f"{self.what}: {name} is not a valid unsigned varint")

    def _length(self, name: str, classic: struct.Struct) -> int:
        """-1 for null, else the length, for strings/bytes/arrays in either encoding."""
        if self.flexible:
            return self.uvarint(f"{name} length") - 1
        length = int(classic.unpack(self._take(classic.size, f"{name} length"))[0])
        if length < -1:
            raise RecordFormatError(f"{self.what}: {name} has negative length {length}")
        return length

    def string(self, name: str, nullable: bool = False) -> str | None:
        length = self._length(name, _I16)
        if length == -1:
            if nullable:
                return None
            raise RecordFormatError(f"{self.what}: non-nullable field {name} was null")
        if length > MAX_STRING_BYTES:
            raise RecordFormatError(
                f"{self.what}: {name} is {length} bytes, over the {MAX_STRING_BYTES}-byte limit"
            )
        raw = self._take(length, name)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordFormatError(f"{self.what}: {name} is not valid UTF-8") from None

    def required_string(self, name: str) -> str:
        value = self.string(name)
        assert value is not None
        return value

    def bytes_(self, name: str) -> bytes:
        length = self._length(name, _I32)
        if length == -1:
            raise RecordFormatError(f"{self.what}: non-nullable field {name} was null")
        return self._take(length, name)

    def array_length(self, name: str, min_item_size: int) -> int:
        count = self._length(name, _I32)
        if count == -1:
            raise RecordFormatError(f"{self.what}: non-nullable field {name} was null")
        if count * min_item_size > len(self.data) - self.pos:
            raise RecordFormatError(
                f"{self.what}: {name} claims {count} entries, more than the "
                f"{len(self.data) - self.pos} bytes left can hold"
            )
        return count

    def end_struct(self) -> None:
        """Skip a flexible struct's tagged fields (none are known for these records)."""
        if not self.flexible:
            return
        for _ in range(self.uvarint("tagged field count")):
            self.uvarint("tag")
            self._take(self.uvarint("tagged field size"), "tagged field")

    def finish(self) -> None:
        left = len(self.data) - self.pos
        if left:
            raise RecordFormatError(f"{self.what}: {left} unexpected bytes after the last field")


def decode_key(data: bytes | bytearray | memoryview) -> OffsetKey | GroupMetadataKey:
    """A record key; RecordFormatError (UnknownRecordVersionError for an unknown version) if
    ``data`` is not one."""
    if data is None:
        raise RecordFormatError("__consumer_offsets record has no key")
    r = _Reader(data, "__consumer_offsets key")
    version = r.int16("version")
    key: OffsetKey | GroupMetadataKey
    if version in (0, 1):
        r.what = f"offset commit key v{version}"
        group = r.required_string("group")
        topic = r.required_string("topic")
        key = OffsetKey(group, topic, r.int32("partition"))
    elif version == GROUP_METADATA_KEY_VERSION:
        r.what = f"group metadata key v{version}"
        key = GroupMetadataKey(r.required_string("group"))
    else:
        raise UnknownRecordVersionError("__consumer_offsets key", version)
    r.finish()
    return key


def decode_value(
    key: OffsetKey | GroupMetadataKey | bytes | bytearray | memoryview,
    data: bytes | bytearray | memoryview | None,
) -> OffsetValue | GroupValue | None:
    """The value of a record whose key is ``key`` (decoded, or its bytes); None for a
    tombstone (null value). Reads value versions 0-4."""
    if not isinstance(key, OffsetKey | GroupMetadataKey):
        key = decode_key(key)
    if data is None:
        return None
    if isinstance(key, OffsetKey):
        return _decode_offset_value(data)
    return _decode_group_value(data)


def _decode_offset_value(data: bytes | bytearray | memoryview) -> OffsetValue:
    r = _Reader(data, "offset commit value")
    version = r.int16("version")
    if version not in OFFSET_VALUE_VERSIONS:
        raise UnknownRecordVersionError("offset commit value", version)
    r.what = f"offset commit value v{version}"
    r.flexible = version >= FLEXIBLE_VALUE_VERSION
    offset = r.int64("offset")
    leader_epoch = r.int32("leaderEpoch") if version >= 3 else -1
    metadata = r.required_string("metadata")
    commit_timestamp = r.int64("commitTimestamp")
    expire: int | None = None
    if version == 1:
        expire = r.int64("expireTimestamp")
        if expire == -1:
            expire = None
    r.end_struct()
    r.finish()
    return OffsetValue(offset, leader_epoch, metadata, commit_timestamp, expire)


def _decode_group_value(data: bytes | bytearray | memoryview) -> GroupValue:
    r = _Reader(data, "group metadata value")
    version = r.int16("version")
    if version not in GROUP_VALUE_VERSIONS:
        raise UnknownRecordVersionError("group metadata value", version)
    r.what = f"group metadata value v{version}"
    r.flexible = version >= FLEXIBLE_VALUE_VERSION
    protocol_type = r.required_string("protocolType")
    generation = r.int32("generation")
    protocol = r.string("protocol", nullable=True)
    leader = r.string("leader", nullable=True)
    current_state_timestamp = r.int64("currentStateTimestamp") if version >= 2 else -1
    # The smallest member: its strings empty, its int32s, its two byte fields empty (and an
    # empty tagged-field section when flexible).
    strings = 4 if version >= 3 else 3
    ints = 2 if version >= 1 else 1
    min_member = strings + 4 * ints + 2 + 1 if r.flexible else 2 * strings + 4 * ints + 2 * 4
    members: list[MemberRecord] = []
    for _ in range(r.array_length("members", min_member)):
        member_id = r.required_string("memberId")
        instance_id = r.string("groupInstanceId", nullable=True) if version >= 3 else None
        client_id = r.required_string("clientId")
        client_host = r.required_string("clientHost")
        rebalance_timeout = r.int32("rebalanceTimeout") if version >= 1 else None
        session_timeout = r.int32("sessionTimeout")
        subscription = r.bytes_("subscription")
        assignment = r.bytes_("assignment")
        r.end_struct()
        members.append(
            MemberRecord(
                member_id=member_id,
                group_instance_id=instance_id,
                client_id=client_id,
                client_host=client_host,
                rebalance_timeout=session_timeout
                if rebalance_timeout is None
                else rebalance_timeout,
                session_timeout=session_timeout,
                subscription=subscription,
                assignment=assignment,
            )
        )
    r.end_struct()
    r.finish()
    return GroupValue(
        protocol_type=protocol_type,
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp=current_state_timestamp,
        members=members,
    )


def decode_consumer_assignment(
    data: bytes | bytearray | memoryview,
) -> tuple[list[tuple[str, int]], bytes | None]:
    """A ``consumer`` protocol assignment (ConsumerProtocolAssignment v0-3: int16 version,
    [topic string, [partition int32]], userData bytes?): the (topic, partition) pairs in order
    and the user data. Newer versions read as v3, as Kafka's clients do."""
    r = _Reader(data, "consumer protocol assignment")
    version = r.int16("version")
    if version < 0:
        raise RecordFormatError(f"consumer protocol assignment: negative version {version}")
    partitions: list[tuple[str, int]] = []
    for _ in range(r.array_length("assignedPartitions", 2 + 4)):
        topic = r.required_string("topic")
        for _ in range(r.array_length("partitions", 4)):
            partitions.append((topic, r.int32("partition")))
    length = r.int32("userData length")
    if length < -1:
        raise RecordFormatError(f"consumer protocol assignment: userData length {length}")
    user_data = None if length == -1 else r._take(length, "userData")
    return partitions, user_data


# --------------------------------------------------------------------------- batches


def build_batch(
    entries: list[tuple[bytes, bytes | None]],
    timestamp_ms: int,
    *,
    producer: tuple[int, int] | None = None,
) -> bytes:
    """One RecordBatch v2 (magic 2, no compression, CreateTime ``timestamp_ms``) holding
    ``entries`` as (key, value) records at offsets 0..n-1; the log assigns the real offsets when
    it appends the batch. Without ``producer`` the batch has no producer id (group records,
    plain offset commits); with ``producer`` = (producer id, epoch) it is a transactional batch
    of that producer with sequence -1, as Kafka writes a TxnOffsetCommit."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    if not entries:
        raise RecordFormatError("a record batch needs at least one record")
    producer_id, producer_epoch = producer if producer is not None else (-1, -1)
    if producer is not None and not (0 <= producer_id < 1 << 63 and 0 <= producer_epoch < 1 << 15):
        raise RecordFormatError(f"not a producer id and epoch: {producer!r}")
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=producer is not None,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        batch_size=(1 << 31) - 1,
    )
    for offset, (key, value) in enumerate(entries):
        if builder.append(offset, timestamp_ms, key, value, []) is None:  # pragma: no cover
            raise RecordFormatError("record batch over 2 GiB")
    return bytes(builder.build())


#: ControlRecordType of a transaction marker's key (int16 version, int16 type)
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


def control_record_type(batch: bytes | bytearray | memoryview) -> int:
    """The type of the control record in a control batch (one RecordBatch v2): 0 ABORT, 1 COMMIT,
    other values for control records that are not transaction markers. RecordFormatError if
    the batch is not a whole, valid control batch."""
    from isrlab.broker.log.control import read_control_record

    data = bytes(batch)
    try:
        headers = list(iter_batches(data))
        if len(headers) != 1 or not headers[0].is_control:
            raise RecordFormatError("not one control batch")
        check_crc(data, headers[0])
        kind, _key, _value = read_control_record(data, headers[0])
    except LogError as exc:
        raise RecordFormatError(f"not a valid control batch: {exc}") from None
    return int(kind)


def iter_batch_records(
    batch: bytes | bytearray | memoryview,
) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record in ``batch``: one RecordBatch v2 or several back to
    back (a log read). CRCs are checked; control batches (transaction markers) are skipped.
    RecordFormatError if the buffer is not whole, valid v2 batches."""
    from kafka.record.default_records import DefaultRecordBatch

    data = bytes(batch)
    try:
        headers = list(iter_batches(data))
        for header in headers:
            check_crc(data, header)
    except LogError as exc:
        raise RecordFormatError(f"not a valid record batch: {exc}") from None
    for header in headers:
        if header.is_control:
            continue
        try:
            records = [
                (rec.offset, rec.key, rec.value)
                for rec in DefaultRecordBatch(data[header.position : header.end_position])
            ]
        except Exception as exc:  # a codec kafka-python lacks, or records cut short
            raise RecordFormatError(
                f"cannot read the records of the batch at offset {header.base_offset}: {exc}"
            ) from None
        for offset, key, value in records:
            yield (
                offset,
                None if key is None else bytes(key),
                None if value is None else bytes(value),
            )
