"""The partition state znode: what leaders and the controller agree on through ZooKeeper.

Kafka (ZooKeeper mode) keeps, per partition, the znode
``/brokers/topics/<topic>/partitions/<partition>/state`` holding the JSON object
``{"controller_epoch": c, "leader": l, "version": 1, "leader_epoch": e, "isr": [..]}``.
Two parties write it, always as a compare-and-set on the znode version:

- the controller, on elections and when it removes dead brokers from the ISR (it bumps
  ``leader_epoch`` every time);
- the partition leader, when it shrinks or expands the ISR (same ``leader_epoch``).

The cores never talk to ZooKeeper: they emit :class:`WriteStateZnode` actions and the shell
performs the conditional write and feeds back success and the new version. ``leader == -1``
(:data:`NO_LEADER`) means the partition is offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

NO_LEADER = -1
STATE_ZNODE_FORMAT_VERSION = 1


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A partition of a topic (Kafka's ``TopicPartition``)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def partition_state_path(tp: TopicPartition) -> str:
    """The ZooKeeper path of ``tp``'s state znode."""
    return f"/brokers/topics/{tp.topic}/partitions/{tp.partition}/state"


def topic_path(topic: str) -> str:
    """The ZooKeeper path holding ``topic``'s replica assignment."""
    return f"/brokers/topics/{topic}"


@dataclass(frozen=True)
class LeaderAndIsr:
    """Contents of a partition state znode plus the znode version it was read at.

    ``zk_version`` is not part of the JSON: it is ZooKeeper's ``stat.version`` and is what a
    compare-and-set write is conditioned on.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int = 0

    def with_isr(self, isr: tuple[int, ...]) -> LeaderAndIsr:
        """The same leadership with another ISR (a leader's own ISR change: no epoch bump)."""
        return replace(self, isr=isr)

    def new_leader(self, leader: int, isr: tuple[int, ...], controller_epoch: int) -> LeaderAndIsr:
        """A controller decision: always bumps ``leader_epoch``, as Kafka's controller does."""
        return LeaderAndIsr(
            leader=leader,
            leader_epoch=self.leader_epoch + 1,
            isr=isr,
            controller_epoch=controller_epoch,
            zk_version=self.zk_version,
        )

    def to_json(self) -> bytes:
        """The znode payload, byte-compatible in shape with Kafka's."""
        return orjson.dumps(
            {
                "controller_epoch": self.controller_epoch,
                "leader": self.leader,
                "version": STATE_ZNODE_FORMAT_VERSION,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
            }
        )

    @classmethod
    def from_json(cls, data: bytes, zk_version: int) -> LeaderAndIsr:
        """Parse a state znode read at ``zk_version``; raises ValueError on a malformed one."""
        try:
            obj: Any = orjson.loads(data)
            return cls(
                leader=int(obj["leader"]),
                leader_epoch=int(obj["leader_epoch"]),
                isr=tuple(int(b) for b in obj["isr"]),
                controller_epoch=int(obj["controller_epoch"]),
                zk_version=zk_version,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"malformed partition state znode {data!r}: expected JSON with leader, "
                f"leader_epoch, isr and controller_epoch ({exc})"
            ) from exc


@dataclass(frozen=True)
class WriteStateZnode:
    """Action: conditionally write ``state`` to ``tp``'s state znode.

    ``expected_version`` is the znode version the writer last saw; ``None`` means "create the
    znode, it must not exist yet" (a new partition). The shell reports the outcome back to the
    emitting core (``Partition.on_isr_update_result`` / ``Controller.on_write_result``).
    """

    tp: TopicPartition
    state: LeaderAndIsr
    expected_version: int | None
    path: str = field(init=False)
    data: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", partition_state_path(self.tp))
        object.__setattr__(self, "data", self.state.to_json())
