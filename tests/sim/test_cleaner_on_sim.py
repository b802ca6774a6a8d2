"""The log cleaner on the simulator (issue 18): under a `SimClock` the broker's cleaner is not a
thread but a task on the loop, in the broker's process (`broker.clock.worker_threads`). On a
3-broker SimCluster (invariants checked after every event), a compacted topic with small
segments and many writes to few keys: every replica cleans its log (fewer records, the
checkpoint written), a consumer still reads the latest value of every key; a broker killed
in the middle of a cleaning (at each of the cleaner's steps) or after it is restarted and
serves the latest value of every key; one seed gives the same trace twice."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from isrlab.broker.log.checkpoint import OffsetCheckpointFile
from isrlab.broker.log.cleaner import CLEANER_OFFSET_CHECKPOINT
from isrlab.broker.network.client import KafkaConnection
from isrlab.harness.sim.cluster import PORT, SimCluster
from tests.broker.rawclient import fetch_request, produce_req
from tests.sim.test_nemesis_on_sim import TP, create_topic, isr, run_sim

KEYS = 5
WRITES = 240
PER_BATCH = 3
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "min.cleanable.dirty.ratio": "0.01",
}
#: the cleaner wakes every half virtual second when idle (Kafka's default: 15 s)
BROKER = {"log.cleaner.backoff.ms": "500"}
#: the cleaner wakes every 30 virtual seconds: the writes are over before its first cleaning
BACKOFF_S = 30
SLOW_BROKER = {"log.cleaner.backoff.ms": str(BACKOFF_S * 1000)}


def keyed_batch(items: list[tuple[bytes, bytes]]) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i, (key, value) in enumerate(items):
        builder.append(timestamp=1_700_000_000_000 + i, key=key, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def records(data: bytes) -> dict[int, tuple[bytes, bytes]]:
    """offset -> (key, value) of the record batches in `data`."""
    out: dict[int, tuple[bytes, bytes]] = {}
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        if pos + 12 + length > len(data):
            break
        for r in DefaultRecordBatch(data[pos : pos + 12 + length]):
            out[r.offset] = (bytes(r.key), bytes(r.value))
        pos += 12 + length
    return out


async def write(c: SimCluster, n: int, tag: str) -> dict[bytes, bytes]:
    """`n` records written acks=all to the leader, round robin over the keys, `PER_BATCH` to a
    batch (so that a cleaning rewrites batches it keeps part of); the latest value of each."""
    latest: dict[bytes, bytes] = {}
    i = 0
    while i < n:
        leader = c.leader_of(TP)
        if leader is None:
            await asyncio.sleep(0.5)
            continue
        conn = KafkaConnection(f"n{leader}", PORT, "producer", c.net.host("producer"))
        try:
            while i < n:
                items = [
                    (b"k%d" % (j % KEYS), f"{tag}{j}".encode())
                    for j in range(i, min(i + PER_BATCH, n))
                ]
                r = await conn.request(produce_req(TP[0], keyed_batch(items), acks=-1), 30)
                p = r.responses[0].partition_responses[0]
                if p.error_code != 0:
                    break  # not the leader any more: find the new one
                latest.update(items)
                i += len(items)
        finally:
            conn.close()
        await asyncio.sleep(0.1)
    return latest


async def consume(c: SimCluster, broker: int, upto: int) -> dict[bytes, bytes]:
    """What a consumer reading `broker` (the leader) from offset 0 ends with, once its high
    watermark has reached `upto` (a new leader's lags until its followers' next fetches): the
    latest value of each key (over the gaps the cleaner left)."""
    await c.wait_for(
        lambda: c.server(broker).replica_manager.partitions[TP].high_watermark >= upto,  # type: ignore[index]
        30,
        f"the high watermark of broker {broker} at {upto}",
    )
    conn = KafkaConnection(f"n{broker}", PORT, "reader", c.net.host("reader"))
    latest: dict[bytes, bytes] = {}
    offset = 0
    try:
        while True:
            f = await conn.request(fetch_request(TP[0], offset=offset), 30)
            assert f.responses[0].partitions[0].error_code == 0, f
            got = records(bytes(f.responses[0].partitions[0].records or b""))
            if not got:
                return latest
            for o in sorted(got):
                latest[got[o][0]] = got[o][1]
            offset = max(got) + 1
    finally:
        conn.close()


def on_disk(c: SimCluster, broker: int) -> dict[int, tuple[bytes, bytes]]:
    """Every record of broker `broker`'s log of t-0, read from its log (not through a request)."""
    lg = c.server(broker).replica_manager.partitions[TP].log  # type: ignore[index]
    return records(lg.read(lg.log_start_offset, 1 << 24).read_bytes())


def cleaned(c: SimCluster, broker: int) -> int | None:
    """Broker `broker`'s cleaner checkpoint of t-0, from its cleaner-offset-checkpoint file."""
    path = c.brokers[broker].data_dir / CLEANER_OFFSET_CHECKPOINT
    if not path.exists():
        return None
    return OffsetCheckpointFile(path).read().get(TP)


async def compacted_topic(c: SimCluster) -> tuple[int, dict[bytes, bytes]]:
    leader = await create_topic(c, configs=COMPACTED)
    latest = await write(c, WRITES, "v")
    return leader, latest


async def wait_cleaned(c: SimCluster, brokers: list[int], at_least: int, timeout: float) -> float:
    return await c.wait_for(
        lambda: all((cleaned(c, b) or 0) >= at_least for b in brokers),
        timeout,
        f"every replica's cleaner checkpoint of t-0 at {at_least} or more",
    )


def test_every_replica_cleans_its_log_on_the_loop(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> dict[str, Any]:
        leader, latest = await compacted_topic(c)
        took = await wait_cleaned(c, [1, 2, 3], WRITES // 2, 30)
        out: dict[str, Any] = {"leader": leader, "latest": latest, "took": took}
        out["on_disk"] = {b: on_disk(c, b) for b in (1, 2, 3)}
        out["checkpoints"] = {b: c.server(b).log_manager.cleaner.checkpoints for b in (1, 2, 3)}
        out["read"] = await consume(c, leader, WRITES)
        out["task"] = {b: c.server(b).log_manager.cleaner.alive for b in (1, 2, 3)}
        return out

    out, c = run_sim(tmp_path, body, overrides=BROKER)
    assert out["took"] < 30
    assert out["read"] == out["latest"] and len(out["latest"]) == KEYS
    for b in (1, 2, 3):
        kept = out["on_disk"][b]
        assert len(kept) < WRITES // 2, (b, len(kept))  # cleaned: far fewer records...
        assert max(kept) == WRITES - 1  # ... and the last one still there
        latest_on_disk = {key: value for _, (key, value) in sorted(kept.items())}
        assert latest_on_disk == out["latest"], b
        assert out["checkpoints"][b][TP] >= WRITES // 2
        assert out["task"][b]  # the cleaner's task, alive between cleanings
    assert not any("VIOLATION" in line for line in c.trace)


def test_the_cleaner_is_a_task_of_the_brokers_process_no_thread(tmp_path: Path) -> None:
    import threading

    async def body(c: SimCluster) -> tuple[set[str], list[bool]]:
        threads = {t.name for t in threading.enumerate()}
        owned = []
        for b in c.brokers.values():
            task = c.server(b.id).log_manager.cleaner._task
            assert b.process is not None
            owned.append(task is not None and not task.done() and task in b.process.tasks)
        return threads, owned

    (threads, owned), _ = run_sim(tmp_path, body, overrides=BROKER)
    assert not any(name.startswith("kafka-log-cleaner") for name in threads)
    assert owned == [True, True, True]


class Killed(BaseException):
    """What ends a broker's code at the kill (no `except Exception` of it runs)."""


@pytest.mark.parametrize("step", ["mapped", "cleaned", "swap", "deleted", "renamed", "after"])
def test_a_broker_killed_during_or_after_a_cleaning_serves_the_latest_values(
    tmp_path: Path, step: str
) -> None:
    """The leader is killed -9 at a step of its next cleaning (the files as that step left
    them: `.cleaned` written, `.swap`, old segments `.deleted`, renamed) or after it; the new
    leader serves the latest value of every key; the killed broker, restarted, recovers its
    log, rejoins the ISR and, once it leads again, serves them too."""

    async def body(c: SimCluster) -> dict[str, Any]:
        hit: list[str] = []

        def at(name: str) -> None:
            if name == step and not hit:
                hit.append(name)
                c.crash(leader)
                raise Killed(name)

        leader = await create_topic(c, configs=COMPACTED)
        task = c.server(leader).log_manager.cleaner._task
        if step != "after":
            c.server(leader).log_manager.cleaner.cleaner.step = at
        latest = await write(c, WRITES, "v")
        written_at = c.loop.time()
        # the cleaners' first pass after the start found nothing; their next is BACKOFF later
        assert written_at < BACKOFF_S and not hit, written_at
        if step != "after":
            await c.wait_for(lambda: bool(hit), 2 * BACKOFF_S, f"the leader's cleaner at {step}")
            # the cleaner's task ended with Killed (retrieved here: a task's unretrieved
            # exception is logged, traceback and all, whenever it is collected)
            assert task is not None and isinstance(task.exception(), Killed)
        else:
            await wait_cleaned(c, [leader], WRITES // 2, 2 * BACKOFF_S)
            c.crash(leader)
        await c.wait_for(
            lambda: c.leader_of(TP) not in (None, leader), 30, "another leader for t-0"
        )
        new_leader = c.leader_of(TP)
        assert new_leader is not None
        out: dict[str, Any] = {"latest": latest, "before": dict(latest), "hit": hit}
        out["leader"] = leader
        out["read_new"] = await consume(c, new_leader, WRITES)
        await c.restart(leader)
        await c.wait_for(lambda: len(isr(c)) == 3, 60, "the full ISR again")
        # more writes, cleaned on every replica, the restarted one included
        latest.update(await write(c, WRITES // 4, "w"))
        await wait_cleaned(c, [1, 2, 3], WRITES, 3 * BACKOFF_S)
        out["on_disk"] = {b: on_disk(c, b) for b in (1, 2, 3)}
        # the restarted broker leads again (the others killed in turn) and serves them
        for other in (b for b in (1, 2, 3) if b != leader):
            c.crash(other)
        await c.wait_for(lambda: c.leader_of(TP) == leader, 60, "the restarted broker leads")
        out["read_restarted"] = await consume(c, leader, WRITES + WRITES // 4)
        return out

    out, c = run_sim(tmp_path, body, overrides=SLOW_BROKER)
    if step != "after":
        assert out["hit"] == [step]
    assert out["read_new"] == out["before"] and len(out["before"]) == KEYS
    assert out["read_restarted"] == out["latest"]
    for b, kept in out["on_disk"].items():
        assert {key: value for _, (key, value) in sorted(kept.items())} == out["latest"], b
        assert len(kept) < WRITES, (b, len(kept))
    # the invariants compared the restarted broker's cleaned batches with the committed ones
    assert c.invariants.cleaned_batches > 0
    assert f"crash broker {out['leader']} (incarnation 1" in "\n".join(c.trace)


def test_one_seed_one_trace_with_the_cleaner(tmp_path: Path) -> None:
    async def body(c: SimCluster) -> list[tuple[int, dict[int, tuple[bytes, bytes]]]]:
        leader, _ = await compacted_topic(c)
        await wait_cleaned(c, [1, 2, 3], WRITES // 2, 30)
        c.crash(leader)
        await asyncio.sleep(10)
        await c.restart(leader)
        await asyncio.sleep(10)
        return [(b, on_disk(c, b)) for b in (1, 2, 3)]

    first, c1 = run_sim(tmp_path / "a", body, seed=7, overrides=BROKER)
    second, c2 = run_sim(tmp_path / "b", body, seed=7, overrides=BROKER)
    assert c1.trace == c2.trace
    assert first == second


def test_a_cleaning_lets_the_rest_of_the_broker_run_between_its_steps(tmp_path: Path) -> None:
    """The cleaner task waits a seeded pause at each step of a cleaning (`LogCleaner.interleave`,
    set by `SimCluster`), as a real cleaner thread lets the event loop run: the writes go on
    inside a cleaning, between its plan and its swaps."""

    def log_end(c: SimCluster, b: int) -> int:
        p = c.server(b).replica_manager.partitions.get(TP)
        return -1 if p is None else p.log.log_end_offset

    async def body(c: SimCluster) -> list[tuple[int, str, float, float, int, int]]:
        seen: list[tuple[int, str, float, float, int, int]] = []
        for b in (1, 2, 3):
            cleaner = c.server(b).log_manager.cleaner
            inner = cleaner.interleave
            assert inner is not None

            async def recording(step: str, b: int = b, inner: Any = inner) -> None:
                t0, end0 = c.loop.time(), log_end(c, b)
                await inner(step)
                seen.append((b, step, t0, c.loop.time(), end0, log_end(c, b)))

            cleaner.interleave = recording
        await compacted_topic(c)
        # more writes while the replicas clean what the first ones filled
        writer = asyncio.ensure_future(write(c, WRITES, "w"))
        await wait_cleaned(c, [1, 2, 3], WRITES // 2, 30)
        await writer
        return seen

    seen, c = run_sim(tmp_path, body, overrides=BROKER)
    assert {step for _, step, *_ in seen} == {"planned", "mapped", "cleaned"}
    assert {b for b, *_ in seen} == {1, 2, 3}
    assert all(t1 > t0 for _, _, t0, t1, _, _ in seen)  # each step took virtual time
    # records were appended to a log while its cleaning waited between two steps
    assert any(end1 > end0 >= 0 for *_, end0, end1 in seen)
    assert not any("VIOLATION" in line for line in c.trace)
