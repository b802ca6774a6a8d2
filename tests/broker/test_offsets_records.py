"""``__consumer_offsets`` records: Kafka 3.x's key/value layout, batches, and dump-log.

The fixed byte strings below are written by hand, field by field, from Kafka's message
definitions (group-coordinator/src/main/resources/common/message/*.json), not produced by the
encoder under test.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from isrlab.broker.cli import app
from isrlab.broker.coordinator.group.records import (
    GROUP_VALUE_VERSIONS,
    OFFSET_VALUE_VERSIONS,
    GroupMetadataKey,
    GroupValue,
    MemberRecord,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    UnknownRecordVersionError,
    build_batch,
    decode_consumer_assignment,
    decode_key,
    decode_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
    iter_batch_records,
)
from isrlab.broker.log.dump import dump_files
from isrlab.broker.log.log import Log, LogConfig

T = 1_700_000_000_000  # 0x0000018BCFE56800


def h(text: str) -> bytes:
    """Hex with spaces and newlines, one field per group, a ``#`` comment after it."""
    return bytes.fromhex(
        "".join(line.partition("#")[0].replace(" ", "") for line in text.splitlines())
    )


# ------------------------------------------------------------------ hand-written Kafka bytes

OFFSET_KEY_V1 = h("0001  0001 67  0006 6f7264657273  00000003")  # g, orders, 3
OFFSET_KEY_V0 = h("0000  0001 67  0006 6f7264657273  00000003")
GROUP_KEY_V2 = h("0002  0005 67726f7570")  # "group"

OFFSET_VALUE_V3 = h(
    """
    0003  # version 3
    000000000000002a  # offset 42
    00000007  # leaderEpoch 7
    0004 6d657461  # metadata "meta"
    0000018bcfe56800  # commitTimestamp T
    """
)
OFFSET_VALUE_V1 = h(
    """
    0001  # version 1
    0000000000000005  # offset 5
    0000  # metadata ""
    0000018bcfe56800  # commitTimestamp T
    0000018bcfe5dd30  # expireTimestamp T + 30000
    """
)
OFFSET_VALUE_V4_WITH_UNKNOWN_TAG = h(
    """
    0004  # version 4 (flexible)
    000000000000002a  # offset 42
    ffffffff  # leaderEpoch -1
    05 6d657461  # compact metadata "meta" (length + 1)
    0000018bcfe56800  # commitTimestamp T
    01  # one tagged field
    1f 02 abcd  # tag 31, size 2, unknown to this version: skipped
    """
)
ASSIGNMENT_V0 = h("0000 00000001 0006 746f70696361 00000002 00000000 00000002 ffffffff")
SUBSCRIPTION = h("0000 00000001 0006 746f70696361 ffffffff")
GROUP_VALUE_V3 = h(
    """
    0003  # version 3
    0008 636f6e73756d6572  # protocolType "consumer"
    00000003  # generation 3
    0005 72616e6765  # protocol "range"
    0002 6d31  # leader "m1"
    0000018bcfe56800  # currentStateTimestamp T
    00000001  # one member
      0002 6d31  # memberId "m1"
      ffff  # groupInstanceId null
      0001 63  # clientId "c"
      0009 2f31302e302e302e31  # clientHost "/10.0.0.1"
      000493e0  # rebalanceTimeout 300000
      0000afc8  # sessionTimeout 45000
      00000012 """
    + SUBSCRIPTION.hex()
    + """ # subscription (18 bytes)
      0000001e """
    + ASSIGNMENT_V0.hex()
    + """ # assignment (30 bytes)
    """
)
GROUP_VALUE_V4 = h(
    """
    0004  # version 4 (flexible)
    09 636f6e73756d6572  # protocolType "consumer"
    00000003  # generation 3
    00  # protocol null
    00  # leader null
    ffffffffffffffff  # currentStateTimestamp -1
    02  # one member (compact array: count + 1)
      03 6d31  # memberId "m1"
      06 696e737431  # groupInstanceId "inst1"
      02 63  # clientId "c"
      02 68  # clientHost "h"
      000493e0  # rebalanceTimeout 300000
      0000afc8  # sessionTimeout 45000
      01  # subscription empty
      03 0102  # assignment 0102
      01 00 01 ff  # member tagged fields: tag 0, size 1 (skipped)
    00  # no tagged fields
    """
)


def _member(instance: str | None = None) -> MemberRecord:
    return MemberRecord(
        member_id="m1",
        group_instance_id=instance,
        client_id="c",
        client_host="/10.0.0.1",
        rebalance_timeout=300_000,
        session_timeout=45_000,
        subscription=SUBSCRIPTION,
        assignment=ASSIGNMENT_V0,
    )


def test_keys_from_kafka_bytes() -> None:
    assert decode_key(OFFSET_KEY_V1) == OffsetKey("g", "orders", 3)
    assert decode_key(OFFSET_KEY_V0) == OffsetKey("g", "orders", 3)
    assert decode_key(GROUP_KEY_V2) == GroupMetadataKey("group")
    # Kafka 3.x writes offset keys at version 1, group keys at version 2.
    assert encode_key(OffsetKey("g", "orders", 3)) == OFFSET_KEY_V1
    assert encode_key(GroupMetadataKey("group")) == GROUP_KEY_V2


def test_offset_values_from_kafka_bytes() -> None:
    key = OffsetKey("g", "orders", 3)
    v3 = OffsetValue(offset=42, leader_epoch=7, metadata="meta", commit_timestamp=T)
    assert decode_value(key, OFFSET_VALUE_V3) == v3
    assert encode_offset_value(v3) == OFFSET_VALUE_V3
    v1 = OffsetValue(offset=5, commit_timestamp=T, expire_timestamp=T + 30_000)
    assert decode_value(OFFSET_KEY_V1, OFFSET_VALUE_V1) == v1
    assert encode_offset_value(v1) == OFFSET_VALUE_V1  # an expire timestamp means version 1
    assert decode_value(key, OFFSET_VALUE_V4_WITH_UNKNOWN_TAG) == OffsetValue(
        offset=42, leader_epoch=-1, metadata="meta", commit_timestamp=T
    )
    assert decode_value(key, None) is None


def test_group_values_from_kafka_bytes() -> None:
    key = GroupMetadataKey("group")
    v3 = GroupValue(
        protocol_type="consumer",
        generation=3,
        protocol="range",
        leader="m1",
        current_state_timestamp=T,
        members=[_member()],
    )
    assert decode_value(key, GROUP_VALUE_V3) == v3
    assert encode_group_value(v3) == GROUP_VALUE_V3
    v4 = decode_value(key, GROUP_VALUE_V4)
    assert v4 == GroupValue(
        protocol_type="consumer",
        generation=3,
        protocol=None,
        leader=None,
        current_state_timestamp=-1,
        members=[
            MemberRecord("m1", "inst1", "c", "h", 300_000, 45_000, b"", b"\x01\x02"),
        ],
    )
    assert decode_value(GROUP_KEY_V2, None) is None
    assert decode_consumer_assignment(ASSIGNMENT_V0) == ([("topica", 0), ("topica", 2)], None)


def test_group_value_v0_reads_rebalance_timeout_as_session_timeout() -> None:
    v0 = h(
        """
        0000 0000 00000000 ffff ffff  # version 0, protocolType "", gen 0, nulls
        00000001  # one member
          0001 61 0001 63 0001 68  # memberId a, clientId c, clientHost h
          00002710  # sessionTimeout 10000
          00000000 00000000  # empty subscription, assignment
        """
    )
    value = decode_value(GroupMetadataKey("g"), v0)
    assert isinstance(value, GroupValue)
    assert value.current_state_timestamp == -1
    assert value.members == [MemberRecord("a", None, "c", "h", 10_000, 10_000, b"", b"")]


# ------------------------------------------------------------------------------ round trips

names = st.text(max_size=12)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@given(group=names, topic=names, partition=i32)
def test_key_round_trip(group: str, topic: str, partition: int) -> None:
    for key in (OffsetKey(group, topic, partition), GroupMetadataKey(group)):
        assert decode_key(encode_key(key)) == key


@given(
    version=st.sampled_from(OFFSET_VALUE_VERSIONS),
    offset=i64,
    epoch=i32,
    metadata=st.text(max_size=40),
    commit=i64,
    expire=st.none() | i64.filter(lambda x: x != -1),
)
def test_offset_value_round_trip(
    version: int, offset: int, epoch: int, metadata: str, commit: int, expire: int | None
) -> None:
    value = OffsetValue(offset, epoch, metadata, commit, expire)
    data = encode_offset_value(value, version=version)
    assert struct.unpack_from(">h", data)[0] == version
    # What the version holds survives; what it lacks comes back as the default.
    expected = OffsetValue(
        offset,
        epoch if version >= 3 else -1,
        metadata,
        commit,
        expire if version == 1 else None,
    )
    assert decode_value(OffsetKey("g", "t", 0), data) == expected


members = st.builds(
    MemberRecord,
    member_id=names,
    group_instance_id=st.none() | names,
    client_id=names,
    client_host=names,
    rebalance_timeout=i32,
    session_timeout=i32,
    subscription=st.binary(max_size=30),
    assignment=st.binary(max_size=30),
)


@given(
    version=st.sampled_from(GROUP_VALUE_VERSIONS),
    group=st.builds(
        GroupValue,
        protocol_type=names,
        generation=i32,
        protocol=st.none() | names,
        leader=st.none() | names,
        current_state_timestamp=i64,
        members=st.lists(members, max_size=4),
    ),
)
def test_group_value_round_trip(version: int, group: GroupValue) -> None:
    data = encode_group_value(group, version=version)
    assert struct.unpack_from(">h", data)[0] == version
    expected = GroupValue(
        protocol_type=group.protocol_type,
        generation=group.generation,
        protocol=group.protocol,
        leader=group.leader,
        current_state_timestamp=group.current_state_timestamp if version >= 2 else -1,
        members=[
            MemberRecord(
                m.member_id,
                m.group_instance_id if version >= 3 else None,
                m.client_id,
                m.client_host,
                m.rebalance_timeout if version >= 1 else m.session_timeout,
                m.session_timeout,
                m.subscription,
                m.assignment,
            )
            for m in group.members
        ],
    )
    assert decode_value(GroupMetadataKey("g"), data) == expected


# --------------------------------------------------------------------------------- garbage


@settings(max_examples=300)
@given(data=st.binary(max_size=80), as_group=st.booleans())
def test_garbage_is_a_format_error_never_a_crash(data: bytes, as_group: bool) -> None:
    key = GroupMetadataKey("g") if as_group else OffsetKey("g", "t", 0)
    for decode in (lambda: decode_key(data), lambda: decode_value(key, data)):
        try:
            decode()
        except RecordFormatError:
            pass


@given(data=st.data())
def test_every_truncation_or_extension_of_a_record_is_rejected(data: st.DataObject) -> None:
    record, key = data.draw(
        st.sampled_from(
            [
                (OFFSET_KEY_V1, None),
                (GROUP_KEY_V2, None),
                (OFFSET_VALUE_V3, OffsetKey("g", "t", 0)),
                (OFFSET_VALUE_V1, OffsetKey("g", "t", 0)),
                (GROUP_VALUE_V3, GroupMetadataKey("g")),
                (GROUP_VALUE_V4, GroupMetadataKey("g")),
            ]
        )
    )
    cut = data.draw(st.integers(0, len(record) - 1))
    for bad in (record[:cut], record + b"\x00"):
        with pytest.raises(RecordFormatError):
            if key is None:
                decode_key(bad)
            else:
                decode_value(key, bad)


@pytest.mark.parametrize(
    ("what", "data", "message"),
    [
        ("key", h("0003 0001 67"), "unknown __consumer_offsets key version 3"),
        ("key", h("ffff"), "unknown __consumer_offsets key version -1"),
        ("key", h("0002 fffe"), "negative length"),
        ("key", h("0002 ffff"), "non-nullable field group was null"),
        ("key", h("0002 0002 c328"), "not valid UTF-8"),
        ("offset", h("0005") + OFFSET_VALUE_V3[2:], "unknown offset commit value version 5"),
        ("group", h("0003 0000 00000000 ffff ffff 0000000000000000 7fffffff"), "claims"),
        ("group", h("0003 0000 00000000 ffff ffff 0000000000000000 ffffffff"), "was null"),
        ("group", h("0004 01 00000000 00 00 0000000000000000 ffffffffff"), "varint"),
    ],
)
def test_specific_garbage_messages(what: str, data: bytes, message: str) -> None:
    with pytest.raises(RecordFormatError, match=message):
        if what == "key":
            decode_key(data)
        else:
            key = OffsetKey("g", "t", 0) if what == "offset" else GroupMetadataKey("g")
            decode_value(key, data)


def test_unknown_versions_say_which() -> None:
    with pytest.raises(UnknownRecordVersionError) as info:
        decode_key(h("0004 0001 67"))
    assert info.value.version == 4
    with pytest.raises(UnknownRecordVersionError):
        encode_offset_value(OffsetValue(1), version=5)


def test_unwritable_values_are_refused() -> None:
    with pytest.raises(RecordFormatError, match="over Kafka's 32767-byte limit"):
        encode_offset_value(OffsetValue(1, metadata="x" * 40_000))
    with pytest.raises(RecordFormatError, match="does not fit its 32-bit field"):
        encode_key(OffsetKey("g", "t", 2**31))
    with pytest.raises(RecordFormatError, match="cannot be null"):
        encode_group_value(GroupValue(None, 1, None, None, 0, []))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- batches


def test_batch_round_trip_and_corruption() -> None:
    entries = [
        (encode_key(OffsetKey("g", "t", 0)), encode_offset_value(OffsetValue(42))),
        (encode_key(GroupMetadataKey("g")), None),
    ]
    batch = build_batch(entries, T)
    assert batch[16] == 2  # magic
    assert struct.unpack_from(">q", batch, 43)[0] == -1  # producer id
    assert struct.unpack_from(">q", batch, 27)[0] == T  # base timestamp
    assert list(iter_batch_records(batch)) == [(0, *entries[0]), (1, *entries[1])]
    second = bytearray(build_batch(entries[:1], T))
    struct.pack_into(">q", second, 0, 2)
    assert [o for o, _, _ in iter_batch_records(batch + bytes(second))] == [0, 1, 2]
    corrupt = bytearray(batch)
    corrupt[-1] ^= 0xFF
    with pytest.raises(RecordFormatError, match="CRC"):
        list(iter_batch_records(bytes(corrupt)))
    with pytest.raises(RecordFormatError, match="torn"):
        list(iter_batch_records(batch[:-3]))
    with pytest.raises(RecordFormatError):
        build_batch([], T)


# -------------------------------------------------------------------------------- dump-log


def _offsets_log(tmp_path: Path) -> Path:
    """A real __consumer_offsets-0 log written through Log: commits, a group, tombstones and a
    record that is not an offsets record."""
    group = GroupValue(
        protocol_type="consumer",
        generation=3,
        protocol="range",
        leader="m1",
        current_state_timestamp=T,
        members=[_member("inst-1")],
    )
    batches = [
        build_batch(
            [
                (
                    encode_key(OffsetKey("g", "orders", 0)),
                    encode_offset_value(OffsetValue(42, 7, "", T)),
                ),
                (
                    encode_key(OffsetKey("g", "orders", 1)),
                    encode_offset_value(OffsetValue(9, metadata="note", commit_timestamp=T)),
                ),
            ],
            T,
        ),
        build_batch([(encode_key(GroupMetadataKey("g")), encode_group_value(group))], T),
        build_batch([(encode_key(OffsetKey("g", "orders", 0)), None)], T + 1),
        build_batch([(encode_key(GroupMetadataKey("g")), None)], T + 1),
        build_batch([(b"\x00\x01garbage", b"x"), (h("000b 0001 67"), b"y")], T + 2),
        build_batch([(encode_key(OffsetKey("g", "orders", 2)), b"\x00\x03\x00")], T + 2),
    ]
    log = Log.open(tmp_path / "__consumer_offsets-0", LogConfig(file_delete_delay_ms=0))
    for batch in batches:
        log.append_as_leader(batch, 5)
    log.close()
    return tmp_path / "__consumer_offsets-0" / "00000000000000000000.log"


def test_dump_log_offsets_decoder(tmp_path: Path) -> None:
    path = _offsets_log(tmp_path)
    out = io.StringIO()
    dump_files([path], out=out, offsets_decoder=True)  # implies print_records
    records = [line for line in out.getvalue().splitlines() if line.startswith("| offset:")]
    assert len(records) == 8
    assert records[0].startswith("| offset: 0 CreateTime: 1700000000000 keySize: 17 ")
    assert records[0].endswith(" key: offset_commit::group=g,partition=orders-0 payload: offset=42")
    assert records[1].endswith(
        " key: offset_commit::group=g,partition=orders-1 payload: offset=9,metadata=note"
    )
    key, _, payload = records[2].partition(" payload: ")
    assert key.endswith(" key: group_metadata::group=g")
    assert json.loads(payload) == {
        "protocolType": "consumer",
        "protocol": "range",
        "generationId": 3,
        "assignment": "{m1=[topica-0, topica-2]}",
    }
    assert payload.startswith('{"protocolType":"consumer","protocol":"range","generationId":3,')
    assert records[3].endswith(
        " valueSize: -1 sequence: -1 headerKeys: [] "
        "key: offset_commit::group=g,partition=orders-0 payload: <DELETE>"
    )
    assert records[4].endswith(" key: group_metadata::group=g payload: <DELETE>")
    assert " key: <undecodable: " in records[5] and "payload: x" in records[5]
    assert records[6].endswith(" key: unknown::version=11")
    assert " payload: <undecodable: offset commit value v3: " in records[7]
    assert "000300" in records[7]


def test_dump_log_cli_offsets_decoder(tmp_path: Path) -> None:
    path = _offsets_log(tmp_path)
    result = CliRunner().invoke(app, ["dump-log", "--offsets-decoder", "--files", str(path)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "key: offset_commit::group=g,partition=orders-1 payload: offset=9,metadata=note" in (
        result.output
    )
    assert "key: group_metadata::group=g payload: <DELETE>" in result.output
    plain = CliRunner().invoke(app, ["dump-log", "--print-data-log", "--files", str(path)])
    assert plain.exit_code == 0 and "offset_commit::" not in plain.output


def test_group_payload_for_other_protocols_and_user_data(tmp_path: Path) -> None:
    with_user_data = h("0001 00000001 0001 74 00000001 00000004 00000003 000102")
    groups = [
        GroupValue("connect", 1, "sessioned", "w1", T, [_member()]),
        GroupValue(
            "consumer",
            2,
            "sticky",
            "m1",
            T,
            [
                MemberRecord("m1", None, "c", "h", 1, 1, b"", with_user_data),
                MemberRecord("m2", None, "c", "h", 1, 1, b"", b""),
            ],
        ),
        GroupValue("consumer", 3, None, None, T, []),
    ]
    batch = build_batch(
        [(encode_key(GroupMetadataKey("g")), encode_group_value(g)) for g in groups], T
    )
    log = Log.open(tmp_path / "__consumer_offsets-1", LogConfig(file_delete_delay_ms=0))
    log.append_as_leader(batch, 0)
    log.close()
    out = io.StringIO()
    dump_files(
        [tmp_path / "__consumer_offsets-1" / "00000000000000000000.log"],
        out=out,
        offsets_decoder=True,
    )
    payloads = [
        json.loads(line.partition(" payload: ")[2])
        for line in out.getvalue().splitlines()
        if line.startswith("| offset:")
    ]
    # Not the consumer protocol: the assignment in hex, as Kafka's "%X" of BigInt prints it.
    assert payloads[0]["assignment"] == "{m1=" + format(int(ASSIGNMENT_V0.hex(), 16), "X") + "}"
    # User data after a colon (leading zero bytes dropped, as Kafka's BigInt does); a member
    # whose assignment is not a consumer assignment gets a marker.
    assert payloads[1]["assignment"].startswith("{m1=[t-4]:102,m2=<undecodable: ")
    assert payloads[2] == {
        "protocolType": "consumer",
        "protocol": None,
        "generationId": 3,
        "assignment": "{}",
    }


# ---------------------------------------------------------------- transactional offset commits


def test_transactional_batch_and_markers() -> None:
    """A TxnOffsetCommit's batch: transactional, the producer's id and epoch, sequence -1, as
    Kafka writes it; markers (control batches) read back as ABORT / COMMIT."""
    from isrlab.broker.coordinator.group.records import (
        CONTROL_ABORT,
        CONTROL_COMMIT,
        control_record_type,
    )
    from isrlab.broker.log.control import build_control_batch
    from isrlab.broker.log.record_batch import iter_batches

    entries = [(encode_key(OffsetKey("g", "t", 0)), encode_offset_value(OffsetValue(42)))]
    batch = build_batch(entries, T, producer=(7, 3))
    (header,) = iter_batches(batch)
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, -1)
    assert list(iter_batch_records(batch)) == [(0, *entries[0])]
    (plain,) = iter_batches(build_batch(entries, T))
    assert not plain.is_transactional and plain.producer_id == -1
    for bad in [(-1, 0), (7, -1), (7, 1 << 15), (1 << 63, 0)]:
        with pytest.raises(RecordFormatError, match="producer"):
            build_batch(entries, T, producer=bad)
    commit = build_control_batch(7, 3, True, 0, T)
    abort = build_control_batch(7, 3, False, 0, T)
    assert control_record_type(commit) == CONTROL_COMMIT
    assert control_record_type(abort) == CONTROL_ABORT
    assert list(iter_batch_records(batch + commit)) == [(0, *entries[0])]  # markers skipped
    with pytest.raises(RecordFormatError, match="control"):
        control_record_type(batch)
    corrupt = bytearray(commit)
    corrupt[-1] ^= 0xFF
    with pytest.raises(RecordFormatError, match="CRC"):
        control_record_type(bytes(corrupt))
    with pytest.raises(RecordFormatError):
        control_record_type(commit[:-2])


def test_the_shell_loads_transactional_batches_and_markers_from_a_log(tmp_path: Path) -> None:
    """GroupCoordinatorService._load reads the batch headers: a transactional batch is pending
    for its producer until that producer's marker; commit applies, abort drops, no marker at the
    log end leaves it pending."""
    import asyncio
    from types import SimpleNamespace

    from isrlab.broker.config import BrokerConfig
    from isrlab.broker.coordinator.group.service import GroupCoordinatorService
    from isrlab.broker.log.control import build_control_batch
    from isrlab.broker.log.log import AppendOrigin

    def offset(tp: int, value: int, producer: tuple[int, int] | None = None) -> bytes:
        key = encode_key(OffsetKey("g", "t", tp))
        return build_batch([(key, encode_offset_value(OffsetValue(value)))], T, producer=producer)

    log = Log.open(tmp_path / "__consumer_offsets-0", LogConfig(file_delete_delay_ms=0))
    coordinator = AppendOrigin.COORDINATOR
    for batch in [
        offset(0, 1),
        offset(0, 10, (1, 0)),
        offset(1, 20, (2, 0)),
        offset(2, 2),
        build_control_batch(1, 0, True, 0, T),
        build_control_batch(2, 0, False, 0, T),
        offset(1, 30, (3, 0)),
    ]:
        log.append_as_leader(batch, 5, origin=coordinator)
    config = BrokerConfig({"offsets.topic.num.partitions": "1"})
    service = GroupCoordinatorService(SimpleNamespace(config=config))  # type: ignore[arg-type]
    service.core.begin_load(0, 5)
    asyncio.run(service._load(SimpleNamespace(log=log), 0, 5))  # type: ignore[arg-type]
    log.close()
    group = service.core.groups["g"]
    assert {tp: c.offset for tp, c in group.offsets.items()} == {("t", 0): 10, ("t", 2): 2}
    assert {pid: {tp: c.offset for tp, c in o.items()} for pid, o in
            group.pending_txn_offsets.items()} == {3: {("t", 1): 30}}  # fmt: skip
    assert group.offsets[("t", 0)].append_offset == 1  # the transactional batch's offset
    service.core.complete_txn(0, 3, [0], True)
    assert group.offsets[("t", 1)].offset == 30
