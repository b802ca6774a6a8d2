"""The built-in models: registers and a key-value store, in the shapes of the history format.

Inputs are ``(f, value)`` pairs taken from the invoke op; outputs are the ``ok`` completion's
value (or ``UNKNOWN`` for indeterminate operations).  Values are frozen (lists become tuples,
objects become sorted item tuples) so that states stay hashable.

- :data:`REGISTER`: ``read``/``get`` and ``write``/``put`` on one register per ``key``
  (ops without a key share one register), initial value ``None`` (absent).
- :data:`CAS_REGISTER`: the register plus ``cas`` with value ``[old, new]``.  An ``ok`` cas
  requires the current value to be ``old``; an indeterminate cas sets ``new`` if the value is
  ``old`` and otherwise changes nothing (a failed cas is ``fail`` and never reaches a model).
- :data:`KV`: ``get``/``read``, ``put``/``write`` and ``append`` per ``key``, partitioned by key.
  An absent key reads as ``None`` or as ``""`` (Jepsen and Porcupine kv histories use the empty
  string; the state of an absent key is ``""``); ``append`` concatenates strings (or extends
  lists) onto the current value.
- :data:`KV_UNPARTITIONED`: the same store as one state over all keys, without partitioning;
  it exists to measure what P-compositionality buys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from isrlab.checkers.linear.model import UNKNOWN, Model, Operation

__all__ = [
    "CAS_REGISTER",
    "KV",
    "KV_UNPARTITIONED",
    "MODELS",
    "REGISTER",
    "freeze",
    "kv_input",
    "partition_by_key",
]

_READS = frozenset({"read", "get"})
_WRITES = frozenset({"write", "put"})


def freeze(value: Any) -> Any:
    """A hashable, comparable rendering of a JSON value (lists -> tuples, dicts -> items)."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    return value


def partition_by_key(ops: Sequence[Operation]) -> list[list[Operation]]:
    """One partition per ``key`` (ops without a key form their own), in order of first use."""
    groups: dict[str | None, list[Operation]] = {}
    for op in ops:
        groups.setdefault(op.key, []).append(op)
    return list(groups.values())


def _unsupported(model: str, f: str) -> ValueError:
    return ValueError(
        f"the {model} model has no operation {f!r}; "
        f"check --workload (register: read/write, cas-register: read/write/cas, "
        f"kv: get/put/append)"
    )


def _register_step(state: Any, input: Any, output: Any) -> tuple[bool, Any]:
    f, value = input
    if f in _READS:
        return (output is UNKNOWN or freeze(output) == state), state
    if f in _WRITES:
        return True, freeze(value)
    raise _unsupported("register", f)


def _cas_register_step(state: Any, input: Any, output: Any) -> tuple[bool, Any]:
    f, value = input
    if f == "cas":
        try:
            old, new = value
        except (TypeError, ValueError):
            raise ValueError(f"a cas value must be [old, new], got {value!r}") from None
        if freeze(old) == state:
            return True, freeze(new)
        # An ok cas needs a match; an indeterminate one that does not match did nothing.
        return output is UNKNOWN, state
    if f in _READS:
        return (output is UNKNOWN or freeze(output) == state), state
    if f in _WRITES:
        return True, freeze(value)
    raise _unsupported("cas-register", f)


def _is_read(input: Any) -> bool:
    return input[0] in _READS


def _describe_register_op(input: Any, output: Any) -> str:
    f, value = input
    shown = "?" if output is UNKNOWN else _show(output)
    if f in _READS:
        return f"{f}() -> {shown}"
    if f == "cas" and isinstance(value, list | tuple) and len(value) == 2:
        return f"cas({_show(value[0])}, {_show(value[1])})" + (" -> ?" if output is UNKNOWN else "")
    return f"{f}({_show(value)})" + (" -> ?" if output is UNKNOWN else "")


def _show(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + " ".join(_show(v) for v in value) + "]"
    return str(value)


def kv_input(op: dict[str, Any]) -> Any:
    """The kv models' input: ``(f, key, value)`` of the invoke."""
    return (op["f"], op.get("key"), op.get("value"))


def _absent_as_empty(value: Any) -> Any:
    return "" if value is None else value


def _append(current: Any, value: Any) -> Any:
    if current is None or current == "":
        return freeze(value)
    if isinstance(current, str) and isinstance(value, str):
        return current + value
    if isinstance(current, tuple):
        return current + (freeze(value) if isinstance(value, list) else (freeze(value),))
    raise ValueError(f"cannot append {value!r} to {current!r}")


def _kv_step(state: Any, input: Any, output: Any) -> tuple[bool, Any]:
    f, _key, value = input
    if f in _READS:
        if output is UNKNOWN:
            return True, state
        return _absent_as_empty(freeze(output)) == _absent_as_empty(state), state
    if f in _WRITES:
        return True, _absent_as_empty(freeze(value))
    if f == "append":
        return True, _append(state, value)
    raise _unsupported("kv", f)


def _kv_map_step(state: Any, input: Any, output: Any) -> tuple[bool, Any]:
    f, key, _value = input
    mapping = dict(state)
    ok, new = _kv_step(mapping.get(key), input, output)
    if not ok or f in _READS:
        return ok, state
    mapping[key] = new
    return True, tuple(sorted(mapping.items(), key=lambda kv: str(kv[0])))


def _describe_kv_op(input: Any, output: Any) -> str:
    f, key, value = input
    shown = "?" if output is UNKNOWN else _show(output)
    if f in _READS:
        return f"{f}({key!r}) -> {shown}"
    return f"{f}({key!r}, {_show(value)})" + (" -> ?" if output is UNKNOWN else "")


def _describe_value_state(state: Any) -> str:
    return _show(state)


def _describe_map_state(state: Any) -> str:
    return "{" + ", ".join(f"{k!r}: {_show(v)}" for k, v in state) + "}"


# Compiled steps: the same transitions as the step functions above, specialised to one
# operation so that the search's inner loop pays for one small call per (op, state).
Stepper = Callable[[Any], tuple[bool, Any]]


def _compile_register(input: Any, output: Any, *, cas: bool, model: str) -> Stepper:
    f, value = input
    if f in _READS:
        if output is UNKNOWN:
            return lambda state: (True, state)
        expected = freeze(output)
        return lambda state: (state == expected, state)
    if f in _WRITES:
        written = freeze(value)
        return lambda state: (True, written)
    if f == "cas" and cas:
        try:
            old, new = (freeze(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"a cas value must be [old, new], got {value!r}") from None
        if output is UNKNOWN:
            return lambda state: (True, new) if state == old else (True, state)
        return lambda state: (state == old, new)
    raise _unsupported(model, f)


def _compile_cas_register(input: Any, output: Any) -> Stepper:
    return _compile_register(input, output, cas=True, model="cas-register")


def _compile_plain_register(input: Any, output: Any) -> Stepper:
    return _compile_register(input, output, cas=False, model="register")


def _compile_kv(input: Any, output: Any) -> Stepper:
    f, _key, value = input
    if f in _READS:
        if output is UNKNOWN:
            return lambda state: (True, state)
        expected = _absent_as_empty(freeze(output))
        return lambda state: (state == expected, state)
    if f in _WRITES:
        written = _absent_as_empty(freeze(value))
        return lambda state: (True, written)
    if f == "append":
        if isinstance(value, str):
            return lambda state: (
                True,
                state + value if isinstance(state, str) else _append(state, value),
            )
        return lambda state: (True, _append(state, value))
    raise _unsupported("kv", f)


REGISTER = Model(
    name="register",
    init=lambda: None,
    step=_register_step,
    partition=partition_by_key,
    read_only=_is_read,
    compile_step=_compile_plain_register,
    read_value=lambda input, output: freeze(output),
    describe_operation=_describe_register_op,
    describe_state=_describe_value_state,
)

CAS_REGISTER = Model(
    name="cas-register",
    init=lambda: None,
    step=_cas_register_step,
    partition=partition_by_key,
    read_only=_is_read,
    compile_step=_compile_cas_register,
    read_value=lambda input, output: freeze(output),
    describe_operation=_describe_register_op,
    describe_state=_describe_value_state,
)

KV = Model(
    name="kv",
    init=str,
    step=_kv_step,
    partition=partition_by_key,
    read_only=lambda input: input[0] in _READS,
    input_of=kv_input,
    compile_step=_compile_kv,
    read_value=lambda input, output: _absent_as_empty(freeze(output)),
    describe_operation=_describe_kv_op,
    describe_state=_describe_value_state,
)

KV_UNPARTITIONED = Model(
    name="kv-unpartitioned",
    init=tuple,
    step=_kv_map_step,
    partition=None,
    read_only=lambda input: input[0] in _READS,
    input_of=kv_input,
    describe_operation=_describe_kv_op,
    describe_state=_describe_map_state,
)

MODELS: dict[str, Model] = {
    "register": REGISTER,
    "cas-register": CAS_REGISTER,
    "kv": KV,
    "kv-unpartitioned": KV_UNPARTITIONED,
}
