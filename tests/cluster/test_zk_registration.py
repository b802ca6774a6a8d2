"""A broker's registration in ZooKeeper after its session expired.

Seen in an embedded-cluster run: a broker partitioned from ZooKeeper lost its session,
reconnected with a new one, read its old `/brokers/ids/<id>` from a follower that had not yet
applied the expiry, concluded it was still registered, and never registered again. The
controller then counted it dead for good, and the partitions whose ISR was that broker alone
stayed offline. The registration must never be decided by such a read.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from types import SimpleNamespace
from typing import Any

from isrlab.broker.cluster import ClusterKafkaServer
from isrlab.broker.zk_client import KafkaZkClient


def _client(zookeeper: Any, chroot: str) -> KafkaZkClient:
    zk = KafkaZkClient(zookeeper.connect + chroot, 6000)
    zk.start()
    return zk


def test_register_broker_says_whether_this_session_created_it(zookeeper):
    zk = _client(zookeeper, "/r" + uuid.uuid4().hex[:8])
    try:
        assert zk.register_broker(7, "h", 1) is True
        assert zk.register_broker(7, "h", 1) is False  # this session holds it already
        assert zk.zk.exists("/brokers/ids/7").ephemeralOwner == zk.zk.client_id[0]
    finally:
        zk.close()


def test_a_renewed_session_registers_again_even_if_a_stale_read_shows_the_old_znode(zookeeper):
    zk = _client(zookeeper, "/r" + uuid.uuid4().hex[:8])
    try:
        stale = SimpleNamespace(ephemeralOwner=12345)  # the expired session's znode
        real_exists = zk.zk.exists
        zk.zk.exists = lambda path, *a, **kw: stale  # type: ignore[method-assign]
        broker = SimpleNamespace(
            stopping=False,
            zk=zk,
            broker_id=3,
            _advertised=("h", 9092),
            _broker_epoch=None,
            _held_leadership={},
            _states={},
        )
        for name in ("_learn_broker_epoch", "_decide_held_leadership"):
            method = getattr(ClusterKafkaServer, name)
            setattr(broker, name, functools.partial(method, broker))
        asyncio.run(ClusterKafkaServer._reregister(broker))  # type: ignore[arg-type]
        stat = real_exists("/brokers/ids/3")
        assert stat is not None, "the broker did not register again"
        assert stat.ephemeralOwner == zk.zk.client_id[0]
        # The new incarnation's broker epoch: states written before it cannot make it lead.
        assert broker._broker_epoch == stat.czxid
    finally:
        zk.close()
