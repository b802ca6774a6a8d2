"""Which queue anomalies invalidate a run (docs/anomalies.md, "Allowed by default").

Found anomalies are always reported; the policy only decides `valid`. Kafka does not
isolate transactional writes, so G0 and G1c-ww cycles (and their variants) and
int-send-skip are expected. In subscribe mode rebalances legitimately move consumers:
when the history records them (`rebalance` fields), the checker forgets a process's
position in a key at each rebalance that moves it, so any poll-skip or nonmonotonic-poll
left is unexplained and invalidates the run; a subscribe-mode history that records no
rebalance (Jepsen's, or older ones) cannot tell, so there poll-skip and
nonmonotonic-poll are allowed, as Jepsen allows them. A test widens the set with
`allow` and narrows it with `disallow` (disallow wins).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ALL_TYPES", "DEFAULT_ALLOWED", "SUBSCRIBE_ALLOWED", "allowed_types"]

CYCLE_TYPES = tuple(
    f"{base}{suffix}"
    for base in ("G0", "G1c", "G1c-ww")
    for suffix in ("", "-process", "-realtime")
)

ALL_TYPES = frozenset(
    {
        "inconsistent-offsets",
        "duplicate",
        "lost-write",
        "unseen",
        "G1a",
        "precommitted-read",
        "poll-skip",
        "nonmonotonic-poll",
        "nonmonotonic-send",
        "int-poll-skip",
        "int-nonmonotonic-poll",
        "int-send-skip",
        "int-nonmonotonic-send",
        *CYCLE_TYPES,
        "hw-regression",
        "hw-regression-realtime",
        "committed-truncation",
        "realtime-send-order",
        "idempotence-duplicate",
        "eos-duplicate",
        "eos-missing",
        "garbage-read",
        "committed-offset-regression",
    }
)

DEFAULT_ALLOWED = frozenset(
    {
        "int-send-skip",
        "G0",
        "G0-process",
        "G0-realtime",
        "G1c-ww",
        "G1c-ww-process",
        "G1c-ww-realtime",
    }
)

SUBSCRIBE_ALLOWED = frozenset({"poll-skip", "nonmonotonic-poll"})


def allowed_types(
    *,
    subscribe: bool,
    allow: Iterable[str] | None = None,
    disallow: Iterable[str] | None = None,
    rebalances: bool = False,
) -> frozenset[str]:
    """The set of anomaly names that do not make a run invalid (`rebalances`: the history
    records consumer-group rebalances, which then explain every legitimate move)."""
    allowed = set(DEFAULT_ALLOWED)
    if subscribe and not rebalances:
        allowed |= SUBSCRIBE_ALLOWED
    allowed |= set(allow or ())
    allowed -= set(disallow or ())
    return frozenset(allowed)
