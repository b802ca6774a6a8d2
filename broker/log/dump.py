"""``dump-log``: print segment files the way Kafka's kafka-dump-log.sh does.

- ``.log``: one line per batch (``baseOffset: 0 lastOffset: 9 count: 10 ... position: 0
  CreateTime: ... size: ... magic: 2 compresscodec: none crc: ... isvalid: true``), and with
  ``print_records`` one ``| offset: ...`` line per record (keys and values shown as
  ``payload``, decoded with kafka-python). Bytes after the last whole batch are reported.
  ``offsets_decoder`` (implies ``print_records``) reads keys and values as
  ``__consumer_offsets`` records and prints them as Kafka 3.x's ``--offsets-decoder`` does:
  ``key: offset_commit::group=g,partition=t-0 payload: offset=42[,metadata=m]``,
  ``key: group_metadata::group=g payload: {"protocolType":...,"assignment":"{m=[t-0]}"}``,
  ``payload: <DELETE>`` for a tombstone, ``key: unknown::version=N`` for a key version it
  does not know; a record it cannot decode gets ``<undecodable: why>`` in place of the field.
  ``transaction_log_decoder`` (implies ``print_records``) reads them as ``__transaction_state``
  records (``key: transaction_metadata::transactionalId=T payload: producerId:5,...``, Kafka's
  ``--transaction-log-decoder``). A control record (transaction marker) reads
  ``endTxnMarker: COMMIT coordinatorEpoch: 3`` after its sequence and header keys.
- ``.index``: ``offset: N position: P`` per entry (absolute offsets).
- ``.timeindex``: ``timestamp: T offset: N`` per entry.
- ``.txnindex``: ``version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S``
  per aborted transaction.
- ``leader-epoch-checkpoint`` and the offset checkpoints: their lines, checked.

Files are opened read-only in spirit: indexes are read straight from the file, never
resized, so dumping a live broker's files does not disturb them.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from isrlab.broker.log.errors import LogError
from isrlab.broker.log.record_batch import (
    COMPRESSION_NAMES,
    LOG_APPEND_TIME,
    BatchHeader,
    check_header,
    compute_crc,
)

if TYPE_CHECKING:
    from isrlab.broker.coordinator.group.records import GroupValue

#: turns a record's key and value into ``key: ... payload: ...`` (never raises)
Decoder = Callable[[bytes | None, bytes | None], str]


def dump_files(
    paths: list[Path],
    print_records: bool = False,
    out: TextIO | None = None,
    *,
    offsets_decoder: bool = False,
    transaction_log_decoder: bool = False,
) -> None:
    """Dump every file in ``paths`` to ``out`` (standard output when None, looked up at the
    call); an unknown kind of file is reported, not fatal. ``offsets_decoder`` decodes records
    as ``__consumer_offsets`` keys and values, ``transaction_log_decoder`` as
    ``__transaction_state`` ones."""
    out = sys.stdout if out is None else out
    print_records = print_records or offsets_decoder or transaction_log_decoder
    decoder: Decoder | None = None
    if offsets_decoder:
        decoder = _offsets_key_and_payload
    elif transaction_log_decoder:
        from isrlab.broker.coordinator.transaction.records import describe_record

        decoder = describe_record
    for path in paths:
        path = Path(path)
        print(f"Dumping {path}", file=out)
        try:
            if path.name.endswith(".log"):
                _dump_log(path, print_records, out, decoder)
            elif path.name.endswith(".txnindex"):
                _dump_txn_index(path, out)
            elif path.name.endswith(".timeindex"):
                _dump_time_index(path, out)
            elif path.name.endswith(".index"):
                _dump_offset_index(path, out)
            elif path.name.endswith("checkpoint"):
                print(path.read_text(encoding="utf-8"), end="", file=out)
            else:
                print(
                    f"Ignoring unknown file {path}: expected .log, .index, .timeindex, .txnindex "
                    "or a checkpoint",
                    file=out,
                )
        except OSError as exc:
            print(f"Cannot read {path}: {exc}", file=out)


def _base_offset(path: Path) -> int:
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else 0


def _format_batch(header: BatchHeader, valid: bool) -> str:
    timestamp_name = "LogAppendTime" if header.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    codec = COMPRESSION_NAMES.get(header.compression_type, str(header.compression_type))
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count} "
        f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {str(header.is_transactional).lower()} isControl: {str(header.is_control).lower()} "
        f"position: {header.position} {timestamp_name}: {header.max_timestamp} size: {header.size} "
        f"magic: {header.magic} compresscodec: {codec} crc: {header.crc} isvalid: {str(valid).lower()}"
    )


def _dump_log(path: Path, print_records: bool, out: TextIO, decoder: Decoder | None = None) -> None:
    data = path.read_bytes()
    print(f"Log starting offset: {_base_offset(path)}", file=out)
    position = 0
    while position < len(data):
        try:
            header = check_header(data, position, len(data))
        except LogError as exc:
            print(
                f"Found {len(data) - position} invalid bytes at the end of {path.name}: {exc}",
                file=out,
            )
            return
        valid = compute_crc(data, header) == header.crc
        print(_format_batch(header, valid), file=out)
        if print_records:
            _dump_records(data[header.position : header.end_position], header, out, decoder)
        position = header.end_position


def _dump_records(
    batch: bytes, header: BatchHeader, out: TextIO, decoder: Decoder | None = None
) -> None:
    from kafka.record.default_records import ControlRecord, DefaultRecordBatch

    timestamp_name = "LogAppendTime" if header.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    try:
        for index, record in enumerate(DefaultRecordBatch(batch)):
            sequence = header.base_sequence + index if header.base_sequence >= 0 else -1
            key = record.key
            value = record.value
            header_keys = [name for name, _ in record.headers]
            if isinstance(record, ControlRecord) or header.is_control:
                shown = _control_record(key, value)
            elif decoder is not None:
                shown = decoder(key, value)
            else:
                shown = f"key: {_show(key)} payload: {_show(value)}"
            print(
                f"| offset: {record.offset} {timestamp_name}: {record.timestamp} "
                f"keySize: {-1 if key is None else len(key)} valueSize: {-1 if value is None else len(value)} "
                f"sequence: {sequence} headerKeys: {header_keys} {shown}",
                file=out,
            )
    except Exception as exc:  # a codec kafka-python lacks, or corrupt records: say so and go on
        print(f"| cannot decode records: {exc}", file=out)


def _control_record(key: bytes | None, value: bytes | None) -> str:
    """A control record as kafka-dump-log prints it: ``endTxnMarker: COMMIT coordinatorEpoch:
    N`` for a transaction marker, ``controlType: UNKNOWN(t)`` otherwise."""
    if key is None or len(key) < 4:
        return "controlType: UNKNOWN(-1)"
    control_type = struct.unpack_from(">h", key, 2)[0]
    if control_type not in (0, 1):
        return f"controlType: UNKNOWN({control_type})"
    if value is None or len(value) < 6:
        return f"endTxnMarker: <undecodable: value of {0 if value is None else len(value)} bytes>"
    coordinator_epoch = struct.unpack_from(">i", value, 2)[0]
    kind = "COMMIT" if control_type == 1 else "ABORT"
    return f"endTxnMarker: {kind} coordinatorEpoch: {coordinator_epoch}"


def _offsets_key_and_payload(key: bytes | None, value: bytes | None) -> str:
    """``key: ... payload: ...`` of one ``__consumer_offsets`` record, as Kafka 3.x's
    GroupMetadataManager.formatRecordKeyAndValue prints it; never raises."""
    from isrlab.broker.coordinator.group.records import (
        GroupMetadataKey,
        OffsetValue,
        RecordFormatError,
        UnknownRecordVersionError,
        decode_key,
        decode_value,
    )

    if key is None:
        return "key: <undecodable: record has no key> payload: " + _show(value)
    try:
        decoded_key = decode_key(key)
    except UnknownRecordVersionError as exc:
        return f"key: unknown::version={exc.version}"
    except RecordFormatError as exc:
        return f"key: <undecodable: {exc}; key bytes {key.hex()}> payload: {_show(value)}"
    if isinstance(decoded_key, GroupMetadataKey):
        shown_key = f"group_metadata::group={decoded_key.group}"
    else:
        shown_key = (
            f"offset_commit::group={decoded_key.group},"
            f"partition={decoded_key.topic}-{decoded_key.partition}"
        )
    try:
        decoded = decode_value(decoded_key, value)
    except RecordFormatError as exc:
        return f"key: {shown_key} payload: <undecodable: {exc}; value bytes {_hex(value)}>"
    if decoded is None:
        payload = "<DELETE>"
    elif isinstance(decoded, OffsetValue):
        payload = f"offset={decoded.offset}"
        if decoded.metadata:
            payload += f",metadata={decoded.metadata}"
    else:
        payload = _group_payload(decoded)
    return f"key: {shown_key} payload: {payload}"


def _group_payload(group: GroupValue) -> str:
    """Kafka's JSON for a group value: the members' assignments, decoded when the protocol
    type is ``consumer`` (``member=[t-0, t-1]`` plus ``:USERDATA`` in hex), else in hex."""
    from isrlab.broker.coordinator.group.records import (
        CONSUMER_PROTOCOL_TYPE,
        RecordFormatError,
        decode_consumer_assignment,
    )

    shown: list[str] = []
    for member in group.members:
        if group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            try:
                partitions, user_data = decode_consumer_assignment(member.assignment)
            except RecordFormatError as exc:
                shown.append(f"{member.member_id}=<undecodable: {exc}>")
                continue
            entry = f"{member.member_id}=[{', '.join(f'{t}-{p}' for t, p in partitions)}]"
            if user_data:
                entry += f":{_kafka_hex(user_data)}"
            shown.append(entry)
        else:
            shown.append(f"{member.member_id}={_kafka_hex(member.assignment)}")
    return json.dumps(
        {
            "protocolType": group.protocol_type,
            "protocol": group.protocol,
            "generationId": group.generation,
            "assignment": "{" + ",".join(shown) + "}",
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _kafka_hex(data: bytes) -> str:
    """Kafka's ``"%X".format(BigInt(1, bytes))``: upper-case hex of the unsigned number, so
    leading zero bytes are dropped; empty for no bytes."""
    return format(int.from_bytes(data, "big"), "X") if data else ""


def _hex(data: bytes | None) -> str:
    return "null" if data is None else data.hex()


def _show(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()


def _dump_offset_index(path: Path, out: TextIO) -> None:
    base = _base_offset(path)
    data = path.read_bytes()
    for relative, position in struct.iter_unpack(">II", data[: len(data) // 8 * 8]):
        if relative == 0 and position == 0:
            # Kafka stops at the zero-filled preallocated tail of an active index.
            break
        print(f"offset: {base + relative} position: {position}", file=out)


def _dump_txn_index(path: Path, out: TextIO) -> None:
    from isrlab.broker.log.txn_index import ENTRY_SIZE, AbortedTxn

    data = path.read_bytes()
    whole = len(data) // ENTRY_SIZE * ENTRY_SIZE
    for position in range(0, whole, ENTRY_SIZE):
        t = AbortedTxn.decode(data, position)
        print(
            f"version: {t.version} producerId: {t.producer_id} firstOffset: {t.first_offset} "
            f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}",
            file=out,
        )
    if whole < len(data):
        print(
            f"Found {len(data) - whole} invalid bytes at the end of {path.name}: not a whole "
            f"{ENTRY_SIZE}-byte entry",
            file=out,
        )


def _dump_time_index(path: Path, out: TextIO) -> None:
    base = _base_offset(path)
    data = path.read_bytes()
    for timestamp, relative in struct.iter_unpack(">qI", data[: len(data) // 12 * 12]):
        if timestamp == 0 and relative == 0:
            break
        print(f"timestamp: {timestamp} offset: {base + relative}", file=out)
