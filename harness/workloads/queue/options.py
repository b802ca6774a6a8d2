"""The queue workload's knobs: one table, beside the generator, client and checker wiring.

`QueueOptions` declares every test.json key the queue workload reads beyond the test table
(`harness.testconfig.TestConfig`): the generator's op mix and timings (`generator.py`), the
client's librdkafka timings (`client.py`) and the checker's policy keys (read from test.json
by `checkers.api.policy_from_test`). Each is declared once, with `harness.optiontable`'s
fields as the test table's options are: its one name, default, validation and help.

The knobs are not ``isrlab test`` flags (they are tuning for the Python API and benchmarks,
``benchmarks/bench_harness.py --set KEY=JSON``). `TestConfig.from_mapping` validates the knobs a
test sets against this table and refuses a key that is in neither table; test.json holds
only the knobs a test sets, as before. `QueueOptions.from_test(test)` is how the generator
and client read them: the test's values, this table's defaults for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from isrlab.checkers.queue.policy import ALL_TYPES
from isrlab.harness.optiontable import ConfigError, Option, option_field, table

__all__ = ["KNOBS", "QueueOptions", "subscribe_share"]

_ANOMALIES = tuple(sorted(ALL_TYPES))


def _knob(default: Any, help: str, **kw: Any) -> Any:
    # test.json keys only: no command-line flag, written only when a test sets them
    return option_field(default, help, flag=None, always_in_json=False, **kw)


@dataclass(frozen=True)
class QueueOptions:
    """The queue workload's knobs, typed (`from_test` reads them from a test map)."""

    # generator.py: the op mix
    max_txn_length: int | None = _knob(
        None, "micro-ops per op at most (unset: 4 with txn, else 1, as Jepsen)", minimum=1
    )
    send_p: float = _knob(0.5, "share of sends among send/poll micro-ops", minimum=0, maximum=1)
    assign_p: float = _knob(
        1 / 64, "chance that an op is replaced by a reassignment", minimum=0, maximum=1
    )
    assign_keys: int | None = _knob(
        None, "keys a reassignment picks at most (unset: about half of the keys)", minimum=1
    )
    sub_via: tuple[str, ...] = _knob(
        ("assign",),
        "how a process takes keys (Jepsen's name; both: one at random per reassignment, as "
        "sub_p 0.5); subscribe also puts the checker in subscribe mode",
        choices=("assign", "subscribe"),
    )
    crash_clients: bool = _knob(False, "crash client processes now and then")
    crash_client_interval: float = _knob(
        30.0, "seconds between client crashes (with crash_clients)", minimum=0, above=True
    )
    # generator.py and client.py: timings
    poll_ms: int = _knob(20, "poll timeout of a poll or txn op, ms", minimum=0)
    final_poll_ms: int = _knob(1000, "poll timeout of the final drain's polls, ms", minimum=0)
    final_restart_s: float = _knob(
        10.0,
        "a drain that reads nothing for this long restarts its client, s",
        minimum=0,
        above=True,
    )
    op_timeout_ms: int = _knob(
        10000, "producer message.timeout.ms: an op's send gives up after it, ms", minimum=1
    )
    request_timeout_ms: int = _knob(
        5000, "client request.timeout.ms and socket.connection.setup.timeout.ms", minimum=1
    )
    linger_ms: int = _knob(0, "producer linger.ms", minimum=0)
    fetch_wait_max_ms: int = _knob(100, "consumer fetch.wait.max.ms", minimum=0)
    session_timeout_ms: int = _knob(
        6000, "group consumers' session.timeout.ms (subscribe)", minimum=1
    )
    heartbeat_interval_ms: int = _knob(
        1000,
        "group consumers' heartbeat.interval.ms (subscribe): how soon a member hears of a "
        "rebalance; below session_timeout_ms",
        minimum=1,
    )
    assignment_strategy: str = _knob(
        "roundrobin",
        "group consumers' partition.assignment.strategy (subscribe); range puts a "
        "single-partition topic's key on the same member for every topic",
        choices=("roundrobin", "range", "cooperative-sticky"),
    )
    max_poll_interval_ms: int = _knob(
        30000,
        "group consumers' max.poll.interval.ms, also their rebalance timeout (subscribe)",
        minimum=1,
    )
    retries: int | None = _knob(None, "producer retries (unset: librdkafka's)", minimum=0)
    watermark_p: float = _knob(
        0.1, "share of ok completions that carry watermarks", minimum=0, maximum=1
    )
    producer_config: dict[str, Any] | None = _knob(  # noqa: RUF009 (None: a field, not a dict)
        None, "extra librdkafka producer settings"
    )
    consumer_config: dict[str, Any] | None = _knob(  # noqa: RUF009 (None: a field, not a dict)
        None, "extra librdkafka consumer settings"
    )
    # checkers.api.policy_from_test: the checker's policy (docs/anomalies.md)
    allow: tuple[str, ...] | None = _knob(
        None, "anomaly types allowed beyond the default set (docs/anomalies.md)", choices=_ANOMALIES
    )
    disallow: tuple[str, ...] | None = _knob(
        None, "anomaly types not allowed (wins over allow)", choices=_ANOMALIES
    )
    ww_deps: bool | None = _knob(None, "false leaves ww edges out of the dependency graph")
    eos: dict[str, Any] | None = _knob(  # noqa: RUF009 (None: a field, not a dict)
        None, "exactly-once topics to check: {input: [...], output: [...]}"
    )
    checker: dict[str, Any] | None = _knob(  # noqa: RUF009 (None: a field, not a dict)
        None, "the checker's policy keys (allow, disallow, ...) nested"
    )

    workload: ClassVar[str] = "queue"

    @classmethod
    def option(cls, name: str) -> Option | None:
        """The row of knob ``name``, None when it is not one."""
        return _BY_NAME.get(name)

    @classmethod
    def from_test(cls, test: Mapping[str, Any]) -> QueueOptions:
        """The knobs of the test map ``test`` (other keys ignored; unset: the defaults),
        validated (`ConfigError`)."""
        return cls(**{o.name: o.check(test[o.name]) for o in KNOBS if test.get(o.name) is not None})


KNOBS: tuple[Option, ...] = table(QueueOptions)
_BY_NAME: dict[str, Option] = {o.name: o for o in KNOBS}


def subscribe_share(test: Mapping[str, Any]) -> float:
    """The chance that a (re)assignment op of test map ``test`` is a subscribe rather than an
    assign: 1 with ``subscribe`` (the test table's ``--subscribe``), else ``sub_p`` (``--sub-p``)
    when set, else from the ``sub_via`` knob (Jepsen's name: assign 0, subscribe 1, both 0.5).
    How often a (re)assignment happens at all is ``assign_p`` (Jepsen's 1/64 per op). Bad
    values raise `ConfigError` (a ValueError)."""
    if test.get("subscribe") is True:
        return 1.0
    if test.get("sub_p") is not None:
        sub_p = test["sub_p"]
        if isinstance(sub_p, bool) or not isinstance(sub_p, int | float) or not 0 <= sub_p <= 1:
            raise ConfigError(f"sub_p (--sub-p) must be a number from 0 to 1, not {sub_p!r}")
        return float(sub_p)
    via = QueueOptions.from_test(test).sub_via
    return sum(1 for f in via if f == "subscribe") / len(via) if via else 0.0
