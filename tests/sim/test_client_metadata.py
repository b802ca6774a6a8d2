"""The simulated client's metadata: an answer naming an older leader epoch than one already
seen is stale and ignored, as librdkafka >= 2.1 ignores it (KIP-320). A broker cut off from the
cluster still answers Metadata as the leader it was; without the rule a consumer followed it
back to a log it no longer leads, found its position out of range there and re-read the key
from the start (nonmonotonic-poll on a safe configuration, isrlab sim --seed 60)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS
from typing import Any

from isrlab.harness.sim import clock
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.network import SimNetwork

TEST: dict[str, Any] = {"seed": 1, "acks": "1", "keys": ["t0/0"], "request_timeout_ms": 2000}


def answer(leader: int, epoch: int) -> Any:
    """A Metadata v8 answer, as the fields the client reads."""
    part = NS(partition_index=0, error_code=0, leader_id=leader, leader_epoch=epoch)
    return NS(
        brokers=[NS(node_id=b, host=f"n{b}", port=9092) for b in (1, 2, 3)],
        topics=[NS(name="t0", error_code=0, partitions=[part])],
    )


class _Conn:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    async def request(self, req: Any, timeout: float) -> Any:
        return self.answers.pop(0)


def test_metadata_naming_an_older_leader_epoch_is_ignored() -> None:
    async def body() -> list[tuple[int | None, int | None]]:
        loop = asyncio.get_running_loop()
        c = SimQueueClient(TEST, SimNetwork(loop, seed=1).host("client0"), ["n1"], process=0)
        conn = _Conn([answer(2, 5), answer(3, 4), answer(1, 6), answer(1, 6)])
        c._conn = lambda host, port: conn  # type: ignore[method-assign]
        seen = []
        for _ in range(3):
            await c._refresh_once(loop.time() + 10)
            seen.append((c._leaders.get(("t0", 0)), c._leader_epochs.get(("t0", 0))))
        return seen

    # epoch 5 names 2; the cut-off broker 3 answering as leader at epoch 4 is stale; epoch 6
    assert clock.run(body()) == [(2, 5), (2, 5), (1, 6)]
