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

KIP-966 (eligible leader replicas, ``eligible.leader.replicas.enable``) adds two optional
fields, written only when non-empty (a znode without them reads as empty lists):

- ``eligible_leader_replicas`` (ELR): replicas out of the ISR that still hold everything up to
  the high watermark. While |ISR| < min.insync.replicas the HW does not advance (strict min
  ISR), so a replica removed from the ISR then, which was in it when the HW last advanced,
  keeps every committed record: it may lead when no ISR member can. The ELR is emptied as soon
  as |ISR| >= min.insync.replicas (the HW may move on without them); a member that registers
  after an unclean shutdown (it may have lost its unflushed tail) leaves it;
- ``last_known_elr``: as Kafka 4.x uses the field, the last leader of a partition whose ISR
  became empty; it is elected, as before KIP-966, only when neither the ISR nor the ELR has a
  live member (every eligible replica lost its tail), and cleared once a leader is elected.

:func:`next_elr` is the one rule both writers (the controller and the leader) apply.
"""

from __future__ import annotations

from collections.abc import Collection
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
    #: KIP-966's eligible leader replicas (see the module docstring)
    elr: tuple[int, ...] = ()
    #: the last leader once the ISR became empty (Kafka 4.x's LastKnownElr)
    last_known_elr: tuple[int, ...] = ()

    def with_isr(self, isr: tuple[int, ...], elr: tuple[int, ...] | None = None) -> LeaderAndIsr:
        """The same leadership with another ISR (a leader's own ISR change: no epoch bump);
        ``elr`` replaces the ELR when given."""
        return replace(self, isr=isr, elr=self.elr if elr is None else elr)

    def new_leader(
        self,
        leader: int,
        isr: tuple[int, ...],
        controller_epoch: int,
        elr: tuple[int, ...] = (),
        last_known_elr: tuple[int, ...] = (),
    ) -> LeaderAndIsr:
        """A controller decision: always bumps ``leader_epoch``, as Kafka's controller does."""
        return LeaderAndIsr(
            leader=leader,
            leader_epoch=self.leader_epoch + 1,
            isr=isr,
            controller_epoch=controller_epoch,
            zk_version=self.zk_version,
            elr=elr,
            last_known_elr=last_known_elr,
        )

    def to_json(self) -> bytes:
        """The znode payload, byte-compatible in shape with Kafka's (the KIP-966 fields only
        when non-empty)."""
        obj: dict[str, Any] = {
            "controller_epoch": self.controller_epoch,
            "leader": self.leader,
            "version": STATE_ZNODE_FORMAT_VERSION,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
        }
        if self.elr:
            obj["eligible_leader_replicas"] = list(self.elr)
        if self.last_known_elr:
            obj["last_known_elr"] = list(self.last_known_elr)
        return orjson.dumps(obj)

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
                elr=tuple(int(b) for b in obj.get("eligible_leader_replicas", ())),
                last_known_elr=tuple(int(b) for b in obj.get("last_known_elr", ())),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"malformed partition state znode {data!r}: expected JSON with leader, "
                f"leader_epoch, isr and controller_epoch ({exc})"
            ) from exc


def next_elr(
    old_isr: Collection[int],
    old_elr: Collection[int],
    new_isr: Collection[int],
    min_insync_replicas: int,
    unclean_shutdown: Collection[int] = (),
) -> tuple[int, ...]:
    """KIP-966: the ELR once the ISR goes from ``old_isr`` to ``new_isr``.

    Empty while |new ISR| >= min.insync.replicas (the HW may advance without the others).
    Otherwise the old ELR plus the members of the old ISR that left it: the HW has not moved
    since the ISR fell below min.insync.replicas, so they hold everything below it. Members of
    the new ISR are not in the ELR, nor are replicas that registered after an unclean
    shutdown (``unclean_shutdown``: they may have lost their unflushed tail)."""
    if len(new_isr) >= min_insync_replicas:
        return ()
    out: list[int] = []
    for r in (*old_elr, *old_isr):
        if r not in out and r not in new_isr and r not in unclean_shutdown:
            out.append(r)
    return tuple(out)


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
