"""Which queue anomalies invalidate a run (docs/anomalies.md, "Allowed by default").

Found anomalies are always reported; the policy only decides `valid`. Kafka does not
isolate transactional writes, so G0 and G1c-ww cycles (and their variants) and
int-send-skip are expected. In subscribe mode rebalances legitimately move consumers, so
poll-skip and nonmonotonic-poll are expected too. A test widens the set with `allow`
and narrows it with `disallow` (disallow wins).
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
) -> frozenset[str]:
    """The set of anomaly names that do not make a run invalid."""
    allowed = set(DEFAULT_ALLOWED)
    if subscribe:
        allowed |= SUBSCRIBE_ALLOWED
    allowed |= set(allow or ())
    allowed -= set(disallow or ())
    return frozenset(allowed)
