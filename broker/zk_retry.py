"""ZooKeeper calls from the event loop that survive a dropped connection.

A kazoo request in flight when the client's connection to ZooKeeper drops fails with
`ConnectionLoss` (the session itself may live on; a write may or may not have applied).
Kafka's `ZooKeeperClient` retries such requests once it is connected again; a controller or
broker that instead logged the error and dropped the event it was handling lost that event
for good: a broker-membership change never acted on left a partition with a dead leader
until the next change, and a state write abandoned half-way left the controller core waiting
for its outcome for ever (found by `isrlab sim --nemesis kill+pause+partition`).

`call(zk, fn, *args)` runs `fn(*args)` off the loop (`asyncio.to_thread`) and, after a
`ConnectionLoss`, waits until the client is connected again and calls it again, as long as
the session is the one it started with. A new session means the old one expired: what was
decided under it may be stale (a controller resigns, its ephemeral znodes are gone), so
`SessionExpiredError` is raised for the caller to handle as the loss of the session. Every
`fn` retried so must be safe to run twice: reads, and writes whose second attempt fails
cleanly when the first applied (conditional writes, creates).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import ConnectionLoss, SessionExpiredError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how often a caller looks whether the connection is back
RETRY_S = 0.1


async def call(zk: Any, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread, again after each ConnectionLoss once `zk` (a kazoo client)
    is connected with the same session; SessionExpiredError if the session changed."""
    session = _session(zk)
    while True:
        try:
            return await asyncio.to_thread(fn, *args)
        except ConnectionLoss:
            log.info("ZooKeeper connection lost during %s: again once reconnected", _name(fn))
        while True:
            await asyncio.sleep(RETRY_S)
            if _session(zk) != session:
                raise SessionExpiredError(f"the ZooKeeper session changed during {_name(fn)}")
            if zk.connected:
                break


def _session(zk: Any) -> int | None:
    client_id = zk.client_id
    return None if client_id is None else int(client_id[0])


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


__all__ = ["RETRY_S", "call"]
