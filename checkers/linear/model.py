"""What a linearizability model is, and the operations it is checked against.

A :class:`Model` is a sequential specification in the style of Porcupine: ``init()`` gives the
initial state, ``step(state, input, output) -> (ok, new_state)`` says whether an operation with
that input could have returned that output in that state, and what the state becomes.  Optional
hooks: ``partition`` splits a history into independent sub-histories (P-compositionality: a
history is linearizable iff every partition is), ``equal``/``hash`` for states that are not
hashable Python values, ``read_only`` to name operations that never change the state (the
search drops them when indeterminate and never backtracks over them when accepted),
``compile_step(input, output)`` returning a ``step`` specialised to one operation (a speed-up
only: it must agree with ``step``), ``read_value(input, output)`` naming the one state in
which a determinate read-only operation is accepted (a speed-up too), and ``describe_operation``/``describe_state`` for
counterexamples.

States should be immutable, hashable Python values (``None``, numbers, strings, tuples,
frozensets): the checker memoises on them.  A model whose states are not hashable must supply
both ``equal`` and ``hash``.

An :class:`Operation` is one invocation paired with its completion.  Its ``output`` is
:data:`UNKNOWN` when the operation is indeterminate (``info`` or never completed): ``step`` must
then accept any outcome the input allows, and the operation's return time is ``+inf`` so it may
take effect at any point after its call, or never (it is placed after everything else).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["INFINITY", "UNKNOWN", "Model", "Operation", "default_input_of", "default_output_of"]

INFINITY = math.inf


class _Unknown:
    """The output of an indeterminate operation (a singleton)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(slots=True)
class Operation:
    """One operation of a history: its call and return times and what the model sees of it.

    ``id`` is dense within the whole checked history (0..n-1, in invocation order);
    ``invoke_index``/``complete_index`` point back to the op dicts (``complete_index`` is
    ``None`` for an operation that never completed).  ``ret`` is ``INFINITY`` for an
    indeterminate operation.
    """

    id: int
    process: Any
    f: str
    key: str | None
    call: float
    ret: float
    input: Any
    output: Any
    invoke_index: int
    complete_index: int | None = None
    error: Any = None

    @property
    def indeterminate(self) -> bool:
        return self.output is UNKNOWN


def default_input_of(op: dict[str, Any]) -> Any:
    """A model's input unless it says otherwise: ``(f, value)`` of the invoke."""
    return (op["f"], op.get("value"))


def default_output_of(invoke: dict[str, Any], completion: dict[str, Any]) -> Any:
    """A model's output unless it says otherwise: the ok completion's value."""
    return completion.get("value")


def _default_describe_operation(input: Any, output: Any) -> str:
    return f"{input!r} -> {'?' if output is UNKNOWN else repr(output)}"


def _default_describe_state(state: Any) -> str:
    return repr(state)


@dataclass(frozen=True)
class Model:
    """A sequential specification (see the module docstring).

    ``input_of(invoke_op)`` and ``output_of(invoke_op, completion_op)`` turn op dicts of the
    history format into the model's inputs and outputs; ``output_of`` is only called for ``ok``
    completions (indeterminate operations get :data:`UNKNOWN`).
    """

    name: str
    init: Callable[[], Any]
    step: Callable[[Any, Any, Any], tuple[bool, Any]]
    partition: Callable[[Sequence[Operation]], list[list[Operation]]] | None = None
    equal: Callable[[Any, Any], bool] | None = None
    hash: Callable[[Any], int] | None = None
    read_only: Callable[[Any], bool] | None = None
    input_of: Callable[[dict[str, Any]], Any] = default_input_of
    output_of: Callable[[dict[str, Any], dict[str, Any]], Any] = default_output_of
    compile_step: Callable[[Any, Any], Callable[[Any], tuple[bool, Any]]] | None = None
    read_value: Callable[[Any, Any], Any] | None = None
    describe_operation: Callable[[Any, Any], str] = _default_describe_operation
    describe_state: Callable[[Any], str] = _default_describe_state
