"""The interpreter: fake clients for its rules, a real broker for whole histories."""

from __future__ import annotations

import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.history import load_history
from isrlab.checkers.queue import check_queue
from isrlab.harness import generator as g
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import Interpreter
from isrlab.harness.workloads.queue.client import QueueClient
from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test
from tests.broker.conftest import BrokerProcess
from tests.workload.shapes import check_op

Op = dict[str, Any]


class FakeClient:
    """Scripted client: `script(op, process)` returns the completion type."""

    opened: list[int] = []
    closed: list[int] = []

    def __init__(self, process: int, script: Callable[[Op, int], str]) -> None:
        self.process = process
        self.script = script
        self.broken = False

    def open(self) -> FakeClient:
        if self.script({"f": "open"}, self.process) == "refuse":
            raise ConnectionError("no route to broker")
        FakeClient.opened.append(self.process)
        return self

    def invoke(self, op: Op) -> Op:
        kind = self.script(op, self.process)
        if kind == "raise":
            raise RuntimeError("boom")
        if kind == "broken":
            self.broken = True
            kind = "fail"
        return {**op, "type": kind, "index": 99, "time": -5}

    def close(self) -> None:
        FakeClient.closed.append(self.process)


def run_fake(
    tmp_path: Path, gen: g.Generator, script: Callable[[Op, int], str], n: int = 2, **kw: Any
) -> tuple[list[Op], Interpreter]:
    FakeClient.opened, FakeClient.closed = [], []
    path = tmp_path / "h.jsonl"
    h = HistoryWriter(path)
    it = Interpreter(gen, h, lambda p, t: FakeClient(p, script), n, **kw)
    it.run()
    h.close()
    return load_history(path), it


def test_processes_advance_after_info_and_broken_clients(tmp_path: Path) -> None:
    kinds = iter(["ok", "info", "ok", "broken", "ok", "fail", "ok", "raise", "ok"] * 10)

    def script(op: Op, p: int) -> str:
        return "ok" if op["f"] == "open" else next(kinds)

    ops, it = run_fake(tmp_path, g.limit(18, g.repeat({"f": "x", "value": 1})), script, n=2)
    comps = [o for o in ops if o["type"] != "invoke"]
    assert len(comps) == 18
    for o in comps:  # written by the interpreter, not taken from the client
        assert o["index"] != 99 and o["time"] >= 0
    seen_dead: set[int] = set()
    for o in ops:
        assert o["process"] not in seen_dead
        assert o["process"] % 2 in (0, 1)
        if o["type"] == "info":
            seen_dead.add(o["process"])
    crashes = [o for o in comps if o.get("error", [None])[0] == "client-crash"]
    assert crashes and all(o["type"] == "info" for o in crashes)
    # info, a broken client's fail and client exceptions each moved their thread on:
    # 3 of every 9 completions, so 6 moves over 2 threads (a thread's last move may have
    # no op after it)
    assert 2 + 6 - 2 <= len({o["process"] for o in ops}) <= 2 + 6
    assert sum(o["type"] == "fail" for o in comps) == 4
    assert sorted(FakeClient.closed) == sorted(FakeClient.opened)
    assert it.stats()["ok"] + it.stats()["fail"] + it.stats()["info"] == 18


def test_client_that_cannot_open_fails_the_op(tmp_path: Path) -> None:
    def script(op: Op, p: int) -> str:
        return "refuse" if op["f"] == "open" else "ok"

    ops, _ = run_fake(tmp_path, g.limit(3, g.repeat({"f": "x", "value": 1})), script, n=1)
    fails = [o for o in ops if o["type"] == "fail"]
    assert len(fails) == 3 and all(o["error"][0] == "client-open" for o in fails)
    assert {o["process"] for o in ops} == {0}  # a definite fail: same process


def test_hints_are_not_recorded_and_nemesis_ops_are_info(tmp_path: Path) -> None:
    class Nem:
        healed = False

        def invoke(self, op: Op) -> Op:
            return {**op, "value": {"n1": ["n2"]}}

        def heal_all(self) -> str:
            Nem.healed = True
            return "healed"

    gen = g.phases(
        g.any_of(
            g.clients(g.limit(4, g.repeat({"f": "x", "value": 1, "_secret": 2}))),
            g.nemesis(g.once({"f": "start-partition", "value": "halves"})),
        ),
        g.nemesis(g.once({"f": "heal-all"})),
    )
    ops, it = run_fake(tmp_path, gen, lambda op, p: "ok", n=2, nemesis=Nem())
    assert not any("_secret" in o for o in ops)
    nem = [o for o in ops if o["process"] == "nemesis"]
    assert [(o["type"], o["f"]) for o in nem] == [("info", "start-partition")] * 2 + [
        ("info", "heal-all")
    ] * 2
    assert nem[1]["value"] == {"n1": ["n2"]} and nem[3]["value"] == "healed"
    assert Nem.healed and it.stats()["active_faults"] == []
    assert it.stats()["ok"] == 4  # nemesis ops are not client completions


def test_stop_finishes_in_flight_ops(tmp_path: Path) -> None:
    def script(op: Op, p: int) -> str:
        time.sleep(0.001)
        return "ok"

    path = tmp_path / "h.jsonl"
    h = HistoryWriter(path)
    it = Interpreter(g.repeat({"f": "x", "value": 1}), h, lambda p, t: FakeClient(p, script), 4)
    threading.Timer(0.3, it.stop).start()
    stats = it.run()
    h.close()
    ops = load_history(path)
    assert stats["finished"] and stats["ok"] > 10
    assert sum(o["type"] == "invoke" for o in ops) == sum(o["type"] == "ok" for o in ops)


def test_generator_bug_stops_the_run_with_a_reason(tmp_path: Path) -> None:
    def bad(ctx: g.Context) -> Op:
        raise KeyError("oops")

    _, it = run_fake(tmp_path, g.fn(bad), lambda op, p: "ok", n=2)
    assert any("oops" in e for e in it.stats()["errors"])


# ----- against a real broker ------------------------------------------------------------


def run_queue(
    bootstrap: str,
    keys: list[str],
    path: Path,
    nemesis: Any = None,
    nemesis_gen: Any = None,
    **test: Any,
) -> tuple[list[Op], dict[str, Any], float]:
    conf: dict[str, Any] = {
        "keys": keys,
        "concurrency": 20,
        "time_limit": 3,
        "final_time_limit": 20,
        "acks": "all",
        "seed": 3,
        **test,
    }
    w = QueueWorkload(conf)
    h = HistoryWriter(path)
    it = Interpreter(
        queue_test(w, conf, nemesis_gen),
        h,
        lambda p, t: QueueClient(conf, bootstrap, p, node="n1"),
        conf["concurrency"],
        nemesis=nemesis,
        seed=conf["seed"],
    )
    stats = it.run()
    h.close()
    ops = load_history(path)
    main = [o for o in ops if o["type"] in ("ok", "fail", "info") and o["time"] < 3e9]
    assert not stats["errors"]
    return ops, stats, len(main) / 3.0


def latencies(ops: list[Op]) -> dict[str, str]:
    """Median and 99th percentile latency (ms) per f, for the printed figures."""
    started: dict[Any, int] = {}
    per: dict[str, list[float]] = defaultdict(list)
    for o in ops:
        if o["process"] == "nemesis":
            continue
        if o["type"] == "invoke":
            started[o["process"]] = o["time"]
        else:
            per[o["f"]].append((o["time"] - started[o["process"]]) / 1e6)
    out = {}
    for f, ls in sorted(per.items()):
        ls.sort()
        out[f] = f"n={len(ls)} p50={ls[len(ls) // 2]:.1f}ms p99={ls[int(len(ls) * 0.99)]:.1f}ms"
    return out


def read_values(ops: list[Op]) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = defaultdict(set)
    for o in ops:
        if o["type"] == "ok" and o["f"] == "poll":
            for _, read in o["value"]:
                for k, pairs in read.items():
                    seen[k].update(v for _, v in pairs)
    return seen


def test_real_broker_history_is_valid_and_drained(
    module_broker: BrokerProcess, fresh_keys: Callable[[int], list[str]], tmp_path: Path
) -> None:
    keys = fresh_keys(8)
    ops, stats, rate = run_queue(
        module_broker.bootstrap,
        keys,
        tmp_path / "h.jsonl",
        crash_clients=True,
        crash_client_interval=2,
    )
    print(f"\nrecorded {rate:.0f} ops/s in the main phase with 20 processes; {latencies(ops)}")
    for o in ops:
        check_op(o)
    result = check_queue(ops)
    assert result["valid"] is True, result["anomaly_types"]
    # the final drain read every acknowledged send
    seen = read_values(ops)
    acked = [
        (k, v) for o in ops if o["type"] == "ok" and o["f"] == "send" for _, k, (_, v) in o["value"]
    ]
    assert len(acked) > 200
    assert all(v in seen[k] for k, v in acked)
    # crashes happened, and their threads went on as new processes
    crashed = {o["process"] for o in ops if o["f"] == "crash" and o["type"] == "info"}
    assert crashed and stats["info"] >= len(crashed)
    assert max(o["process"] for o in ops) >= 20
    assert any("watermarks" in o for o in ops)
    assert all(o["node"] == "n1" for o in ops if o["type"] in ("ok", "fail"))


class PauseNemesis:
    """SIGSTOP/SIGCONT of the broker process, as nemeses/process.py does over SSH."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker

    def invoke(self, op: Op) -> Op:
        if op["f"] == "start-pause":
            self.broker.signal(signal.SIGSTOP)
        elif op["f"] == "stop-pause":
            self.broker.signal(signal.SIGCONT)
        return {**op, "value": ["n1"]}

    def heal_all(self) -> list[str]:
        self.broker.signal(signal.SIGCONT)
        return ["n1"]


def test_paused_broker_gives_info_and_new_processes(
    module_broker: BrokerProcess, fresh_keys: Callable[[int], list[str]], tmp_path: Path
) -> None:
    keys = fresh_keys(4)
    schedule = g.seq(
        g.sleep(0.5),
        g.once({"f": "start-pause", "value": None}),
        g.sleep(2),
        g.once({"f": "stop-pause", "value": None}),
    )
    try:
        ops, stats, _ = run_queue(
            module_broker.bootstrap,
            keys,
            tmp_path / "h.jsonl",
            nemesis=PauseNemesis(module_broker),
            nemesis_gen=schedule,
            op_timeout_ms=1000,
            recovery_time=1,
            concurrency=10,
        )
    finally:
        module_broker.signal(signal.SIGCONT)
    for o in ops:
        check_op(o)
    infos = [o for o in ops if o["type"] == "info" and o["f"] == "send"]
    assert infos, "sends during the pause should be indefinite"
    assert all(o.get("error") for o in infos)
    # each info moved its thread to process + concurrency; none was used again
    for o in infos:
        later = [x for x in ops if x["index"] > o["index"] and x["process"] == o["process"]]
        assert later == []
    assert any(o["process"] != "nemesis" and o["process"] >= 10 for o in ops)
    nem = [o["f"] for o in ops if o["process"] == "nemesis"]
    assert nem == ["start-pause"] * 2 + ["stop-pause"] * 2 + ["heal-all"] * 2
    result = check_queue(ops)
    assert result["valid"] is True, result["anomaly_types"]
    assert stats["info"] >= len(infos)


def test_three_broker_cluster_history_is_valid(cluster_factory: Any, tmp_path: Path) -> None:
    from tests.workload.conftest import make_topics

    cluster = cluster_factory(3, {"min.insync.replicas": "2"})
    keys = make_topics(cluster.bootstrap, 8, rf=3)
    ops, _, rate = run_queue(cluster.bootstrap, keys, tmp_path / "h.jsonl", time_limit=5)
    print(f"\nrecorded {rate:.0f} ops/s against 3 brokers (rf=3, acks=all); {latencies(ops)}")
    result = check_queue(ops)
    assert result["valid"] is True, result["anomaly_types"]


class KillNemesis:
    """kill -9 of one broker of a local cluster, then a restart (nemeses/process.py's kill)."""

    def __init__(self, cluster: Any, broker_id: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id

    def invoke(self, op: Op) -> Op:
        b = self.cluster.brokers[self.broker_id]
        if op["f"] == "kill":
            b.kill9()
        elif op["f"] == "start":
            b.start()
        return {**op, "value": [f"b{self.broker_id}"]}

    def heal_all(self) -> list[str]:
        b = self.cluster.brokers[self.broker_id]
        if b.proc is None:
            b.start()
        return [f"b{self.broker_id}"]


@pytest.mark.slow
@pytest.mark.parametrize("idempotence", [False, True])
def test_cluster_leader_kill_keeps_acks_all_valid(
    cluster_factory: Any, tmp_path: Path, idempotence: bool
) -> None:
    from tests.workload.conftest import make_topics

    cluster = cluster_factory(3, {"min.insync.replicas": "2"})
    keys = make_topics(cluster.bootstrap, 4, rf=3)
    schedule = g.seq(
        g.sleep(2),
        g.once({"f": "kill", "value": None}),
        g.sleep(4),
        g.once({"f": "start", "value": None}),
    )
    ops, stats, rate = run_queue(
        cluster.bootstrap,
        keys,
        tmp_path / "h.jsonl",
        nemesis=KillNemesis(cluster, 1),
        nemesis_gen=schedule,
        time_limit=10,
        recovery_time=3,
        final_time_limit=30,
        idempotence=idempotence,
    )
    print(f"\n{rate:.0f} ops/s; {stats}; {latencies(ops)}")
    for o in ops:
        check_op(o)
    # Without idempotence librdkafka's retries across the failover may write a record
    # twice: Kafka's documented at-least-once behaviour, so duplicates are allowed here.
    result = check_queue(ops, allow=set() if idempotence else {"duplicate"})
    assert result["valid"] is True, result["anomaly_types"]
    assert not {"lost-write", "unseen"} & set(result["anomaly_types"])
