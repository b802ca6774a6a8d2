"""Which fetches waiting for data (long polls) a partition's changes wake, through the
ReplicaManager's notifier: only those its core would now answer with records or an error
(`Partition.fetch_has_answer`), as Kafka's DelayedFetch completes on accumulated bytes and not
on every append. A consumer at the high watermark sleeps through an append the HW does not
follow; a follower at the log end sleeps through a HW move."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from isrlab.broker.log.log import Log, LogConfig
from isrlab.broker.partition import HostedPartition
from isrlab.broker.replica_manager import FetchInterest, LocalStateStore, ReplicaManager
from isrlab.broker.replication import LeaderAndIsr, ReplicationConfig
from tests.log.batches import make_batch

TP = ("t", 0)
EPOCH = 1


class Leader:
    """Broker 0 leading t-0 with follower 1 in the ISR (min.insync.replicas 1)."""

    def __init__(self, directory: Path):
        self.rm = ReplicaManager(
            0,
            directory,
            lambda topic: ReplicationConfig(min_insync_replicas=1),
            lambda broker: None,
            LocalStateStore(),
        )
        self.log = Log.open(directory / "t-0", LogConfig(file_delete_delay_ms=0))
        self.hp: HostedPartition = self.rm.add(TP, self.log, {})
        self.rm.become(TP, LeaderAndIsr(0, EPOCH, (0, 1), 1), [0, 1])

    def append(self) -> None:
        res = self.rm.append(TP, memoryview(make_batch(1)), 1, 30_000)
        assert not isinstance(res, asyncio.Future) and res.error == 0

    def follower_fetch(self, offset: int) -> None:
        res = self.rm.read(
            TP,
            offset,
            1 << 20,
            replica_id=1,
            current_leader_epoch=EPOCH,
            read_committed=False,
            min_one_message=True,
        )
        assert res.error == 0


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    ld = Leader(tmp_path)
    yield ld
    ld.log.close_without_flush()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_an_append_wakes_followers_not_consumers_at_the_hw(leader: Leader) -> None:
    async def go() -> None:
        notifier = leader.rm.notifier
        leader.follower_fetch(0)
        consumer = asyncio.ensure_future(
            notifier.wait([TP], 5, [FetchInterest(-1, 0, EPOCH, False)])
        )
        committed = asyncio.ensure_future(notifier.wait([TP], 5, [FetchInterest(-1, 0, -1, True)]))
        follower = asyncio.ensure_future(
            notifier.wait([TP], 5, [FetchInterest(1, 0, EPOCH, False)])
        )
        await settle()
        leader.append()  # LEO 1, HW still 0: follower 1 has not fetched it
        await settle()
        assert follower.done()
        assert not consumer.done() and not committed.done()
        # follower 1 at the new log end: the HW moves, the consumers wake
        follower = asyncio.ensure_future(
            notifier.wait([TP], 5, [FetchInterest(1, 1, EPOCH, False)])
        )
        await settle()
        leader.follower_fetch(1)
        await settle()
        assert consumer.done() and committed.done()
        assert not follower.done()  # the follower at the log end has nothing new
        leader.append()
        await settle()
        assert follower.done()

    asyncio.run(go())


def test_errors_and_waiters_without_interest_wake(leader: Leader) -> None:
    async def go() -> None:
        notifier = leader.rm.notifier
        plain = asyncio.ensure_future(notifier.wait([TP], 5))
        fenced = asyncio.ensure_future(notifier.wait([TP], 5, [FetchInterest(-1, 5, 0, False)]))
        at_hw = asyncio.ensure_future(notifier.wait([TP], 5, [FetchInterest(-1, 0, -1, False)]))
        await settle()
        leader.append()
        await settle()
        assert plain.done() and fenced.done() and not at_hw.done()
        # the timeout still ends a wait nothing answers
        await asyncio.wait_for(notifier.wait([TP], 0.05, [FetchInterest(-1, 1, -1, False)]), 5)
        notifier.notify()  # shutdown: everyone
        await settle()
        assert at_hw.done()
        assert notifier._waiters == {}

    asyncio.run(go())


class CountingServer:
    """What `handle_fetch` uses of a KafkaServer, over the Leader's ReplicaManager, counting
    the partition reads."""

    def __init__(self, leader: Leader) -> None:
        self.replica_manager = leader.rm
        self.stopping = False
        self.config = {"zero.copy.threshold.bytes": 0}
        self.reads: list[int] = []

    def read_partition(self, tp: tuple[str, int], fetch_offset: int, max_bytes: int, **kw):  # type: ignore[no-untyped-def]
        self.reads.append(kw["replica_id"])
        kw.pop("fetcher_log_start", None)
        return self.replica_manager.read(tp, fetch_offset, max_bytes, **kw)


def _fetch_request(replica_id: int, offset: int) -> Any:
    from kafka.protocol.consumer import FetchRequest

    F = FetchRequest[11]
    body = F(
        replica_id=replica_id,
        max_wait_ms=5000,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            F.FetchTopic(
                topic=TP[0],
                partitions=[
                    F.FetchTopic.FetchPartition(
                        partition=TP[1],
                        current_leader_epoch=EPOCH,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    return SimpleNamespace(body=body, api_version=11, correlation_id=7)


def test_a_consumer_fetch_at_the_hw_reads_only_once_woken(leader: Leader) -> None:
    """A consumer's long poll at the high watermark reads nothing until the HW moves, then
    reads once; a follower's fetch reads at once (its offset acknowledges its log end)."""
    from isrlab.broker.apis.fetch import handle_fetch

    async def go() -> None:
        server = CountingServer(leader)
        consumer = asyncio.ensure_future(handle_fetch(server, _fetch_request(-1, 0)))  # type: ignore[arg-type]
        await settle()
        assert server.reads == [] and not consumer.done()
        leader.append()  # the HW does not move yet: nothing for the consumer
        await settle()
        assert server.reads == [] and not consumer.done()
        follower = asyncio.ensure_future(handle_fetch(server, _fetch_request(1, 1)))  # type: ignore[arg-type]
        await settle()
        # the follower read once at offset 1 (its LEO): the HW moves to 1, the consumer wakes
        assert consumer.done() and server.reads == [1, -1], server.reads
        assert not follower.done()
        follower.cancel()

    asyncio.run(go())
