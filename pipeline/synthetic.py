"""Synthetic run directories for pipeline tests and benchmarks.

`simulate_run(test, n_ops)` records a spec-format queue history
(shared/spec/history-format.md) from a small simulated replicated log: three brokers,
one partition per key with a leader, followers, an ISR and a high watermark, driven by
client processes that send and poll while a nemesis kills, isolates, pauses or
clock-skews brokers. The model follows Kafka's replication rules closely enough that
the physics the real matrix should show comes out of it, not out of a table:

- acks=0 acknowledges on the send without an offset, acks=1 once the leader appended,
  acks=all once every ISR member has the record (and refuses below
  ``min.insync.replicas`` with NOT_ENOUGH_REPLICAS);
- followers fetch lazily, the ISR shrinks when a broker dies, is cut off or pauses,
  and the high watermark is the smallest log end among the ISR; consumers read only
  below the high watermark of the current leader;
- clean elections pick an ISR member; with ``unclean_leader_election`` an out-of-sync
  survivor may win; a partitioned leader keeps acknowledging acks=0/1 writes (and
  acks=all ones when min.insync.replicas=1) from clients with stale metadata until the
  partition heals; a returning broker truncates to the leader's log (leader-epoch mode:
  to the common prefix; high-watermark mode: to its own, lagging high watermark first);
- without idempotence a timed-out send that did land may be retried and land twice.

So acks=0 and acks=1 lose acknowledged writes under partitions, kills and pauses, and
acks=all with min.insync.replicas=2 and clean elections loses none. `write_run` and
`write_store` lay the histories out as run directories (``<name>/<timestamp>/`` with
test.json and history.jsonl) like the harness does.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from isrlab.checkers.history import write_history
from isrlab.pipeline.store import COMBINED_KINDS, config_name

__all__ = [
    "NEMESES",
    "default_grid",
    "make_test",
    "simulate_run",
    "write_run",
    "write_store",
]

NEMESES = ("none", "partition", "kill", "pause", "clock", "combined")
BROKERS = ("n1", "n2", "n3")


def make_test(
    *,
    acks: str = "all",
    nemesis: str = "partition",
    seed: int = 0,
    repeat: int = 0,
    idempotence: bool = False,
    txn: bool = False,
    min_insync_replicas: int = 2,
    unclean_leader_election: bool = False,
    truncation_mode: str = "leader-epoch",
    keys: int = 4,
    concurrency: int = 10,
) -> dict[str, Any]:
    """A test configuration (test.json) with the harness's keys (notes/harness-api.md)."""
    kinds = list(COMBINED_KINDS) if nemesis == "combined" else [nemesis]
    test: dict[str, Any] = {
        "workload": "queue",
        "nodes": list(BROKERS),
        "concurrency": concurrency,
        "rate": 0,
        "time_limit": 60,
        "final_time_limit": 30,
        "recovery_time": 5,
        "nemesis": kinds,
        "nemesis_interval": 5,
        "acks": acks,
        "idempotence": idempotence,
        "txn": txn,
        "isolation_level": "read_committed" if txn else "read_uncommitted",
        "min_insync_replicas": min_insync_replicas,
        "unclean_leader_election": unclean_leader_election,
        "truncation_mode": truncation_mode,
        "replication_factor": 3,
        "partitions_per_topic": 1,
        "keys": [f"t{i}/0" for i in range(keys)],
        "seed": seed,
        "repeat": repeat,
        "synthetic": True,
    }
    test["name"] = config_name(test)
    return test


@dataclass
class _Partition:
    logs: list[list[int]]  # per broker: the values at offsets 0..LEO-1
    leader: int | None
    isr: set[int]
    hw: int = 0
    follower_hw: list[int] = field(default_factory=lambda: [0, 0, 0])
    zombie: int | None = None  # a cut-off old leader that still takes stale clients' writes


class _Cluster:
    """Brokers and partitions; every method applies Kafka's rule the module doc names."""

    def __init__(self, test: dict[str, Any], keys: Sequence[str], rng: random.Random) -> None:
        self.rng = rng
        self.acks = str(test.get("acks", "all"))
        self.min_isr = int(test.get("min_insync_replicas") or 1)
        self.unclean = bool(test.get("unclean_leader_election"))
        self.hw_mode = test.get("truncation_mode") == "high-watermark"
        self.dead: set[int] = set()
        self.cut: set[int] = set()  # partitioned away from the other brokers
        self.paused: set[int] = set()
        self.parts = {k: _Partition([[], [], []], i % 3, {0, 1, 2}) for i, k in enumerate(keys)}

    def up(self, b: int) -> bool:
        """Reachable by the controller and the other brokers."""
        return b not in self.dead and b not in self.cut and b not in self.paused

    def _truncate(self, p: _Partition, b: int) -> None:
        if p.leader is None or b == p.leader:
            return
        mine, lead = p.logs[b], p.logs[p.leader]
        if self.hw_mode:
            # Pre-KIP-101: trust the follower's own (lagging) high watermark, no divergence check.
            del mine[min(len(mine), p.follower_hw[b]) :]
        else:
            n = 0
            for a, c in zip(mine, lead, strict=False):
                if a != c:
                    break
                n += 1
            del mine[n:]

    def fetch(self, p: _Partition, b: int) -> None:
        if p.leader is None or b == p.leader or not self.up(b):
            return
        lead = p.logs[p.leader]
        mine = p.logs[b]
        p.follower_hw[b] = p.hw
        if len(mine) == len(lead) and b in p.isr:
            return  # caught up already: nothing moves
        mine.extend(lead[len(mine) :])
        if len(mine) >= len(lead):
            p.isr.add(b)
        self._advance_hw(p)

    def _advance_hw(self, p: _Partition) -> None:
        if p.leader is None:
            return
        hw = min(len(p.logs[b]) for b in p.isr | {p.leader})
        p.hw = max(p.hw, min(hw, len(p.logs[p.leader])))

    def elect(self, p: _Partition) -> None:
        old = p.leader
        candidates = [b for b in sorted(p.isr) if b != old and self.up(b)]
        if not candidates and self.unclean:
            candidates = [b for b in range(3) if b != old and self.up(b)]
        if not candidates:
            if old is not None and not self.up(old):
                p.leader = None
            return
        new = candidates[0]
        p.leader = new
        p.isr = {b for b in p.isr if self.up(b)} | {new}
        p.hw = min(p.hw, len(p.logs[new]))
        for b in range(3):
            if b != new:
                self._truncate(p, b)

    def fail_broker(self, b: int, how: str) -> None:
        if how == "kill":
            self.dead.add(b)
        elif how == "pause":
            self.paused.add(b)
        else:
            self.cut.add(b)
        for p in self.parts.values():
            p.isr.discard(b)
            if p.leader == b:
                if how == "partition":
                    p.zombie = b
                self.elect(p)
                if p.leader is None:
                    p.isr.add(b)  # Kafka keeps the last ISR member as leader-to-be

    def heal_broker(self, b: int) -> None:
        self.dead.discard(b)
        self.cut.discard(b)
        self.paused.discard(b)
        for p in self.parts.values():
            if p.zombie == b:
                p.zombie = None
            if p.leader is None and b in p.isr:
                p.leader = b
                continue
            if p.leader is None:
                self.elect(p)
                continue
            self._truncate(p, b)

    def tick(self) -> None:
        """Followers fetch now and then (acks=all replicates synchronously anyway)."""
        for p in self.parts.values():
            if p.leader is None:
                self.elect(p)
                continue
            for b in range(3):
                if b != p.leader and self.rng.random() < 0.6:
                    self.fetch(p, b)

    def send(self, key: str, value: int) -> tuple[str, int | None, str | None]:
        """(completion type, offset or None, error) for one produce request."""
        p = self.parts[key]
        if p.zombie is not None and self.rng.random() < 0.3:
            # A client with stale metadata still talks to the cut-off old leader.
            log = p.logs[p.zombie]
            if self.acks == "all" and self.min_isr > 1:
                return "fail", None, "NOT_ENOUGH_REPLICAS"
            log.append(value)
            return "ok", (None if self.acks == "0" else len(log) - 1), None
        leader = p.leader
        if leader is None or leader in self.paused or leader in self.dead:
            return "info", None, "REQUEST_TIMED_OUT"
        log = p.logs[leader]
        if self.acks == "all":
            in_sync = [b for b in p.isr if b != leader and self.up(b)]
            if len(in_sync) + 1 < self.min_isr:
                return "fail", None, "NOT_ENOUGH_REPLICAS"
            log.append(value)
            for b in in_sync:
                self.fetch(p, b)
            return "ok", len(log) - 1, None
        log.append(value)
        self._advance_hw(p)
        return "ok", (None if self.acks == "0" else len(log) - 1), None

    def read(self, key: str, pos: int, limit: int) -> tuple[list[list[int]], int]:
        p = self.parts[key]
        if p.leader is None or not self.up(p.leader):
            return [], pos
        log = p.logs[p.leader]
        pos = min(pos, p.hw)  # offset out of range: the consumer resets to the end
        end = min(p.hw, pos + limit)
        return [[o, log[o]] for o in range(pos, end)], end

    def heal_all(self) -> None:
        for b in sorted(self.dead | self.cut | self.paused):
            self.heal_broker(b)
        for p in self.parts.values():
            if p.leader is None:
                self.elect(p)
            for b in range(3):
                self.fetch(p, b)


def simulate_run(test: dict[str, Any], n_ops: int = 2000) -> list[dict[str, Any]]:
    """A history of about `n_ops` lines for `test` (deterministic in test['seed'])."""
    rng = random.Random(f"{test.get('seed', 0)}/{test.get('name', '')}")
    keys = [str(k) for k in (test.get("keys") or ["t0/0"])]
    kinds = test.get("nemesis") or ["none"]
    if isinstance(kinds, str):
        kinds = [kinds]
    faulty = [k for k in kinds if k in ("partition", "kill", "pause")]
    idempotent = bool(test.get("idempotence"))
    cluster = _Cluster(test, keys, rng)
    concurrency = int(test.get("concurrency") or 5)
    history: list[dict[str, Any]] = []
    t = 0

    def emit(process: Any, typ: str, f: str, value: Any, **extra: Any) -> None:
        nonlocal t
        t += rng.randint(10_000, 2_000_000)
        op = {"index": len(history), "time": t, "process": process, "type": typ, "f": f}
        op["value"] = value
        op.update(extra)
        history.append(op)

    def wm(ks: Iterable[str]) -> dict[str, Any]:
        out = {}
        for k in ks:
            p = cluster.parts[k]
            out[k] = {"low": 0, "high": p.hw}
        return {"watermarks": out}

    procs = list(range(concurrency))
    open_op: dict[int, dict[str, Any]] = {}
    positions: dict[int, dict[str, int]] = {p: {} for p in procs}
    next_value = dict.fromkeys(keys, 0)
    next_process = concurrency
    producer_id = itertools.count(1000)
    producers = {p: next(producer_id) for p in procs}
    interval = max(40, n_ops // 40)
    # Combined faults overlap (two brokers at once): the case the historic switches lose in.
    max_faults = 2 if len(faulty) > 1 else 1
    faults: list[tuple[str, int]] = []
    for p in procs:
        emit(p, "invoke", "assign", list(keys))
        emit(p, "ok", "assign", list(keys))
    budget = max(n_ops - 4 * len(keys) - 4 * max_faults, len(history))
    while len(history) < budget:
        if faulty and len(history) % interval == 0:
            if not faults or (len(faults) < max_faults and rng.random() < 0.5):
                kind = rng.choice(faulty)
                b = rng.choice([x for x in range(3) if x not in {f[1] for f in faults}])
                emit("nemesis", "info", f"start-{kind}", None)
                cluster.fail_broker(b, kind)
                faults.append((kind, b))
                emit("nemesis", "info", f"start-{kind}", {BROKERS[b]: kind})
            else:
                kind, b = faults.pop(0)
                emit("nemesis", "info", f"stop-{kind}", None)
                cluster.heal_broker(b)
                emit("nemesis", "info", f"stop-{kind}", {BROKERS[b]: "healed"})
            continue
        if "clock" in kinds and len(history) % interval == interval // 2:
            emit("nemesis", "info", "bump-clock", None)
            emit("nemesis", "info", "bump-clock", {rng.choice(BROKERS): rng.randint(-5, 5)})
            continue
        if len(history) % 4 == 0:
            cluster.tick()
        i = rng.randrange(len(procs))
        proc = procs[i]
        inv = open_op.pop(proc, None)
        if inv is None:
            if rng.random() < 0.6:
                k = rng.choice(keys)
                v = next_value[k]
                next_value[k] += 1
                op: dict[str, Any] = {"f": "send", "value": [["send", k, v]]}
            else:
                op = {"f": "poll", "value": [["poll"]]}
            open_op[proc] = op
            emit(proc, "invoke", op["f"], op["value"])
            continue
        producer = {"id": producers[proc], "epoch": 0, "idempotent": idempotent}
        if inv["f"] == "send":
            _, k, v = inv["value"][0]
            typ, offset, error = cluster.send(k, v)
            if typ == "info" and rng.random() < 0.5:
                # The request did land after the client gave up on it.
                part = cluster.parts[k]
                if part.leader is not None:
                    part.logs[part.leader].append(v)
                    if not idempotent and rng.random() < 0.5:
                        part.logs[part.leader].append(v)  # an internal retry lands it again
            extra: dict[str, Any] = {"producer": producer}
            if error:
                extra["error"] = error
            if typ == "ok":
                extra.update(wm([k]))
                value: Any = [["send", k, [offset, v]]]
            else:
                value = [["send", k, v]]
            emit(proc, typ, "send", value, **extra)
        else:
            polled: dict[str, list[list[int]]] = {}
            pos = positions[proc]
            for k in keys:
                pairs, end = cluster.read(k, pos.get(k, 0), rng.randint(0, 6))
                polled[k] = pairs
                pos[k] = end
            emit(proc, "ok", "poll", [["poll", polled]], **wm(keys))
        if history[-1]["type"] == "info":
            procs[i] = next_process
            positions[next_process] = {}
            producers[next_process] = next(producer_id)
            next_process += 1
    for proc, inv in sorted(open_op.items()):
        emit(proc, "info", inv["f"], inv["value"], error="REQUEST_TIMED_OUT")
    for kind, b in faults:
        emit("nemesis", "info", f"stop-{kind}", None)
        emit("nemesis", "info", f"stop-{kind}", {BROKERS[b]: "healed"})
    cluster.heal_all()
    drain = next_process
    for k in keys:
        emit(drain, "invoke", "assign", [k])
        emit(drain, "ok", "assign", [k])
        emit(drain, "invoke", "poll", [["poll"]])
        pairs, _ = cluster.read(k, 0, 1 << 62)
        emit(drain, "ok", "poll", [["poll", {k: pairs}]], **wm([k]))
    return history


def write_run(
    store: Path, test: dict[str, Any], n_ops: int, timestamp: str = "20260101T000000"
) -> Path:
    """Simulate `test` and write ``store/<name>/<timestamp>/`` with test.json + history.jsonl."""
    run_dir = Path(store) / str(test["name"]) / timestamp
    run_dir.mkdir(parents=True, exist_ok=True)
    test = dict(test, run_dir=str(run_dir))
    (run_dir / "test.json").write_bytes(orjson.dumps(test, option=orjson.OPT_INDENT_2))
    write_history(simulate_run(test, n_ops), run_dir / "history.jsonl")
    return run_dir


def default_grid(repeats: int = 1, *, switches: bool = True) -> Iterator[dict[str, Any]]:
    """The issue's matrix: acks x nemesis x repeats, plus the historic switches under faults."""
    seed = 0
    for acks in ("0", "1", "all"):
        for nemesis in NEMESES[1:]:
            for r in range(repeats):
                seed += 1
                yield make_test(acks=acks, nemesis=nemesis, seed=seed, repeat=r)
    if not switches:
        return
    for nemesis in ("partition", "kill", "combined"):
        for r in range(repeats):
            for variant in (
                {"unclean_leader_election": True},
                {"truncation_mode": "high-watermark"},
                {"min_insync_replicas": 1},
                {"idempotence": True},
            ):
                seed += 1
                yield make_test(acks="all", nemesis=nemesis, seed=seed, repeat=r, **variant)


def write_store(
    store: Path, tests: Iterable[dict[str, Any]], n_ops: int, timestamp: str = "20260101T000000"
) -> list[Path]:
    """Write one run directory per test; returns their paths."""
    return [write_run(store, t, n_ops, timestamp) for t in tests]
