"""Types of the compiled search loop (_search.pyx)."""

from collections.abc import Callable
from typing import Any, Literal

def run(
    op_of: list[int],
    match: list[int],
    steppers: list[Callable[[Any], tuple[bool, Any]]],
    forced: list[bool],
    prev_twin: list[int],
    fixed: list[int],
    states: list[Any],
    known: dict[Any, int] | None,
    intern: Callable[[Any], int],
    deadline: float | None,
    max_configs: int | None,
) -> tuple[Literal["ok", "illegal", "unknown"], list[int], int | None, int, int, int]: ...
