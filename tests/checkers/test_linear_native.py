"""The compiled search loop (checkers/linear/_search.pyx) against the Python loop it replaces.

``search(..., native=False)`` is the reference.  On random small histories of every built-in
model (with and without the models' speed-ups, and a user model with equal/hash), ok and not,
the two must give the same outcome field for field: verdict, linearization or longest prefix,
blocked op, state, backtracks, memo size and the states the shared table interned.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrlab.checkers.linear import CAS_REGISTER, KV, KV_UNPARTITIONED, REGISTER, Model
from isrlab.checkers.linear import search as search_module
from isrlab.checkers.linear.model import UNKNOWN, Operation
from isrlab.checkers.linear.operations import operations_from_history
from isrlab.checkers.linear.search import StateTable, search


def test_the_compiled_loop_is_built() -> None:
    assert search_module.NATIVE, "the compiled search is not built: run `make build`"


def _plain(model: Model) -> Model:
    """The model without its speed-ups: init and step (and partition) only."""
    return dataclasses.replace(model, compile_step=None, read_value=None, read_only=None)


def _set_step(state: set[Any], input: Any, output: Any) -> tuple[bool, set[Any]]:
    f, value = input
    if f == "write":  # add
        return True, state | {value}
    if f == "cas":  # remove the first value if present
        return True, state - {value[0]}
    if output is UNKNOWN:
        return True, state
    expected = [] if output is None else output if isinstance(output, list) else [output]
    return sorted(state) == sorted(expected), state


# A model with unhashable states: the search interns them through equal/hash.
SET = Model(
    name="set",
    init=set,
    step=_set_step,
    equal=lambda a, b: a == b,
    hash=lambda s: hash(frozenset(s)),
)

MODELS = {
    "register": REGISTER,
    "cas-register": CAS_REGISTER,
    "plain-cas-register": _plain(CAS_REGISTER),
    "kv": KV,
    "plain-kv": _plain(KV),
    "kv-unpartitioned": KV_UNPARTITIONED,
    "set": SET,
}
KV_LIKE = {"kv", "plain-kv", "kv-unpartitioned"}


@st.composite
def histories(draw: st.DrawFn, name: str) -> list[dict[str, Any]]:
    """Op dicts with up to 4 processes and 16 events; reads return arbitrary values, so many
    histories are not linearizable; info completions retire their process."""
    kv = name in KV_LIKE
    register_fs = ["read", "write"] if name == "register" else ["read", "write", "cas"]
    idle = list(range(draw(st.integers(1, 4))))
    running: dict[int, tuple[str, Any, str]] = {}
    next_process = len(idle)
    ops: list[dict[str, Any]] = []
    values = st.sampled_from(["", "x", "y", "xy", "yx", "xx"]) if kv else st.integers(0, 2)
    for _ in range(draw(st.integers(1, 16))):
        if idle and (not running or draw(st.booleans())):
            process = idle.pop(draw(st.integers(0, len(idle) - 1)))
            key = draw(st.sampled_from(["a", "b"]))
            value: Any = None
            if kv:
                f = draw(st.sampled_from(["get", "put", "append", "append"]))
                if f == "put":
                    value = draw(values)
                elif f == "append":
                    value = draw(st.sampled_from(["x", "y"]))
            else:
                f = draw(st.sampled_from(register_fs))
                if f == "write":
                    value = draw(values)
                elif f == "cas":
                    value = [draw(st.sampled_from([None, 0, 1, 2])), draw(values)]
            running[process] = (f, value, key)
            ops.append({"process": process, "type": "invoke", "f": f, "value": value, "key": key})
        else:
            process = draw(st.sampled_from(sorted(running)))
            f, value, key = running.pop(process)
            kind = draw(st.sampled_from(["ok", "ok", "ok", "info", "fail"]))
            if f in ("read", "get") and kind == "ok":
                value = draw(st.sampled_from([None, 0, 1, 2, [0], [0, 1]]) if not kv else values)
            ops.append({"process": process, "type": kind, "f": f, "value": value, "key": key})
            if kind == "info":
                idle.append(next_process)
                next_process += 1
            else:
                idle.append(process)
    for i, op in enumerate(ops):
        op["index"] = i
        op["time"] = i * 10
    return ops


def _outcomes(
    model: Model, ops: list[Operation], native: bool, max_configs: int | None = None
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """Every partition's outcome (as the checker searches them: smallest first, one state
    table), and the states the table interned."""
    table = StateTable(model)
    parts = model.partition(ops) if model.partition is not None else [list(ops)]
    found = []
    for part in sorted((p for p in parts if p), key=len):
        o = search(model, part, None, table, max_configs, native=native)
        found.append(
            (o.verdict, o.linearization, o.blocked, o.state, o.steps, o.cache_size, o.states_seen)
        )
    return found, table.states


def _assert_same(model: Model, history: list[dict[str, Any]], **kwargs: Any) -> str:
    ops, _failed, _dropped = operations_from_history(model, history)
    reference = _outcomes(model, ops, native=False, **kwargs)
    assert _outcomes(model, ops, native=True, **kwargs) == reference
    verdicts = {v[0] for v in reference[0]}
    return "illegal" if "illegal" in verdicts else "unknown" if "unknown" in verdicts else "ok"


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_compiled_and_python_loops_agree(name: str, data: st.DataObject) -> None:
    if not search_module.NATIVE:
        pytest.skip("the compiled search is not built")
    model = MODELS[name]
    history = data.draw(histories(name))
    _assert_same(model, history)


def test_both_verdicts_are_drawn() -> None:
    """The generator makes linearizable and non-linearizable histories for every model."""
    if not search_module.NATIVE:
        pytest.skip("the compiled search is not built")
    seen: dict[str, set[str]] = {name: set() for name in MODELS}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(MODELS)))
        seen[name].add(_assert_same(MODELS[name], data.draw(histories(name))))

    run()
    assert all(verdicts >= {"ok", "illegal"} for verdicts in seen.values()), seen


def _hard(writers: int) -> list[dict[str, Any]]:
    """Overlapping writes, then a read of a value nobody wrote: thousands of backtracks."""
    ops = [{"process": p, "type": "invoke", "f": "write", "value": p} for p in range(writers)]
    ops += [{"process": p, "type": "ok", "f": "write", "value": p} for p in range(writers)]
    ops += [
        {"process": writers, "type": "invoke", "f": "read", "value": None},
        {"process": writers, "type": "ok", "f": "read", "value": -1},
    ]
    for i, op in enumerate(ops):
        op["index"] = i
        op["time"] = i
    return ops


def test_budget_and_long_searches_agree() -> None:
    if not search_module.NATIVE:
        pytest.skip("the compiled search is not built")
    assert _assert_same(REGISTER, _hard(9)) == "illegal"
    assert _assert_same(REGISTER, _hard(9), max_configs=100) == "unknown"
    assert _assert_same(_plain(CAS_REGISTER), _hard(9), max_configs=10) == "unknown"
    assert _assert_same(_plain(CAS_REGISTER), _hard(7)) == "illegal"


def test_deadline_gives_unknown() -> None:
    if not search_module.NATIVE:
        pytest.skip("the compiled search is not built")
    ops, _f, _d = operations_from_history(REGISTER, _hard(10))
    outcome = search(REGISTER, ops, deadline=0.0, native=True)
    assert outcome.verdict == "unknown" and outcome.blocked is None
    assert outcome.steps == 1024


def _step_or_fail(state: Any, input: Any, output: Any) -> tuple[bool, Any]:
    if input[0] == "cas":
        raise ValueError("no cas here")
    return REGISTER.step(state, input, output)


def test_model_errors_surface_the_same() -> None:
    if not search_module.NATIVE:
        pytest.skip("the compiled search is not built")
    failing = dataclasses.replace(_plain(REGISTER), step=_step_or_fail)
    history = _hard(2)
    history[0]["f"] = history[2]["f"] = "cas"
    ops, _f, _d = operations_from_history(failing, history)
    unhashable = dataclasses.replace(SET, equal=None, hash=None)
    set_ops, _f, _d = operations_from_history(unhashable, _hard(2))
    for native in (False, True):
        with pytest.raises(ValueError, match="no cas here"):
            search(failing, ops, native=native)
        with pytest.raises(TypeError, match=r"model set: state .* is not hashable"):
            search(unhashable, set_ops, native=native)
