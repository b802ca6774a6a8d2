"""The queue workload on the simulator: `isrlab test`'s pieces (the test map, the generator
phases, the history, the checker) around a `SimCluster` and simulated clients.

- `sim_test(overrides)`: the test map, validated by `TestConfig` as `isrlab test` does
  (defaults for the rest; `node_count` 3 and no nemesis schedule unless given), with
  `"simulated": true` added (`sim_config`: the `TestConfig` itself);
- `broker_overrides(test)`: the broker settings the test asks for (the test table's broker
  keys, `flush_policy`, `broker_config`) on top of the timings `harness/db.py` gives every
  real run (ZooKeeper session 6 s, replica lag 10 s, no auto-created topics);
- `create_topics(cluster, keys, rf, min_insync)`: CreateTopics over the simulated network,
  then a wait in virtual time for a leader of every key;
- `run_queue(cluster, test, run_dir, nemesis=None, nemesis_gen=None)`: `queue_test`'s phases
  (harness/workloads/queue/generator.py) with `SimQueueClient`s (harness/sim/client.py) under
  `SimInterpreter` (harness/sim/interpreter.py) on the cluster's loop; writes test.json and
  history.jsonl (times in virtual nanoseconds since the run started) into `run_dir` and
  returns the interpreter's stats. `nemesis` is an object with `async invoke(op)` (and
  optionally `async heal_all()`), `nemesis_gen` the generator of its ops. A test of the eos
  workload runs `EosWorkload`'s generator instead, each thread its client by role
  (harness/sim/eos.py's `client_factory`), and drops the zombie copiers left at the end
  (stats ``zombie_fates``);
- `simulate_queue(overrides, base_dir, nemesis_factory=None, nemesis_gen=None)`: all of it
  from one call, synchronous: a `VirtualTimeLoop`, a cluster of `node_count` brokers from the
  test's seed, the run (with the test's own `nemesis` kinds when no nemesis is given: the
  harness's schedule, `runner.ScheduleGenerator`, performed by `harness/sim/nemesis.py`'s
  `SimNemesis`), then the project's checker on the history (`runner.check_run`:
  results.json, the checker's artefacts, report.html; with `report=False`
  `runner.check_history`, results.json only); returns (run dir, results).

The run directory has test.json, history.jsonl, results.json, report.html and the checker's
artefacts, and `trace.txt` (the cluster's trace: nemesis operations, leaders, high
watermarks; the network's per-segment lines are left out). There are no per-node log
folders: the brokers run in this process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kafka.protocol.admin import CreateTopicsRequest

from isrlab.broker.network.client import ConnectionFailed, KafkaConnection
from isrlab.harness.db import BASE_BROKER_SETTINGS
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import bounds
from isrlab.harness.sim import clock
from isrlab.harness.sim.client import SimQueueClient
from isrlab.harness.sim.cluster import PORT, SimCluster
from isrlab.harness.sim.interpreter import AsyncNemesis, SimInterpreter
from isrlab.harness.testconfig import (
    BROKER_SETTINGS,
    TestConfig,
    flush_policy_properties,
    render_broker_value,
)
from isrlab.harness.workloads.queue.client import parse_key
from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test
from isrlab.harness.workloads.queue.options import QueueOptions

__all__ = [
    "broker_overrides",
    "create_topics",
    "run_queue",
    "sim_config",
    "sim_test",
    "simulate_queue",
]


#: a network trace line of one data segment (left out of trace.txt: there are many)
_SEGMENT = re.compile(r"^\S+ c\d+ \S+->\S+ data ")


def sim_config(overrides: Mapping[str, Any]) -> TestConfig:
    """The validated configuration of a simulated run: `overrides` on the test table's
    defaults, except `node_count` 3 and no nemesis unless given; ConfigError for bad values."""
    return TestConfig.from_mapping({"node_count": 3, "nemesis": "none", **overrides})


def sim_test(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The test map of a simulated run (see the module doc); ConfigError for bad values.
    ``mode: "sim"`` marks it for the pipeline (a test.json without ``mode`` is a real run's)."""
    return {**sim_config(overrides).to_test(), "simulated": True, "mode": "sim"}


def broker_overrides(test: Mapping[str, Any]) -> dict[str, str]:
    """Broker settings for every simulated broker of `test`."""
    props = dict(BASE_BROKER_SETTINGS)
    props["default.replication.factor"] = str(
        min(3, int(test.get("node_count") or 3), int(test.get("replication_factor") or 3))
    )
    for key, prop in BROKER_SETTINGS.items():
        if test.get(key) is not None:
            props[prop] = render_broker_value(test[key])
    if test.get("flush_policy"):
        props.update(flush_policy_properties(str(test["flush_policy"])))
    for k, v in (test.get("broker_config") or {}).items():
        props[str(k)] = str(v)
    return props


async def create_topics(
    cluster: SimCluster,
    keys: Iterable[str],
    rf: int,
    min_insync: int | None = None,
    timeout: float = 60.0,
) -> None:
    """Create the topics of `keys` through the controller path and wait for their leaders."""
    parts: dict[str, int] = {}
    for k in keys:
        topic, p = parse_key(k)
        parts[topic] = max(parts.get(topic, 0), p + 1)
    C = CreateTopicsRequest[4]
    configs = (
        []
        if min_insync is None
        else [
            C.CreatableTopic.CreatableTopicConfig(name="min.insync.replicas", value=str(min_insync))
        ]
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = dict(parts)
    hosts = [b.host for b in cluster.brokers.values()]
    attempt = 0
    while pending:
        if loop.time() > deadline:
            raise TimeoutError(f"creating topics {sorted(pending)}: not within {timeout} s")
        host = hosts[attempt % len(hosts)]
        attempt += 1
        conn = KafkaConnection(host, PORT, "sim-admin", cluster.net.host("admin"))
        topics = [
            C.CreatableTopic(
                name=t, num_partitions=n, replication_factor=rf, assignments=[], configs=configs
            )
            for t, n in sorted(pending.items())
        ]
        try:
            r = await conn.request(C(topics=topics, timeout_ms=10000, validate_only=False), 30)
        except ConnectionFailed:
            await asyncio.sleep(0.5)
            continue
        finally:
            conn.close()
        for t in r.topics:
            if t.error_code in (0, 36):  # created, or TOPIC_ALREADY_EXISTS
                pending.pop(t.name, None)
        if pending:
            await asyncio.sleep(0.5)
    tps = [parse_key(k) for k in keys]
    await cluster.wait_for(
        lambda: all(cluster.leader_of(tp) is not None for tp in tps),
        max(1.0, deadline - loop.time()),
        "a leader for every key",
    )


def _virtual_ns(loop: asyncio.AbstractEventLoop) -> Callable[[], int]:
    if isinstance(loop, clock.VirtualTimeLoop):
        # (its clock read without the call to `time()`: the history reads it 61,000 times a
        # bench_sim run)
        virtual: Any = loop
        return lambda: round(virtual._now * 1e9)
    return lambda: round(loop.time() * 1e9)


async def run_queue(
    cluster: SimCluster,
    test: Mapping[str, Any],
    run_dir: Path,
    nemesis: AsyncNemesis | None = None,
    nemesis_gen: Any = None,
) -> dict[str, Any]:
    """Run the queue workload of `test` (a `sim_test` map) against `cluster`, writing
    test.json and history.jsonl into `run_dir`; the interpreter's final stats."""
    loop = asyncio.get_running_loop()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "test.json").write_text(json.dumps(dict(test), indent=2, default=str))
    await create_topics(
        cluster,
        test["keys"],
        int(test.get("replication_factor") or 3),
        test.get("min_insync_replicas"),
    )
    zombies: Any = None
    workload: Any
    if test.get("workload") == "eos":
        # the eos workload (harness/sim/eos.py): its generator, each thread its client by role
        from isrlab.harness.sim import eos
        from isrlab.harness.workloads.eos.generator import EosWorkload

        workload = EosWorkload(test)
        zombies = eos.Zombies()
        nodes = [b.host for b in cluster.brokers.values()]
        factory = eos.client_factory(test, cluster.net, nodes, workload, zombies)
    else:
        workload = QueueWorkload(test)
        factory = SimQueueClient.factory(
            test, cluster.net, [b.host for b in cluster.brokers.values()]
        )
    gen = queue_test(workload, test, nemesis_gen=nemesis_gen if nemesis is not None else None)
    hang_timeout, run_timeout = bounds(
        QueueOptions.from_test(test).op_timeout_ms / 1000,
        float(test.get("time_limit", 60)),
        float(test.get("recovery_time", 0)),
        float(test.get("final_time_limit", 30)),
    )
    history = HistoryWriter(run_dir / "history.jsonl", clock=_virtual_ns(loop))
    try:
        interp = SimInterpreter(
            gen,
            history,
            factory,
            int(test.get("concurrency", 20)),
            nemesis=nemesis,
            seed=int(test.get("seed") or 0),
            hang_timeout=hang_timeout,
            run_timeout=run_timeout,
        )
        stats = await interp.run()
    finally:
        history.close(fsync=False)
        if zombies is not None:
            # the zombie copiers still held are dropped (the real `EosWorkload.close`)
            workload.zombie_fates = zombies.drop_all()
        else:
            workload.close()
    if zombies is not None:
        stats["zombie_fates"] = workload.zombie_fates
    return stats


def simulate_queue(
    overrides: Mapping[str, Any],
    base_dir: Path,
    nemesis_factory: Callable[[SimCluster], AsyncNemesis] | None = None,
    nemesis_gen: Any = None,
    *,
    check_invariants: bool = True,
    report: bool = True,
    run_dir: Path | None = None,
    nemesis_schedule: Iterable[tuple[int, Mapping[str, Any]]] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """One simulated run from a test's overrides, checked (see the module doc): the run
    directory (`run_dir`, default `base_dir`/run; the brokers' data under `base_dir`/data)
    and the checker's results (with the interpreter's stats under "sim"). `report` false:
    results.json only (`runner.check_history`: the same checker and policy, no artefacts,
    no report.html; a second or two less). results.json gets two optional fields: ``mode``
    ("sim") and ``sim`` (the interpreter's stats, the virtual seconds, the invariant checks,
    the history's sha256). trace.txt is written also when the run raises (an invariant
    violation: its last line says which). `nemesis_schedule`: the test's nemesis performs
    these ``(at, op)`` (at: ns on the history's clock) instead of its generated schedule
    (harness/sim/shrink.py's `FixedSchedule`; `schedule_of(run_dir)` gives a run's own)."""
    from isrlab.harness.runner import ScheduleGenerator, check_history, check_run

    config = sim_config(overrides)
    test = sim_test(overrides)
    if nemesis_factory is None and config.nemesis:
        # the test's own nemesis, as `isrlab test` runs it: the harness's schedule of its
        # kinds, performed by the simulator's nemesis
        from isrlab.harness.sim.nemesis import SimNemesis

        def nemesis_factory(cluster: SimCluster) -> AsyncNemesis:
            return SimNemesis(cluster, list(config.nemesis), test)

        if nemesis_schedule is not None:
            from isrlab.harness.sim.shrink import FixedSchedule

            nemesis_gen = FixedSchedule(nemesis_schedule)
        else:
            nemesis_gen = ScheduleGenerator.for_test(config)
    run_dir = Path(run_dir) if run_dir is not None else Path(base_dir) / "run"
    holder: dict[str, Any] = {}

    async def main() -> dict[str, Any]:
        loop: Any = asyncio.get_running_loop()
        cluster = SimCluster(
            loop,
            Path(base_dir) / "data",
            int(test.get("node_count") or 3),
            seed=int(test.get("seed") or 0),
            overrides=broker_overrides(test),
            check_invariants=check_invariants,
            trace_data=False,  # (trace.txt leaves them out)
        )
        holder["cluster"] = cluster
        async with cluster:
            nem = nemesis_factory(cluster) if nemesis_factory is not None else None
            try:
                stats = await run_queue(cluster, test, run_dir, nem, nemesis_gen)
            finally:
                close = getattr(nem, "close", None)
                if callable(close):
                    close()
            stats["virtual_s"] = loop.time()
            return stats

    try:
        stats = clock.run(main())
    finally:
        if "cluster" in holder:
            trace = [line for line in holder["cluster"].trace if not _SEGMENT.match(line)]
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "trace.txt").write_text("\n".join(trace) + "\n")
    cluster: SimCluster = holder["cluster"]
    if report:
        results = check_run(run_dir, test)
    else:
        results = check_history(run_dir, test)[1]
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    results["mode"] = "sim"
    results["sim"] = {
        **stats,
        "invariant_checks": cluster.invariants.checks,
        "violation": str(cluster.violation) if cluster.violation else None,
        "history_sha256": hashlib.sha256((run_dir / "history.jsonl").read_bytes()).hexdigest(),
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return run_dir, results
