"""The test table (harness.testconfig): every option's validation, the CLI derived from it, and
bad options rejected before anything touches a node."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from isrlab.harness import runner, testconfig
from isrlab.harness.testconfig import OPTIONS, ConfigError, Option, TestConfig
from isrlab.harness.workloads.queue.options import KNOBS
from tests.harness.conftest import Refusals
from tests.typer_app import subcommand_app


def _app() -> typer.Typer:
    return subcommand_app("test", runner.test_command)


def _good(opt: Option) -> Any:
    if opt.choices:
        return opt.choices[0]
    if opt.kind is bool:
        return True
    if opt.kind in (int, float):
        return opt.minimum + 1 if opt.minimum is not None else 7
    if opt.kind is dict:
        return {"log.segment.bytes": 1048576}
    return "n1" if opt.kind is list else "x"


# Options that only make sense with another: what each is tried with.
_COMPANIONS: dict[str, dict[str, Any]] = {
    "commit_p": {"subscribe": True},
    # the coordinator target needs a group, the txn-coordinator target transactions
    "nemesis_targets": {"subscribe": True, "txn": True},
    # a cluster of one or two brokers, or one replica, needs topics and an ISR to match
    "node_count": {"replication_factor": 1, "min_insync_replicas": 1},
    "nodes": {"replication_factor": 1, "min_insync_replicas": 1},
    "replication_factor": {"min_insync_replicas": 1},
}


def _config(opt: Option, value: Any) -> TestConfig:
    return TestConfig.from_mapping({**_COMPANIONS.get(opt.name, {}), opt.name: value})


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o.name)
def test_every_option_is_validated_from_the_table(opt: Option) -> None:
    # the default, and a good value, pass
    assert _config(opt, opt.default) is not None
    good = _config(opt, _good(opt))
    value = getattr(good, opt.name)
    assert value is not None and (opt.name != "keys" or value == ("n1",))
    # a value of the wrong type is refused with the option's name
    wrong: Any = _wrong_type(opt)
    if opt.kind in (str, list) and not opt.choices:
        wrong = object()
    with pytest.raises(ConfigError, match=re.escape(opt.name)):
        _config(opt, wrong)
    for choice in opt.choices:
        assert _config(opt, choice)
    _refuses_values_outside_its_bounds(opt)
    if opt.minimum is not None and not opt.above:
        assert _config(opt, opt.minimum)


def _wrong_type(opt: Option) -> Any:
    return {bool: "maybe", int: "many", float: "fast", dict: "k=v"}.get(opt.kind, 3.5)


def _refuses_values_outside_its_bounds(opt: Option) -> None:
    """A value outside the option's choices, minimum or maximum is refused, naming it."""
    named = rf"{re.escape(opt.name)}( \(--[\w-]+\))? must be"
    if opt.choices:
        with pytest.raises(ConfigError, match="must be one of"):
            _config(opt, "no-such-value")
    if opt.minimum is not None:
        low = opt.minimum if opt.above else opt.minimum - 1
        with pytest.raises(ConfigError, match=named):
            _config(opt, low)
    if opt.maximum is not None:
        with pytest.raises(ConfigError, match=named + " at most"):
            _config(opt, opt.maximum + 0.5)


def test_the_typed_config_round_trips_through_test_json() -> None:
    config = TestConfig.from_mapping(
        {
            "nemesis": ["partition", "kill", "none"],
            "acks": "-1",
            "seed": 3,
            "key_count": 2,
            "poll_ms": 5,
        }
    )
    assert config.acks == "all" and config.nemesis == ("partition", "kill")
    test = json.loads(json.dumps(config.to_test()))
    assert test["nemesis"] == ["partition", "kill"] and test["keys"] == ["t0/0", "t1/0"]
    assert test["poll_ms"] == 5  # a knob of the workload's table (QueueOptions)
    # the keys every harness run has written (the history/results contract), and no more
    always = {
        *[
            "name",
            "workload",
            "nodes",
            "nodes_file",
            "node_count",
            "cluster_name",
            "keep_cluster",
            "concurrency",
        ],
        *["rate", "time_limit", "final_time_limit", "recovery_time", "nemesis", "nemesis_interval"],
        *[
            "nemesis_targets",
            "squeeze_then",
            "flap_follower",
            "lagging_how",
            "acks",
            "idempotence",
            "txn",
            "isolation_level",
            "min_insync_replicas",
        ],
        *["unclean_leader_election", "truncation_mode", "replica_lag_time_max_ms"],
        "eligible_leader_replicas",
        *["txn_verification", "txn_epoch_fencing", "txn_marker_acks"],
        *[
            "zk_session_timeout_ms",
            "replication_factor",
            "key_count",
            "seed",
            "store",
            "keys",
            "poll_ms",
        ],
    }
    assert set(test) == always
    assert TestConfig.from_mapping(test) == config


def test_broker_settings_and_report_columns_come_from_the_table() -> None:
    assert testconfig.BROKER_SETTINGS["min_insync_replicas"] == "min.insync.replicas"
    from isrlab.harness.db import KafkaDB
    from isrlab.harness.inventory import Inventory, Node, SshOptions

    inv = Inventory([Node("n1", "10.0.0.11")], SshOptions(host_key_policy="warn"))
    test = TestConfig.from_mapping({"unclean_leader_election": True}).to_test()
    props = KafkaDB(test, inv, "/tmp/run").broker_properties("n1")
    for name, key in testconfig.BROKER_SETTINGS.items():
        if test.get(name) is not None:
            assert f"{key}={testconfig.render_broker_value(test[name])}\n" in props
    assert "unclean.leader.election.enable=true\n" in props
    from isrlab.pipeline.ingest import RUNS_SCHEMA
    from isrlab.pipeline.store import CONFIG_COLUMNS, config_of

    assert set(CONFIG_COLUMNS) == {
        "workload",
        "mode",
        "consumer",
        "nemesis",
        *(o.name for o in testconfig.COLUMNS),
    }
    assert set(CONFIG_COLUMNS) <= set(RUNS_SCHEMA.names)
    # a stored test.json without min_insync_replicas ran with Kafka's 1, not the new default 2
    assert TestConfig().min_insync_replicas == 2
    assert config_of({})["min_insync_replicas"] == 1


def test_help_lists_every_option_of_the_table() -> None:
    res = CliRunner().invoke(_app(), ["test", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    flags = [o.flag for o in OPTIONS if o.flag]
    assert len(flags) >= 30
    for flag in [*flags, "--test-count"]:
        assert flag in res.output, flag


@pytest.fixture()
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records any attempt to reach nodes (inventory, deploy, run) instead of doing it."""
    from isrlab.harness import db

    calls = Refusals(monkeypatch)
    calls.refuse(runner, "node_inventory")
    calls.refuse(runner, "run_test")
    calls.refuse(db.KafkaDB, "setup", "KafkaDB.setup")
    return calls


@pytest.fixture()
def stopped_runs(monkeypatch: pytest.MonkeyPatch) -> list[TestConfig]:
    """The configs `isrlab test` hands to `run_test`, which stops there (SetupError "stop
    here", exit 2) instead of reaching any node."""
    seen: list[TestConfig] = []

    def fake_run(config: TestConfig) -> Any:
        seen.append(config)
        raise runner.SetupError("stop here")

    monkeypatch.setattr(runner, "run_test", fake_run)
    return seen


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nemesis", "partition+flood"], "flood"),
        (["--nemesis", "partition,kill"], "partition+kill"),
        (["--test-count", "0"], "test-count"),
        (["--acks", "2"], "acks"),
        (["--nemesis-targets", "half"], "nemesis_targets"),
        (["--truncation-mode", "none"], "truncation_mode"),
        (["--replica-lag-time-max-ms", "0"], "at least 100"),
        (["--time-limit", "0"], "above 0"),
        (["--nodes", "n1,n2,n3", "--nodes-file", "nodes.yaml"], "not both"),
        (["--set", "copier_zombie=true", "--workload", "eos"], "did you mean 'copier_zombies'"),
        (["--set", "time_limit=5"], "give it as --time-limit"),
        (["--set", "poll_ms"], "NAME=VALUE"),
        (["--workload", "eos", "--set", "copier_zombies=maybe"], "copier_zombies"),
        (["--node-count", "2"], "needs at least 3 brokers, and the cluster has 2 (--node-count)"),
        (["--nodes", "n1"], "needs at least 3 brokers, and the cluster has 1 (--nodes)"),
        (["--min-insync-replicas", "4"], "min.insync.replicas 4 (--min-insync-replicas) is above"),
    ],
)
def test_bad_options_exit_2_before_any_node_is_touched(
    no_cluster: list[str], tmp_path: Path, args: list[str], message: str
) -> None:
    res = CliRunner().invoke(_app(), ["test", "--store", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # rich wraps long lines
    assert message in text and "Traceback" not in text
    assert no_cluster == []
    assert not any(tmp_path.iterdir())  # no run directory either


def test_good_options_do_reach_the_run(no_cluster: list[str], tmp_path: Path) -> None:
    # the guard above is not vacuous: valid options get as far as running
    res = CliRunner().invoke(
        _app(), ["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", "--nemesis", "kill"]
    )
    assert no_cluster == ["run_test"] and res.exit_code != 0


@pytest.mark.parametrize(
    "values",
    [
        {"node_count": 1, "replication_factor": 1, "min_insync_replicas": 1},
        {"node_count": 3},  # the default replication factor, 3
        {"nodes": ("n1", "n2"), "replication_factor": 2},
        {"nodes_file": "nodes.yaml"},  # its size is known once it is read
        {"acks": "1", "min_insync_replicas": 4},  # acks=1 does not wait for the ISR
    ],
)
def test_clusters_large_enough_for_the_replication_factor_pass(values: dict[str, Any]) -> None:
    TestConfig.from_mapping(values)


def test_the_options_reference_is_the_table() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "test-options.md"
    assert doc.read_text() == testconfig.reference_markdown(), (
        "regenerate: python -c 'from isrlab.harness.testconfig import reference_markdown; "
        'print(reference_markdown(), end="")\' > docs/test-options.md'
    )


# ----- the workload's knobs (harness.workloads.queue.options.QueueOptions) ------------------


@pytest.mark.parametrize("knob", KNOBS, ids=lambda o: o.name)
def test_every_workload_knob_is_validated_from_its_table(knob: Option) -> None:
    assert knob.flag is None and not knob.always_in_json  # test.json keys, not flags
    given = TestConfig.from_mapping({knob.name: knob.default}).knobs
    assert given.get(knob.name) == knob.default
    good = _good(knob) if knob.maximum is None else knob.maximum
    assert getattr(TestConfig.from_mapping({knob.name: good}).workload_options, knob.name) == (
        knob.check(good)
    )
    with pytest.raises(ConfigError, match=re.escape(knob.name)):
        TestConfig.from_mapping({knob.name: _wrong_type(knob)})
    _refuses_values_outside_its_bounds(knob)


def test_a_misspelled_knob_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown test option 'send_pp' \(did you mean 'send_p'"):
        TestConfig.from_mapping({"send_pp": 0.9})
    with pytest.raises(ConfigError, match="unknown test option 'poll_ms_'"):
        TestConfig.from_mapping({"nemesis": "kill"}).replace(poll_ms_=5)
    # a stored test.json read back: the same refusal
    stored = TestConfig.from_mapping({"seed": 1}).to_test()
    with pytest.raises(ConfigError, match="'op_timeout'"):
        TestConfig.from_mapping({**stored, "op_timeout": 500})


def test_a_misspelled_knob_exits_2_before_any_node_is_touched(
    no_cluster: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the CLI's path (`isrlab test` builds its configurations with make_test before any run)
    with pytest.raises(typer.Exit) as exit_:
        runner._test_command(store=str(tmp_path), nodes="n1,n2,n3", send_pp=0.9)
    assert exit_.value.exit_code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown test option 'send_pp'" in err and "Traceback" not in err
    assert no_cluster == [] and not any(tmp_path.iterdir())
    # the guard is not vacuous: the right spelling gets as far as running
    with pytest.raises(AssertionError, match="run_test called"):
        runner._test_command(store=str(tmp_path), nodes="n1,n2,n3", send_p=0.9)
    assert no_cluster == ["run_test"]


def test_knobs_in_test_json_are_the_ones_set_as_before() -> None:
    config = TestConfig.from_mapping(
        {
            "seed": 1,
            "send_p": 1,
            "sub_via": "assign,subscribe",
            "allow": "poll-skip, unseen",
            "producer_config": {"topic.metadata.propagation.max.ms": 1000},
            "checker": {"disallow": ["duplicate"]},
            "clock_max_skew_ms": 5000,
        }
    )
    test = json.loads(json.dumps(config.to_test()))
    bare = json.loads(json.dumps(TestConfig.from_mapping({"seed": 1}).to_test()))
    assert set(test) - set(bare) == {
        *["send_p", "sub_via", "allow", "producer_config", "checker", "clock_max_skew_ms"],
        "group",  # processes may subscribe: the test names its consumer group
    }
    assert test["group"] == "isrlab-queue-1"
    assert not {o.name for o in KNOBS} & set(bare)  # unset knobs are not written
    assert test["sub_via"] == ["assign", "subscribe"] and test["allow"] == ["poll-skip", "unseen"]
    # librdkafka settings keep their JSON types (the broker_config of the test table is text)
    assert test["producer_config"] == {"topic.metadata.propagation.max.ms": 1000}
    assert TestConfig.from_mapping(test) == config
    # what reads them still does: the checker's policy, the clock nemesis's bound
    from isrlab.checkers.api import policy_from_test

    policy = policy_from_test(test)
    assert policy["allow"] == {"poll-skip", "unseen"} and policy["disallow"] == {"duplicate"}
    assert policy["subscribe"] is True
    assert test["clock_max_skew_ms"] == 5000


def test_the_runs_schema_is_unchanged_by_the_knobs() -> None:
    from isrlab.pipeline.ingest import RUNS_DDL

    assert not {o.name for o in KNOBS} & set(RUNS_DDL.replace(",", " ").split())


# ----- how processes take keys: subscribe, sub_p, commit_p, group ---------------------------


def test_subscribing_tests_name_their_group_and_assigning_ones_do_not() -> None:
    bare = TestConfig.from_mapping({"seed": 4}).to_test()
    assert not {"subscribe", "sub_p", "commit_p", "group"} & set(bare)
    assert testconfig.consumer_mode(bare) == "assign"
    sub = TestConfig.from_mapping({"seed": 4, "subscribe": "true", "commit_p": 0.1}).to_test()
    assert sub["subscribe"] is True and sub["commit_p"] == 0.1
    assert sub["group"] == "isrlab-queue-4" and testconfig.consumer_mode(sub) == "subscribe"
    assert testconfig.config_name(sub) == "acks-all_kill+partition_idem_sub_commit0.1_isr2"
    mixed = TestConfig.from_mapping({"seed": 4, "sub_p": 0.25, "group": "mine"}).to_test()
    assert mixed["group"] == "mine" and testconfig.consumer_mode(mixed) == "mixed"
    assert "_subp0.25_" in testconfig.config_name(mixed)
    # the checker reads the mode from test.json (mixed runs: from the history)
    from isrlab.checkers.api import policy_from_test

    assert policy_from_test(sub)["subscribe"] is True
    assert "subscribe" not in policy_from_test(mixed) and "subscribe" not in policy_from_test(bare)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"subscribe": True, "sub_p": 0.5}, "give one of subscribe"),
        ({"sub_p": 0.5, "sub_via": "subscribe"}, "give one of subscribe"),
        ({"commit_p": 0.1}, r"commit_p \(--commit-p\).*add --subscribe or --sub-p"),
        ({"commit_p": 0.1, "sub_p": 0}, r"commit_p \(--commit-p\)"),
        ({"nemesis_targets": "leader,coordinator"}, r"coordinator.*add --subscribe or --sub-p"),
        ({"sub_p": 1.5}, r"sub_p \(--sub-p\) must be at most 1"),
    ],
)
def test_inconsistent_consumer_options_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TestConfig.from_mapping(values)


def test_consumer_flags_reach_the_run(no_cluster: list[str], tmp_path: Path) -> None:
    res = CliRunner().invoke(
        _app(),
        ["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", "--commit-p", "0.1"],
    )
    assert res.exit_code == 2 and "--commit-p" in res.output and no_cluster == []
    with pytest.raises(AssertionError, match="run_test called"):
        runner._test_command(
            store=str(tmp_path),
            nodes="n1,n2,n3",
            subscribe=True,
            commit_p=0.2,
            nemesis_targets="coordinator",
        )
    assert no_cluster == ["run_test"]


def test_set_gives_the_workload_knobs_to_the_run(
    stopped_runs: list[TestConfig], tmp_path: Path
) -> None:
    res = CliRunner().invoke(
        _app(),
        [
            "test",
            "--store",
            str(tmp_path),
            "--nodes",
            "n1,n2,n3",
            "--workload",
            "eos",
            "--txn",
            "--set",
            "copier_zombies=true",
            "--set",
            "copier_kill_interval=5",
        ],
    )
    assert res.exit_code == 2 and "stop here" in res.output, res.output
    [config] = stopped_runs
    assert config.knobs["copier_zombies"] is True
    assert config.knobs["copier_kill_interval"] == 5.0
    assert config.to_test()["copier_zombies"] is True  # in test.json


# ----- --broker-config KEY=VALUE: raw server.properties keys for every broker ---------------


def test_broker_config_items_are_parsed_and_saved_in_test_json() -> None:
    config = TestConfig.from_mapping(
        {
            "broker_config": [
                "log.segment.bytes=20000",
                " log.cleaner.backoff.ms = 200 ",
                "log.cleanup.policy=compact,delete",  # (a value may hold commas; = splits once)
            ]
        }
    )
    expected = {
        "log.segment.bytes": "20000",
        "log.cleaner.backoff.ms": "200",
        "log.cleanup.policy": "compact,delete",
    }
    assert config.broker_config == expected
    assert json.loads(json.dumps(config.to_test()))["broker_config"] == expected
    # test.json's mapping reads back as the same test; unset, the key is not written
    assert TestConfig.from_mapping(config.to_test()) == config
    assert "broker_config" not in TestConfig.from_mapping({}).to_test()
    assert "broker_config" not in TestConfig.from_mapping({"broker_config": []}).to_test()
    # the same item twice is one item
    same = ["log.segment.bytes=20000", "log.segment.bytes=20000"]
    assert TestConfig.from_mapping({"broker_config": same}).broker_config == {
        "log.segment.bytes": "20000"
    }


@pytest.mark.parametrize(
    ("items", "message"),
    [
        # not KEY=VALUE
        (["log.segment.bytes"], r"takes KEY=VALUE.*not 'log.segment.bytes'"),
        (["=20000"], r"takes KEY=VALUE.*not '=20000'"),
        (["log.segment.bytes=1", "log.segment.bytes=2"], "gives log.segment.bytes twice"),
        # the broker's own refusals, in its words
        (["segment.bytes=1"], r"unknown configuration key 'segment.bytes' \(did you mean log"),
        (["no.such.key=1"], "unknown configuration key 'no.such.key'"),
        (["log.segment.bytes=abc"], r"log.segment.bytes: invalid value 'abc' \(int expected"),
        (["log.segment.bytes=3"], "log.segment.bytes: invalid value '3': must be >= 14"),
        (["log.cleaner.enable=maybe"], "log.cleaner.enable: invalid value 'maybe'"),
        (["queued.max.request.bytes=10"], "is smaller than socket.request.max.bytes"),
        # a setting of the test table: its own flag
        (["min.insync.replicas=1"], "give it as --min-insync-replicas"),
        (["unclean.leader.election.enable=true"], "give it as --unclean-leader-election"),
        (["replica.truncation.mode=high-watermark"], "give it as --truncation-mode"),
        (["default.replication.factor=1"], "give it as --replication-factor"),
        (["replica.lag.time.max.ms=500"], "give it as --replica-lag-time-max-ms"),
        (["offsets.commit.required.acks=1"], "give it as --offsets-commit-required-acks"),
        (
            ["log.flush.interval.messages=1"],
            r"give it as --flush-interval-messages \(test.json's flush_interval_messages\) or "
            "--flush-policy every-append",
        ),
        (
            ["log.flush.interval.ms=100"],
            r"--flush-interval-ms \(test.json's flush_interval_ms\) or",
        ),
        # what the harness sets for each broker
        (["listeners=PLAINTEXT://:9093"], "listeners: the harness sets it for each broker"),
        (["broker.id=7"], "broker.id: the harness sets it"),
        (["log.dirs=/tmp/x"], "log.dirs: the harness sets it"),
        (["zookeeper.connect=zk:2181"], "zookeeper.connect: the harness sets it"),
    ],
)
def test_bad_broker_config_is_refused(items: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=r"broker_config \(--broker-config\)") as e:
        TestConfig.from_mapping({"broker_config": items})
    assert re.search(message, str(e.value)), str(e.value)
    # the same through the Python API's mapping, for the keys (not the item syntax)
    if "KEY=VALUE" not in message and "twice" not in message:
        key, _, value = items[0].partition("=")
        with pytest.raises(ConfigError, match=message):
            TestConfig.from_mapping({"broker_config": {key: value}})
        with pytest.raises(ConfigError, match=message):
            TestConfig.from_mapping({}).replace(broker_config={key: value})


def test_every_broker_key_of_the_table_is_refused_as_a_raw_key() -> None:
    keys = [o for o in OPTIONS if o.broker_key]
    assert len(keys) >= 10
    for opt in keys:
        with pytest.raises(ConfigError, match=re.escape(f"give it as {opt.flag}")):
            TestConfig.from_mapping({"broker_config": [f"{opt.broker_key}=1"]})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--broker-config", "log.segment.bytes"], "takes KEY=VALUE"),
        (["--broker-config", "log.segment.bytes=abc"], "log.segment.bytes: invalid value 'abc'"),
        (["--broker-config", "no.such.key=1"], "unknown configuration key 'no.such.key'"),
        (["--broker-config", "min.insync.replicas=1"], "give it as --min-insync-replicas"),
        (["--set", "broker_config=x"], "give it as --broker-config"),
    ],
)
def test_isrlab_test_refuses_bad_broker_config_before_any_node(
    no_cluster: list[str], tmp_path: Path, args: list[str], message: str
) -> None:
    res = CliRunner().invoke(
        _app(), ["test", "--store", str(tmp_path), "--nodes", "n1,n2,n3", *args]
    )
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and message in text and "Traceback" not in text, text
    assert no_cluster == [] and not any(tmp_path.iterdir())


def test_isrlab_test_gives_broker_config_to_every_broker(
    stopped_runs: list[TestConfig], tmp_path: Path
) -> None:
    from isrlab.harness.db import KafkaDB
    from isrlab.harness.inventory import Inventory, Node, SshOptions

    res = CliRunner().invoke(
        _app(),
        [
            "test",
            "--store",
            str(tmp_path),
            "--nodes",
            "n1,n2,n3",
            "--test-count",
            "2",
            "--broker-config",
            "offsets.topic.segment.bytes=16384",
            "--broker-config",
            "log.cleaner.backoff.ms=200",
        ],
    )
    assert res.exit_code == 2 and "stop here" in res.output, res.output
    config = stopped_runs[0]
    expected = {"offsets.topic.segment.bytes": "16384", "log.cleaner.backoff.ms": "200"}
    assert config.broker_config == expected
    test = config.to_test()
    assert test["broker_config"] == expected  # test.json
    nodes = [Node(n, f"10.0.0.1{i}") for i, n in enumerate(["n1", "n2", "n3"], 1)]
    db = KafkaDB(test, Inventory(nodes, SshOptions(host_key_policy="warn")), "/tmp/run")
    for node in db.names:
        props = db.broker_properties(node)
        assert "offsets.topic.segment.bytes=16384\n" in props
        assert "log.cleaner.backoff.ms=200\n" in props
