"""The harness's nemesis on a simulated cluster: the same ops as `nemeses.compose.Nemesis`,
performed on a `SimCluster` instead of real nodes.

A run of the harness is driven by `nemeses.compose.schedule(kinds, interval, seed)`: sleeps and
``start-<kind>`` / ``stop-<kind>`` ops whose values `nemeses.compose.start_value` draws from the
seed. `SimNemesis.invoke(op)` takes those same ops and returns the completion the real
`Nemesis.invoke` would (``type`` ``info``, ``value`` shaped as the real fault's, ``error``
when the fault could not be applied), so a simulated history reads like a real one. Targets
are resolved by the real `nemeses.base.resolve_targets` and partition shapes drawn by the real
`nemeses.partition.grudge`, with a random generator seeded as `nemeses.compose.build` seeds
it (``f"{seed}-nemesis"``), over the simulated nodes (hosts ``n1..nN``) and what the
simulation knows of them (the leader of a key, the controller, a group's coordinator).

Kinds:

- ``partition`` (and ``partition-iptables``): the grudge on the simulated network
  (`SimCluster.partition`): segments into it are dropped (the routes and the iptables rules of
  a real run both drop them silently); ZooKeeper runs on the nodes, so a broker cut from a
  majority loses its session. Every shape the real fault draws, and ``{"grudge": ...}``.
- ``kill``: kill -9 (`SimCluster.crash`); ``stop-kill`` restarts the brokers it killed.
- ``pause``: SIGSTOP / SIGCONT (`SimCluster.pause` / `resume`).
- ``power``: the power loss of the targets' machines (`SimCluster.power_loss`: a crash, then
  each log dir cut back to what its fsync journal says reached disk; a target already down
  loses its page cache too); ``stop-power`` restarts the brokers it killed.
- ``clock``: the targets' wall clocks moved (`SimCluster.set_clock_offset`), ``bump`` once or
  ``strobe`` between the offset and 0 every ``period_ms`` (a task on the loop, in virtual
  time, where the real fault runs a thread); ``stop-clock`` puts every clock back.

Every other kind of `nemeses.compose.KINDS` (packet, corrupt, power-zookeeper, the targeted
ones) is refused when the nemesis is built (`NemesisError` naming it): the simulator has no
model of it yet.

`heal_all()` undoes every fault on the cluster whatever this nemesis did: the partition, the
clock offsets, the paused brokers, then the crashed ones restarted (a broker stopped cleanly
is left alone), as `nemeses.compose.heal_all` does to real nodes.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any, cast

from isrlab.broker.config import BrokerConfig
from isrlab.broker.coordinator.ownership import partition_for
from isrlab.harness.sim.cluster import CHROOT, SimCluster
from isrlab.nemeses.base import (
    ClusterDB,
    NemesisError,
    coordinator_node,
    leader_node,
    resolve_targets,
    txn_coordinator_node,
)
from isrlab.nemeses.clock import DEFAULT_MAX_SKEW_MS
from isrlab.nemeses.compose import KINDS, parse_kinds
from isrlab.nemeses.partition import Grudge, grudge

#: the kinds a simulated cluster can be given
SUPPORTED: tuple[str, ...] = ("partition", "partition-iptables", "kill", "pause", "power", "clock")


class SimTargets:
    """The cluster questions `nemeses.base.resolve_targets` and the partition shapes ask
    (`ClusterDB`'s ``test``, ``names``, ``leader_of``, ``controller``, ``coordinator``,
    ``txn_coordinator``), answered from the simulation's state."""

    def __init__(self, cluster: SimCluster, test: dict[str, Any]) -> None:
        self.cluster = cluster
        self.test = test

    @property
    def names(self) -> list[str]:
        return sorted(b.host for b in self.cluster.brokers.values())

    def host(self, broker_id: int | None) -> str | None:
        if broker_id is None or broker_id not in self.cluster.brokers:
            return None
        return self.cluster.brokers[broker_id].host

    def broker_id(self, node: str) -> int:
        for b in self.cluster.brokers.values():
            if b.host == node:
                return b.id
        raise NemesisError(f"no simulated node {node!r} (nodes: {', '.join(self.names)})")

    def leader_of(self, topic: str, partition: int) -> str | None:
        return self.host(self.cluster.leader_of((topic, partition)))

    def controller(self) -> str | None:
        node = self.cluster.ensemble.core.nodes.get(f"{CHROOT}/controller")
        if node is None:
            return None
        return self.host(int(json.loads(node.data)["brokerid"]))

    def _config(self, key: str) -> int:
        return int(BrokerConfig(next(iter(self.cluster.brokers.values())).config)[key])

    def coordinator(self, group: str) -> str | None:
        p = partition_for(group, self._config("offsets.topic.num.partitions"))
        return self.leader_of("__consumer_offsets", p)

    def txn_coordinator(self, transactional_id: str) -> str | None:
        p = partition_for(transactional_id, self._config("transaction.state.log.num.partitions"))
        return self.leader_of("__transaction_state", p)

    @property
    def db(self) -> ClusterDB:
        # the real functions read only the methods above of their ClusterDB
        return cast(ClusterDB, self)


class SimNemesis:
    """`nemeses.compose.Nemesis` for a `SimCluster` (see the module docstring). `test` is
    the test map the real nemesis gets (``seed``, ``keys``, ``group``,
    ``transactional_ids``, ``clock_max_skew_ms``)."""

    def __init__(
        self, cluster: SimCluster, kinds: str | Sequence[str], test: dict[str, Any] | None = None
    ) -> None:
        wanted = parse_kinds(kinds)
        unsupported = [k for k in wanted if k not in SUPPORTED]
        if unsupported:
            raise NemesisError(
                f"nemesis kind(s) {', '.join(unsupported)} not supported in the simulator "
                f"(it models {', '.join(SUPPORTED)} of {', '.join(KINDS)})"
            )
        if "power" in wanted:
            off = [
                b.id
                for b in cluster.brokers.values()
                if not BrokerConfig(b.config)["isrlab.power.journal.enable"]
            ]
            if off:
                raise NemesisError(
                    f"power needs the fsync journal, off on broker(s) {off} "
                    "(isrlab.power.journal.enable=false)"
                )
        self.cluster = cluster
        self.kinds = wanted
        self.test = dict(test or {})
        # as nemeses.compose.build seeds the faults' generator
        self.rng = random.Random(f"{self.test.get('seed', 0)}-nemesis")
        self.targets = SimTargets(cluster, self.test)
        self.active: set[str] = set()
        self.grudges: dict[str, Grudge] = {}  # partition kind -> its grudge
        self.killed: set[str] = set()
        self.power_killed: set[str] = set()
        self.paused: set[str] = set()
        self.offsets: dict[str, float] = {}
        self.max_skew_ms = int(self.test.get("clock_max_skew_ms") or DEFAULT_MAX_SKEW_MS)
        self._strobe: asyncio.Task[None] | None = None

    # ----- the ops -------------------------------------------------------------------------

    async def invoke(self, op: dict[str, Any]) -> dict[str, Any]:
        """The completion of the nemesis op `op` (as `nemeses.compose.Nemesis.invoke`)."""
        f = str(op.get("f", ""))
        verb, _, kind = f.partition("-")
        done = {**op, "process": "nemesis", "type": "info"}
        if verb not in ("start", "stop") or kind not in self.kinds:
            done["error"] = f"no fault handles {f!r} (kinds: {', '.join(self.kinds) or 'none'})"
            self._note(done)
            return done
        try:
            if verb == "start":
                done["value"] = await self._start(kind, op.get("value"))
                self.active.add(kind)
            else:
                done["value"] = await self._stop(kind)
                self.active.discard(kind)
        except Exception as e:  # the history records it; heal_all repairs the cluster
            done["error"] = f"{type(e).__name__}: {e}"
        self._note(done)
        return done

    def _note(self, done: dict[str, Any]) -> None:
        self.cluster.note(f"nemesis {json.dumps(done, sort_keys=True, default=str)}")

    async def _start(self, kind: str, value: Any) -> Any:
        value = dict(value or {})
        if kind in ("partition", "partition-iptables"):
            return self._start_partition(kind, value)
        target = str(value.get("target", "one"))
        if kind == "clock":
            return self._start_clock(value, target)
        nodes = resolve_targets(target, self.targets.db, self.rng, value.get("key"))
        if kind == "kill":
            hit = [n for n in nodes if self._crash(n)]
            self.killed.update(hit)
            return {"target": target, "nodes": hit}
        if kind == "pause":
            hit = [n for n in nodes if self._pause(n)]
            self.paused.update(hit)
            return {"target": target, "nodes": hit}
        if kind == "power":
            return self._start_power(nodes, target)
        raise NemesisError(f"no simulated fault for {kind!r}")

    async def _stop(self, kind: str) -> Any:
        if kind in ("partition", "partition-iptables"):
            self.grudges.pop(kind, None)
            self.cluster.heal()
            return {n: [] for n in self.targets.names}
        if kind == "clock":
            return self._stop_clock()
        if kind == "pause":
            nodes = sorted(self.paused)
            for n in nodes:
                self.cluster.resume(self.targets.broker_id(n))
            self.paused.clear()
            return {"nodes": nodes}
        if kind in ("kill", "power"):
            killed = self.killed if kind == "kill" else self.power_killed
            nodes = sorted(killed)
            await self._restart(nodes)
            killed.clear()
            return {"nodes": nodes}
        raise NemesisError(f"no simulated fault for {kind!r}")

    # ----- partition -----------------------------------------------------------------------

    def _start_partition(self, kind: str, value: dict[str, Any]) -> Grudge:
        shape = str(value.get("shape", "halves"))
        db = self.targets.db
        if "grudge" in value:
            g: Grudge = {k: sorted(v) for k, v in value["grudge"].items()}
        else:
            victim = None
            if shape == "isolate-leader":
                victim = leader_node(db, value.get("key"))
            elif shape == "isolate-coordinator":
                victim = coordinator_node(db)
            elif shape == "isolate-txn-coordinator":
                victim = txn_coordinator_node(db, self.rng)
            g = grudge(shape, self.targets.names, self.rng, victim)
        current = {n: list(g.get(n, [])) for n in self.targets.names}
        self.cluster.heal()
        self.cluster.partition(current)
        self.grudges = {kind: current}
        return current

    # ----- processes -----------------------------------------------------------------------

    def _crash(self, node: str) -> bool:
        """kill -9 of the node's broker; whether it was running (as `db.kill`)."""
        broker_id = self.targets.broker_id(node)
        if not self.cluster.brokers[broker_id].alive:
            return False
        self.cluster.crash(broker_id)
        return True

    def _pause(self, node: str) -> bool:
        """SIGSTOP of the node's broker; whether there was a process to stop (as `db.pause`)."""
        broker_id = self.targets.broker_id(node)
        if not self.cluster.brokers[broker_id].alive:
            return False
        self.cluster.pause(broker_id)
        return True

    async def _restart(self, nodes: list[str]) -> None:
        """Start the brokers of `nodes` that are down (concurrently, as the real fault's
        threads do; a broker already running is left alone, as `db.start` does)."""
        ids = [self.targets.broker_id(n) for n in nodes]
        down = [i for i in ids if not self.cluster.brokers[i].alive]
        results = await asyncio.gather(
            *(self.cluster.restart(i) for i in down), return_exceptions=True
        )
        errors = [
            f"{self.cluster.brokers[i].host}: {r!r}"
            for i, r in zip(down, results, strict=True)
            if r is not None
        ]
        if errors:
            raise NemesisError("restart failed: " + "; ".join(errors))

    def _start_power(self, nodes: list[str], target: str) -> dict[str, Any]:
        killed = [n for n in nodes if self._crash(n)]
        self.power_killed.update(killed)
        # a broker already down (killed earlier) lost its power too: its log dir is cut as well
        down = [
            n
            for n in nodes
            if n in killed or self.cluster.brokers[self.targets.broker_id(n)].crashed
        ]
        summaries: dict[str, str] = {}
        errors: dict[str, str] = {}
        for n in down:
            try:
                reports = self.cluster.power_loss(self.targets.broker_id(n))
                summaries[n] = "\n".join(r.summary() for r in reports)
            except Exception as e:
                errors[n] = f"{type(e).__name__}: {e}"
        out: dict[str, Any] = {"target": target, "nodes": killed, "power_loss": summaries}
        if errors:
            out["error"] = "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
        return out

    # ----- clocks --------------------------------------------------------------------------

    def _set_offset(self, node: str, seconds: float) -> None:
        self.cluster.set_clock_offset(self.targets.broker_id(node), seconds)
        self.offsets[node] = seconds

    def _delta_ms(self, value: dict[str, Any]) -> float:
        if value.get("delta_ms") is not None:
            return float(value["delta_ms"])
        return float(self.rng.randint(-self.max_skew_ms, self.max_skew_ms))

    def _start_clock(self, value: dict[str, Any], target: str) -> dict[str, Any]:
        mode = str(value.get("mode", "bump"))
        if mode not in ("bump", "strobe"):
            raise NemesisError(f"unknown clock mode {mode!r}; use bump or strobe")
        nodes = resolve_targets(target, self.targets.db, self.rng, value.get("key"))
        if mode == "bump":
            offsets = {}
            delta = self._delta_ms(value)
            for n in nodes:
                d = self._delta_ms({}) if value.get("per_node") else delta
                offsets[n] = self.offsets.get(n, 0.0) + d / 1000.0
            for n in nodes:
                self._set_offset(n, offsets[n])
            return {"mode": mode, "target": target, "offsets": offsets}
        delta_s = self._delta_ms(value) / 1000.0
        period_s = float(value.get("period_ms", 500)) / 1000.0
        self._stop_strobe()
        for n in nodes:  # high at once, as the real strobe's thread starts
            self._set_offset(n, delta_s)
        self._strobe = asyncio.get_running_loop().create_task(
            self._strobe_loop(nodes, delta_s, period_s)
        )
        return {
            "mode": mode,
            "target": target,
            "offsets": dict.fromkeys(nodes, delta_s),
            "period_ms": period_s * 1000,
        }

    async def _strobe_loop(self, nodes: list[str], delta_s: float, period_s: float) -> None:
        """Every `period_s` (virtual) the targets' offsets flip between `delta_s` and 0."""
        high = True
        while True:
            await asyncio.sleep(period_s)
            high = not high
            for n in nodes:
                self._set_offset(n, delta_s if high else 0.0)

    def _stop_strobe(self) -> None:
        if self._strobe is not None:
            self._strobe.cancel()
            self._strobe = None

    def _stop_clock(self) -> dict[str, Any]:
        self._stop_strobe()
        names = self.targets.names
        skewed = sorted(
            n for n in names if self.cluster.brokers[self.targets.broker_id(n)].clock_offset != 0
        )
        for n in names:
            self._set_offset(n, 0.0)
        return {"nodes": skewed, "offsets": dict.fromkeys(names, 0.0)}

    # ----- healing -------------------------------------------------------------------------

    async def heal_all(self) -> dict[str, Any]:
        """Undo every fault on the cluster, whatever this nemesis did (see the module
        docstring); what had to be undone, per kind (as `nemeses.compose.heal_all`)."""
        out: dict[str, Any] = {}
        cut = dict(self.cluster.net.grudge)
        self.cluster.heal()
        self.grudges.clear()
        if cut:
            out["partition"] = cut
        skewed = self._stop_clock()["nodes"]
        if skewed:
            out["clock"] = skewed
        paused = [b.host for b in self.cluster.brokers.values() if b.paused]
        for n in paused:
            self.cluster.resume(self.targets.broker_id(n))
        self.paused.clear()
        if paused:
            out["pause"] = paused
        dead = [b.host for b in self.cluster.brokers.values() if b.crashed and not b.alive]
        await self._restart(dead)
        self.killed.clear()
        self.power_killed.clear()
        if dead:
            out["power" if "power" in self.kinds else "kill"] = dead
        self.active.clear()
        return out

    def close(self) -> None:
        """Stop background work (a clock strobe)."""
        self._stop_strobe()


__all__ = ["SUPPORTED", "SimNemesis", "SimTargets"]
