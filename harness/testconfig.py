"""The test configuration: one table of options, and the typed object it describes.

Every option of a test is one field of `TestConfig`, declared once with its type, default,
allowed values, help, the broker key it sets and the report column it becomes (`OPTIONS`, the
table, is read from those declarations). From the table come:

- the ``isrlab test`` command-line options (`cli_parameters`, one flag per option);
- validation with one message style (`TestConfig.from_mapping`, raising `ConfigError`), run
  before any node is touched;
- test.json (`TestConfig.to_test`: the plain test map, with the keys runs have always had);
- the broker settings under test (`BROKER_SETTINGS`, test key -> server.properties key);
- the matrix's switches and ``--set`` settings (`SWITCHES`, `SETTINGS`);
- the pipeline's report columns and Spark/Arrow schemas (`COLUMNS`, `Option.column`), with
  `Option.absent`: the value a stored run whose test.json lacks the key actually ran with.

Defaults and "absent" differ on purpose for one option: a new test runs with
``min_insync_replicas`` = 2 (with acks=all the safe lab default), but a stored test.json without
the key ran on brokers that were given no ``min.insync.replicas`` and so used Kafka's default, 1.
Every other option's absent value is its default (the harness writes the timings into each
broker's server.properties whether or not the test names them).

Components below the runner (db, nemeses, generator, client, checkers) receive the test map
(`to_test()`): data across the boundary, as Jepsen's test map. The workload's own knobs (the
queue workload's ``send_p``, ``poll_ms``, ...) are the workload's table
(`harness.workloads.queue.options.QueueOptions`, found through `WORKLOAD_OPTIONS`): a test
sets them as keys of the same map, `from_mapping` validates them with that table into
``knobs``, and a key in neither table is refused (`ConfigError`, before any node is touched).
The option machinery both tables share is `harness.optiontable`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from isrlab.broker.config import BrokerConfig
from isrlab.broker.config import ConfigError as BrokerConfigError
from isrlab.harness.optiontable import ConfigError, Option, table
from isrlab.harness.optiontable import option_field as _opt
from isrlab.harness.workloads.eos.options import EOS_KNOBS, EosOptions
from isrlab.harness.workloads.queue.options import QueueOptions, subscribe_share
from isrlab.nemeses import KINDS as FAULT_KINDS
from isrlab.nemeses import TARGETS
from isrlab.nemeses.clock import DEFAULT_MAX_SKEW_MS

__all__ = [
    "BROKER_SETTINGS",
    "COLUMNS",
    "COMBINED_KINDS",
    "CONSUMER_MODES",
    "OPTIONS",
    "SETTINGS",
    "SWITCHES",
    "TIMINGS",
    "WORKLOAD_OPTIONS",
    "ConfigError",
    "Option",
    "TestConfig",
    "cli_parameters",
    "config_name",
    "consumer_mode",
    "nemesis_kinds",
    "nemesis_label",
    "option",
]

# Each workload's table of knobs: test.json keys beside the test table's. The eos workload's
# (consume-transform-produce, harness.workloads.eos) are the queue workload's and its own.
WORKLOAD_OPTIONS: dict[str, type[QueueOptions]] = {
    QueueOptions.workload: QueueOptions,
    EosOptions.workload: EosOptions,
}


# flush_policy's values: Kafka's default, fsync on every append, and time-based flushes
FLUSH_POLICIES: tuple[str, ...] = (
    "never",
    "every-append",
    "interval:100",
    "interval:1000",
    "interval:10000",
)


@dataclass(frozen=True)
class TestConfig:
    """One test, typed. Build it with `from_mapping` (validates); `to_test()` is test.json."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str = _opt("queue", "test name (run store folder)")
    workload: str = _opt(
        "queue", "workload (the one `isrlab test` runs)", choices=tuple(WORKLOAD_OPTIONS)
    )
    nodes: tuple[str, ...] | None = _opt(None, "comma-separated SSH hosts (real nodes)")
    nodes_file: str | None = _opt(None, "YAML nodes file (host, port, user, key)")
    node_count: int = _opt(5, "embedded cluster size", minimum=1)
    cluster_name: str = _opt("default", "embedded cluster name")
    keep_cluster: bool = _opt(False, "leave the embedded cluster up")
    concurrency: int = _opt(20, "client processes", minimum=1, setting=True)
    rate: float = _opt(0.0, "target ops/s over all processes (0 = unlimited)", minimum=0)
    time_limit: float = _opt(60.0, "seconds of workload with faults", minimum=0, above=True)
    final_time_limit: float = _opt(
        60.0, "seconds for the final reads", minimum=0, above=True, setting=True
    )
    recovery_time: float = _opt(
        10.0, "seconds between healing and final reads", minimum=0, setting=True
    )
    nemesis: tuple[str, ...] = _opt(
        ("partition", "kill"),
        "faults: a fault kind, kinds joined by + (partition+kill: each on its own schedule, "
        "so they overlap), combined (partition+kill+pause+clock) or none; the grammar of "
        "`isrlab matrix --nemesis`, where a comma lists cells (test.json: the list of kinds)",
        choices=(*FAULT_KINDS, "none"),
    )
    nemesis_interval: float = _opt(
        10.0, "seconds between fault changes", minimum=0, above=True, setting=True
    )
    nemesis_targets: tuple[str, ...] | None = _opt(None, "comma list of targets", choices=TARGETS)
    squeeze_then: tuple[str, ...] | None = _opt(
        None,
        "how the isr-squeeze nemesis fails the leader once its ISR has shrunk: comma list of "
        "kill, isolate, power (kill -9, then its files cut back to their last fsync), one "
        "drawn per strike (unset: kill,isolate)",
        choices=("kill", "isolate", "power"),
        setting=True,
    )
    flap_follower: tuple[str, ...] | None = _opt(
        None,
        "what the leader-flap nemesis does to the followers: comma list of restart (one "
        "restarted after the first leader change), cut (two in-sync followers cut off from "
        "each other before the leader is killed, the next leader killed at once), diverge "
        "(KIP-279: the next leader made to lag, then killed; the other leads; the first "
        "comes back, rejoins, and leads once the other is killed), one drawn per strike "
        "(unset: restart)",
        choices=("restart", "cut", "diverge"),
        setting=True,
    )
    lagging_how: tuple[str, ...] | None = _opt(
        None,
        "how the lagging-failover nemesis holds the key's in-sync followers back before it "
        "kills the leader: comma list of pause (SIGSTOP the followers), cut (drop their broker "
        "connections to the leader's node only, so they keep replicating from other leaders), "
        "one drawn per strike (unset: pause)",
        choices=("pause", "cut"),
        setting=True,
    )
    acks: str = _opt(
        "all", "producer acks", choices=("0", "1", "all"), aliases={"-1": "all"}, column="string"
    )
    idempotence: bool | None = _opt(
        None,
        "idempotent producers (enable.idempotence; unset: Kafka 3.x's default, on with acks=all "
        "and off with acks 0 or 1); --no-idempotence for the at-least-once study, where a "
        "producer's own retries may write a record twice",
        column="boolean",
        absent=False,
        switch=True,
    )
    txn: bool = _opt(False, "transactional sends and polls", column="boolean", switch=True)
    isolation_level: str | None = _opt(
        None,
        "consumer isolation (unset: read_uncommitted; eos: read_committed, that of its readers, "
        "since its copiers and final drain always read committed)",
        choices=("read_uncommitted", "read_committed"),
        column="string",
        absent="read_uncommitted",
        switch=True,
    )
    subscribe: bool = _opt(
        False,
        "every process subscribes to the test's consumer group (group) instead of assigning "
        "keys; the checker checks in subscribe mode",
        always_in_json=False,
    )
    sub_p: float | None = _opt(
        None,
        "chance that a (re)assignment (assign_p, 1/64 per op as Jepsen) is a subscribe rather "
        "than an assign (unset: from the sub_via knob, assign only)",
        minimum=0,
        maximum=1,
        always_in_json=False,
    )
    commit_p: float = _opt(
        0.0,
        "chance that an op of a subscribed process commits the offsets it has polled (needs "
        "subscribe or sub_p)",
        minimum=0,
        maximum=1,
        always_in_json=False,
    )
    group: str | None = _opt(
        None,
        "consumer group id of the test (unset: isrlab-<name>-<seed> when subscribe can happen)",
        always_in_json=False,
    )
    min_insync_replicas: int = _opt(
        2,
        "broker and topic min.insync.replicas",
        minimum=1,
        broker_key="min.insync.replicas",
        column="int",
        absent=1,
        switch=True,
    )
    unclean_leader_election: bool = _opt(
        False,
        "HISTORIC: unclean leader election",
        broker_key="unclean.leader.election.enable",
        column="boolean",
        switch=True,
    )
    truncation_mode: str = _opt(
        "leader-epoch",
        "follower truncation (leader-epoch-v0 and high-watermark are HISTORIC)",
        choices=("leader-epoch", "leader-epoch-v0", "high-watermark"),
        broker_key="replica.truncation.mode",
        column="string",
        switch=True,
    )
    eligible_leader_replicas: bool = _opt(
        True,
        "eligible leader replicas (KIP-966); off is HISTORIC (the last ISR member is elected "
        "again whatever it lost)",
        broker_key="eligible.leader.replicas.enable",
        column="boolean",
        absent=False,
        switch=True,
    )
    txn_verification: bool = _opt(
        True,
        "transaction verification (KIP-890); off is HISTORIC (before Kafka 3.6)",
        broker_key="transaction.partition.verification.enable",
        column="boolean",
        switch=True,
    )
    txn_epoch_fencing: bool = _opt(
        True,
        "producer epoch fencing of zombies; off is HISTORIC",
        broker_key="transaction.producer.epoch.fencing.enable",
        column="boolean",
        switch=True,
    )
    txn_marker_acks: str = _opt(
        "all",
        "acks of transaction markers (1 is HISTORIC: acknowledged before replicated)",
        choices=("all", "1"),
        broker_key="transaction.marker.required.acks",
        column="string",
        switch=True,
    )
    offsets_commit_required_acks: str = _opt(
        "-1",
        "acks of a group's offset commits (1 is HISTORIC: acknowledged before replicated)",
        choices=("-1", "1"),
        broker_key="offsets.commit.required.acks",
        always_in_json=False,
        switch=True,
    )
    replica_lag_time_max_ms: int = _opt(
        10000,
        "broker replica.lag.time.max.ms",
        minimum=100,
        broker_key="replica.lag.time.max.ms",
        column="bigint",
        setting=True,
    )
    zk_session_timeout_ms: int = _opt(
        6000,
        "broker zookeeper.session.timeout.ms",
        minimum=2000,
        broker_key="zookeeper.session.timeout.ms",
        column="bigint",
        setting=True,
    )
    replication_factor: int = _opt(
        3, "topic replication factor", minimum=1, broker_key="default.replication.factor"
    )
    key_count: int = _opt(8, "number of keys (topic-partitions)", minimum=1, setting=True)
    seed: int | None = _opt(None, "random seed (default: random, saved in test.json)")
    store: str = _opt("store", "run store")
    # Written to test.json only when set (runs never had these keys otherwise).
    partitions_per_topic: int | None = _opt(
        None,
        "broker num.partitions (auto-created topics)",
        minimum=1,
        broker_key="num.partitions",
        always_in_json=False,
    )
    flush_interval_messages: int | None = _opt(
        None,
        "broker log.flush.interval.messages (unset: page cache, as Kafka)",
        minimum=1,
        broker_key="log.flush.interval.messages",
        always_in_json=False,
    )
    flush_interval_ms: int | None = _opt(
        None,
        "broker log.flush.interval.ms (unset: page cache, as Kafka)",
        minimum=0,
        broker_key="log.flush.interval.ms",
        always_in_json=False,
    )
    flush_policy: str = _opt(
        "never",
        "broker flush policy: never (page cache only, Kafka's default), every-append "
        "(log.flush.interval.messages=1: fsync before acknowledging) or interval:<ms> "
        "(log.flush.interval.ms=<ms>); a matrix --switch",
        choices=FLUSH_POLICIES,
        column="string",
        absent="never",
        switch=True,
        always_in_json=False,
    )
    clock_mode: str = _opt(
        "process",
        "clock faults move the broker's own clock (process) or the node's (date, real hosts)",
        choices=("process", "date"),
        always_in_json=False,
    )
    clock_max_skew_ms: int | None = _opt(
        None,
        f"largest clock offset a clock fault sets, ms (unset: {DEFAULT_MAX_SKEW_MS})",
        minimum=1,
        flag=None,
        always_in_json=False,
    )
    node_python: str | None = _opt(
        None, "the nodes' python executable (default: python3.X as here)", always_in_json=False
    )
    broker_config: dict[str, str] | None = _opt(  # noqa: RUF009 (None: a field, not a dict)
        None,
        "raw server.properties keys for every broker of the test, KEY=VALUE (repeatable), "
        "checked with the broker's own definitions; a key another option sets is refused "
        "(give that option), as are the ones the harness sets per broker (broker.id, "
        "listeners, advertised.listeners, log.dirs, zookeeper.connect)",
        always_in_json=False,
    )
    keys: tuple[str, ...] | None = _opt(
        None, "the keys (default: t0/0 .. t<key_count-1>/0)", flag=None
    )
    repeat: int | None = _opt(
        None, "repetition of a matrix cell", minimum=0, flag=None, always_in_json=False
    )
    run_dir: str | None = _opt(None, "the run directory", flag=None, always_in_json=False)
    workdirs: dict[str, str] | None = _opt(  # noqa: RUF009 (None: a field, not a dict)
        None, "node -> work directory (embedded cluster)", flag=None, always_in_json=False
    )
    transactional_ids: tuple[str, ...] | None = _opt(
        None,
        "transactional.id of each transactional thread (thread i: item i; unset with txn: "
        "isrlab-<name>-<seed>-<i> for every thread, eos: for its copiers)",
        flag=None,
        always_in_json=False,
    )
    # The workload's knobs the test sets, validated by its table (WORKLOAD_OPTIONS).
    knobs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TestConfig:
        """Validate and coerce ``values`` (a test map, CLI values; None = default)."""
        kwargs: dict[str, Any] = {}
        others: dict[str, Any] = {}
        for key, value in values.items():
            opt = _BY_NAME.get(key)
            if opt is None:
                others[key] = value
            elif value is not None:
                kwargs[key] = opt.check(_given(key, value))
        if kwargs.get("broker_config") is not None:
            kwargs["broker_config"] = check_broker_config(kwargs["broker_config"])
        workload = kwargs.get("workload", _BY_NAME["workload"].default)
        knobs = _check_knobs(workload, others)
        if "nemesis" in kwargs:
            kwargs["nemesis"] = tuple(k for k in dict.fromkeys(kwargs["nemesis"]) if k != "none")
        if kwargs.get("nodes") == ():
            raise ConfigError(
                "nodes (--nodes) takes SSH hosts, comma-separated (n1,n2,n3): give at least one, "
                "or leave it out to run on the embedded cluster"
            )
        if kwargs.get("nodes") and kwargs.get("nodes_file"):
            raise ConfigError("give --nodes or --nodes-file, not both")
        _check_idempotence(kwargs)
        _check_cluster_size(kwargs)
        if kwargs.get("seed") is None:
            kwargs["seed"] = random.SystemRandom().randrange(1 << 31)
        _check_eos(kwargs, knobs)
        if kwargs.get("isolation_level") is None:
            eos = workload == EosOptions.workload
            kwargs["isolation_level"] = "read_committed" if eos else "read_uncommitted"
        if kwargs.get("keys") is None:
            count = kwargs.get("key_count", _BY_NAME["key_count"].default)
            kwargs["keys"] = tuple(f"t{i}/0" for i in range(count))
        _check_consumer(kwargs, knobs)
        _check_txn(kwargs, knobs)
        return cls(**kwargs, knobs=knobs)

    def replace(self, **changes: Any) -> TestConfig:
        """A copy with ``changes`` (validated like `from_mapping`; knobs too)."""
        checked: dict[str, Any] = {
            k: None if v is None else _BY_NAME[k].check(_given(k, v))
            for k, v in changes.items()
            if k in _BY_NAME
        }
        if checked.get("broker_config") is not None:
            checked["broker_config"] = check_broker_config(checked["broker_config"])
        knobs = _check_knobs(self.workload, {k: v for k, v in changes.items() if k not in _BY_NAME})
        if knobs:
            checked["knobs"] = {**self.knobs, **knobs}
        return dataclasses.replace(self, **checked)

    @property
    def workload_options(self) -> QueueOptions:
        """The workload's knobs, typed: the test's, and its table's defaults for the rest."""
        return WORKLOAD_OPTIONS[self.workload].from_test(self.knobs)

    def to_test(self) -> dict[str, Any]:
        """The test map written as test.json and handed to the components (lists, not tuples)."""
        out: dict[str, Any] = {}
        for opt in OPTIONS:
            value = getattr(self, opt.name)
            if not opt.always_in_json and (value is None or value == opt.default):
                continue
            out[opt.name] = list(value) if isinstance(value, tuple) else value
        out.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.knobs.items()})
        return out


def nemesis_kinds(spec: str) -> tuple[str, ...]:
    """A nemesis spec, the one grammar of ``isrlab test --nemesis`` and of each cell of
    ``isrlab matrix --nemesis``: a fault kind (``kill``), kinds joined by ``+``
    (``partition+kill``, each kind on its own schedule), ``combined`` (`COMBINED_KINDS`) or
    ``none`` -> the test's kinds. A comma is refused (in the matrix it separates cells);
    `ConfigError` names an unknown kind."""
    spec = spec.strip()
    if "," in spec:
        joined = "+".join(k.strip() for k in spec.split(",") if k.strip())
        raise ConfigError(
            f"nemesis (--nemesis) {spec!r}: join fault kinds with + ({joined!r}) to run them "
            "together; a comma lists separate cells in `isrlab matrix --nemesis`"
        )
    if spec == "combined":
        return COMBINED_KINDS
    if spec in ("none", ""):
        return ()
    kinds = [k.strip() for k in spec.split("+")]
    known = [k for k in _BY_NAME["nemesis"].choices if k != "none"]
    bad = [k for k in kinds if k not in known]
    if bad:
        raise ConfigError(
            f"nemesis (--nemesis): unknown fault kind {', '.join(repr(b) for b in bad)} in "
            f"{spec!r}: a kind must be one of {', '.join(known)}; or give combined or none, "
            "or join kinds with +"
        )
    return tuple(dict.fromkeys(kinds))


def _given(key: str, value: Any) -> Any:
    """A value as the command line gives it, as the table takes it: ``nemesis`` given as text
    is a spec (`nemesis_kinds`; as a list, the kinds), ``broker_config`` given as a list is
    its ``KEY=VALUE`` items (`broker_config_items`; as a mapping, the keys)."""
    if key == "nemesis" and isinstance(value, str):
        return nemesis_kinds(value)
    if key == "broker_config" and isinstance(value, list | tuple):
        return broker_config_items(value)
    return value


#: server.properties keys the harness sets for each broker itself (`harness/db.py`,
#: `harness/sim/cluster.py`): its id, its address, its data directory and its ZooKeeper
HARNESS_BROKER_KEYS: tuple[str, ...] = (
    "broker.id",
    "listeners",
    "advertised.listeners",
    "log.dirs",
    "zookeeper.connect",
)


def broker_config_items(items: Sequence[Any]) -> dict[str, str]:
    """``--broker-config KEY=VALUE`` items -> ``{KEY: VALUE}`` (both stripped; the value may
    hold ``=``). `ConfigError` for an item that is not KEY=VALUE, or a key given twice with two
    values; the keys and values are checked by `check_broker_config`."""
    label = _BY_NAME["broker_config"].label
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key, value = key.strip(), value.strip()
        if not isinstance(item, str) or not sep or not key:
            raise ConfigError(
                f"{label} takes KEY=VALUE, a server.properties key of the broker and its value "
                f"(e.g. --broker-config log.segment.bytes=1048576), not {item!r}"
            )
        if key in out and out[key] != value:
            raise ConfigError(
                f"{label} gives {key} twice ({key}={out[key]} and {key}={value}): give it once"
            )
        out[key] = value
    return out


def _broker_key_homes() -> dict[str, str]:
    """server.properties key -> the option of the test table that sets it (flags)."""
    homes = {o.broker_key: f"{o.flag} (test.json's {o.name})" for o in OPTIONS if o.broker_key}
    for policy, shown in (("every-append", "every-append"), ("interval:1000", "interval:<ms>")):
        for key in flush_policy_properties(policy):
            how = f"--flush-policy {shown}"
            homes[key] = f"{homes[key]} or {how}" if key in homes else how
    return homes


def check_broker_config(values: Mapping[str, str]) -> dict[str, str] | None:
    """``broker_config`` checked before any broker starts: a key the test table sets through
    its own option is refused (one home per setting: give that option), as is one the harness
    sets per broker (`HARNESS_BROKER_KEYS`); every other key and value must be one the broker
    takes (`isrlab.broker.config.BrokerConfig`, its own messages). Empty: None."""
    if not values:
        return None
    label = _BY_NAME["broker_config"].label
    homes = _broker_key_homes()
    for key in values:
        if key in HARNESS_BROKER_KEYS:
            raise ConfigError(
                f"{label} {key}: the harness sets it for each broker (its id, address, data "
                "directory and ZooKeeper); leave it out"
            )
        if key in homes:
            raise ConfigError(
                f"{label} {key}: the test sets it through its own option; give it as "
                f"{homes[key]}, not as a raw key (each broker setting has one home)"
            )
    try:
        config = BrokerConfig()
        config.update_raw(values, label)
        config.check()
    except BrokerConfigError as e:
        text = str(e)
        raise ConfigError(text if text.startswith(label) else f"{label}: {text}") from None
    return dict(values)


def _check_idempotence(kwargs: dict[str, Any]) -> None:
    """Idempotence as Kafka 3.x's producer has it: on by default with acks=all, off with acks
    0 or 1 (KIP-679), always on for a transactional producer; enabled with acks 0 or 1 it is
    refused, as Kafka's producer (and librdkafka) refuse it. Raises `ConfigError`."""
    acks = kwargs.get("acks", _BY_NAME["acks"].default)
    if kwargs.get("txn"):
        kwargs["idempotence"] = True  # a transactional producer is idempotent
    elif kwargs.get("idempotence") is None:
        kwargs["idempotence"] = acks == "all"
    if kwargs["idempotence"] and acks != "all":
        what = "txn (--txn)" if kwargs.get("txn") else "idempotence (--idempotence)"
        raise ConfigError(
            f"{what} needs acks=all (an idempotent producer with acks={acks} is refused by "
            "Kafka's producer): give --acks all, or --no-idempotence"
        )


def _check_cluster_size(kwargs: dict[str, Any]) -> None:
    """A cluster with fewer brokers than the topics' replication factor creates no topic (the
    run would wait for them and fail late), and a min.insync.replicas above the replication
    factor acknowledges no acks=all write: both are refused before anything starts. A nodes
    file is read later; its size is checked then, by the topics' creation."""
    rf = kwargs.get("replication_factor", _BY_NAME["replication_factor"].default)
    if kwargs.get("nodes_file"):
        brokers, how = None, ""
    elif kwargs.get("nodes"):
        brokers, how = len(kwargs["nodes"]), "--nodes"
    else:
        brokers, how = kwargs.get("node_count", _BY_NAME["node_count"].default), "--node-count"
    if brokers is not None and rf > brokers:
        more = f"--node-count {rf} or more" if how == "--node-count" else f"{rf} or more --nodes"
        raise ConfigError(
            f"the replication factor {rf} (--replication-factor) needs at least {rf} brokers, "
            f"and the cluster has {brokers} ({how}): give {more}, or --replication-factor "
            f"{brokers}"
        )
    isr = kwargs.get("min_insync_replicas", _BY_NAME["min_insync_replicas"].default)
    if kwargs.get("acks", _BY_NAME["acks"].default) == "all" and isr > rf:
        raise ConfigError(
            f"min.insync.replicas {isr} (--min-insync-replicas) is above the replication factor "
            f"{rf}: no acks=all write could be acknowledged (NOT_ENOUGH_REPLICAS); give "
            f"--min-insync-replicas {rf} or less, or --replication-factor {isr}"
        )


def _check_consumer(kwargs: dict[str, Any], knobs: Mapping[str, Any]) -> None:
    """How processes take keys: one of ``subscribe``, ``sub_p`` and the ``sub_via`` knob;
    ``commit_p`` only where a process can subscribe; a ``group`` named when one can (filled
    in with ``isrlab-<name>-<seed>``). Raises `ConfigError`."""
    given = [n for n in ("subscribe", "sub_p") if kwargs.get(n) not in (None, False)]
    given += ["sub_via"] if knobs.get("sub_via") is not None else []
    if len(given) > 1:
        raise ConfigError(
            f"give one of subscribe (--subscribe), sub_p (--sub-p) and the sub_via knob, not "
            f"{' and '.join(given)}: each says how often a process subscribes"
        )
    share = subscribe_share({**kwargs, **knobs})
    if kwargs.get("commit_p") and share == 0:
        raise ConfigError(
            "commit_p (--commit-p) commits a subscribed process's offsets to the test's "
            "consumer group: add --subscribe or --sub-p (no process subscribes otherwise)"
        )
    eos = kwargs.get("workload") == EosOptions.workload  # (its copiers always subscribe)
    if "coordinator" in (kwargs.get("nemesis_targets") or ()) and share == 0 and not eos:
        raise ConfigError(
            "nemesis_targets (--nemesis-targets) coordinator aims faults at the coordinator of "
            "the test's consumer group: add --subscribe or --sub-p (there is no group otherwise)"
        )
    if share > 0 and kwargs.get("group") is None:
        name = kwargs.get("name", _BY_NAME["name"].default)
        kwargs["group"] = f"isrlab-{name}-{kwargs['seed']}"


def _check_eos(kwargs: dict[str, Any], knobs: dict[str, Any]) -> None:
    """The eos workload's keys and group: the ``eos`` knob ``{"input": [...], "output":
    [...]}`` (input key i is copied to output key i), by default ``eos-in/0`` ..
    ``eos-in/<key_count-1>`` and ``eos-out/...`` alike; ``keys`` are the input keys then the
    output keys; the copiers' consumer group is ``group`` (default isrlab-<name>-<seed>); the
    thread counts leave at least one producer. Raises `ConfigError`."""
    if kwargs.get("workload") != EosOptions.workload:
        return
    given = [n for n in ("subscribe", "sub_p", "commit_p") if kwargs.get(n)]
    given += [n for n in ("sub_via",) if knobs.get(n) is not None]
    if given:
        raise ConfigError(
            f"the eos workload does not take {', '.join(given)}: its copiers always subscribe "
            "to the input as one consumer group and commit their offsets with each copy"
        )
    eos = knobs.get("eos")
    if eos is None:
        if kwargs.get("keys") is not None:
            raise ConfigError(
                "the eos workload takes its keys from the eos knob ({input: [...], output: "
                "[...]}) or from key_count (--key-count N): give eos rather than keys"
            )
        n = kwargs.get("key_count", _BY_NAME["key_count"].default)
        eos = {
            "input": [f"eos-in/{i}" for i in range(n)],
            "output": [f"eos-out/{i}" for i in range(n)],
        }
    inputs, outputs = eos.get("input"), eos.get("output")
    if (
        not isinstance(inputs, list | tuple)
        or not isinstance(outputs, list | tuple)
        or not inputs
        or len(inputs) != len(outputs)
    ):
        raise ConfigError(
            "eos must be {input: [keys], output: [keys]}, both non-empty and of the same "
            f"length (input key i is copied to output key i), not {eos!r}"
        )
    inputs, outputs = [str(k) for k in inputs], [str(k) for k in outputs]
    for k in [*inputs, *outputs]:
        topic, sep, part = k.rpartition("/")
        if not sep or not topic or not part.isdigit():
            raise ConfigError(f"eos key {k!r} is not 'topic/partition' (e.g. 'eos-in/0')")
    if len(set(inputs + outputs)) != len(inputs) + len(outputs):
        raise ConfigError(f"eos input and output keys must be distinct, not {eos!r}")
    knobs["eos"] = {"input": inputs, "output": outputs}
    kwargs["keys"] = tuple(inputs + outputs)
    opts = EosOptions.from_test(knobs)
    threads = kwargs.get("concurrency", _BY_NAME["concurrency"].default)
    if opts.copiers + opts.readers >= threads:
        raise ConfigError(
            f"the eos workload needs a thread to produce the input besides its {opts.copiers} "
            f"copiers and {opts.readers} readers: concurrency (--concurrency) {threads} is too "
            f"small (at least {opts.copiers + opts.readers + 1})"
        )
    if kwargs.get("group") is None:
        name = kwargs.get("name", _BY_NAME["name"].default)
        kwargs["group"] = f"isrlab-{name}-{kwargs['seed']}"


def _check_txn(kwargs: dict[str, Any], knobs: Mapping[str, Any]) -> None:
    """With ``txn``: the transactional ids, one per transactional thread (every thread of
    the queue workload, the copiers of the eos workload), named after the test unless given;
    the txn-coordinator nemesis target needs them. Raises `ConfigError`."""
    targets = kwargs.get("nemesis_targets") or ()
    if not kwargs.get("txn"):
        if "txn-coordinator" in targets:
            raise ConfigError(
                "nemesis_targets (--nemesis-targets) txn-coordinator aims faults at the "
                "coordinator of the test's transactional ids: add --txn (there is none otherwise)"
            )
        return
    if kwargs.get("transactional_ids") is not None:
        return
    if kwargs.get("workload") == EosOptions.workload:
        n = EosOptions.from_test(knobs).copiers
    else:
        n = kwargs.get("concurrency", _BY_NAME["concurrency"].default)
    name = kwargs.get("name", _BY_NAME["name"].default)
    kwargs["transactional_ids"] = tuple(f"isrlab-{name}-{kwargs['seed']}-{i}" for i in range(n))


def _check_knobs(workload: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (keys outside the test table) checked as ``workload``'s knobs; a key that
    is not one is refused, with the nearest name of either table."""
    knobs: dict[str, Any] = {}
    options = WORKLOAD_OPTIONS[workload]
    for key, value in values.items():
        knob = options.option(key)
        if knob is None:
            names = [*_BY_NAME, *(f.name for f in dataclasses.fields(options))]
            near = difflib.get_close_matches(str(key), names, n=1)
            raise ConfigError(
                f"unknown test option {key!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + f": neither an option of the test nor a knob of the {workload} workload;"
                " docs/test-options.md lists both"
            )
        if value is not None:
            knobs[key] = knob.check(value)
    return knobs


OPTIONS: tuple[Option, ...] = table(TestConfig)
_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The table row of ``name``."""
    return _BY_NAME[name]


def flush_policy_properties(policy: str) -> dict[str, str]:
    # (the option's choices are FLUSH_POLICIES; any interval:<ms> maps the same way)
    """The broker keys of a ``flush_policy``: ``never`` none, ``every-append``
    log.flush.interval.messages=1, ``interval:<ms>`` log.flush.interval.ms=<ms>."""
    if policy == "never":
        return {}
    if policy == "every-append":
        return {"log.flush.interval.messages": "1"}
    kind, _, ms = policy.partition(":")
    if kind == "interval" and ms.isdigit():
        return {"log.flush.interval.ms": str(int(ms))}
    raise ConfigError(
        f"flush_policy (--flush-policy) must be never, every-append or interval:<ms>, "
        f"not {policy!r}"
    )


def render_broker_value(value: Any) -> str:
    """A test value as a server.properties value (booleans as Kafka writes them, acks "all"
    as -1)."""
    if isinstance(value, bool):
        return str(value).lower()
    return "-1" if value == "all" else str(value)


# test key -> server.properties key
BROKER_SETTINGS: dict[str, str] = {o.name: o.broker_key for o in OPTIONS if o.broker_key}
# the report's columns (in table order; the nemesis column is `nemesis_label`)
COLUMNS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.column)
SWITCHES: tuple[Option, ...] = tuple(o for o in OPTIONS if o.switch)
SETTINGS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.setting)
# the report's timing columns: how fast the ISR shrinks and a dead broker's leadership moves
TIMINGS: tuple[str, ...] = tuple(o.name for o in COLUMNS if o.kind is int and not o.switch)

# The "combined" schedule (the matrix's, and synthetic stores'): every fault kind at once.
COMBINED_KINDS: tuple[str, ...] = ("partition", "kill", "pause", "clock")


def nemesis_label(kinds: Any) -> str:
    """A test's ``nemesis`` as one label: a kind, ``combined`` (all of `COMBINED_KINDS`),
    kinds joined by ``+`` in name order (``kill+partition``), or ``none``."""
    if kinds is None or kinds == [] or kinds == "":
        return "none"
    if isinstance(kinds, str):
        kinds = [kinds]
    names = sorted({str(k) for k in kinds if str(k) != "none"})
    if not names:
        return "none"
    if set(names) == set(COMBINED_KINDS):
        return "combined"
    return "+".join(names)


# How a run's processes take keys (the report's ``consumer`` column, the matrix's --consumer).
CONSUMER_MODES: tuple[str, ...] = ("assign", "subscribe", "mixed")


def consumer_mode(test: Mapping[str, Any]) -> str:
    """``assign`` (no process subscribes: every run before consumer groups), ``subscribe``
    (every (re)assignment subscribes: ``--subscribe``) or ``mixed`` (some do: ``--sub-p``)."""
    if test.get("workload") == EosOptions.workload:
        return "subscribe"  # the copiers are one consumer group
    share = subscribe_share(test)
    return "assign" if share == 0 else "subscribe" if share == 1 else "mixed"


def config_name(test: Mapping[str, Any]) -> str:
    """A file-name-safe name for a configuration (a matrix cell's test name): the workload
    unless queue, acks, nemesis, the switches that are on (``rc``: read_committed) and the
    timings that differ from what a stored run without them ran with, e.g.
    ``acks-all_partition_isr2_unclean_r0`` or ``eos_acks-all_kill_idem_txn_rc_isr2_r0``."""
    parts = [f"acks-{test.get('acks', 'all')}", nemesis_label(test.get("nemesis"))]
    if test.get("workload") not in (None, "queue"):
        parts.insert(0, str(test["workload"]))
    if test.get("idempotence"):
        parts.append("idem")
    if test.get("txn"):
        parts.append("txn")
    if test.get("isolation_level") == "read_committed":
        parts.append("rc")
    mode = consumer_mode(test)
    if mode == "subscribe" and test.get("workload") != EosOptions.workload:
        parts.append("sub")
    elif mode == "mixed":
        parts.append(f"subp{subscribe_share(test):g}")
    if test.get("commit_p"):
        parts.append(f"commit{float(test['commit_p']):g}")
    if test.get("min_insync_replicas") is not None:
        parts.append(f"isr{test['min_insync_replicas']}")
    if test.get("unclean_leader_election"):
        parts.append("unclean")
    if test.get("truncation_mode") not in (None, "leader-epoch"):
        parts.append(str(test["truncation_mode"]))
    if test.get("eligible_leader_replicas") is False:
        parts.append("no-elr")
    if test.get("flush_policy") not in (None, "never"):
        parts.append("flush-" + str(test["flush_policy"]).replace(":", ""))
    if test.get("txn_verification") is False:
        parts.append("no-txn-verification")
    if test.get("txn_epoch_fencing") is False:
        parts.append("no-txn-epoch-fencing")
    if str(test.get("txn_marker_acks") or "all") != "all":
        parts.append(f"marker-acks{test['txn_marker_acks']}")
    if str(test.get("offsets_commit_required_acks") or "-1") != "-1":
        parts.append(f"commit-acks{test['offsets_commit_required_acks']}")
    for name, short in zip(TIMINGS, ("lag", "zk"), strict=True):
        if test.get(name) is not None and int(test[name]) != _BY_NAME[name].absent:
            parts.append(f"{short}{int(test[name])}")
    if test.get("repeat") is not None:
        parts.append(f"r{test['repeat']}")
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", "_".join(parts))


def _cli_annotation(opt: Option) -> Any:
    import typer

    assert opt.flag
    if opt.kind is dict:
        # a mapping is given item by item: the flag repeated, KEY=VALUE each time
        return Annotated[
            list[str] | None, typer.Option(opt.flag, metavar="KEY=VALUE", help=opt.help)
        ]
    base: Any = str if opt.kind is list else opt.kind
    typ = base | None if opt.optional else base
    help = opt.help
    if opt.name == "nemesis":
        help += "; kinds"
    if opt.choices:
        help += f": {', '.join(opt.choices)}"
    decl = f"{opt.flag}/--no-{opt.flag[2:]}" if opt.kind is bool else opt.flag
    return Annotated[typ, typer.Option(decl, help=help)]


def _cli_default(opt: Option) -> Any:
    if isinstance(opt.default, tuple):
        return ("+" if opt.name == "nemesis" else ",").join(opt.default)
    return opt.default


def cli_parameters() -> list[inspect.Parameter]:
    """One typer option per table row that has a flag (defaults and help from the table)."""
    return [
        inspect.Parameter(
            o.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=_cli_default(o),
            annotation=_cli_annotation(o),
        )
        for o in OPTIONS
        if o.flag
    ]


def with_cli_options(
    fn: Callable[..., None], extra: list[inspect.Parameter] | None = None
) -> Callable[..., None]:
    """``fn(**values)`` as a typer command taking the table's options plus ``extra``."""

    def command(**values: Any) -> None:
        fn(**values)

    command.__signature__ = inspect.Signature([*cli_parameters(), *(extra or [])])  # type: ignore[attr-defined]
    command.__doc__ = fn.__doc__
    command.__name__ = fn.__name__
    return command


def reference_markdown() -> str:
    """docs/test-options.md: the tables as a reference (a test keeps the file in step)."""

    def show(v: Any) -> str:
        if v is None:
            return "(unset)"
        if isinstance(v, tuple):
            return ",".join(v)
        return str(v).lower() if isinstance(v, bool) else str(v)

    def kind(o: Option) -> str:
        name = "list of str" if o.kind is list else o.kind.__name__
        return name + (" or unset" if o.optional else "")

    lines = [
        "# Test options",
        "",
        "Generated from `harness/testconfig.py` (`reference_markdown()`): the one table of",
        "`isrlab test` options. A key is the test.json key; the flag sets it on the command line;",
        "`broker key` is the server.properties key it becomes; `column` its type in the pipeline's",
        "runs table, where a stored test.json without the key reads as `absent`.",
        "",
        "| key | flag | type | default | allowed | broker key | column (absent) | meaning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in OPTIONS:
        column = f"{o.column} ({show(o.absent)})" if o.column else ""
        lines.append(
            f"| `{o.name}` | {f'`{o.flag}`' if o.flag else ''} | {kind(o)} | `{show(o.default)}` | "
            f"{o.allowed} | {f'`{o.broker_key}`' if o.broker_key else ''} | {column} | {o.help} |"
        )
    for workload, options in WORKLOAD_OPTIONS.items():
        lines += [
            "",
            f"## The {workload} workload's knobs",
            "",
            f"From `{options.__module__.removeprefix('isrlab.').replace('.', '/')}.py`"
            f" (`{options.__name__}`): test.json keys",
            f"the {workload} workload (generator, client, checker) reads, set through the Python",
            "API (`TestConfig.from_mapping`), not the command line. A test.json holds the ones a",
            "test sets; a key in neither table is refused before any node is touched.",
            "",
            "| key | type | default | allowed | meaning |",
            "|---|---|---|---|---|",
        ]
        rows = table(options)
        if options is EosOptions:
            lines[-2:-2] = [
                "Every knob of the queue workload (above) applies too; these are its own.",
                "",
            ]
            rows = EOS_KNOBS
        for o in rows:
            lines.append(
                f"| `{o.name}` | {kind(o)} | `{show(o.default)}` | {o.allowed} | {o.help} |"
            )
    return "\n".join(lines) + "\n"
