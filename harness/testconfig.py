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
(`to_test()`): data across the boundary, as Jepsen's test map. Keys the table does not own (the
workload's tuning knobs such as ``send_p`` or ``poll_ms``) pass through in ``extra``.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin, get_type_hints

from isrlab.nemeses import KINDS as FAULT_KINDS
from isrlab.nemeses import TARGETS

__all__ = [
    "BROKER_SETTINGS",
    "COLUMNS",
    "COMBINED_KINDS",
    "OPTIONS",
    "SETTINGS",
    "SWITCHES",
    "TIMINGS",
    "ConfigError",
    "Option",
    "TestConfig",
    "cli_parameters",
    "config_name",
    "nemesis_label",
    "option",
]


class ConfigError(ValueError):
    """An option has a bad value; the message names the option and what it accepts."""


_UNSET: Any = object()


def _opt(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    aliases: Mapping[str, str] | None = None,
    minimum: float | None = None,
    above: bool = False,
    flag: str | None = "",
    broker_key: str | None = None,
    column: str | None = None,
    absent: Any = _UNSET,
    always_in_json: bool = True,
    switch: bool = False,
    setting: bool = False,
) -> Any:
    """One option's declaration (see `Option` for the meaning of each argument)."""
    meta = {
        "help": help,
        "choices": choices,
        "aliases": dict(aliases or {}),
        "minimum": minimum,
        "above": above,
        "flag": flag,
        "broker_key": broker_key,
        "column": column,
        "absent": default if absent is _UNSET else absent,
        "always_in_json": always_in_json,
        "switch": switch,
        "setting": setting,
    }
    return field(default=default, metadata={"option": meta})


@dataclass(frozen=True)
class TestConfig:
    """One test, typed. Build it with `from_mapping` (validates); `to_test()` is test.json."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str = _opt("queue", "test name (run store folder)")
    workload: str = _opt("queue", "workload (the one `isrlab test` runs)", choices=("queue",))
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
        "comma list of fault kinds, or none",
        choices=(*FAULT_KINDS, "none"),
    )
    nemesis_interval: float = _opt(
        10.0, "seconds between fault changes", minimum=0, above=True, setting=True
    )
    nemesis_targets: tuple[str, ...] | None = _opt(None, "comma list of targets", choices=TARGETS)
    acks: str = _opt(
        "all", "producer acks", choices=("0", "1", "all"), aliases={"-1": "all"}, column="string"
    )
    idempotence: bool = _opt(False, "idempotent producers", column="boolean", switch=True)
    txn: bool = _opt(False, "transactional sends and polls", column="boolean", switch=True)
    isolation_level: str = _opt(
        "read_uncommitted", "consumer isolation", choices=("read_uncommitted", "read_committed")
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
    key_count: int = _opt(
        8, "number of keys (topic-partitions)", minimum=1, flag="--keys", setting=True
    )
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
    clock_mode: str = _opt(
        "process",
        "clock faults move the broker's own clock (process) or the node's (date, real hosts)",
        choices=("process", "date"),
        always_in_json=False,
    )
    node_python: str | None = _opt(
        None, "the nodes' python executable (default: python3.X as here)", always_in_json=False
    )
    broker_config: dict[str, str] | None = _opt(  # noqa: RUF009 (None: a field, not a dict)
        None, "raw server.properties keys", flag=None, always_in_json=False
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
    # Keys the table does not own (workload tuning knobs): passed through as given.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TestConfig:
        """Validate and coerce ``values`` (a test map, CLI values; None = default)."""
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = dict(values.get("extra") or {})
        for key, value in values.items():
            if key == "extra":
                continue
            opt = _BY_NAME.get(key)
            if opt is None:
                extra[key] = value
            elif value is not None:
                kwargs[key] = opt.check(value)
        if "nemesis" in kwargs:
            kwargs["nemesis"] = tuple(k for k in dict.fromkeys(kwargs["nemesis"]) if k != "none")
        if kwargs.get("nodes") and kwargs.get("nodes_file"):
            raise ConfigError("give --nodes or --nodes-file, not both")
        if kwargs.get("txn"):
            kwargs["idempotence"] = True  # a transactional producer is idempotent
        if kwargs.get("seed") is None:
            kwargs["seed"] = random.SystemRandom().randrange(1 << 31)
        if kwargs.get("keys") is None:
            count = kwargs.get("key_count", _BY_NAME["key_count"].default)
            kwargs["keys"] = tuple(f"t{i}/0" for i in range(count))
        return cls(**kwargs, extra=extra)

    def replace(self, **changes: Any) -> TestConfig:
        """A copy with ``changes`` (validated like `from_mapping`)."""
        checked: dict[str, Any] = {
            k: None if v is None else _BY_NAME[k].check(v) for k, v in changes.items()
        }
        return dataclasses.replace(self, **checked)

    def to_test(self) -> dict[str, Any]:
        """The test map written as test.json and handed to the components (lists, not tuples)."""
        out: dict[str, Any] = {}
        for opt in OPTIONS:
            value = getattr(self, opt.name)
            if not opt.always_in_json and (value is None or value == opt.default):
                continue
            out[opt.name] = list(value) if isinstance(value, tuple) else value
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Option:
    """One row of the table.

    ``kind`` is the value type (``list`` for a comma list, ``dict`` for a mapping) and
    ``optional`` whether None is a value; ``choices`` the allowed values (of each item, for a
    list) and ``aliases`` other spellings of them; ``minimum`` the smallest allowed number
    (``above``: strictly above it); ``flag`` the command-line flag (None: not on the command
    line); ``broker_key`` the server.properties key it sets; ``column`` the Spark DDL type of
    its report column (None: not a column); ``absent`` the value a stored run without the key
    ran with; ``always_in_json``: written to test.json even when unset; ``switch`` / ``setting``:
    a matrix ``--switch`` / ``--set`` name.
    """

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...]
    aliases: Mapping[str, str]
    minimum: float | None
    above: bool
    flag: str | None
    broker_key: str | None
    column: str | None
    absent: Any
    always_in_json: bool
    switch: bool
    setting: bool

    @property
    def label(self) -> str:
        """How errors name the option: the test.json key and the flag that sets it."""
        return f"{self.name} ({self.flag})" if self.flag else self.name

    def _fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.label} {what}")

    def _item(self, raw: Any) -> Any:
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise self._fail(f"takes true or false, not {raw!r}")
        if self.kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise self._fail(f"takes an integer, not {raw!r}")
            try:
                value: Any = int(str(raw).strip()) if isinstance(raw, str) else int(raw)
            except (TypeError, ValueError):
                raise self._fail(f"takes an integer, not {raw!r}") from None
        elif self.kind is float:
            if isinstance(raw, bool):
                raise self._fail(f"takes a number, not {raw!r}")
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise self._fail(f"takes a number, not {raw!r}") from None
        elif self.kind is dict:
            if not isinstance(raw, Mapping):
                raise self._fail(f"takes a mapping of key to value, not {raw!r}")
            return {str(k): str(v) for k, v in raw.items()}
        else:
            if not isinstance(raw, str | int) or isinstance(raw, bool):
                raise self._fail(f"takes text, not {raw!r}")
            value = self.aliases.get(str(raw).strip(), str(raw).strip())
            if self.choices and value not in self.choices:
                raise self._fail(f"must be one of {', '.join(self.choices)}, not {raw!r}")
            if not value and self.kind is str and not self.optional:
                raise self._fail("must not be empty")
            return value
        if self.minimum is not None and (
            value <= self.minimum if self.above else value < self.minimum
        ):
            bound = "above" if self.above else "at least"
            raise self._fail(f"must be {bound} {self.minimum:g}, not {raw!r}")
        return value

    def check(self, raw: Any) -> Any:
        """``raw`` as this option's value (a comma string or a sequence for lists)."""
        if raw is None:
            if self.optional:
                return None
            raise self._fail("must be given")
        if self.kind is not list:
            return self._item(raw)
        if isinstance(raw, str):
            items = [s.strip() for s in raw.split(",") if s.strip()]
        elif isinstance(raw, list | tuple):
            items = [str(s).strip() for s in raw]
        else:
            raise self._fail(f"takes a comma list, not {raw!r}")
        inner = dataclasses.replace(self, kind=str, optional=False)
        return tuple(inner._item(s) for s in items)


def _kind_of(hint: Any) -> tuple[type, bool]:
    optional = False
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        (hint,) = args
    origin = get_origin(hint) or hint
    if origin is tuple:
        return list, optional
    if origin in (dict, Mapping):
        return dict, optional
    return origin, optional


def _table() -> tuple[Option, ...]:
    hints = get_type_hints(TestConfig)
    rows = []
    for f in dataclasses.fields(TestConfig):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        kind, optional = _kind_of(hints[f.name])
        flag = meta["flag"]
        rows.append(
            Option(
                name=f.name,
                kind=kind,
                optional=optional,
                default=f.default,
                **{**meta, "flag": "--" + f.name.replace("_", "-") if flag == "" else flag},
            )
        )
    return tuple(rows)


OPTIONS: tuple[Option, ...] = _table()
_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The table row of ``name``."""
    return _BY_NAME[name]


def render_broker_value(value: Any) -> str:
    """A test value as a server.properties value (booleans as Kafka writes them)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


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


def config_name(test: Mapping[str, Any]) -> str:
    """A file-name-safe name for a configuration (a matrix cell's test name): acks, nemesis,
    the switches that are on and the timings that differ from what a stored run without them
    ran with, e.g. ``acks-all_partition_isr2_unclean_r0``."""
    parts = [f"acks-{test.get('acks', 'all')}", nemesis_label(test.get("nemesis"))]
    if test.get("idempotence"):
        parts.append("idem")
    if test.get("txn"):
        parts.append("txn")
    if test.get("min_insync_replicas") is not None:
        parts.append(f"isr{test['min_insync_replicas']}")
    if test.get("unclean_leader_election"):
        parts.append("unclean")
    if test.get("truncation_mode") not in (None, "leader-epoch"):
        parts.append(str(test["truncation_mode"]))
    for name, short in zip(TIMINGS, ("lag", "zk"), strict=True):
        if test.get(name) is not None and int(test[name]) != _BY_NAME[name].absent:
            parts.append(f"{short}{int(test[name])}")
    if test.get("repeat") is not None:
        parts.append(f"r{test['repeat']}")
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", "_".join(parts))


def _cli_annotation(opt: Option) -> Any:
    import typer

    base: Any = str if opt.kind in (list, dict) else opt.kind
    typ = base | None if opt.optional else base
    help = opt.help
    if opt.choices:
        help += f": {', '.join(opt.choices)}"
    assert opt.flag
    decl = f"{opt.flag}/--no-{opt.flag[2:]}" if opt.kind is bool else opt.flag
    return Annotated[typ, typer.Option(decl, help=help)]


def _cli_default(opt: Option) -> Any:
    if isinstance(opt.default, tuple):
        return ",".join(opt.default)
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
    """docs/test-options.md: the table as a reference (a test keeps the file in step)."""

    def show(v: Any) -> str:
        if v is None:
            return "(unset)"
        if isinstance(v, tuple):
            return ",".join(v)
        return str(v).lower() if isinstance(v, bool) else str(v)

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
        kind = ("list of " if o.kind is list else "") + (
            "str" if o.kind is list else o.kind.__name__
        )
        allowed = ", ".join(o.choices)
        if o.minimum is not None:
            allowed = f"{'>' if o.above else '>='} {o.minimum:g}"
        column = f"{o.column} ({show(o.absent)})" if o.column else ""
        lines.append(
            f"| `{o.name}` | {f'`{o.flag}`' if o.flag else ''} | {kind}"
            f"{' or unset' if o.optional else ''} | `{show(o.default)}` | {allowed} | "
            f"{f'`{o.broker_key}`' if o.broker_key else ''} | {column} | {o.help} |"
        )
    return "\n".join(lines) + "\n"
