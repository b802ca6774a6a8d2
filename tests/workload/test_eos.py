"""The eos workload (consume-transform-produce) without a broker: the copier against an
in-memory Kafka with transactions (tests/workload/fakekafka.py), its generator, the client
factory, whole runs through the interpreter checked by the queue checker's eos check, and
the test options that set it up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from isrlab.checkers.api import check, policy_from_test
from isrlab.checkers.history import load_history
from isrlab.harness.generator import Context
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import Interpreter
from isrlab.harness.optiontable import ConfigError
from isrlab.harness.runner import workload_for
from isrlab.harness.testconfig import TestConfig, config_name, consumer_mode
from isrlab.harness.workloads.eos.client import EosCopier, client_factory
from isrlab.harness.workloads.eos.generator import EosWorkload
from isrlab.harness.workloads.queue.client import QueueClient
from isrlab.harness.workloads.queue.generator import queue_test
from isrlab.pipeline.check import check_run
from isrlab.pipeline.store import config_of
from tests.workload.fakekafka import FakeKafka
from tests.workload.shapes import check_op

Op = dict[str, Any]
IN, OUT = ["in/0", "in/1"], ["out/0", "out/1"]
SUBSCRIBE: Op = {"f": "subscribe", "value": sorted(IN)}
COPY: Op = {"f": "txn", "value": [["poll"]], "_poll_ms": 1}


def eos_test(txn: bool = True, **over: Any) -> dict[str, Any]:
    conf = {
        "workload": "eos",
        "name": "eos-unit",
        "seed": 5,
        "txn": txn,
        "concurrency": 6,
        "eos": {"input": IN, "output": OUT},
        "copiers": 2,
        "watermark_p": 0,
        "op_timeout_ms": 2000,
        **over,
    }
    return TestConfig.from_mapping(conf).to_test()


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    return FakeKafka(IN + OUT).install(monkeypatch)


def fill(kafka: FakeKafka, values: dict[str, list[int]]) -> None:
    """Plain (non-transactional) input records."""
    from tests.workload.fakekafka import Record

    for k, vs in values.items():
        t, _, p = k.rpartition("/")
        log = kafka.logs[(t, int(p))]
        for v in vs:
            log.append(Record(len(log), str(v).encode()))


def copier(test: dict[str, Any], process: int = 0, thread: int = 0) -> EosCopier:
    c = EosCopier(test, "fake:9092", process, node="n1", thread=thread)
    c.open()
    assert c.invoke(SUBSCRIBE)["type"] == "ok"
    return c


def sends_of(op: Op) -> list[tuple[str, Any]]:
    return [(m[1], m[2]) for m in op["value"] if m[0] == "send"]


def polled(op: Op) -> dict[str, list[list[Any]]]:
    return dict(op["value"][0][1])


# -- one copier --------------------------------------------------------------------------


def test_a_copy_sends_every_value_to_its_output_key_and_commits_the_offsets(
    kafka: FakeKafka,
) -> None:
    test = eos_test()
    fill(kafka, {"in/0": [1, 2], "in/1": [3]})
    c = copier(test)
    assert c.transactional_id == test["transactional_ids"][0]
    op = c.invoke(COPY)
    assert op["type"] == "ok", op
    assert polled(op) == {"in/0": [[0, 1], [1, 2]], "in/1": [[0, 3]]}
    assert sends_of(op) == [("out/0", [0, 1]), ("out/0", [1, 2]), ("out/1", [0, 3])]
    assert op["rebalance"]["assigned"] == IN
    assert op["producer"]["transactional_id"] == test["transactional_ids"][0]
    # committed with the transaction: the next offset to read of every key copied
    assert kafka.committed == {("in", 0): 2, ("in", 1): 1}
    assert kafka.values("out") == [1, 2, 3]
    assert kafka.calls[-1] == f"commit {c.transactional_id} 3"
    # nothing more to copy: an ok op without sends and without a transaction
    calls = len(kafka.calls)
    empty = c.invoke(COPY)
    assert empty["type"] == "ok" and empty["value"] == [["poll", {}]]
    assert len(kafka.calls) == calls


def test_a_failed_send_aborts_and_rewinds_to_the_committed_offsets(kafka: FakeKafka) -> None:
    c = copier(eos_test())
    fill(kafka, {"in/0": [1]})
    assert c.invoke(COPY)["type"] == "ok"
    fill(kafka, {"in/0": [2, 3]})
    kafka.send_errors = [KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    op = c.invoke(COPY)
    assert op["type"] == "fail" and op["error"] == "msg-size-too-large", op
    assert kafka.calls[-1].startswith("abort")
    assert polled(op) == {"in/0": [[1, 2], [2, 3]]}  # what it read is recorded
    # the aborted copy is invisible, and the consumer reads again from offset 1
    assert kafka.values("out") == [1]
    again = c.invoke(COPY)
    assert again["type"] == "ok" and polled(again) == {"in/0": [[1, 2], [2, 3]]}
    assert kafka.values("out") == [1, 2, 3]
    # (the refused send never reached the log; its sibling was aborted)
    assert kafka.values("out", committed_only=False) == [1, 3, 2, 3]


def test_the_rewind_goes_to_the_groups_committed_offsets_not_this_ops_first_read(
    kafka: FakeKafka,
) -> None:
    c = copier(eos_test())
    fill(kafka, {"in/0": [1, 2, 3]})
    assert c.invoke(COPY)["type"] == "ok"
    kafka.committed[("in", 0)] = 1  # (as if a later commit had not happened)
    fill(kafka, {"in/0": [4]})
    kafka.send_errors = [KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)]
    assert c.invoke(COPY)["type"] == "fail"
    assert [o for o, _v in polled(c.invoke(COPY))["in/0"]] == [1, 2, 3]


def test_a_stale_generation_aborts_the_copy(kafka: FakeKafka) -> None:
    c = copier(eos_test())
    fill(kafka, {"in/0": [1]})
    kafka.offsets_errors = [
        KafkaError(KafkaError.ILLEGAL_GENERATION, "old", txn_requires_abort=True)
    ]
    op = c.invoke(COPY)
    assert op["type"] == "fail" and op["error"] == "illegal-generation", op
    assert kafka.values("out") == [] and kafka.committed == {}
    assert not c.broken


def test_commit_outcomes(kafka: FakeKafka) -> None:
    c = copier(eos_test())
    fill(kafka, {"in/0": [1]})
    # refused by the broker (abortable): aborted, a fail
    kafka.commit_errors = [KafkaError(KafkaError.INVALID_TXN_STATE, "x", txn_requires_abort=True)]
    assert c.invoke(COPY)["type"] == "fail"
    assert kafka.values("out") == []
    # unknown outcome (a timeout): info, and the client is given up
    kafka.commit_errors = [KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True)]
    op = c.invoke(COPY)
    assert op["type"] == "info" and op["error"] == "timed-out" and c.broken, op


@pytest.mark.parametrize(("stuck", "kind"), [("offsets", "fail"), ("commit", "info")])
def test_a_transactional_call_that_never_returns_is_given_up(
    kafka: FakeKafka, monkeypatch: pytest.MonkeyPatch, stuck: str, kind: str
) -> None:
    from isrlab.harness.workloads.queue import client as queue_client

    monkeypatch.setattr(queue_client, "TXN_GRACE_S", 0.05)
    c = copier(eos_test(op_timeout_ms=200))
    fill(kafka, {"in/0": [1]})
    if stuck == "commit":
        kafka.offsets_errors = []  # (send_offsets passes, then the commit blocks)
        real = c.producer.send_offsets_to_transaction  # type: ignore[union-attr]

        def offsets_then_hang(*a: Any) -> None:
            real(*a)
            kafka.hang.set()

        c.producer.send_offsets_to_transaction = offsets_then_hang  # type: ignore[union-attr]
    else:
        kafka.hang.set()
    try:
        op = c.invoke(COPY)
        # nothing will commit a transaction stuck before its commit: a fail; a commit that
        # never answered may have committed: unknown. Either way the client is given up.
        assert op["type"] == kind and c.broken, op
        assert op["error"] == [{"offsets": "send-offsets", "commit": "commit"}[stuck], "timeout"]
        assert kafka.values("out") == []
    finally:
        kafka.released.set()


def test_a_rebalance_during_the_poll_drops_the_batch(kafka: FakeKafka) -> None:
    test = eos_test()
    a = copier(test)
    assert a.invoke(COPY)["rebalance"]["assigned"] == IN  # (nothing to copy yet)
    fill(kafka, {"in/0": [1], "in/1": [2]})
    b = EosCopier(test, "fake:9092", 1, thread=1).open()
    assert b.invoke(SUBSCRIBE)["type"] == "ok"  # joins: a new generation
    op = a.invoke(COPY)
    # a was revoked during its poll: what it read may be another member's now, it copies
    # nothing
    assert op["type"] == "fail" and op["error"] == "rebalanced", op
    assert not sends_of(op) and op["rebalance"]["revoked"] == IN
    assert kafka.values("out") == []
    # each copier then copies its own share once
    a_op, b_op = a.invoke(COPY), b.invoke(COPY)
    assert a_op["type"] == b_op["type"] == "ok"
    assert sorted(kafka.values("out")) == [1, 2]


def test_a_killed_copier_is_fenced_by_the_next_and_nothing_is_copied_twice(
    kafka: FakeKafka,
) -> None:
    test = eos_test()
    c = copier(test)
    fill(kafka, {"in/0": [1, 2]})
    op = c.invoke({**COPY, "_kill": True})
    assert op["type"] == "info" and op["error"] == "killed", op
    assert [s[1] for s in sends_of(op)] == [[0, 1], [1, 2]]  # sent, then killed
    assert c.producer is None and c.consumer is None
    assert op["rebalance"]["revoked"] == IN
    open_records = [r.state for r in kafka.logs[("out", 0)]]
    assert open_records == ["open", "open"]  # the zombie's transaction is still open
    del c
    # the thread's next process: the same transactional id, which fences the zombie
    nxt = copier(test, process=6)
    assert nxt.transactional_id == test["transactional_ids"][0]
    assert [r.state for r in kafka.logs[("out", 0)]] == ["aborted", "aborted"]
    assert nxt.invoke(COPY)["type"] == "ok"
    assert kafka.values("out") == [1, 2]


def test_without_transactions_a_killed_copier_is_copied_again(kafka: FakeKafka) -> None:
    test = eos_test(txn=False)
    c = copier(test)
    assert c.transactional_id is None
    fill(kafka, {"in/0": [1, 2]})
    op = c.invoke({**COPY, "_kill": True})
    assert op["type"] == "info" and op["error"] == "killed"
    del c
    nxt = copier(test, process=6)
    assert nxt.invoke(COPY)["type"] == "ok"
    assert kafka.values("out") == [1, 2, 1, 2]  # at-least-once
    assert kafka.committed == {("in", 0): 2}


def test_at_least_once_commits_after_the_sends(kafka: FakeKafka) -> None:
    c = copier(eos_test(txn=False))
    fill(kafka, {"in/1": [7]})
    op = c.invoke(COPY)
    assert op["type"] == "ok" and kafka.committed == {("in", 1): 1}
    assert sends_of(op) == [("out/1", [0, 7])]
    # a commit refused (the group moved on): the sends stay, the outcome is unknown
    fill(kafka, {"in/1": [8]})
    kafka.generation += 1
    op = c.invoke(COPY)
    assert op["type"] == "info" and op["error"] == ["commit", "illegal-generation"], op
    assert kafka.values("out") == [7, 8]


# -- the generator and the factory --------------------------------------------------------


def ctx(thread: int, process: int | None = None, t: int = 0) -> Context:
    import random

    return Context(
        t, thread, thread if process is None else process, list(range(6)), random.Random(1)
    )


def test_roles_and_their_ops() -> None:
    w = EosWorkload(eos_test(copier_kill_interval=1.0))
    assert [w.role(t) for t in range(6)] == ["copier", "copier", "reader", *["producer"] * 3]
    gen = w.generator()
    # a copier subscribes first, a reader assigns the output keys, a producer sends
    assert gen.op(ctx(0)) == SUBSCRIBE
    assert gen.op(ctx(2)) == {"f": "assign", "value": OUT}
    sends = [gen.op(ctx(3)) for _ in range(20)]
    values = [m[2] for op in sends for m in op["value"]]  # type: ignore[index]
    assert values == list(range(len(values)))  # unique over the whole test
    assert {m[1] for op in sends for m in op["value"]} <= set(IN)  # type: ignore[index]
    # once joined: copies; the first kill is due within 0.5 to 1.5 intervals
    gen.update(ctx(0), {"process": 0, "type": "ok", "f": "subscribe", "value": IN})
    first = gen.op(ctx(0))
    assert first == {**COPY, "_poll_ms": w.poll_ms}
    late = gen.op(ctx(0, t=2 * 10**9))
    assert late is not None and late.get("_kill") is True  # type: ignore[union-attr]
    # one kill at a time: the other copier copies plainly meanwhile
    gen.update(ctx(1), {"process": 1, "type": "ok", "f": "subscribe", "value": IN})
    assert "_kill" not in gen.op(ctx(1, t=2 * 10**9))  # type: ignore[operator]
    # a kill that found nothing to copy stays due; one that happened is counted
    gen.update(ctx(0), {"process": 0, "type": "ok", "f": "txn", "value": [["poll", {}]]})
    assert gen.op(ctx(1, t=2 * 10**9)).get("_kill") is True  # type: ignore[union-attr]
    killed: Op = {"process": 1, "type": "info", "f": "txn", "value": [], "error": "killed"}
    gen.update(ctx(1, t=2 * 10**9), killed)
    assert w.kills == 1
    assert "_kill" not in gen.op(ctx(0, t=2 * 10**9 + 1))  # type: ignore[operator]


def test_the_factory_gives_each_role_its_client(kafka: FakeKafka) -> None:
    test = eos_test(isolation_level="read_uncommitted")
    w = EosWorkload(test)
    make = client_factory(test, {"n1": "h1:9092", "n2": "h2:9092"}, w)
    c0, c2, c3 = make(0, 0), make(2, 2), make(3, 3)
    assert type(c0) is EosCopier and c0.txn
    assert c0.consumer_config()["isolation.level"] == "read_committed"
    assert c0.producer_config()["transaction.timeout.ms"] == 10000
    longer = EosCopier(eos_test(op_timeout_ms=15000), "h1:9092", 0, thread=0)
    assert longer.producer_config()["transaction.timeout.ms"] == 15000
    for c in (c2, c3):
        assert type(c) is QueueClient and not c.txn and c.transactional_id is None
    assert c2.consumer_config()["isolation.level"] == "read_uncommitted"  # the test's
    w.draining = True
    d = make(6, 0)
    assert type(d) is QueueClient and not d.txn
    assert d.consumer_config()["isolation.level"] == "read_committed"
    assert workload_for(test, {"n1": "h1:9092"})[0].copiers == 2


# -- whole runs -------------------------------------------------------------------------


def run(tmp_path: Path, kafka: FakeKafka, test: dict[str, Any]) -> tuple[list[Op], EosWorkload]:
    workload = EosWorkload(test)
    path = tmp_path / "history.jsonl"
    history = HistoryWriter(path)
    gen = queue_test(workload, test)
    Interpreter(
        gen, history, client_factory(test, {"n1": "fake:9092"}, workload), test["concurrency"]
    ).run()
    history.close()
    return load_history(path), workload


RUN = {
    "time_limit": 2.0,
    "recovery_time": 0.0,
    "final_time_limit": 20.0,
    "rate": 300.0,
    "copier_kill_interval": 0.2,
    "final_poll_ms": 10,
}


def test_a_transactional_run_copies_exactly_once(tmp_path: Path, kafka: FakeKafka) -> None:
    test = eos_test(crash_clients=True, crash_client_interval=0.5, **RUN)
    ops, w = run(tmp_path, kafka, test)
    for op in ops:
        check_op({k: v for k, v in op.items() if k != "rebalance"})
    copies = [o for o in ops if o["f"] == "txn" and o["type"] == "ok" and len(o["value"]) > 1]
    assert copies and w.kills >= 1, (len(copies), w.kills)
    assert any(o["f"] == "crash" for o in ops)
    policy = policy_from_test(test)
    assert policy["workload"] == "queue" and policy["eos"] == {"input": IN, "output": OUT}
    policy.pop("workload")
    r = check(ops, "queue", **policy)
    assert r["valid"] is True, {k: r["anomalies"][k] for k in r["not_allowed"]}
    assert not {"eos-duplicate", "eos-missing"} & set(r["anomaly_types"])
    (tmp_path / "test.json").write_text(json.dumps(test))
    row = check_run("eos/1", tmp_path, test)
    assert row["status"] == "checked" and row["valid"] == "true", row
    # everything produced was copied once (the drain reads the output read_committed)
    assert sorted(kafka.values("out")) == sorted(set(kafka.values("out")))
    assert set(kafka.values("in")) >= set(kafka.values("out"))


def test_an_at_least_once_run_copies_twice_under_copier_kills(
    tmp_path: Path, kafka: FakeKafka
) -> None:
    test = eos_test(txn=False, **RUN)
    ops, w = run(tmp_path, kafka, test)
    assert w.kills >= 1
    policy = policy_from_test(test)
    policy.pop("workload")
    r = check(ops, "queue", **policy)
    assert "eos-duplicate" in r["not_allowed"] and r["valid"] is False, r["anomaly_types"]
    assert "eos-missing" not in r["anomaly_types"]
    # the pipeline's per-run check finds the same in the run directory
    (tmp_path / "test.json").write_text(json.dumps(test))
    row = check_run("eos/1", tmp_path, test)
    assert row["status"] == "checked" and row["valid"] == "false", row["error"]
    assert "eos-duplicate" in row["not_allowed"]
    assert config_of(test)["workload"] == "eos"


# -- options ------------------------------------------------------------------------------


def test_eos_options_fill_in_keys_group_and_transactional_ids() -> None:
    t = TestConfig.from_mapping(
        {"workload": "eos", "txn": True, "key_count": 2, "seed": 3, "name": "e", "concurrency": 6}
    ).to_test()
    assert t["eos"] == {"input": ["eos-in/0", "eos-in/1"], "output": ["eos-out/0", "eos-out/1"]}
    assert t["keys"] == ["eos-in/0", "eos-in/1", "eos-out/0", "eos-out/1"]
    assert t["group"] == "isrlab-e-3"
    assert t["transactional_ids"] == ["isrlab-e-3-0", "isrlab-e-3-1", "isrlab-e-3-2"]
    assert consumer_mode(t) == "subscribe"
    assert config_name({**t, "isolation_level": "read_committed"}).startswith("eos_acks-all")
    assert "_rc" in config_name({**t, "isolation_level": "read_committed"})
    # the queue workload's transactional threads are every thread
    q = TestConfig.from_mapping({"txn": True, "concurrency": 3, "seed": 1, "name": "q"})
    assert q.transactional_ids == ("isrlab-q-1-0", "isrlab-q-1-1", "isrlab-q-1-2")
    assert TestConfig.from_mapping({"seed": 1}).transactional_ids is None


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"subscribe": True}, "does not take subscribe"),
        ({"concurrency": 4}, "too small"),
        ({"keys": ["a/0"]}, "give eos rather than keys"),
        ({"eos": {"input": ["a/0"], "output": []}}, "same length"),
        ({"eos": {"input": ["a/0"], "output": ["a/0"]}}, "distinct"),
        ({"eos": {"input": ["a"], "output": ["b/0"]}}, "not 'topic/partition'"),
        ({"copiers": 0}, "copiers"),
        ({"nemesis_targets": "txn-coordinator"}, "add --txn"),
    ],
)
def test_bad_eos_options_are_refused(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TestConfig.from_mapping({"workload": "eos", "concurrency": 5, **conf})
