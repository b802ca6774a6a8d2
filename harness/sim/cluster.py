"""A whole cluster on the simulator: N real `ClusterKafkaServer`s in one process, on one
`clock.VirtualTimeLoop`, one `SimEnsemble` and one `SimNetwork`, all from one seed.

Each broker is a `clock.Process` on the loop with its own host name (`n1`, `n2`, ...), its own
data directory (the real file layer: the simulated disk is later work), its own ZooKeeper
client on the shared ensemble, and its own `broker.clock` seam set to `SimClock`: the loop's
virtual time and a random generator seeded from the cluster's seed and the broker's
incarnation. They run in ZooKeeper mode as on real machines: controller election,
LeaderAndIsr through the state znodes, replica fetchers over the simulated network, ISR
changes, CreateTopics through the controller path.

What a nemesis does to it:

- `crash(id)`: kill -9. The process is killed on the loop (its callbacks and timers dropped,
  its tasks frozen where they stand: no `finally`, no flush, no close), the kernel closes its
  sockets (`SimNetwork.crash_host`: peers see EOF or a reset, its port is free), and its
  ZooKeeper session is no longer heard from and expires after its timeout, taking its
  ephemeral registration (and `/controller`, if it held it) with it. What its logs wrote is
  on disk (a process kill loses no page cache).
- A broker whose log dir goes offline (a corrupt batch met by a read, a failed fsync) halts
  as a real one does (`LogManager.halt`, Kafka's Exit.halt): here its process ends as after
  `crash` and the simulation goes on (`_halt`).
- `restart(id)`: a new incarnation from the same data directory (log recovery after the
  unclean shutdown, registration once the old session is gone, then the controller's
  decision), a new process, a new ZooKeeper session.
- `power_loss(id)`: a crash (if it runs), then its log dirs cut back to what reached disk
  (`broker.log.durable.apply_power_loss`, from the fsync journal every broker keeps while
  `isrlab.power.journal.enable` is true, its default): what it had only in the page cache is
  gone. `restart(id)` brings it back.
- `pause(id)` / `resume(id)`: SIGSTOP / SIGCONT (`VirtualTimeLoop.pause`): nothing of the
  process runs, what it is sent waits in its socket buffers, its ZooKeeper session is no
  longer heard from (it expires if the pause outlasts its timeout; kazoo finds out on resume,
  when its overdue read timeout fires, and opens a new session).
- `set_clock_offset(id, seconds)`: the broker's wall clock (its `SimClock`) runs `seconds`
  ahead of (behind, if negative) the others', as `nemeses.clock`'s offset file does to a real
  broker; monotonic time is not moved. The offset outlives a restart, as the file does.
- `partition(grudge)` / `partition_shape(...)` / `heal()`: the network's grudge
  (`nemeses.partition`'s vocabulary) between the broker hosts and any client hosts. ZooKeeper
  runs on the broker nodes, as in the embedded cluster: a broker keeps its session while it
  reaches a majority of them, and is cut from the ensemble otherwise (SUSPENDED, then its
  session expires unless healed in time).

A broker's log cleaner is a task of its process (no worker threads on a virtual clock), which
waits a seeded pause at each point where a real cleaner thread lets the broker's event-loop
thread run (`LogCleaner.interleave`: before its offset map, after it, before each swap; an
exponential draw, mean `CLEANER_STEP_MEAN_S`), so that appends, rolls, truncations, retention
and crashes land inside a cleaning as they do beside a thread.

Every fsync of the simulated brokers (`broker.log.durable`) is recorded in their journals as
on a real broker, but the system call itself is skipped (`durable.skip_fsync`, set in each
broker's context): a simulation never loses the machine's page cache, and a real fsync costs
milliseconds of wall time.

After every event the loop runs, `Invariants.check` runs over the brokers' in-memory state and
the ensemble's znodes (`harness.sim.invariants`), told which broker's code the event ran (the
broker whose process the callback belongs to; none for the network's, the ensemble's and the
harness's callbacks), so that an event that changed nothing costs next to nothing; a
violation stops the run with the virtual time and the event. `trace` collects, with the
virtual time, every network event, every nemesis operation and every change the checker saw
(a leader elected, a high watermark moved, a state znode's epoch): one seed gives the same
trace, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isrlab.broker import clock as broker_clock
from isrlab.broker.cluster import ClusterKafkaServer
from isrlab.broker.config import BrokerConfig
from isrlab.broker.log import durable
from isrlab.harness.sim.clock import Process, VirtualTimeLoop, owner
from isrlab.harness.sim.invariants import Invariants, InvariantViolation, state_znodes
from isrlab.harness.sim.kazoo_client import SimEnsemble, SimKazooClient
from isrlab.harness.sim.network import SimNetwork
from isrlab.nemeses.partition import Grudge

_UNKNOWN = object()

#: the wall-clock time at virtual time 0 (2024-01-01T00:00:00Z): record timestamps, segment
#: ages and ZooKeeper timestamps are in the same range as a real cluster's
EPOCH = 1_704_067_200.0
PORT = 9092
CHROOT = "/isrlab"

#: what the simulation sets on every broker (overridable): nothing now (the log cleaner, on
#: by default as in Kafka, runs as a task on the loop: `SimClock.worker_threads`)
SIM_DEFAULTS: dict[str, str] = {}

#: mean virtual seconds a simulated cleaner "thread" works between two of its steps (see the
#: module docstring): the scale of a small segment's cleaning on a loaded broker
CLEANER_STEP_MEAN_S = 0.05


async def _cleaner_pause(rng: random.Random, step: str) -> None:
    """`LogCleaner.interleave` in a simulation: a seeded pause at each step of a cleaning."""
    await asyncio.sleep(rng.expovariate(1 / CLEANER_STEP_MEAN_S))


class SimClock:
    """`broker.clock.Clock` on a virtual-time loop: wall time is `EPOCH` + the loop's time,
    monotonic time the loop's, UUIDs from a seeded generator. A blocking sleep cannot pass
    virtual time (the loop's thread would stop with it) and is refused; so are the broker's
    worker threads (`worker_threads`): what it would run on them (the log cleaner) runs as a
    task on the loop, in the broker's process."""

    #: a thread waiting in real time would not see virtual time move, and its timing would
    #: decide the order of events
    worker_threads = False

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        epoch: float = EPOCH,
        offset: float = 0.0,
    ):
        self.loop = loop
        self.rng = rng
        self.epoch = epoch
        #: seconds this broker's wall clock is off (a clock nemesis sets it)
        self.offset = offset
        if isinstance(loop, VirtualTimeLoop):
            # `monotonic` is the loop's clock, read in C (the broker reads it 44,000 times
            # a bench_sim run): no Python frame per read
            self.monotonic = functools.partial(getattr, loop, "_now")  # type: ignore[method-assign]

    def time(self) -> float:
        return self.epoch + self.offset + self.loop.time()

    def monotonic(self) -> float:
        return self.loop.time()

    def sleep(self, seconds: float) -> None:
        raise RuntimeError(
            f"a blocking sleep ({seconds} s) on the simulated loop: it would stop virtual time; "
            "wait with asyncio.sleep in the caller instead"
        )

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)


@dataclass
class SimBroker:
    """One broker of the cluster: its identity, and its current incarnation when it runs."""

    id: int
    host: str
    data_dir: Path
    config: dict[str, str]
    incarnation: int = 0
    server: ClusterKafkaServer | None = None
    process: Process | None = None
    clock: SimClock | None = None
    dead: list[Process] = field(default_factory=list)
    #: killed (crash or power loss) and not started since: what a nemesis restarts on heal
    #: (a broker stopped cleanly is not)
    crashed: bool = False
    #: stopped by `SimCluster.pause` (SIGSTOP)
    paused: bool = False
    #: its wall clock's offset in seconds (kept across restarts, as the offset file is)
    clock_offset: float = 0.0
    #: every fsync fails with EIO (the ``fsync-fail`` nemesis; kept across restarts, as the
    #: flag file is: `durable.fsync_fails`)
    fsync_failing: bool = False
    #: while a start is under way: resolved by `SimCluster.crash` if it is killed meanwhile
    killed_while_starting: asyncio.Future[None] | None = None

    @property
    def alive(self) -> bool:
        return self.server is not None

    @property
    def log_dirs(self) -> list[str]:
        return [d for d in self.config["log.dirs"].split(",") if d]


class SimCluster:
    """`n` brokers (ids 1..n on hosts n1..nn) on `loop`, data under `base_dir`, from `seed`.
    `overrides` are broker settings for all. `check_invariants` runs the checker after every
    event; `trace_data` false leaves the network's data segment lines out of `trace`. Use
    as `async with SimCluster(...) as cluster:` (or `start()` / `close()`)."""

    def __init__(
        self,
        loop: VirtualTimeLoop,
        base_dir: Path,
        n: int = 3,
        seed: int = 0,
        *,
        overrides: dict[str, str] | None = None,
        zk_tick_ms: int = 500,
        latency: tuple[float, float] = (0.0002, 0.002),
        check_invariants: bool = True,
        trace_data: bool = True,
    ) -> None:
        self.loop = loop
        self.base_dir = Path(base_dir)
        self.seed = seed
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self.net = SimNetwork(
            loop,
            seed=self.rng.getrandbits(64),
            latency=latency,
            on_event=self.trace.append,
            trace_data=trace_data,
        )
        self.ensemble = SimEnsemble(loop, seed=self.rng.getrandbits(64), tick_ms=zk_tick_ms)
        self.zk_hosts = [f"n{i}" for i in range(1, n + 1)]
        self.brokers: dict[int, SimBroker] = {}
        for i in range(1, n + 1):
            host = f"n{i}"
            self.brokers[i] = SimBroker(
                i,
                host,
                Path(base_dir) / host,
                {
                    **SIM_DEFAULTS,
                    "broker.id": str(i),
                    "listeners": f"PLAINTEXT://{host}:{PORT}",
                    "log.dirs": str(Path(base_dir) / host),
                    "zookeeper.connect": f"zk:2181{CHROOT}",
                    **(overrides or {}),
                },
            )
            self.net.host(host)
        self.invariants = Invariants(state_znodes(self.ensemble.core, CHROOT))
        self._quiet = self.invariants.quiet
        self._check_broker = self.invariants.check_broker
        #: the brokers, as the invariants are given them after each event
        self._broker_list = list(self.brokers.values())
        #: each broker incarnation's process -> the broker's id (whose state its events change)
        self._broker_of: dict[Process, int] = {}
        self._check = check_invariants
        self._violation: InvariantViolation | None = None
        #: hosts whose ZooKeeper client traffic only is cut (`cut_zookeeper`)
        self.zk_cut: set[str] = set()

    # ----- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        if self._check:
            self.loop.after_event = self._after_event
        for b in self.brokers.values():
            await self.start_broker(b.id)

    async def start_broker(self, broker_id: int) -> None:
        """Start (or restart) broker `broker_id` from its data directory, as a new process;
        returns once it has registered in ZooKeeper."""
        b = self.brokers[broker_id]
        if b.server is not None:
            raise RuntimeError(f"broker {broker_id} is running")
        b.incarnation += 1
        process = Process(f"broker{b.id}.{b.incarnation}")
        sim_clock = SimClock(
            self.loop,
            random.Random(f"{self.seed}/{b.id}/{b.incarnation}"),
            offset=b.clock_offset,
        )
        process.run(broker_clock.use, sim_clock)
        process.run(durable.skip_fsync.set, True)
        process.run(durable.fsync_fails.set, lambda: b.fsync_failing)
        config = BrokerConfig(b.config)
        kazoo = functools.partial(SimKazooClient, self.ensemble)
        server = process.run(
            ClusterKafkaServer,
            config,
            self.net.host(b.host),
            kazoo,  # type: ignore[arg-type]
        )
        # Kafka's Exit.halt (a log dir gone offline) ends this broker, not the simulator
        server.log_manager.halt = functools.partial(self._halt, b, process)
        # the cleaner's steps interleave with the rest of the broker (module docstring); the
        # draws have a generator of their own, so they move no other draw of the run
        server.log_manager.cleaner.interleave = functools.partial(
            _cleaner_pause, random.Random(f"{self.seed}/{b.id}/{b.incarnation}/cleaner")
        )
        b.process, b.server, b.clock = process, server, sim_clock
        self._broker_of[process] = b.id
        b.crashed = b.paused = False
        self.note(f"start broker {b.id} (incarnation {b.incarnation})")
        self._apply_zk_reachability()
        starting = process.run(self.loop.create_task, server.start())
        killed = b.killed_while_starting = self.loop.create_future()
        try:
            # a kill during the start freezes the start's task for good: the harness's
            # future wakes this waiter instead
            await asyncio.wait((starting, killed), return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                raise RuntimeError(f"broker {broker_id} was killed while starting")
            starting.result()
        except asyncio.CancelledError:
            starting.cancel()  # (what awaiting it would have done)
            b.server = None
            b.crashed = True
            raise
        except BaseException as e:
            # down, as a real broker that exits at start-up (ZooKeeper unreachable, a log
            # dir refused, say): its process ends, and the kernel closes what it held (its
            # listener among them); what heals the cluster starts it again
            if b.process is process:
                self._end(b, f"broker {b.id} exited at start-up: {self.scrub(repr(e))}")
            b.crashed = True
            raise
        finally:
            b.killed_while_starting = None
        self.note(f"broker {b.id} registered")

    async def restart(self, broker_id: int) -> None:
        await self.start_broker(broker_id)

    def crash(self, broker_id: int) -> None:
        """kill -9 of broker `broker_id` (see the module docstring)."""
        b = self.brokers[broker_id]
        if b.server is None or b.process is None:
            raise RuntimeError(f"broker {broker_id} is not running")
        if b.killed_while_starting is not None and not b.killed_while_starting.done():
            b.killed_while_starting.set_result(None)
        server = b.server
        self._end(b, f"crash broker {b.id} (incarnation {b.incarnation}, {{n}} connections)")
        self._close_files(b, server)

    @staticmethod
    def _close_files(b: SimBroker, server: ClusterKafkaServer) -> None:
        """What the kernel closes when a broker's process ends: its segments and index
        mappings (nothing written: Log.close_without_flush) and its fsync journal's file (a
        restart attaches it again). Left open, every crash kept its files open in the
        simulator's one process, and a long sweep in one process ran out of descriptors
        (EMFILE at a restart, the broker down to the end: 'unseen' records)."""
        for lg in list(server.log_manager.logs.values()):
            lg.close_without_flush()
        for d in b.log_dirs:
            durable.detach(d)

    def _halt(self, b: SimBroker, process: Process, status: int) -> None:
        """A simulated broker's `LogManager.halt`: its process ends at once, as after kill -9
        (Kafka's Exit.halt runs no shutdown hook): its callbacks and timers are dropped and its
        sockets closed. The call returns (a real halt does not): every caller raises the
        storage error right after it, so the callback that halted ends there, its last words
        written to closed sockets. Its files are closed once that callback has ended (the
        next one of the loop, in no broker's process): it may still touch them on its way
        out, as the real process did up to its exit."""
        if b.process is process:
            server = b.server
            assert server is not None
            self._end(b, f"broker {b.id} halted (exit status {status})")
            self.loop.call_soon(self._close_files, b, server, context=contextvars.Context())

    def _end(self, b: SimBroker, note: str) -> None:
        """Broker `b`'s process ends at once (killed, or exited): its callbacks and timers
        dropped, its ZooKeeper session's connection gone, its sockets closed by the kernel;
        `note` (with ``{n}``, the connections closed) goes into the trace."""
        server, process = b.server, b.process
        assert server is not None and process is not None
        b.server, b.process, b.clock = None, None, None
        b.crashed, b.paused = True, False
        self.loop.kill(process)
        zk_client = server.zk.zk
        if isinstance(zk_client, SimKazooClient):
            zk_client.crash()
        n = self.net.crash_host(b.host)
        b.dead.append(process)
        self.note(note.replace("{n}", str(n)))

    async def stop_broker(self, broker_id: int) -> None:
        """A clean stop (SIGTERM): logs closed, session closed."""
        b = self.brokers[broker_id]
        if b.server is None or b.process is None:
            return
        server, process = b.server, b.process
        if b.paused:
            self.resume(broker_id)  # a stopped process cannot act on SIGTERM
        await process.run(self.loop.create_task, server.stop())
        b.server, b.process, b.clock = None, None, None
        self.note(f"stop broker {b.id}")

    async def close(self) -> None:
        """Stop every running broker cleanly, then close what the killed ones left."""
        self.loop.after_event = None
        try:
            for b in self.brokers.values():
                with contextlib.suppress(Exception):
                    await self.stop_broker(b.id)
        finally:
            for b in self.brokers.values():
                for process in b.dead:
                    process.bury()
                b.dead.clear()

    def power_loss(
        self, broker_id: int, torn_seed: int | None = None
    ) -> list[durable.PowerLossReport]:
        """Power loss of broker `broker_id`'s machine: crashed if it runs, then each of its log
        dirs left as a power loss leaves it (`durable.apply_power_loss`: files cut back to their
        synced length, entries never synced deleted; with `torn_seed`, torn tails). It stays
        down until `restart`. Raises `durable.JournalError` if the broker kept no fsync
        journal."""
        b = self.brokers[broker_id]
        if b.server is not None:
            self.crash(broker_id)
        for d in b.log_dirs:
            durable.detach(d)  # the dead process's journal file, closed as the kernel would
        token = durable.skip_fsync.set(True)
        try:
            reports = [durable.apply_power_loss(d, torn_seed=torn_seed) for d in b.log_dirs]
        finally:
            durable.skip_fsync.reset(token)
        for report in reports:
            report.log_dir = self.relative(report.log_dir)
            self.note(f"power loss broker {b.id}: {report.summary()}")
        b.crashed = True
        return reports

    def damaged(self, broker_id: int, tp: tuple[str, int]) -> None:
        """A nemesis damaged broker `broker_id`'s segment files of `tp`: the invariants stop
        comparing its bytes (`Invariants.damage`)."""
        self.invariants.damage(broker_id, tp)
        self.note(f"damaged broker {broker_id} {tp[0]}-{tp[1]}")

    def scrub(self, text: str) -> str:
        """`text` with the cluster's base directory taken out of the paths it names (an
        error message that goes into a history names no temporary directory)."""
        return text.replace(f"{self.base_dir.resolve()}/", "").replace(f"{self.base_dir}/", "")

    def relative(self, path: str | Path) -> str:
        """`path` relative to the cluster's base directory (traces name no temporary dir)."""
        try:
            return str(Path(path).resolve().relative_to(self.base_dir.resolve()))
        except ValueError:
            return str(path)

    def pause(self, broker_id: int) -> None:
        """SIGSTOP of broker `broker_id` (see the module docstring)."""
        b = self.brokers[broker_id]
        if b.server is None or b.process is None:
            raise RuntimeError(f"broker {broker_id} is not running")
        if b.paused:
            return
        self.loop.pause(b.process)
        b.paused = True
        client = b.server.zk.zk
        if isinstance(client, SimKazooClient):
            sid = client._session_id
            if sid is not None and sid in client.core.sessions:
                # no pings from a stopped process: last heard now; kazoo's own read timeout
                # (a timer of the process) is held with the rest until the resume
                self.ensemble.call(client.core.partition, sid)
        self.note(f"pause broker {b.id}")

    def resume(self, broker_id: int) -> None:
        """SIGCONT of broker `broker_id`: its held callbacks run, its session is heard again
        (if it has not expired and the broker reaches the ensemble)."""
        b = self.brokers[broker_id]
        if not b.paused or b.server is None or b.process is None:
            b.paused = False
            return
        b.paused = False
        client = b.server.zk.zk
        if isinstance(client, SimKazooClient) and self.reaches_zookeeper(b.host):
            client.heal()
            timer = client._suspend_timer
            if timer is not None and timer.when() > self.loop.time():
                # pings go out again before kazoo's read timeout: it notices nothing
                client._cancel_suspend()
        self.loop.resume(b.process)
        self.note(f"resume broker {b.id}")

    def set_clock_offset(self, broker_id: int, seconds: float) -> None:
        """Broker `broker_id`'s wall clock `seconds` off from true (virtual) time."""
        b = self.brokers[broker_id]
        if seconds == b.clock_offset:
            return
        b.clock_offset = seconds
        if b.clock is not None:
            b.clock.offset = seconds
        self.note(f"clock broker {b.id} offset {seconds:+.3f}")

    # ----- the network ---------------------------------------------------------------------

    def partition(self, grudge: Grudge) -> None:
        self.net.partition(grudge)
        self._apply_zk_reachability()

    def partition_shape(
        self, shape: str, nodes: Sequence[str] | None = None, leader: str | None = None
    ) -> Grudge:
        g = self.net.partition_shape(shape, nodes if nodes is not None else self.zk_hosts, leader)
        self._apply_zk_reachability()
        return g

    def heal(self) -> None:
        self.net.heal()
        self._apply_zk_reachability()

    def reaches_zookeeper(self, host: str) -> bool:
        """Whether `host` reaches a majority of the ZooKeeper nodes (itself counts)."""
        if host in self.zk_cut:
            return False
        reached = sum(
            1
            for z in self.zk_hosts
            if z == host or (self.net.reachable(host, z) and self.net.reachable(z, host))
        )
        return reached * 2 > len(self.zk_hosts)

    def cut_zookeeper(self, broker_id: int) -> None:
        """Cut broker `broker_id`'s ZooKeeper client off from every ZooKeeper server (the
        zk-cut nemesis: its host's TCP to the client port dropped), nothing else: its peers
        and clients still reach it; its session expires unless healed in time."""
        self.zk_cut.add(self.brokers[broker_id].host)
        self.note(f"zk-cut broker {broker_id}")
        self._apply_zk_reachability()

    def heal_zookeeper(self, broker_id: int) -> None:
        """Undo `cut_zookeeper`."""
        self.zk_cut.discard(self.brokers[broker_id].host)
        self.note(f"zk-uncut broker {broker_id}")
        self._apply_zk_reachability()

    def _apply_zk_reachability(self) -> None:
        for b in self.brokers.values():
            if b.server is None or b.paused:
                continue  # a paused broker is not heard from whatever the network (resume)
            client = b.server.zk.zk
            if not isinstance(client, SimKazooClient):
                continue
            reach = self.reaches_zookeeper(b.host)
            cut = client._cut or (
                client._session_id is not None
                and client._session_id in client.core.sessions
                and not client.core.sessions[client._session_id].reachable
            )
            if reach and cut:
                client.heal()
                self.note(f"zk heal broker {b.id}")
            elif not reach and not cut:
                client.partition()
                self.note(f"zk cut broker {b.id}")

    # ----- inspection ----------------------------------------------------------------------

    def server(self, broker_id: int) -> ClusterKafkaServer:
        server = self.brokers[broker_id].server
        if server is None:
            raise RuntimeError(f"broker {broker_id} is down")
        return server

    def live(self) -> list[SimBroker]:
        return [b for b in self.brokers.values() if b.server is not None]

    def leader_of(self, tp: tuple[str, int]) -> int | None:
        """The broker that leads `tp` now by its own state (the highest epoch if several
        think they do), None if none."""
        best: tuple[int, int] | None = None
        for b in self.live():
            assert b.server is not None
            hp = b.server.replica_manager.partitions.get(tp)  # type: ignore[call-overload]
            if hp is not None and hp.is_leader and (best is None or hp.leader_epoch > best[0]):
                best = (hp.leader_epoch, b.id)
        return None if best is None else best[1]

    async def wait_for(
        self, predicate: Callable[[], bool], timeout: float, what: str, step: float = 0.1
    ) -> float:
        """Wait in virtual time until `predicate()`; the virtual seconds it took."""
        start = self.loop.time()
        while not predicate():
            if self.loop.time() - start > timeout:
                raise TimeoutError(f"{what}: not within {timeout} virtual seconds")
            await asyncio.sleep(step)
        return self.loop.time() - start

    # ----- trace and invariants ------------------------------------------------------------

    def note(self, what: str) -> None:
        self.trace.append(f"{self.loop.time():.6f} {what}")

    def _after_event(self, handle: asyncio.Handle) -> None:
        if self._violation is not None:
            return
        # whose code the event ran: a broker's process (its state may have changed), no
        # process (the harness, the network, the ensemble: no broker state), or unknown (a
        # handle of asyncio's own, another program's process): a full check
        try:
            process: Any = handle._process  # type: ignore[attr-defined]
        except AttributeError:
            process = _UNKNOWN
        brokers = self._broker_list
        try:
            # (the most frequent events, checked in one call each)
            if process is None:
                if self._quiet(brokers):
                    return
                changes = self.invariants.check(brokers, ())
            else:
                broker = self._broker_of.get(process)
                if broker is None:
                    changes = self.invariants.check(brokers, None)
                else:
                    changes = self._check_broker(brokers, self.brokers[broker])
        except InvariantViolation as e:
            self._violation = InvariantViolation(
                f"at virtual time {self.loop.time():.6f}, after {describe(handle)}: {e}"
            )
            self.note(f"VIOLATION {self._violation}")
            raise self._violation from None
        for line in changes:
            self.note(line)

    @property
    def violation(self) -> InvariantViolation | None:
        return self._violation


def describe(handle: asyncio.Handle) -> str:
    """An event for a report: the callback and the process it belongs to."""
    callback: Any = getattr(handle, "_callback", None)
    name = getattr(callback, "__qualname__", None) or type(callback).__name__
    self_ = getattr(callback, "__self__", None)
    if isinstance(self_, asyncio.Task):
        coro = self_.get_coro()
        name = f"task {getattr(coro, '__qualname__', self_.get_name())}"
    process = owner(getattr(handle, "_context", None))
    return f"{name} ({process.name if process is not None else 'harness'})"


__all__ = ["EPOCH", "SimBroker", "SimClock", "SimCluster", "describe"]
