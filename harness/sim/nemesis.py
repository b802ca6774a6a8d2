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
- ``power-torn``: the same with torn tails (`nemeses.power`: each node's files keep part of
  what they never synced, drawn from the start value's ``torn_seed`` and the node's name).
- ``fsync-fail``: every fsync of the targets' brokers fails with EIO (`durable.fsync_fails`,
  the flag `nemeses.fsyncshim` watches on real nodes); a broker halts at its first failed
  segment fsync; ``stop-fsync-fail`` makes fsyncs work and starts the halted brokers.
- ``clock``: the targets' wall clocks moved (`SimCluster.set_clock_offset`), ``bump`` once or
  ``strobe`` between the offset and 0 every ``period_ms`` (a task on the loop, in virtual
  time, where the real fault runs a thread); ``stop-clock`` puts every clock back.

- ``isr-squeeze``, ``leader-flap`` (``follower`` restart, cut or diverge) and ``zk-cut``: the
  sequences of `nemeses.targeted`, step for step, as coroutines on the loop (the real faults
  are synchronous, with injectable ``sleep``/``clock``): the state znode read from the
  ensemble every `POLL_S` virtual seconds while waiting (`SimTargets.partition_state`), the
  election order from the topic znode (`SimTargets.assignment`), the same draws from the
  generator, the real faults' completion values. A whole strike runs in ``start-<kind>``;
  where the real one calls ``db.start`` the broker is started without waiting for its
  registration (the daemon is started and the call returns), while ``stop-<kind>`` starts what
  the kind killed and waits (``KillFault.stop``). A targeted cut is the kind's own grudge,
  imposed with the partition kinds' (their union); ``zk-cut`` cuts the leader's ZooKeeper
  client only (`SimCluster.cut_zookeeper`).

- ``late-produce`` (`nemeses.targeted.LateProduceFault`, in virtual time): the clients' TCP to
  the key's leader's broker port dropped (`SimNetwork.cut_port`, the real ``-s CLIENT --dport
  9092 -j DROP``; the clients are every host that is not a broker's, the control host of a
  real run) for ``hold_s`` (default op_timeout_ms + 2.5 s), then only their SYNs for
  ``release_s`` (default 3 s), then nothing. A request held on an open connection is
  retransmitted on Linux's backoff and arrives once the first rule is gone
  (`harness.sim.network`): after its transaction was aborted.
- ``lagging-failover`` (`nemeses.process.LaggingFailoverFault`): the key's in-sync followers
  (the state znode's ISR) held back, ``how`` ``pause`` (SIGSTOP) or ``cut`` (their
  connections to the leader's broker port dropped both ways, on the leader's node), for
  ``lag_ms``, then the leader killed and the followers let go; ``stop-lagging-failover``
  starts the leader again.

- ``packet`` (`nemeses.packet.PacketFault`): a netem qdisc on each target node's egress
  (`SimNetwork.netem`; the per-packet model is `harness.sim.netem`'s and
  `harness.sim.network`'s), the behaviour (default `DEFAULT_BEHAVIOUR`, 50 ms +- 10 ms)
  checked by the real `netem_args`, the targets resolved as the real fault resolves them
  (default ``all``); ``stop-packet`` clears every node's qdisc. ``rate`` is refused (the
  model has no bandwidth). The simulated ZooKeeper sessions do not go through `SimNetwork`,
  so netem does not delay a node's ZooKeeper traffic as it does on a real node.

- ``corrupt`` (`nemeses.corrupt.CorruptFault` itself, `harness.sim.corrupt`): the simulated
  brokers' log dirs are real directories of the run, so the real fault damages them (bit
  flips, cuts, an old disk copied aside and put back) through a local shell, one node after
  another; its kill is the simulated kill -9 and its start does not wait for the
  registration. A damaged segment is left out of the invariants' data comparison.

Every other kind of `nemeses.compose.KINDS` (power-zookeeper: the simulated ensemble is one
server) is refused when the nemesis is built (`NemesisError` naming it).

`heal_all()` undoes every fault on the cluster whatever this nemesis did: the partition (and
the targeted cuts), the port rules, the ZooKeeper cuts, the netem qdiscs, the clock offsets, the paused brokers, then the crashed ones restarted (a broker stopped cleanly
is left alone), as `nemeses.compose.heal_all` does to real nodes.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

from isrlab.broker.config import BrokerConfig
from isrlab.broker.coordinator.ownership import partition_for
from isrlab.harness.sim.cluster import CHROOT, SimCluster
from isrlab.harness.sim.corrupt import SimCorrupt
from isrlab.harness.sim.netem import Netem
from isrlab.harness.sim.network import PortCut
from isrlab.nemeses.base import (
    BROKER_PORT,
    ClusterDB,
    NemesisError,
    coordinator_node,
    default_key,
    leader_node,
    resolve_targets,
    txn_coordinator_node,
)
from isrlab.nemeses.clock import DEFAULT_MAX_SKEW_MS
from isrlab.nemeses.compose import KINDS, parse_kinds
from isrlab.nemeses.packet import DEFAULT_BEHAVIOUR
from isrlab.nemeses.partition import Grudge, grudge
from isrlab.nemeses.power import node_torn_seed
from isrlab.nemeses.process import LAG_HOWS

#: the kinds a simulated cluster can be given
SUPPORTED: tuple[str, ...] = (
    "partition",
    "partition-iptables",
    "kill",
    "pause",
    "power",
    "power-torn",
    "fsync-fail",
    "clock",
    "isr-squeeze",
    "leader-flap",
    "zk-cut",
    "late-produce",
    "lagging-failover",
    "packet",
    "corrupt",
)
#: the targeted kinds (`nemeses.targeted`) among them: one sequence each, run in `start`
TARGETED_SIM: tuple[str, ...] = ("isr-squeeze", "leader-flap", "zk-cut", "late-produce")
#: the kinds that keep their own killed and paused brokers (the real faults' own `KillFault`)
_OWN_PROCESSES: tuple[str, ...] = (*TARGETED_SIM, "lagging-failover")
#: how often the targeted faults read the state znode (`nemeses.targeted.POLL_S`)
POLL_S = 0.25


def _split(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition("/")
    return topic, int(part)


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

    def _znode(self, path: str) -> Any:
        node = self.cluster.ensemble.core.nodes.get(f"{CHROOT}{path}")
        if node is None:
            raise KeyError(f"no znode {path}")
        return json.loads(node.data)

    def partition_state(self, topic: str, partition: int) -> tuple[str | None, list[str], int]:
        """(leader node, ISR nodes, leader epoch) as the controller last wrote them in the
        partition's state znode (`harness.db.DB.partition_state`), read from the ensemble."""
        state = self._znode(f"/brokers/topics/{topic}/partitions/{partition}/state")
        leader = int(state["leader"])
        isr = [n for n in (self.host(int(b)) for b in state["isr"]) if n]
        return (self.host(leader) if leader >= 0 else None), isr, int(state["leader_epoch"])

    def assignment(self, topic: str, partition: int) -> list[str]:
        """The assigned replicas of the partition in order, from the topic znode
        (`harness.db.DB.assignment`): the order the controller elects from."""
        replicas = self._znode(f"/brokers/topics/{topic}")["partitions"][str(partition)]
        return [n for n in (self.host(int(b)) for b in replicas) if n]

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
        if "power" in wanted or "power-torn" in wanted:
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
        #: the brokers each power kind (power, power-torn) took down, started by its stop
        self.power_killed: dict[str, set[str]] = {"power": set(), "power-torn": set()}
        self.paused: set[str] = set()
        self.offsets: dict[str, float] = {}
        self.max_skew_ms = int(self.test.get("clock_max_skew_ms") or DEFAULT_MAX_SKEW_MS)
        self._strobe: asyncio.Task[None] | None = None
        # the targeted kinds' own bookkeeping, per kind (as each real fault keeps its own)
        self.cuts: dict[str, Grudge] = {}  # a targeted kind's network cut
        self.t_killed: dict[str, set[str]] = {k: set() for k in _OWN_PROCESSES}
        self.t_paused: dict[str, set[str]] = {k: set() for k in _OWN_PROCESSES}
        self.port_cuts: dict[str, list[PortCut]] = {}  # a kind's iptables-shaped port rules
        self.zk_cut: set[str] = set()
        self._starts: list[asyncio.Task[None]] = []
        self.corrupt = SimCorrupt(self) if "corrupt" in wanted else None

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
        if kind == "isr-squeeze":
            return await self._start_isr_squeeze(value)
        if kind == "leader-flap":
            return await self._start_leader_flap(value)
        if kind == "zk-cut":
            return self._start_zk_cut(value)
        if kind == "late-produce":
            return await self._start_late_produce(value)
        if kind == "lagging-failover":
            return await self._start_lagging_failover(value)
        if kind == "packet":
            return self._start_packet(value)
        if kind == "corrupt":
            assert self.corrupt is not None
            return self.corrupt.start(value)
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
        if kind in ("power", "power-torn"):
            return self._start_power(kind, nodes, target, value)
        if kind == "fsync-fail":
            for n in nodes:
                self.cluster.brokers[self.targets.broker_id(n)].fsync_failing = True
            self.cluster.note(f"fsync-fail on {', '.join(sorted(nodes))}")
            return {"target": target, "nodes": nodes}
        raise NemesisError(f"no simulated fault for {kind!r}")

    async def _stop(self, kind: str) -> Any:
        if kind in ("partition", "partition-iptables"):
            self.grudges.pop(kind, None)
            self._apply_grudges()
            return {n: [] for n in self.targets.names}
        if kind == "isr-squeeze":
            return await self._stop_isr_squeeze()
        if kind == "leader-flap":
            return await self._stop_leader_flap()
        if kind == "zk-cut":
            return self._stop_zk_cut()
        if kind == "late-produce":
            return {"nodes": self._uncut_ports(kind)}
        if kind == "lagging-failover":
            self._uncut_ports(kind)  # a start that failed before removing its rules
            return await self._t_stop_kills(kind)
        if kind == "clock":
            return self._stop_clock()
        if kind == "packet":
            return {"nodes": self._clear_packet()}
        if kind == "corrupt":
            assert self.corrupt is not None
            return self.corrupt.stop()
        if kind == "pause":
            nodes = sorted(self.paused)
            for n in nodes:
                self.cluster.resume(self.targets.broker_id(n))
            self.paused.clear()
            return {"nodes": nodes}
        if kind == "fsync-fail":
            nodes = sorted(b.host for b in self.cluster.brokers.values() if b.fsync_failing)
            return {"nodes": nodes, "started": await self._repair_fsync(nodes)}
        if kind in ("kill", "power", "power-torn"):
            killed = self.killed if kind == "kill" else self.power_killed[kind]
            nodes = sorted(killed)
            await self._restart(nodes)
            killed.clear()
            return {"nodes": nodes}
        raise NemesisError(f"no simulated fault for {kind!r}")

    # ----- partition -----------------------------------------------------------------------

    def _grudge_of(self, value: dict[str, Any]) -> Grudge:
        """The grudge `nemeses.partition.PartitionFault.start` imposes for `value`, over
        every node (drawn with this nemesis's generator)."""
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
        return {n: list(g.get(n, [])) for n in self.targets.names}

    def _start_partition(self, kind: str, value: dict[str, Any]) -> Grudge:
        current = self._grudge_of(value)
        self.grudges = {kind: current}
        self._apply_grudges()
        return current

    def _apply_grudges(self) -> None:
        """Impose the union of the partition kinds' grudge and the targeted kinds' cuts (each
        fault's own rules, as routes and chains of several faults add up on real nodes)."""
        merged: dict[str, set[str]] = {}
        for g in [*self.grudges.values(), *self.cuts.values()]:
            for a, bs in g.items():
                merged.setdefault(a, set()).update(bs)
        self.cluster.heal()
        if any(merged.values()):
            self.cluster.partition({a: sorted(bs) for a, bs in sorted(merged.items())})

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
            f"{self.cluster.brokers[i].host}: {self.cluster.scrub(repr(r))}"
            for i, r in zip(down, results, strict=True)
            if r is not None
        ]
        if errors:
            raise NemesisError("restart failed: " + "; ".join(errors))

    async def _repair_fsync(self, nodes: list[str]) -> list[str]:
        """`nemeses.fsync.FsyncFailFault._repair`: fsyncs work again on `nodes`, and their
        brokers that are down (halted) are started."""
        for n in nodes:
            self.cluster.brokers[self.targets.broker_id(n)].fsync_failing = False
        down = [n for n in nodes if self.cluster.brokers[self.targets.broker_id(n)].crashed]
        await self._restart(down)
        return down

    def _start_power(
        self, kind: str, nodes: list[str], target: str, value: dict[str, Any]
    ) -> dict[str, Any]:
        """`nemeses.power.PowerFault.start` on simulated brokers (``power-torn``: each node's
        files torn with its own seed, `nemeses.power.node_torn_seed`)."""
        torn_seed: int | None = None
        if kind == "power-torn":
            torn_seed = int(value.get("torn_seed", self.rng.randrange(2**31)))
        killed = [n for n in nodes if self._crash(n)]
        self.power_killed[kind].update(killed)
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
                seed = None if torn_seed is None else node_torn_seed(torn_seed, n)
                reports = self.cluster.power_loss(self.targets.broker_id(n), torn_seed=seed)
                summaries[n] = "\n".join(r.summary() for r in reports)
            except Exception as e:
                errors[n] = f"{type(e).__name__}: {e}"
        out: dict[str, Any] = {"target": target, "nodes": killed, "power_loss": summaries}
        if torn_seed is not None:
            out["torn_seed"] = torn_seed
        if errors:
            out["error"] = "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
        return out

    # ----- the targeted kinds (nemeses.targeted, in virtual time) ---------------------------

    def _state(self, key: str) -> tuple[str | None, list[str], int] | None:
        try:
            return self.targets.partition_state(*_split(key))
        except Exception:
            return None

    async def _wait_for(
        self, key: str, done: Callable[[tuple[str | None, list[str], int]], bool], wait_s: float
    ) -> tuple[tuple[str | None, list[str], int] | None, float]:
        """Read the state znode every `POLL_S` (virtual) until `done(state)` or `wait_s`;
        (last state, seconds waited), as `nemeses.targeted._Watching.wait_for`."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        state = self._state(key)
        while (state is None or not done(state)) and loop.time() - start < wait_s:
            await asyncio.sleep(POLL_S)
            state = self._state(key)
        return state, round(loop.time() - start, 3)

    def _t_kill(self, kind: str, node: str) -> bool:
        if self._crash(node):
            self.t_killed[kind].add(node)
            return True
        return False

    def _t_pause(self, kind: str, nodes: list[str]) -> list[str]:
        hit = [n for n in nodes if self._pause(n)]
        self.t_paused[kind].update(hit)
        return hit

    def _t_resume(self, kind: str, nodes: list[str]) -> None:
        for n in nodes:
            self.cluster.resume(self.targets.broker_id(n))
            self.t_paused[kind].discard(n)

    def _spawn_start(self, node: str) -> None:
        """Start `node`'s broker and go on at once, as `db.start` starts the daemon and
        returns without waiting for it to register (a broker that fails to start is down,
        crashed: heal_all starts it again)."""
        broker_id = self.targets.broker_id(node)
        if self.cluster.brokers[broker_id].alive:
            return

        async def start() -> None:
            try:
                await self.cluster.restart(broker_id)
            except Exception as e:
                self.cluster.note(f"nemesis start of {node} failed: {self.cluster.scrub(repr(e))}")

        self._starts.append(asyncio.get_running_loop().create_task(start()))

    async def _t_stop_kills(self, kind: str) -> dict[str, Any]:
        """The real fault's ``_kills.stop``: start every broker it killed."""
        nodes = sorted(self.t_killed[kind])
        await self._restart(nodes)
        self.t_killed[kind].clear()
        return {"nodes": nodes}

    def _t_cut(self, kind: str, g: Grudge | None) -> Grudge:
        """Impose (None: heal) `kind`'s own cut; the real `PartitionFault.start`/`stop`
        value: the grudge over every node."""
        if g is None:
            self.cuts.pop(kind, None)
            self._apply_grudges()
            return {n: [] for n in self.targets.names}
        current = {n: list(g.get(n, [])) for n in self.targets.names}
        self.cuts[kind] = current
        self._apply_grudges()
        return current

    async def _start_isr_squeeze(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.targeted.IsrSqueezeFault.start`: followers SIGSTOPped until the state
        znode shows the ISR at ``to``'s size, then the leader killed, isolated or powered
        off, and the followers resumed."""
        kind = "isr-squeeze"
        key = str(value.get("key") or default_key(self.targets.db))
        to = str(value.get("to", "min"))
        then = str(value.get("then", "kill"))
        lag_ms = int(self.test.get("replica_lag_time_max_ms") or 10000)
        wait_s = float(value.get("wait_s", 3 * lag_ms / 1000))
        leader, isr, epoch = self._state(key) or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        target = 1 if to == "leader" else max(1, int(self.test.get("min_insync_replicas") or 1))
        followers = [n for n in isr if n != leader]
        victims = self.rng.sample(followers, max(0, len(isr) - target))
        out: dict[str, Any] = {
            "key": key,
            "to": to,
            "then": then,
            "leader": leader,
            "leader_epoch": epoch,
            "isr_before": isr,
        }
        if not victims:
            return {**out, "error": f"the ISR {isr} is already at {target}: nothing to squeeze"}
        paused = self._t_pause(kind, victims)
        try:
            seen, waited = await self._wait_for(
                key, lambda s: s[0] == leader and len(s[1]) <= target, wait_s
            )
            out.update(paused=paused, waited_s=waited, isr_at_failure=seen[1] if seen else None)
            if seen is None or seen[0] != leader or len(seen[1]) > target:
                return {**out, "error": f"the ISR did not shrink to {target} in {wait_s} s"}
            if then == "isolate":
                value = {"shape": "isolate-leader", "key": key}
                out["isolated"] = self._t_cut(kind, self._grudge_of(value))
            else:
                out["killed"] = leader if self._t_kill(kind, leader) else None
                if then == "power" and out["killed"] is not None:
                    try:  # before the followers resume: the leader is down, its files cut
                        reports = self.cluster.power_loss(self.targets.broker_id(leader))
                        out["power_loss"] = "\n".join(r.summary() for r in reports)
                    except Exception as e:
                        out["error"] = f"power loss of {leader}: {type(e).__name__}: {e}"
        finally:
            self._t_resume(kind, paused)
        return out

    async def _stop_isr_squeeze(self) -> dict[str, Any]:
        out = await self._t_stop_kills("isr-squeeze")
        if "isr-squeeze" in self.cuts:
            out["healed"] = self._t_cut("isr-squeeze", None)
        return out

    async def _start_leader_flap(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.targeted.LeaderFlapFault.start`: two leader changes in quick succession
        (``follower`` restart, cut or diverge; see that module)."""
        kind = "leader-flap"
        key = str(value.get("key") or default_key(self.targets.db))
        gap_ms = int(value.get("gap_ms", 500))
        wait_s = float(value.get("wait_s", 30))
        follower = str(value.get("follower", "restart"))
        first, isr, epoch = self._state(key) or (None, [], -1)
        if first is None:
            return {"key": key, "error": "no leader in the state znode"}
        out: dict[str, Any] = {"key": key, "gap_ms": gap_ms, "leaders": [first], "epochs": [epoch]}
        if follower == "cut":
            out["follower"] = "cut"
            return await self._flap_with_a_cut(key, first, isr, gap_ms, wait_s, out)
        if follower == "diverge":
            out["follower"] = "diverge"
            return await self._flap_to_diverge(key, first, isr, value, wait_s, out)
        if len(isr) < 2:
            return {**out, "error": f"the ISR {isr} has no follower to take over"}
        self._t_kill(kind, first)
        seen, waited = await self._wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        if seen is None or seen[0] in (None, first):
            return {**out, "error": f"no new leader within {wait_s} s"}
        second = seen[0]
        out["leaders"].append(second)
        out["epochs"].append(seen[2])
        restarted = [n for n in seen[1] if n not in (first, second)]
        if restarted:
            node = self.rng.choice(restarted)
            self._crash(node)  # db.kill and db.start: not the fault's to start again
            self._spawn_start(node)
            out["restarted"] = node
        return await self._kill_the_second(key, second, gap_ms, wait_s, waited, out)

    async def _kill_the_second(
        self, key: str, second: str, gap_ms: int, wait_s: float, waited: float, out: dict[str, Any]
    ) -> dict[str, Any]:
        await asyncio.sleep(gap_ms / 1000)
        self._t_kill("leader-flap", second)
        third, waited2 = await self._wait_for(key, lambda s: s[0] not in (None, second), wait_s)
        out["waited_s"] = round(waited + waited2, 3)
        if third is not None and third[0] is not None:
            out["leaders"].append(third[0])
            out["epochs"].append(third[2])
        return out

    async def _flap_with_a_cut(
        self, key: str, first: str, isr: list[str], gap_ms: int, wait_s: float, out: dict[str, Any]
    ) -> dict[str, Any]:
        followers = [n for n in isr if n != first]
        if len(followers) < 2:
            return {**out, "error": f"the ISR {isr} has no two followers to cut apart"}
        pair = sorted(self.rng.sample(followers, 2))
        b, c = pair
        out["cut"] = pair
        self._t_cut("leader-flap", {b: [c], c: [b]})
        self._t_kill("leader-flap", first)
        seen, waited = await self._wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        out["waited_s"] = waited
        if seen is None or seen[0] in (None, first):
            return {**out, "error": f"no new leader within {wait_s} s"}
        second = seen[0]
        out["leaders"].append(second)
        out["epochs"].append(seen[2])
        out["isr_at_second_kill"] = seen[1]
        if second not in pair:
            return {**out, "error": f"{second} was elected, not one of the cut pair {pair}"}
        out["truncating"] = c if second == b else b
        return await self._kill_the_second(key, second, gap_ms, wait_s, waited, out)

    def _succession(self, key: str, isr: list[str]) -> list[str]:
        try:
            order = self.targets.assignment(*_split(key))
        except Exception:
            order = []
        ranked = [n for n in order if n in isr]
        return ranked if len(ranked) == len(isr) else list(isr)

    async def _flap_to_diverge(
        self,
        key: str,
        first: str,
        isr: list[str],
        value: dict[str, Any],
        wait_s: float,
        out: dict[str, Any],
    ) -> dict[str, Any]:
        """``follower: diverge`` (KIP-279's scenario): see `nemeses.targeted`."""
        kind = "leader-flap"
        lag_ms = int(value.get("lag_ms", 500))
        lead_ms = int(value.get("lead_ms", max(int(value.get("gap_ms", 500)), 1500)))
        followers = [n for n in self._succession(key, isr) if n != first]
        if len(followers) != 2:
            return {**out, "error": f"the ISR {isr} has not exactly two followers"}
        b, c = followers
        out.update(cut=sorted(followers), lagging=b, lag_ms=lag_ms, lead_ms=lead_ms)
        self._t_cut(kind, {b: [c], c: [b]})
        paused = self._t_pause(kind, [b])
        try:
            await asyncio.sleep(lag_ms / 1000)
            self._t_kill(kind, first)
        finally:
            self._t_resume(kind, paused)
        seen, waited = await self._wait_for(key, lambda s: s[0] not in (None, first), wait_s)
        out["waited_s"] = waited
        if seen is None or seen[0] != b:
            elected = None if seen is None else seen[0]
            return {**out, "error": f"{elected} was elected, not the lagging follower {b}"}
        out["leaders"].append(b)
        out["epochs"].append(seen[2])
        await asyncio.sleep(lead_ms / 1000)
        self._t_kill(kind, b)
        seen, waited2 = await self._wait_for(key, lambda s: s[0] not in (None, b), wait_s)
        out["waited_s"] = round(waited + waited2, 3)
        if seen is None or seen[0] != c:
            elected = None if seen is None else seen[0]
            return {**out, "error": f"{elected} was elected after {b}, not {c}"}
        out["leaders"].append(c)
        out["epochs"].append(seen[2])
        out["healed"] = self._t_cut(kind, None)
        self._spawn_start(b)
        self.t_killed[kind].discard(b)
        seen, waited3 = await self._wait_for(key, lambda s: s[0] == c and b in s[1], wait_s)
        out["waited_s"] = round(waited + waited2 + waited3, 3)
        if seen is None or b not in seen[1]:
            return {**out, "error": f"{b} did not rejoin {c}'s ISR within {wait_s} s"}
        out["isr_at_third_kill"] = seen[1]
        await asyncio.sleep(lag_ms / 1000)
        self._t_kill(kind, c)
        seen, waited4 = await self._wait_for(key, lambda s: s[0] not in (None, c), wait_s)
        out["waited_s"] = round(waited + waited2 + waited3 + waited4, 3)
        if seen is not None and seen[0] is not None:
            out["leaders"].append(seen[0])
            out["epochs"].append(seen[2])
        return out

    async def _stop_leader_flap(self) -> dict[str, Any]:
        healed = None
        if "leader-flap" in self.cuts:  # the cut first, so the brokers started find their peers
            healed = self._t_cut("leader-flap", None)
        out = await self._t_stop_kills("leader-flap")
        if healed is not None:
            out["healed"] = healed
        return out

    def _start_zk_cut(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.targeted.ZkCutFault.start`: the key's leader cut off from ZooKeeper only
        (`SimCluster.cut_zookeeper`: its session's traffic, nothing else), and one in-sync
        follower SIGSTOPped unless ``pause_follower`` is false."""
        key = str(value.get("key") or default_key(self.targets.db))
        leader, isr, epoch = self._state(key) or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        self.cluster.cut_zookeeper(self.targets.broker_id(leader))
        self.zk_cut.add(leader)
        out: dict[str, Any] = {"key": key, "leader": leader, "leader_epoch": epoch, "isr": isr}
        followers = [n for n in isr if n != leader]
        if value.get("pause_follower", True) and followers:
            out["paused"] = self._t_pause("zk-cut", [self.rng.choice(followers)])
        return out

    def _stop_zk_cut(self) -> dict[str, Any]:
        nodes = sorted(self.zk_cut)
        for n in nodes:
            self.cluster.heal_zookeeper(self.targets.broker_id(n))
        self.zk_cut.clear()
        paused = sorted(self.t_paused["zk-cut"])
        self._t_resume("zk-cut", paused)
        return {"nodes": nodes, "resumed": paused}

    # ----- port rules: late-produce, lagging-failover's cut ---------------------------------

    def _cut_port(
        self,
        kind: str,
        host: str,
        sources: Collection[str] | Callable[[str], bool],
        label: str,
        **how: bool,
    ) -> PortCut:
        cut = self.cluster.net.cut_port(host, BROKER_PORT, sources, label=label, **how)
        self.port_cuts.setdefault(kind, []).append(cut)
        return cut

    def _uncut_port(self, kind: str, cut: PortCut) -> None:
        self.cluster.net.uncut_port(cut)
        cuts = self.port_cuts.get(kind, [])
        if cut in cuts:
            cuts.remove(cut)
        if not cuts:
            self.port_cuts.pop(kind, None)

    def _uncut_ports(self, kind: str) -> list[str]:
        """Remove every port rule `kind` left (a start that failed midway); their nodes."""
        cuts = self.port_cuts.pop(kind, [])
        for cut in cuts:
            self.cluster.net.uncut_port(cut)
        return sorted({c.host for c in cuts})

    def _clients(
        self, value: dict[str, Any]
    ) -> tuple[Collection[str] | Callable[[str], bool], str]:
        """The sources late-produce cuts and their name: ``client`` (a host or a list of
        hosts) or, by default, every host that is not a broker's: the simulated clients
        (``client<thread>``) and the admin connection, the control host of a real run."""
        given = value.get("client")
        if given:
            hosts = [given] if isinstance(given, str) else [str(h) for h in given]
            return frozenset(hosts), ",".join(sorted(hosts))
        brokers = frozenset(self.targets.names)
        return (lambda host: host not in brokers), "control"

    async def _start_late_produce(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.targeted.LateProduceFault.start`: the clients' TCP to the key's leader's
        broker port dropped for ``hold_s`` (default op_timeout_ms + 2.5 s), then only their
        new connections (SYN) for ``release_s`` (default 3 s), then the rules removed. The
        requests held on open connections arrive at their first retransmission after the
        first rule goes (`harness.sim.network`), after their transactions were aborted."""
        kind = "late-produce"
        key = str(value.get("key") or default_key(self.targets.db))
        op_timeout_s = int(self.test.get("op_timeout_ms") or 10000) / 1000
        hold_s = float(value.get("hold_s", op_timeout_s + 2.5))
        release_s = float(value.get("release_s", 3.0))
        leader, isr, epoch = self._state(key) or (None, [], -1)
        if leader is None:
            return {"key": key, "error": "no leader in the state znode"}
        out: dict[str, Any] = {"key": key, "leader": leader, "leader_epoch": epoch, "isr": isr}
        sources, label = self._clients(value)
        out.update(client=label, port=BROKER_PORT)
        loop = asyncio.get_running_loop()
        try:
            # 1. hold: every segment of the clients to the leader's broker port is dropped
            hold = self._cut_port(kind, leader, sources, label)
            started = loop.time()
            await asyncio.sleep(hold_s)
            out["held_s"] = round(loop.time() - started, 3)
            # 2. release: new connections (SYN) still dropped, the held requests go through
            self._cut_port(kind, leader, sources, label, syn_only=True)
            self._uncut_port(kind, hold)
            released = loop.time()
            await asyncio.sleep(release_s)
            out["released_s"] = round(loop.time() - released, 3)
        finally:
            self._uncut_ports(kind)  # 3. heal
        after = self._state(key)
        out["leader_after"] = after[0] if after else None
        return out

    async def _start_lagging_failover(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.process.LaggingFailoverFault.start`: the key's in-sync followers held
        back (``how`` ``pause``: SIGSTOP; ``cut``: on the leader's node, their connections to
        its broker port dropped both ways), ``lag_ms``, the leader killed, the followers let
        go. The followers are the state znode's ISR (the real fault asks a broker's
        metadata, which the controller updates from that znode)."""
        kind = "lagging-failover"
        key = str(value.get("key") or default_key(self.targets.db))
        lag_ms = int(value.get("lag_ms", 1000))
        how = str(value.get("how", "pause"))
        if how not in LAG_HOWS:
            return {"key": key, "error": f"unknown how {how!r}; use {', '.join(LAG_HOWS)}"}
        leader, isr, _ = self._state(key) or (None, [], -1)
        followers = [n for n in isr if n != leader]
        if leader is None or not followers:
            return {"key": key, "leader": leader, "error": "no leader with in-sync followers"}
        if how == "cut":
            cut = self._cut_port(kind, leader, followers, ",".join(followers), both_ways=True)
            try:
                await asyncio.sleep(lag_ms / 1000)
                killed = self._t_kill(kind, leader)
            finally:
                self._uncut_port(kind, cut)
            return {
                "key": key,
                "lag_ms": lag_ms,
                "how": "cut",
                "leader": leader if killed else None,
                "followers": list(followers),
                "cut": list(followers),
            }
        paused = self._t_pause(kind, followers)
        try:
            await asyncio.sleep(lag_ms / 1000)
            killed = self._t_kill(kind, leader)
        finally:
            self._t_resume(kind, paused)
        return {
            "key": key,
            "lag_ms": lag_ms,
            "leader": leader if killed else None,
            "followers": paused,
        }

    # ----- packet: netem on the nodes' egress ------------------------------------------------

    def _start_packet(self, value: dict[str, Any]) -> dict[str, Any]:
        """`nemeses.packet.PacketFault.start`: the behaviour (default `DEFAULT_BEHAVIOUR`)
        checked as the real one checks it, then a netem qdisc on every target node's egress
        (`SimNetwork.netem`; default target ``all``), replacing one there before."""
        behaviour = dict(value.get("behaviour") or DEFAULT_BEHAVIOUR)
        qdisc = Netem.parse(behaviour)
        target = str(value.get("target", "all"))
        nodes = resolve_targets(target, self.targets.db, self.rng, value.get("key"))
        for n in nodes:
            self.cluster.net.netem(n, qdisc)
        return {"target": target, "nodes": nodes, "behaviour": behaviour}

    def _clear_packet(self) -> list[str]:
        """`PacketFault.heal`: the qdisc removed from every node; the nodes that had one."""
        cleared = set(self.cluster.net.clear_netem())
        return [n for n in self.targets.names if n in cleared]

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
        self.cuts.clear()
        if cut:
            out["partition"] = cut
        for kind in sorted(self.port_cuts):
            out[kind] = self._uncut_ports(kind)
        self.cluster.net.uncut_port(None)  # rules of no kind's left (none should be)
        zk_cut = sorted(self.zk_cut)
        for n in zk_cut:
            self.cluster.heal_zookeeper(self.targets.broker_id(n))
        self.zk_cut.clear()
        if zk_cut:
            out["zk-cut"] = zk_cut
        packet = self._clear_packet()
        if packet:
            out["packet"] = packet
        skewed = self._stop_clock()["nodes"]
        if skewed:
            out["clock"] = skewed
        failing = sorted(b.host for b in self.cluster.brokers.values() if b.fsync_failing)
        for b in self.cluster.brokers.values():
            b.fsync_failing = False  # before the restarts below
        if failing:
            out["fsync-fail"] = failing
        paused = [b.host for b in self.cluster.brokers.values() if b.paused]
        for n in paused:
            self.cluster.resume(self.targets.broker_id(n))
        self.paused.clear()
        if paused:
            out["pause"] = paused
        if self.corrupt is not None:
            self.corrupt.heal()  # old disks copied aside and not put back: deleted
        dead = [b.host for b in self.cluster.brokers.values() if b.crashed and not b.alive]
        await self._restart(dead)
        self.killed.clear()
        for down in self.power_killed.values():
            down.clear()
        for kind in _OWN_PROCESSES:
            self.t_killed[kind].clear()
            self.t_paused[kind].clear()
        if dead:
            power = [k for k in ("power", "power-torn") if k in self.kinds]
            out[power[0] if power else "kill"] = dead
        self.active.clear()
        return out

    def close(self) -> None:
        """Stop background work (a clock strobe, broker starts still under way)."""
        self._stop_strobe()
        for task in self._starts:
            task.cancel()
        self._starts.clear()


__all__ = ["SUPPORTED", "SimNemesis", "SimTargets"]
