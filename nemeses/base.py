"""What every fault module shares: the ``Fault`` protocol, the DB it needs, and target choice.

A *fault* is one kind of failure (``partition``, ``pause``, ...). ``start(value)`` injects it and
returns what it did (a JSON value for the history); ``stop(value)`` undoes what this fault did;
``heal()`` undoes it whatever the fault believes, so it is safe to run after a crash of the
harness, twice in a row, or on a cluster that was never touched. Faults reach nodes only through
the DB's ``remote(node)`` (SSH) and ask it cluster questions (``leader_of``, ``controller``,
``coordinator``).

The dependency runs one way: the harness imports nemeses, never the reverse. What a fault needs of
the harness is written here as protocols (``ClusterDB``, ``Shell``, ``CommandResult``), which
``harness.db.KafkaDB`` and ``harness.remote.Remote`` satisfy (mypy checks it where the runner hands
its DB to ``nemeses.build``); ``tests/nemeses/test_layering.py`` fails if a nemesis imports the
harness again.

Targets (for process, clock and packet faults): ``one``, ``minority``, ``majority``, ``all``,
``leader`` (of a key, default the test's first key), ``controller``, ``coordinator`` (of the
test's consumer group, ``test["group"]``), ``txn-coordinator`` (the transaction coordinator of
one of the test's transactional ids, ``test["transactional_ids"]``, drawn with the seeded
random; FindCoordinator with key type TRANSACTION); ``resolve_targets`` turns a
target into node names with a seeded ``random.Random`` so a run is reproducible given the same
cluster answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

#: the brokers' client port (harness.db's BROKER_PORT: nemeses do not import the harness)
BROKER_PORT = 9092

TARGETS: tuple[str, ...] = (
    "one",
    "minority",
    "majority",
    "all",
    "leader",
    "controller",
    "coordinator",
    "txn-coordinator",
)


class NemesisError(Exception):
    """A fault cannot be injected here; the message says why and what to do."""


class CommandResult(Protocol):
    """The outcome of one shell command on a node."""

    @property
    def ok(self) -> bool: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...

    def check(self) -> Any: ...


class NodeAddress(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def host(self) -> str: ...


class Shell(Protocol):
    """A shell on one node: all a fault needs of the harness's SSH layer."""

    @property
    def node(self) -> NodeAddress: ...

    def exec(self, cmd: str, *, check: bool = True) -> CommandResult: ...


class ClusterDB(Protocol):
    """The part of ``harness.db.KafkaDB`` that nemeses use."""

    test: dict[str, Any]

    @property
    def names(self) -> list[str]: ...

    def remote(self, name: str) -> Shell: ...

    def leader_of(self, topic: str, partition: int) -> str | None: ...

    def replicas_of(self, topic: str, partition: int) -> tuple[str | None, list[str]]: ...

    def partition_state(self, topic: str, partition: int) -> tuple[str | None, list[str], int]: ...

    def controller(self) -> str | None: ...

    def coordinator(self, group: str) -> str | None: ...

    def txn_coordinator(self, transactional_id: str) -> str | None: ...

    def kill(self, node: str) -> bool: ...

    def start(self, node: str) -> int: ...

    def pause(self, node: str) -> bool: ...

    def resume(self, node: str) -> bool: ...

    def clock_offset_file(self, node: str) -> str: ...

    def clock_via_file(self, node: str) -> bool: ...


class Fault(Protocol):
    kind: str

    def start(self, value: Any) -> Any: ...

    def stop(self, value: Any) -> Any: ...

    def heal(self) -> Any: ...


def default_key(db: ClusterDB) -> str:
    keys = db.test.get("keys") or ["t0/0"]
    return str(keys[0])


def leader_node(db: ClusterDB, key: str | None) -> str | None:
    """The node the metadata names as leader of ``key`` (None when unknown or unreachable)."""
    topic, _, part = (key or default_key(db)).rpartition("/")
    try:
        return db.leader_of(topic, int(part))
    except Exception:
        return None


def coordinator_node(db: ClusterDB) -> str | None:
    """The coordinator of the test's consumer group (``test["group"]``): the broker leading
    the group's ``__consumer_offsets`` partition, as a FindCoordinator request names it. None
    when the test has no group or the cluster cannot tell (no leader, unreachable)."""
    group = db.test.get("group")
    if not group:
        return None
    try:
        return db.coordinator(str(group))
    except Exception:
        return None


def txn_coordinator_node(db: ClusterDB, rng: random.Random | None = None) -> str | None:
    """The transaction coordinator of one of the test's transactional ids
    (``test["transactional_ids"]``; drawn with ``rng``, the first without one): the broker
    leading the id's ``__transaction_state`` partition, as a FindCoordinator request (key type
    TRANSACTION) names it. None when the test has no transactional ids or the cluster cannot
    tell."""
    ids = [str(i) for i in db.test.get("transactional_ids") or ()]
    if not ids:
        return None
    tid = rng.choice(ids) if rng is not None else ids[0]
    try:
        return db.txn_coordinator(tid)
    except Exception:
        return None


def resolve_targets(
    target: str, db: ClusterDB, rng: random.Random, key: str | None = None
) -> list[str]:
    """Node names for ``target`` (see the module docstring); never empty."""
    nodes: Sequence[str] = db.names
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    n = len(nodes)
    if target == "one":
        return sorted(shuffled[:1])
    if target == "minority":
        return sorted(shuffled[: max(1, (n - 1) // 2)])
    if target == "majority":
        return sorted(shuffled[: n // 2 + 1])
    if target == "all":
        return sorted(nodes)
    if target == "leader":
        leader = leader_node(db, key)
        return [leader] if leader else sorted(shuffled[:1])
    if target == "controller":
        try:
            ctl = db.controller()
        except Exception:
            ctl = None
        return [ctl] if ctl else sorted(shuffled[:1])
    if target == "coordinator":
        coord = coordinator_node(db)
        return [coord] if coord else sorted(shuffled[:1])
    if target == "txn-coordinator":
        coord = txn_coordinator_node(db, rng)
        return [coord] if coord else sorted(shuffled[:1])
    raise NemesisError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
