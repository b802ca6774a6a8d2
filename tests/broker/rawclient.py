"""A tiny blocking Kafka client over one socket, for tests that need exact control of the bytes."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder


class RawClient:
    def __init__(self, port: int, timeout: float = 10, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def recv_frame(self) -> bytes:
        head = self._recv_exactly(4)
        (size,) = struct.unpack(">i", head)
        return self._recv_exactly(size)

    def _recv_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by broker")
            buf += chunk
        return bytes(buf)

    def encode(self, request: Any) -> bytes:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="raw")
        return bytes(request.encode(header=True))

    def call(self, request: Any) -> Any:
        self.send_frame(self.encode(request))
        if request.API_KEY == 0 and request.acks == 0:
            return None
        frame = self.recv_frame()
        cls = _response_class(request)
        version = request.API_VERSION
        if request.API_KEY == 18:
            return ApiVersionsResponse[version].decode(frame, header=True)
        return cls[version].decode(frame, header=True)

    def is_closed(self, timeout: float = 5) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def _response_class(request: Any) -> Any:
    from kafka.protocol.api_header import ResponseClassRegistry

    return ResponseClassRegistry._response_class_registry[request.API_KEY]


def build_batch(values: list[bytes], *, timestamp: int = 1_700_000_000_000, **kw: Any) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20, **kw)
    for i, v in enumerate(values):
        builder.append(timestamp=timestamp + i, key=None, value=v, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce_req(
    topic: str,
    records: bytes | None,
    acks: int = 1,
    partition: int = 0,
    *,
    timeout_ms: int = 5000,
) -> Any:
    """A Produce v8 of ``records`` (a record batch, or None) to one partition."""
    P = ProduceRequest[8]
    return P(
        transactional_id=None,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[
            P.TopicProduceData(
                name=topic,
                partition_data=[
                    P.TopicProduceData.PartitionProduceData(index=partition, records=records)
                ],
            )
        ],
    )


def fetch_request(
    topic: str,
    *,
    partition: int = 0,
    offset: int = 0,
    replica_id: int = -1,
    current_leader_epoch: int = -1,
    isolation_level: int = 0,
    max_bytes: int = 1 << 20,
) -> Any:
    """A Fetch v11 of one partition from ``offset`` (no wait, no session); ``max_bytes`` bounds
    the request and the partition alike."""
    F = FetchRequest[11]
    return F(
        replica_id=replica_id,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=[
            F.FetchTopic(
                topic=topic,
                partitions=[
                    F.FetchTopic.FetchPartition(
                        partition=partition,
                        current_leader_epoch=current_leader_epoch,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def list_offsets_request(
    topic: str,
    timestamps: dict[int, int],
    *,
    replica_id: int = -1,
    current_leader_epoch: int = -1,
    isolation_level: int = 0,
) -> Any:
    """A ListOffsets v4 asking, for each partition of ``timestamps``, the offset of its
    timestamp (-1 latest, -2 earliest)."""
    L = ListOffsetsRequest[4]
    return L(
        replica_id=replica_id,
        isolation_level=isolation_level,
        topics=[
            L.ListOffsetsTopic(
                name=topic,
                partitions=[
                    L.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=partition,
                        current_leader_epoch=current_leader_epoch,
                        timestamp=timestamp,
                    )
                    for partition, timestamp in timestamps.items()
                ],
            )
        ],
    )


def fetch_records(
    client: RawClient, topic: str, partition: int, start: int = 0
) -> list[tuple[int, bytes | None]]:
    """Every (offset, value) of a partition from ``start`` to the high watermark, fetched
    (Fetch v11) until an empty answer."""
    from kafka.record.default_records import DefaultRecordBatch

    out: list[tuple[int, bytes | None]] = []
    offset = start
    while True:
        req = fetch_request(topic, partition=partition, offset=offset)
        p = client.call(req).responses[0].partitions[0]
        if p.error_code != 0:
            raise AssertionError(f"fetch {topic}-{partition} at {offset}: error {p.error_code}")
        data = bytes(p.records or b"")
        position = 0
        batches = 0
        while position + 12 <= len(data):
            (length,) = struct.unpack_from(">i", data, position + 8)
            if position + 12 + length > len(data):
                break  # a partial batch at the end of the fetch
            for record in DefaultRecordBatch(data[position : position + 12 + length]):
                out.append((record.offset, None if record.value is None else bytes(record.value)))
            position += 12 + length
            batches += 1
        if batches == 0:
            return out
        offset = out[-1][0] + 1
