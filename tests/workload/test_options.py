"""The queue workload's knobs (harness.workloads.queue.options): the generator and the client
read them from the one table, with the defaults they had before the table existed."""

from __future__ import annotations

import pytest

from isrlab.harness.generator import NS
from isrlab.harness.optiontable import ConfigError
from isrlab.harness.testconfig import TestConfig
from isrlab.harness.workloads.queue.client import QueueClient
from isrlab.harness.workloads.queue.generator import QueueWorkload
from isrlab.harness.workloads.queue.options import KNOBS, QueueOptions

KEYS = [f"t{i}/0" for i in range(5)]


def test_the_generator_runs_with_the_defaults_it_always_had() -> None:
    # the literals below are the generator's defaults from before the table (test.get(k, d))
    w = QueueWorkload({"keys": KEYS})
    assert (w.max_txn_length, w.send_p, w.assign_p, w.assign_keys) == (1, 0.5, 1 / 64, 3)
    assert (w.sub_via, w.crash_clients, w.crash_interval) == (["assign"], False, 30.0)
    assert (w.poll_ms, w.final_poll_ms, w.final_restart_ns) == (20, 1000, 10 * NS)
    assert QueueWorkload({"keys": KEYS, "txn": True}).max_txn_length == 4
    # and a full test map from the test table gives the same (its keys are not knobs)
    full = QueueWorkload(TestConfig.from_mapping({"key_count": 5}).to_test())
    assert vars(full) == vars(w)


def test_the_client_runs_with_the_defaults_it_always_had() -> None:
    c = QueueClient({"keys": KEYS}, "x:9092", 0)
    assert (c.op_timeout, c.poll_s, c.watermark_p) == (10.0, 0.02, 0.1)
    p, cons = c.producer_config(), c.consumer_config()
    assert (p["linger.ms"], p["message.timeout.ms"], p["request.timeout.ms"]) == (0, 10000, 5000)
    assert p["socket.connection.setup.timeout.ms"] == 5000 and "retries" not in p
    assert (cons["fetch.wait.max.ms"], cons["socket.connection.setup.timeout.ms"]) == (100, 5000)
    assert c.admin_config()["socket.connection.setup.timeout.ms"] == 5000
    txn = QueueClient({"txn": True, "op_timeout_ms": 40000}, "x:9092", 0).producer_config()
    assert txn["transaction.timeout.ms"] == 80000 and txn["message.timeout.ms"] == 40000


def test_the_knobs_a_test_sets_reach_the_generator_and_the_client() -> None:
    test = TestConfig.from_mapping(
        {"key_count": 5, "send_p": "1", "sub_via": "subscribe", "retries": 3, "poll_ms": 7}
    ).to_test()
    w = QueueWorkload(test)
    assert (w.send_p, w.sub_via, w.poll_ms) == (1.0, ["subscribe"], 7)
    c = QueueClient({**test, "consumer_config": {"fetch.min.bytes": 4096}}, "x:9092", 0)
    assert c.producer_config()["retries"] == 3 and c.poll_s == 0.007
    assert c.consumer_config()["fetch.min.bytes"] == 4096


def test_a_bad_knob_value_is_refused_by_the_workload_too() -> None:
    with pytest.raises(ConfigError, match="send_p must be at most 1"):
        QueueWorkload({"keys": KEYS, "send_p": 1.5})
    with pytest.raises(ConfigError, match="op_timeout_ms takes an integer"):
        QueueClient({"op_timeout_ms": "soon"}, "x:9092", 0)


def test_every_knob_has_help_and_a_default_of_its_type() -> None:
    assert {o.name for o in KNOBS} >= {"send_p", "poll_ms", "op_timeout_ms", "watermark_p"}
    for o in KNOBS:
        assert o.help and o.flag is None
        assert o.check(o.default) == o.default or (o.optional and o.default is None)
    assert QueueOptions.from_test({}) == QueueOptions()
