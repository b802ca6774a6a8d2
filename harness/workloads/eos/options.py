"""The eos workload's knobs: the queue workload's (`QueueOptions`), plus the copiers' own.

`EosOptions` is `QueueOptions` with the knobs of consume-transform-produce
(`harness.workloads.eos`): how many threads copy and how many read the output while the
copiers run, how often a copier is killed in the middle of a copy, and the copiers'
transaction timeout. Every queue knob keeps its meaning (timings of the clients, the
checker's policy keys); the queue generator's op-mix knobs (`max_txn_length`, `send_p`,
`assign_p`, `assign_keys`, `sub_via`) are not read by the eos generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from isrlab.harness.optiontable import Option, option_field, table
from isrlab.harness.workloads.queue.options import KNOBS as QUEUE_KNOBS
from isrlab.harness.workloads.queue.options import QueueOptions

__all__ = ["EOS_KNOBS", "KNOBS", "EosOptions"]


def _knob(default: Any, help: str, **kw: Any) -> Any:
    # test.json keys only: no command-line flag, written only when a test sets them
    return option_field(default, help, flag=None, always_in_json=False, **kw)


@dataclass(frozen=True)
class EosOptions(QueueOptions):
    """The eos workload's knobs, typed: every queue knob, and the copiers' own below."""

    copiers: int = _knob(
        3,
        "threads that copy the input to the output (one consumer group); the first threads",
        minimum=1,
    )
    readers: int = _knob(
        1,
        "threads that poll the output keys while the copiers run (assigned, at the test's "
        "isolation_level); the rest of the threads produce the input",
        minimum=0,
    )
    copier_kill_interval: float | None = _knob(
        15.0,
        "about every this many seconds a copier is killed in the middle of a copy, after its "
        "sends and before its commit (unset: never); its thread goes on as a new copier",
        minimum=0,
        above=True,
    )
    copier_zombies: bool = _knob(
        False,
        "a killed copier lives on as a zombie: it leaves the group but keeps its producer and "
        "open transaction, and when the next copier of its transactional id has a transaction "
        "open on one of the same output keys it sends its copies there again and tries to "
        "commit (Kafka's zombie instance; producer epoch fencing must refuse it)",
    )
    transaction_timeout_ms: int = _knob(
        10000,
        "the copiers' transaction.timeout.ms (at least op_timeout_ms): how long the "
        "coordinator lets a killed copier's open transaction hold back read_committed readers "
        "when no new copier fences it",
        minimum=1000,
    )

    workload: ClassVar[str] = "eos"

    @classmethod
    def option(cls, name: str) -> Option | None:
        """The row of knob ``name``, None when it is not one."""
        return _BY_NAME.get(name)

    @classmethod
    def from_test(cls, test: Mapping[str, Any]) -> EosOptions:
        """The knobs of the test map ``test`` (other keys ignored; unset: the defaults),
        validated (`ConfigError`)."""
        return cls(**{o.name: o.check(test[o.name]) for o in KNOBS if test.get(o.name) is not None})


KNOBS: tuple[Option, ...] = table(EosOptions)
# The knobs the eos workload adds to the queue workload's.
EOS_KNOBS: tuple[Option, ...] = tuple(
    o for o in KNOBS if o.name not in {q.name for q in QUEUE_KNOBS}
)
_BY_NAME: dict[str, Option] = {o.name: o for o in KNOBS}
