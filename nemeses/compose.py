"""Composing faults into one nemesis, the schedule of nemesis ops, and healing everything.

``Nemesis`` (from ``build(kinds, db, test)``) routes each op by its ``f`` to one fault:
``start-<kind>`` / ``stop-<kind>`` for kind in ``KINDS``. ``invoke(op)`` returns the completion:
the same op with ``type`` ``info``, ``value`` what was done (for partitions ``{node: [nodes it
cannot reach]}``), and ``error`` (a message) when the fault could not be applied; it never
raises for a fault that failed on the cluster, since a nemesis op is information, not a verdict.
``active`` names the kinds currently injected (for the progress display).

``heal_all()`` (method, and module function ``heal_all(db)`` for a harness that lost its nemesis
object) undoes every kind of fault on every node whether or not this process injected it:
black-hole routes and our iptables chain, netem qdiscs, clock offsets, paused and dead brokers.
It is idempotent. ``healing(nemesis)`` is a context manager that runs it on the way out, also
when the block raises (an abort), and ``Nemesis.close()`` stops background work (a clock strobe).

``schedule(kinds, interval, seed, ...)`` is the nemesis generator: an endless iterator of op
dicts in Jepsen's shape. ``{"type": "sleep", "value": seconds}`` asks the interpreter to wait;
every other item is an invoke ``{"process": "nemesis", "type": "info", "f": ..., "value": ...}``.
It alternates start and stop of one fault at a time, sleeping a staggered ``interval`` (uniform
in [0.5, 1.5] x interval) before each op; the fault kind, shape, target and parameters are drawn
from ``random.Random(seed)``, so the same seed gives the same schedule. Targets default to
``DEFAULT_TARGETS``; with ``coordinator`` among them, partitions also draw the
``isolate-coordinator`` shape (only it, when every target is ``coordinator``), and with
``txn-coordinator`` the ``isolate-txn-coordinator`` shape alike. ``final_ops(kinds)``
lists the stop ops to run when the main phase ends (then ``heal_all`` as a safety net).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

from isrlab.nemeses.base import TARGETS, ClusterDB, Fault, NemesisError, default_key
from isrlab.nemeses.clock import ClockFault
from isrlab.nemeses.corrupt import CorruptFault
from isrlab.nemeses.corrupt import start_value as corrupt_value
from isrlab.nemeses.fsync import FsyncFailFault
from isrlab.nemeses.packet import PacketFault, check_available
from isrlab.nemeses.partition import DEFAULT_SHAPES, SHAPES, PartitionFault
from isrlab.nemeses.power import PowerFault
from isrlab.nemeses.process import LAG_HOWS, KillFault, LaggingFailoverFault, PauseFault
from isrlab.nemeses.targeted import (
    IsrSqueezeFault,
    LateProduceFault,
    LeaderFlapFault,
    ZkCutFault,
)

# The targets a schedule draws from when none are given (``coordinator`` needs a group).
DEFAULT_TARGETS: tuple[str, ...] = ("one", "minority", "leader", "controller")

KINDS: tuple[str, ...] = (
    "partition",
    "partition-iptables",
    "pause",
    "kill",
    "power",
    "power-torn",
    "power-zookeeper",
    "fsync-fail",
    "clock",
    "corrupt",
    "packet",
    "lagging-failover",
    "isr-squeeze",
    "leader-flap",
    "zk-cut",
    "late-produce",
)

#: the targeted schedules (nemeses.targeted): they watch the state znode and aim at one key
#: how isr-squeeze may fail the leader, and what a schedule draws from unless told
SQUEEZE_THEN: tuple[str, ...] = ("kill", "isolate", "power")
SQUEEZE_THEN_DEFAULT: tuple[str, ...] = ("kill", "isolate")
#: what leader-flap does to the followers between its two leader kills (a schedule draws one
#: per strike only when told which: unset, every strike restarts one, as before)
FLAP_FOLLOWER: tuple[str, ...] = ("restart", "cut", "diverge")
#: how lagging-failover holds the followers back (a schedule draws one per strike only when
#: told which: unset, every strike pauses them, as before): nemeses.process.LAG_HOWS
LAGGING_HOW: tuple[str, ...] = LAG_HOWS
TARGETED: tuple[str, ...] = ("isr-squeeze", "leader-flap", "zk-cut", "late-produce")

PACKET_BEHAVIOURS: tuple[dict[str, str], ...] = (
    {"delay": "50ms", "jitter": "10ms"},
    {"loss": "20%"},
    {"duplicate": "10%"},
    {"delay": "20ms", "reorder": "25%"},
)


def parse_kinds(kinds: str | Sequence[str] | None) -> list[str]:
    """``"partition,kill"`` or a list -> the kinds, checked; ``"none"`` / empty -> ``[]``."""
    if kinds is None:
        return []
    items = kinds.split(",") if isinstance(kinds, str) else list(kinds)
    out = []
    for k in (x.strip() for x in items):
        if not k or k == "none":
            continue
        if k not in KINDS:
            raise NemesisError(f"unknown nemesis {k!r}; use a comma list of {', '.join(KINDS)}")
        if k not in out:
            out.append(k)
    return out


class Nemesis:
    """Several faults behind one ``invoke``; see the module docstring."""

    def __init__(self, faults: dict[str, Fault], db: ClusterDB) -> None:
        self.faults = faults
        self.db = db
        self.active: set[str] = set()

    @property
    def kinds(self) -> list[str]:
        return list(self.faults)

    def invoke(self, op: dict[str, Any]) -> dict[str, Any]:
        f = str(op.get("f", ""))
        verb, _, kind = f.partition("-")
        done = {**op, "process": "nemesis", "type": "info"}
        fault = self.faults.get(kind)
        if verb not in ("start", "stop") or fault is None:
            done["error"] = f"no fault handles {f!r} (kinds: {', '.join(self.faults) or 'none'})"
            return done
        try:
            if verb == "start":
                done["value"] = fault.start(op.get("value"))
                self.active.add(kind)
            else:
                done["value"] = fault.stop(op.get("value"))
                self.active.discard(kind)
        except Exception as e:  # the history records it; heal_all repairs the cluster
            done["error"] = f"{type(e).__name__}: {e}"
        return done

    def heal_all(self) -> dict[str, Any]:
        """Undo every fault everywhere (idempotent); returns what had to be undone per kind."""
        out = heal_all(self.db, self.faults)
        self.active.clear()
        return out

    def close(self) -> None:
        for fault in self.faults.values():
            stop = getattr(fault, "_stop_strobe", None)
            if stop is not None:
                stop()


def build(kinds: str | Sequence[str], db: ClusterDB, test: dict[str, Any]) -> Nemesis:
    """The nemesis for ``kinds``; fails now (NemesisError) if one cannot work on this cluster."""
    wanted = parse_kinds(kinds)
    rng = random.Random(f"{test.get('seed', 0)}-nemesis")
    faults: dict[str, Fault] = {}
    for kind in wanted:
        if kind == "partition":
            faults[kind] = PartitionFault(db, rng, "route")
        elif kind == "partition-iptables":
            faults[kind] = PartitionFault(db, rng, "iptables")
        elif kind == "pause":
            faults[kind] = PauseFault(db, rng)
        elif kind == "kill":
            faults[kind] = KillFault(db, rng)
        elif kind in ("power", "power-torn", "power-zookeeper"):
            faults[kind] = PowerFault(
                db,  # type: ignore[arg-type]
                rng,
                zookeeper=kind == "power-zookeeper",
                torn=kind == "power-torn",
            )
        elif kind == "fsync-fail":
            faults[kind] = FsyncFailFault(db, rng)  # type: ignore[arg-type]
        elif kind == "clock":
            faults[kind] = ClockFault(db, rng)
        elif kind == "corrupt":
            faults[kind] = CorruptFault(db, rng)  # type: ignore[arg-type]
        elif kind == "packet":
            check_available(db)
            faults[kind] = PacketFault(db, rng)
        elif kind == "lagging-failover":
            faults[kind] = LaggingFailoverFault(db, rng)
        elif kind == "isr-squeeze":
            faults[kind] = IsrSqueezeFault(db, rng)
        elif kind == "leader-flap":
            faults[kind] = LeaderFlapFault(db, rng)
        elif kind == "zk-cut":
            faults[kind] = ZkCutFault(db, rng)
        elif kind == "late-produce":
            faults[kind] = LateProduceFault(db, rng)
    return Nemesis(faults, db)


def heal_all(db: ClusterDB, faults: dict[str, Fault] | None = None) -> dict[str, Any]:
    """Heal every kind of fault on every node of ``db`` (see the module docstring)."""
    faults = dict(faults or {})
    rng = random.Random(0)
    # fresh fault objects for kinds not built: healing must not depend on what this run used
    faults.setdefault("partition", PartitionFault(db, rng, "route"))
    faults.setdefault("packet", PacketFault(db, rng))
    faults.setdefault("clock", ClockFault(db, rng))
    faults.setdefault("pause", PauseFault(db, rng))
    faults.setdefault("kill", KillFault(db, rng))
    faults.setdefault("zk-cut", ZkCutFault(db, rng))
    faults.setdefault("late-produce", LateProduceFault(db, rng))
    faults.setdefault("lagging-failover", LaggingFailoverFault(db, rng))
    if hasattr(db, "set_fsync_failing"):  # a flag file left by a run that ended mid-fault
        faults.setdefault("fsync-fail", FsyncFailFault(db, rng))  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    errors: list[str] = []
    # network first (so restarted brokers find their peers), then clocks, then processes
    network = (
        "partition",
        "partition-iptables",
        "zk-cut",
        "late-produce",
        "lagging-failover",
        "isr-squeeze",
        "packet",
    )
    for kind in (
        *network,
        "leader-flap",
        "clock",
        "pause",
        "power-zookeeper",
        "power",
        "power-torn",
        "fsync-fail",
        "kill",
    ):
        fault = faults.get(kind)
        if fault is None:
            continue
        try:
            healed = fault.heal()
        except Exception as e:
            errors.append(f"{kind}: {type(e).__name__}: {e}")
            continue
        if healed:
            out[kind] = healed
    if errors:
        raise NemesisError("healing failed for " + "; ".join(errors))
    return out


@contextlib.contextmanager
def healing(nemesis: Nemesis) -> Iterator[Nemesis]:
    """Run the block, then ``close`` and ``heal_all`` whatever happened in it."""
    try:
        yield nemesis
    finally:
        nemesis.close()
        nemesis.heal_all()


def _op(f: str, value: Any) -> dict[str, Any]:
    return {"process": "nemesis", "type": "info", "f": f, "value": value}


def start_value(
    kind: str,
    rng: random.Random,
    targets: Sequence[str],
    shapes: Sequence[str],
    keys: Sequence[str],
    squeeze_then: Sequence[str] | None = None,
    flap_follower: Sequence[str] | None = None,
    lagging_how: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A random ``start-<kind>`` value (what the schedule draws). ``squeeze_then``: the ways
    isr-squeeze may fail the leader (default kill or isolate); ``flap_follower``: what
    leader-flap may do to the followers (default: no draw, restart, so old seeds replay);
    ``lagging_how``: how lagging-failover may hold the followers back (default: no draw,
    pause, so old seeds replay)."""
    if kind in TARGETED:
        # (targets do not apply: each aims at one key's leader and followers)
        targeted: dict[str, Any] = {}
        if keys:
            targeted["key"] = rng.choice(list(keys))
        if kind == "isr-squeeze":
            targeted["to"] = rng.choice(["min", "leader"])
            targeted["then"] = rng.choice(list(squeeze_then or SQUEEZE_THEN_DEFAULT))
        elif kind == "leader-flap":
            targeted["gap_ms"] = rng.choice([200, 500, 1000])
            if flap_follower:
                targeted["follower"] = rng.choice(list(flap_follower))
        return targeted
    if kind == "lagging-failover":
        # (targets do not apply: it always aims at one key's leader and followers)
        lagging: dict[str, Any] = {"lag_ms": rng.choice([1000, 2000, 3000])}
        if keys:
            lagging["key"] = rng.choice(list(keys))
        if lagging_how:
            lagging["how"] = rng.choice(list(lagging_how))
        return lagging
    if kind in ("partition", "partition-iptables"):
        shape = rng.choice(list(shapes))
        value: dict[str, Any] = {"shape": shape}
        if shape == "isolate-leader" and keys:
            value["key"] = rng.choice(list(keys))
        return value
    target = rng.choice(list(targets))
    if kind == "corrupt":
        return corrupt_value(rng, target, list(keys))
    value = {"target": target}
    if target == "leader" and keys:
        value["key"] = rng.choice(list(keys))
    if kind == "clock":
        value["mode"] = rng.choice(["bump", "strobe"])
        value["delta_ms"] = rng.choice([-1, 1]) * rng.randint(100, 60_000)
        if value["mode"] == "strobe":
            value["period_ms"] = rng.choice([100, 500, 1000])
    elif kind == "packet":
        value["behaviour"] = dict(rng.choice(PACKET_BEHAVIOURS))
    elif kind == "power-torn":
        value["torn_seed"] = rng.randrange(2**31)
    return value


def schedule(
    kinds: str | Sequence[str],
    interval: float,
    seed: int | str = 0,
    *,
    targets: Sequence[str] | None = None,
    shapes: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    squeeze_then: Sequence[str] | None = None,
    flap_follower: Sequence[str] | None = None,
    lagging_how: Sequence[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """The endless nemesis op stream (see the module docstring). Empty kinds: only sleeps."""
    wanted = parse_kinds(kinds)
    if interval <= 0:
        raise NemesisError(f"nemesis interval must be positive, not {interval}")
    tgts = list(targets or DEFAULT_TARGETS)
    bad = [t for t in tgts if t not in TARGETS]
    if bad:
        raise NemesisError(f"unknown target(s) {', '.join(bad)}; use {', '.join(TARGETS)}")
    shps = list(shapes or DEFAULT_SHAPES)
    if shapes is None and "coordinator" in tgts:
        # a schedule aimed at the group coordinator also cuts it off from the rest (only that,
        # when every target is the coordinator)
        coordinator_only = all(t == "coordinator" for t in tgts)
        shps = ["isolate-coordinator"] if coordinator_only else [*shps, "isolate-coordinator"]
    if shapes is None and "txn-coordinator" in tgts:
        # the same for the transaction coordinator
        if all(t == "txn-coordinator" for t in tgts):
            shps = ["isolate-txn-coordinator"]
        else:
            shps = [*shps, "isolate-txn-coordinator"]
    bad = [t for t in squeeze_then or () if t not in SQUEEZE_THEN]
    if bad:
        raise NemesisError(
            f"unknown isr-squeeze failure(s) {', '.join(bad)}; use {', '.join(SQUEEZE_THEN)}"
        )
    bad = [f for f in flap_follower or () if f not in FLAP_FOLLOWER]
    if bad:
        raise NemesisError(
            f"unknown leader-flap follower action(s) {', '.join(bad)}; "
            f"use {', '.join(FLAP_FOLLOWER)}"
        )
    bad = [h for h in lagging_how or () if h not in LAGGING_HOW]
    if bad:
        raise NemesisError(
            f"unknown lagging-failover way(s) {', '.join(bad)}; use {', '.join(LAGGING_HOW)}"
        )
    bad = [s for s in shps if s not in SHAPES]
    if bad:
        raise NemesisError(f"unknown shape(s) {', '.join(bad)}; use {', '.join(SHAPES)}")
    rng = random.Random(f"{seed}-schedule")
    key_list = list(keys or [])
    while True:
        yield {"type": "sleep", "value": round(interval * rng.uniform(0.5, 1.5), 3)}
        if not wanted:
            continue
        kind = rng.choice(wanted)
        value = start_value(
            kind, rng, tgts, shps, key_list, squeeze_then, flap_follower, lagging_how
        )
        yield _op(f"start-{kind}", value)
        yield {"type": "sleep", "value": round(interval * rng.uniform(0.5, 1.5), 3)}
        yield _op(f"stop-{kind}", None)


def final_ops(kinds: str | Sequence[str]) -> list[dict[str, Any]]:
    """Stop ops for every kind, to run when the main phase ends."""
    return [_op(f"stop-{k}", None) for k in parse_kinds(kinds)]


__all__ = [
    "DEFAULT_TARGETS",
    "KINDS",
    "TARGETED",
    "Nemesis",
    "build",
    "default_key",
    "final_ops",
    "heal_all",
    "healing",
    "parse_kinds",
    "schedule",
]
