"""The follower side of `ReplicaManager`: one batched Fetch at a time per leader broker.

The partitions that follow one leader send their fetches together, as Kafka's
ReplicaFetcherThread does: the SendFetch actions the cores emit in one turn of the loop become
one request; one that comes while that request is in flight waits for the next; each partition
gets its own part of the response (error, records, high watermark, log start); a failed
connection answers every partition of the request with REPLICA_NOT_AVAILABLE; another leader's
partitions go in a request of their own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from isrlab.broker.errors import ErrorCode
from isrlab.broker.network.client import ConnectionFailed
from isrlab.broker.network.replica_fetch import VERSION
from isrlab.broker.replica_manager import LocalStateStore, ReplicaManager
from isrlab.broker.replication import ReplicationConfig, SendFetch

R = FetchResponse[VERSION]
Q = FetchRequest[VERSION]


class FakePartition:
    def __init__(self, tp: tuple[str, int]) -> None:
        self.tp = tp
        self.name = f"{tp[0]}-{tp[1]}"
        self.log = SimpleNamespace(log_start_offset=0)
        self.answers: list[tuple[Any, ...]] = []

    def on_fetch_response(self, *args: Any) -> None:
        self.answers.append(args)


class FakeConnection:
    """Answers each Fetch after ``gate`` is set: partition p of a topic gets p records' worth of
    bytes and high watermark 100 + p; partition 9 an error."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.requests: list[list[tuple[str, int, int]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate = asyncio.Event()
        self.fail = False

    async def exchange(self, encode: Any, timeout: float) -> bytes:
        frame = encode(len(self.requests) + 1)  # what the fetcher sends, read by kafka-python
        req = Q.decode(frame[4:], header=True)
        assert req.header.correlation_id == len(self.requests) + 1
        assert req.replica_id == 1 and req.max_wait_ms == 500
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.requests.append(
            [(t.topic, p.partition, p.fetch_offset) for t in req.topics for p in t.partitions]
        )
        await self.gate.wait()
        self.in_flight -= 1
        if self.fail:
            raise ConnectionFailed("reset")
        resp = R(
            throttle_time_ms=0,
            error_code=0,
            session_id=0,
            responses=[
                R.FetchableTopicResponse(
                    topic=t.topic,
                    partitions=[
                        R.FetchableTopicResponse.PartitionData(
                            partition_index=p.partition,
                            error_code=int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                            if p.partition == 9
                            else 0,
                            high_watermark=100 + p.partition,
                            last_stable_offset=100 + p.partition,
                            log_start_offset=p.partition,
                            aborted_transactions=None,
                            preferred_read_replica=-1,
                            records=b"x" * p.partition,
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ],
        )
        resp.with_header(correlation_id=req.header.correlation_id)
        data: bytes = resp.encode(header=True, framed=True)
        return data[4:]

    def close(self) -> None:
        pass


def _manager(tmp_path: Path) -> tuple[ReplicaManager, dict[int, FakeConnection]]:
    rm = ReplicaManager(
        1,
        tmp_path,
        lambda topic: ReplicationConfig(),
        lambda broker: ("h", 9092),
        LocalStateStore(),
    )
    conns: dict[int, FakeConnection] = {}

    def connection(leader: int, tp: Any) -> FakeConnection:
        assert tp is None, "fetches share the leader's connection"
        return conns.setdefault(leader, FakeConnection(leader))

    rm._connection = connection  # type: ignore[assignment,method-assign]
    return rm, conns


def _host(rm: ReplicaManager, tp: tuple[str, int]) -> FakePartition:
    hp = FakePartition(tp)
    rm.partitions[tp] = hp  # type: ignore[assignment]
    return hp


def _fetch(hp: FakePartition, leader: int, request_id: int, offset: int = 5) -> SendFetch:
    return SendFetch(hp.tp, request_id, leader, 1, offset, 3, 500)


async def _stop(rm: ReplicaManager) -> None:
    rm.stopping = True
    tasks = list(rm._tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_fetches_to_one_leader_share_a_request_and_each_gets_its_part(tmp_path: Path) -> None:
    async def main() -> None:
        rm, conns = _manager(tmp_path)
        a, b, c = (_host(rm, ("t", p)) for p in (0, 1, 2))
        other = _host(rm, ("u", 9))
        for i, hp in enumerate((a, b, c, other)):
            rm.send_fetch(hp, _fetch(hp, 2, request_id=10 + i, offset=i))  # type: ignore[arg-type]
        await _turns()
        assert conns[2].requests == [[("t", 0, 0), ("t", 1, 1), ("t", 2, 2), ("u", 9, 3)]]
        # asked while that request is in flight: waits for the next one, nothing concurrent
        rm.send_fetch(a, _fetch(a, 2, request_id=20, offset=7))  # type: ignore[arg-type]
        rm.send_fetch(a, _fetch(a, 2, request_id=21, offset=8))  # type: ignore[arg-type]
        await _turns()
        assert len(conns[2].requests) == 1
        conns[2].gate.set()
        await _turns(10)
        assert conns[2].most_in_flight == 1
        # the newer SendFetch of a partition replaced the older one before it went out
        assert conns[2].requests[1] == [("t", 0, 8)]
        assert a.answers[0] == (10, 0, b"", 100, 0, 100)
        assert b.answers == [(11, 0, b"x", 101, 1, 101)]
        assert c.answers == [(12, 0, b"xx", 102, 2, 102)]
        err = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        assert other.answers == [(13, err, b"x" * 9, 109, 9, 109)]
        assert a.answers[1][0] == 21
        await _stop(rm)

    asyncio.run(main())


def test_each_leader_has_its_own_request(tmp_path: Path) -> None:
    async def main() -> None:
        rm, conns = _manager(tmp_path)
        a, b = _host(rm, ("t", 0)), _host(rm, ("t", 1))
        rm.send_fetch(a, _fetch(a, 2, 1))  # type: ignore[arg-type]
        rm.send_fetch(b, _fetch(b, 3, 2))  # type: ignore[arg-type]
        await _turns()
        assert conns[2].requests == [[("t", 0, 5)]]
        assert conns[3].requests == [[("t", 1, 5)]]
        for conn in conns.values():
            conn.gate.set()
        await _turns(10)
        assert [x[0] for x in a.answers] == [1] and [x[0] for x in b.answers] == [2]
        await _stop(rm)

    asyncio.run(main())


@pytest.mark.parametrize("removed", [False, True])
def test_a_failed_request_answers_every_partition_in_it(tmp_path: Path, removed: bool) -> None:
    async def main() -> None:
        rm, conns = _manager(tmp_path)
        a, b = _host(rm, ("t", 0)), _host(rm, ("t", 1))
        rm.send_fetch(a, _fetch(a, 2, 1))  # type: ignore[arg-type]
        rm.send_fetch(b, _fetch(b, 2, 2))  # type: ignore[arg-type]
        await _turns()
        if removed:  # a partition no longer hosted is not answered
            del rm.partitions[b.tp]
        conns[2].fail = True
        conns[2].gate.set()
        await asyncio.sleep(0.3)  # the fetcher's back-off after a failed connection
        na = int(ErrorCode.REPLICA_NOT_AVAILABLE)
        assert a.answers == [(1, na, b"", -1, -1, -1)]
        assert b.answers == ([] if removed else [(2, na, b"", -1, -1, -1)])
        await _stop(rm)

    asyncio.run(main())
