"""Kafka's answers list their partitions topic by topic: the handlers' one way of grouping."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

V = TypeVar("V")
R = TypeVar("R")


def by_topic(
    items: Iterable[tuple[tuple[str, int], V]], entry: Callable[[int, V], R]
) -> dict[str, list[R]]:
    """`entry(partition, value)` for each ((topic, partition), value), grouped by topic; topics
    and their partitions keep the order in which they come."""
    out: dict[str, list[R]] = {}
    for (topic, partition), value in items:
        out.setdefault(topic, []).append(entry(partition, value))
    return out
