"""QueueClient in a consumer group (subscribe, rebalances, commits) against a real broker, and
the commit error mapping without one."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from typer.testing import CliRunner

from isrlab.checkers.api import check, policy_from_test
from isrlab.checkers.cli import check_command
from isrlab.checkers.history import load_history
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import Interpreter
from isrlab.harness.testconfig import TestConfig
from isrlab.harness.workloads.queue.client import QueueClient, generation_of
from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test
from tests.broker.conftest import BrokerProcess, free_port
from tests.typer_app import subcommand_app
from tests.workload.conftest import make_topics

Op = dict[str, Any]
POLL: Op = {"f": "poll", "value": [["poll"]], "_poll_ms": 500}
COMMIT: Op = {"f": "commit", "value": [["commit", {}]]}


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # no initial rebalance delay: a first member gets its assignment within a poll or two
    base = tmp_path_factory.mktemp("group-broker")
    b = BrokerProcess(
        base / "logs",
        free_port(),
        {
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            # crashed members are dropped, not closed: a short session lets the group notice
            # them (and rebalance) within a test's few seconds, even on a loaded machine
            "group.min.session.timeout.ms": "1000",
        },
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture
def group_client(group_broker: BrokerProcess) -> Iterator[Callable[..., QueueClient]]:
    made: list[QueueClient] = []

    def make(process: int, group: str, **test: Any) -> QueueClient:
        conf = {"op_timeout_ms": 5000, "watermark_p": 0, "group": group, **test}
        c = QueueClient(conf, group_broker.bootstrap, process, node="n1")
        made.append(c.open())
        return c

    yield make
    for c in made:
        c.close()


def polls_until(c: QueueClient, done: Callable[[list[Op]], bool], tries: int = 30) -> list[Op]:
    """Poll until ``done(the polls so far)``; return the polls."""
    out: list[Op] = []
    for _ in range(tries):
        op = c.invoke(POLL)
        assert op["type"] == "ok", op
        out.append(op)
        if done(out):
            return out
    raise AssertionError(f"process {c.process}: no poll satisfied the wait: {out[-3:]}")


def read_something(ops: list[Op]) -> bool:
    return bool(reads(ops))


def rebalanced(key: str) -> Callable[[list[Op]], bool]:
    return lambda ops: any(key in o.get("rebalance", {}).get("assigned", ()) for o in ops)


def reads(ops: list[Op]) -> dict[str, list[list[Any]]]:
    got: dict[str, list[list[Any]]] = {}
    for op in ops:
        for _, read in op["value"]:
            for k, pairs in read.items():
                got.setdefault(k, []).extend(pairs)
    return got


@pytest.mark.parametrize("strategy", ["roundrobin", "cooperative-sticky"])
def test_subscribe_records_rebalances_and_commits(
    group_client: Callable[..., QueueClient], group_broker: BrokerProcess, strategy: str
) -> None:
    keys = make_topics(group_broker.bootstrap, 2)
    group = f"g-{keys[0].split('-')[0]}-{strategy}"
    c1 = group_client(0, group, assignment_strategy=strategy)
    for k in keys:
        assert c1.invoke({"f": "send", "value": [["send", k, v] for v in range(3)]})["type"] == "ok"
    assert c1.invoke({"f": "subscribe", "value": keys})["type"] == "ok"
    # the first member gets both keys from an empty group: nothing committed yet
    ops = polls_until(c1, lambda ops: sum(map(len, reads(ops).values())) >= 6)
    [first] = [o["rebalance"] for o in ops if "rebalance" in o]
    assert first["assigned"] == sorted(keys) and first["revoked"] == []
    assert first["committed"] == {k: None for k in keys}
    assert first["generation"] >= 1
    assert reads(ops) == {k: [[0, 0], [1, 1], [2, 2]] for k in keys}
    # a commit names the next offset to read of every key the process polled
    done = c1.invoke(COMMIT)
    assert done["type"] == "ok" and done["value"] == [["commit", {k: 3 for k in keys}]]
    # a second member joins: the keys are split, each side says so, with the commits
    c2 = group_client(1, group, assignment_strategy=strategy)
    assert c2.invoke({"f": "subscribe", "value": keys})["type"] == "ok"
    seen: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for _ in range(40):
        for c in (c1, c2):
            op = c.invoke(POLL)
            assert op["type"] == "ok" and reads([op]) == {}  # nothing new to read
            if "rebalance" in op:
                seen[c.process].append(op["rebalance"])
        if c1.assigned and c2.assigned and len(c1.assigned | c2.assigned) == 2:
            break
    assert c1.assigned | c2.assigned == set(keys) and not c1.assigned & c2.assigned
    [moved] = c2.assigned
    joined = [r for r in seen[1] if moved in r["assigned"]]
    assert joined and joined[-1]["committed"] == {moved: 3}
    assert joined[-1]["generation"] > first["generation"]
    assert any(moved in r["revoked"] for r in seen[0])
    # c2 commits nothing it has not polled; a send to its key is read from the commit on
    assert c2.invoke(COMMIT) == {
        **COMMIT,
        "type": "fail",
        "error": "nothing-to-commit",
        "node": "n1",
    }
    assert c1.invoke({"f": "send", "value": [["send", moved, 3]]})["type"] == "ok"
    got = polls_until(c2, read_something)
    assert reads(got) == {moved: [[3, 3]]}
    assert c2.invoke(COMMIT)["value"] == [["commit", {moved: 4}]]
    # a crash leaves the group: c1 takes the key back, starting from c2's commit
    assert c2.invoke({"f": "crash", "value": None})["type"] == "info"
    back = polls_until(c1, rebalanced(moved))
    assert back[-1]["rebalance"]["committed"][moved] == 4
    # assign after subscribe leaves the group; kept keys resume where the polls left off
    [kept] = [k for k in keys if k != moved]
    done = c1.invoke({"f": "assign", "value": [kept]})
    assert done["type"] == "ok" and not c1.subscribed and c1.assigned == {kept}
    assert set(done["rebalance"]["revoked"]) == set(keys)
    assert c1.invoke({"f": "send", "value": [["send", kept, 3]]})["type"] == "ok"
    assert reads(polls_until(c1, read_something)) == {kept: [[3, 3]]}
    # an assigned process is no group member: its commit is refused without a request
    done = c1.invoke(COMMIT)
    assert done["type"] == "fail" and done["error"] == "not-subscribed"


def test_subscribe_after_assign_revokes_the_assigned_keys(
    group_client: Callable[..., QueueClient], group_broker: BrokerProcess
) -> None:
    keys = make_topics(group_broker.bootstrap, 2)
    c = group_client(0, f"g-{keys[0].split('-')[0]}-switch")
    assert c.invoke({"f": "send", "value": [["send", keys[0], 1]]})["type"] == "ok"
    assert c.invoke({"f": "assign", "value": keys})["type"] == "ok"
    assert reads(polls_until(c, read_something)) == {keys[0]: [[0, 1]]}
    # the process's positions in the assigned keys are gone with the assignment
    done = c.invoke({"f": "subscribe", "value": keys[1:]})
    assert done["type"] == "ok" and done["rebalance"]["revoked"] == sorted(keys)
    assert done["rebalance"]["assigned"] == [] and c.next_offsets == {}
    # and what the group then assigns arrives as a rebalance of its own
    polls_until(c, rebalanced(keys[1]))
    assert c.assigned == {keys[1]}


@pytest.mark.parametrize("mode", ["subscribe", "mixed"])
def test_subscribe_history_is_valid_under_isrlab_check(
    group_broker: BrokerProcess, tmp_path: Path, mode: str
) -> None:
    keys = make_topics(group_broker.bootstrap, 6)
    how: dict[str, Any] = {"subscribe": True} if mode == "subscribe" else {"sub_p": 0.5}
    config = TestConfig.from_mapping(
        {
            **how,
            "name": f"{mode}-live",
            "keys": keys,
            "concurrency": 6,
            "time_limit": 8,
            "final_time_limit": 20,
            "recovery_time": 0,
            "seed": 11,
            "commit_p": 0.2,
            # fewer subscription changes than Jepsen's 1/64 per op at this op rate: each one
            # is a rebalance of the whole group, and a group that never settles reads nothing
            "assign_p": 0.01,
            "crash_clients": True,
            "crash_client_interval": 3,
            "op_timeout_ms": 5000,
            "session_timeout_ms": 2000,
            "heartbeat_interval_ms": 500,
        }
    )
    test = config.to_test()
    assert test["group"] == f"isrlab-{mode}-live-11"
    assert test.get("subscribe") is (True if mode == "subscribe" else None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "test.json").write_text(json.dumps(test))
    history = HistoryWriter(run / "history.jsonl")
    workload = QueueWorkload(test)
    stats = Interpreter(
        queue_test(workload, test),
        history,
        QueueClient.factory(test, {"n1": group_broker.bootstrap}),
        config.concurrency,
        seed=11,
    ).run()
    history.close()
    assert not stats["errors"]
    ops = load_history(run / "history.jsonl")
    main = [o for o in ops if o["time"] < 8e9 and o["type"] != "invoke"]
    subscribes = [o for o in main if o["f"] == "subscribe" and o["type"] == "ok"]
    assigns = [o for o in main if o["f"] == "assign" and o["type"] == "ok"]
    assert subscribes and (bool(assigns) if mode == "mixed" else not assigns)
    rebalances = [o["rebalance"] for o in ops if "rebalance" in o]
    assert any(r["assigned"] for r in rebalances), rebalances
    assert any(r["revoked"] for r in rebalances), rebalances
    assert all(isinstance(r["generation"], int) for r in rebalances)
    assert all(r["generation"] > 0 for r in rebalances if r["assigned"])
    commits = [o for o in ops if o["f"] == "commit" and o["type"] == "ok"]
    assert all(o["value"][0][1] for o in commits)
    assert commits or mode == "mixed"  # (few mixed processes stay subscribed long enough)
    # what a member is assigned after a commit of the key starts from a committed offset
    committed_keys: set[str] = set()
    for o in ops:
        for k, off in o.get("rebalance", {}).get("committed", {}).items():
            assert off is not None or k not in committed_keys, (o, k)
        if o["f"] == "commit" and o["type"] == "ok":
            committed_keys.update(o["value"][0][1])
    # the group holds at least what it was told it committed (a rebalance after a commit
    # may or may not come within the run's few seconds: asked directly instead)
    best: dict[str, int] = {}
    for o in commits:
        for k, off in o["value"][0][1].items():
            best[k] = max(best.get(k, -1), off)
    if mode == "subscribe":
        assert best
    if best:
        from confluent_kafka import Consumer

        probe = Consumer({"bootstrap.servers": group_broker.bootstrap, "group.id": test["group"]})
        try:
            got = probe.committed(
                [TopicPartition(k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1])) for k in best],
                timeout=20,
            )
        finally:
            probe.close()
        held = {f"{tp.topic}/{tp.partition}": tp.offset for tp in got}
        assert all(held[k] >= off for k, off in best.items()), (held, best)
    # the checker, with the test's policy (subscribe mode; a mixed run's from the history),
    # finds it valid ...
    policy = policy_from_test(test)
    policy.pop("workload", None)
    results = check(ops, "queue", **policy)
    assert results["valid"] is True, results["anomaly_types"]
    assert results["stats"]["subscribe_mode"] is True
    # ... and so does `isrlab check` on the run directory
    res = CliRunner().invoke(subcommand_app("check", check_command), ["check", str(run)])
    assert res.exit_code == 0, res.output


def test_generation_is_read_from_librdkafkas_group_metadata() -> None:
    meta = b"CGMDv2:" + struct.pack("=i", 7) + b"g\x00m\x00\x00"
    assert generation_of(meta, 99) == 7
    assert generation_of(b"CGMDv2:\xff\xff\xff\xffg1\x00\x00\x01", 99) == -1
    assert generation_of(b"other", 3) == 3 and generation_of(None, 4) == 4


class _CommitConsumer:
    """A consumer whose commit() raises or returns what the test says."""

    def __init__(self, outcome: KafkaError | list[TopicPartition]) -> None:
        self.outcome = outcome
        self.committed: list[TopicPartition] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        assert asynchronous is False
        self.committed = offsets
        if isinstance(self.outcome, KafkaError):
            raise KafkaException(self.outcome)
        return self.outcome


def _committing(outcome: KafkaError | list[TopicPartition]) -> tuple[QueueClient, Op]:
    c = QueueClient({"group": "g"}, "x:9092", 0)
    c.consumer = _CommitConsumer(outcome)  # type: ignore[assignment]
    c.producer = object()  # type: ignore[assignment]
    c.subscribed = True
    c.assigned = {"t/0", "t/1"}
    c.next_offsets = {"t/0": 5, "t/1": 2}
    return c, c.invoke(COMMIT)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        # refused before the append: certainly not committed
        (KafkaError.ILLEGAL_GENERATION, "fail"),
        (KafkaError.UNKNOWN_MEMBER_ID, "fail"),
        (KafkaError.REBALANCE_IN_PROGRESS, "fail"),
        (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "fail"),
        # Kafka's answer to an append that failed or timed out: may still commit
        (KafkaError.NOT_COORDINATOR, "info"),
        (KafkaError.COORDINATOR_NOT_AVAILABLE, "info"),
        (KafkaError._TIMED_OUT, "info"),
        (KafkaError._TRANSPORT, "info"),
    ],
)
def test_commit_errors_are_definite_only_before_the_append(code: int, kind: str) -> None:
    c, done = _committing(KafkaError(code))
    assert done["type"] == kind and done["error"][0] == "commit"
    assert done["value"] == [["commit", {"t/0": 5, "t/1": 2}]]
    assert [(tp.topic, tp.partition, tp.offset) for tp in c.consumer.committed] == [  # type: ignore[union-attr]
        ("t", 0, 5),
        ("t", 1, 2),
    ]


class _Result:
    """One partition of commit()'s result (TopicPartition's error is read-only)."""

    def __init__(self, code: int | None) -> None:
        self.error = None if code is None else KafkaError(code)


def test_commit_with_per_partition_errors() -> None:
    _, done = _committing([_Result(None), _Result(KafkaError.ILLEGAL_GENERATION)])  # type: ignore[list-item]
    assert done["type"] == "info"  # half of it happened
    assert done["error"] == ["commit", "illegal-generation"]
    both = [_Result(KafkaError.UNKNOWN_MEMBER_ID), _Result(KafkaError.ILLEGAL_GENERATION)]
    _, done = _committing(both)  # type: ignore[arg-type]
    assert done["type"] == "fail"
    _, done = _committing([_Result(None), _Result(KafkaError.NOT_COORDINATOR)])  # type: ignore[list-item]
    assert done["type"] == "info"
    _, done = _committing([_Result(None), _Result(None)])  # type: ignore[list-item]
    assert done["type"] == "ok" and "error" not in done


class _StuckCommitConsumer:
    """librdkafka's synchronous commit with no coordinator: it does not return."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.release.wait(30)
        return None


def test_a_commit_that_never_returns_is_an_info_after_the_op_timeout() -> None:
    """Seen on the embedded cluster: commits sent while the coordinator was partitioned away
    blocked their processes for good, and the run never reached its final phase."""
    c = QueueClient({"group": "g", "op_timeout_ms": 300}, "x:9092", 0)
    stuck = _StuckCommitConsumer()
    c.consumer = stuck  # type: ignore[assignment]
    c.producer = object()  # type: ignore[assignment]
    c.subscribed = True
    c.assigned = {"t/0"}
    c.next_offsets = {"t/0": 5}
    try:
        done = c.invoke(COMMIT)
    finally:
        stuck.release.set()
    assert done["type"] == "info"
    assert done["error"] == ["commit", "timeout"]
    assert done["value"] == [["commit", {"t/0": 5}]]


def test_find_coordinator_names_the_broker(group_broker: BrokerProcess) -> None:
    import time

    from isrlab.harness.db import find_coordinator

    # the first FindCoordinator creates __consumer_offsets: COORDINATOR_NOT_AVAILABLE meanwhile
    deadline = time.monotonic() + 30
    found = None
    while found is None and time.monotonic() < deadline:
        found = find_coordinator(group_broker.host, group_broker.port, "g-find")
        time.sleep(0.1)
    assert found == group_broker.broker_id
