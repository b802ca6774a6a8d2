"""The linearizability checker on hand-written histories, against a brute-force oracle, and
through ``check_workload`` (results dict and HTML)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isrlab.checkers.linear import CAS_REGISTER, KV, KV_UNPARTITIONED, REGISTER, Model, check
from isrlab.checkers.linear.api import check_workload
from isrlab.checkers.linear.model import INFINITY, Operation
from isrlab.checkers.linear.operations import HistoryError, operations_from_history

Event = tuple[Any, ...]


def history(*events: Event) -> list[dict[str, Any]]:
    """Op dicts from (process, type, f, value[, key]) tuples, indexed and timed in order."""
    ops = []
    for i, event in enumerate(events):
        process, kind, f, value = event[:4]
        op: dict[str, Any] = {
            "index": i,
            "time": i * 10,
            "process": process,
            "type": kind,
            "f": f,
            "value": value,
        }
        if len(event) > 4:
            op["key"] = event[4]
        ops.append(op)
    return ops


def verdict(model: Model, ops: Sequence[dict[str, Any]]) -> str:
    return check(model, ops).verdict


# --- registers ------------------------------------------------------------------------------


def test_concurrent_writes_may_take_effect_in_either_order() -> None:
    for seen in (1, 2):
        ops = history(
            (0, "invoke", "write", 1),
            (1, "invoke", "write", 2),
            (0, "ok", "write", 1),
            (1, "ok", "write", 2),
            (2, "invoke", "read", None),
            (2, "ok", "read", seen),
        )
        assert verdict(REGISTER, ops) == "ok"


def test_read_concurrent_with_write_sees_old_or_new_value() -> None:
    for seen in (None, 1):
        ops = history(
            (0, "invoke", "write", 1),
            (1, "invoke", "read", None),
            (1, "ok", "read", seen),
            (0, "ok", "write", 1),
        )
        assert verdict(REGISTER, ops) == "ok"
    ops = history(
        (0, "invoke", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", 7),
        (0, "ok", "write", 1),
    )
    assert verdict(REGISTER, ops) == "illegal"


def test_stale_read_is_illegal_and_explained() -> None:
    ops = history(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "write", 2),
        (1, "ok", "write", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 1),
    )
    result = check(REGISTER, ops)
    assert result.verdict == "illegal"
    [part] = result.illegal
    assert [op.input for op in part.linearization] == [("write", 1), ("write", 2)]
    assert part.blocked is not None and part.blocked.invoke_index == 4
    assert part.state == 2
    text = part.explanation(REGISTER)
    assert "read() -> 1" in text and "2 of 3" in text


def test_reads_must_not_go_back_in_time() -> None:
    ops = history(
        (0, "invoke", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", 1),
        (2, "invoke", "read", None),
        (2, "ok", "read", None),
        (0, "ok", "write", 1),
    )
    assert verdict(REGISTER, ops) == "illegal"


def test_cas_semantics() -> None:
    ok = history(
        (0, "invoke", "cas", [None, 1]),
        (0, "ok", "cas", [None, 1]),
        (0, "invoke", "cas", [1, 2]),
        (0, "ok", "cas", [1, 2]),
        (1, "invoke", "read", None),
        (1, "ok", "read", 2),
    )
    assert verdict(CAS_REGISTER, ok) == "ok"
    wrong_old = history(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (0, "invoke", "cas", [3, 4]),
        (0, "ok", "cas", [3, 4]),
    )
    assert verdict(CAS_REGISTER, wrong_old) == "illegal"
    failed_cas_is_dropped = history(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (0, "invoke", "cas", [1, 5]),
        (0, "fail", "cas", [1, 5]),
        (1, "invoke", "read", None),
        (1, "ok", "read", 1),
    )
    result = check(CAS_REGISTER, failed_cas_is_dropped)
    assert result.verdict == "ok" and result.failed == 1
    with pytest.raises(ValueError, match="register model has no operation 'cas'"):
        check(REGISTER, ok)


def test_indeterminate_cas_applies_only_if_it_matches() -> None:
    base: list[Event] = [
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "cas", [1, 2]),
        (1, "info", "cas", [1, 2]),
    ]
    for seen, expected in ((1, "ok"), (2, "ok"), (3, "illegal")):
        ops = history(*base, (2, "invoke", "read", None), (2, "ok", "read", seen))
        assert verdict(CAS_REGISTER, ops) == expected


def test_info_write_may_or_may_not_happen_but_once() -> None:
    base: list[Event] = [
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "write", 2),
        (1, "info", "write", 2),
    ]
    reads = {
        (1,): "ok",
        (2,): "ok",
        (1, 2): "ok",
        (2, 2): "ok",
        (2, 1): "illegal",  # it took effect, then un-happened
        (1, 2, 1): "illegal",
    }
    for seen, expected in reads.items():
        events = list(base)
        for value in seen:
            events += [(2, "invoke", "read", None), (2, "ok", "read", value)]
        assert verdict(REGISTER, history(*events)) == expected, seen


def test_unfinished_invoke_counts_as_info() -> None:
    ops = history(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "write", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 2),
    )
    assert verdict(REGISTER, ops) == "ok"
    ops[-1]["value"] = 1
    assert verdict(REGISTER, ops) == "illegal"


def test_indeterminate_reads_are_dropped_and_nemesis_ignored() -> None:
    ops = history(
        ("nemesis", "info", "start-partition", None),
        (0, "invoke", "read", None),
        (0, "info", "read", None),
        (1, "invoke", "write", 1),
        (1, "ok", "write", 1),
        ("nemesis", "info", "start-partition", {"n1": ["n2"]}),
    )
    result = check(REGISTER, ops)
    assert result.verdict == "ok"
    assert result.dropped_reads == 1 and result.operations == 1


def test_keys_are_independent_registers() -> None:
    ops = history(
        (0, "invoke", "write", 1, "a"),
        (0, "ok", "write", 1, "a"),
        (0, "invoke", "write", 2, "b"),
        (0, "ok", "write", 2, "b"),
        (1, "invoke", "read", None, "a"),
        (1, "ok", "read", 1, "a"),
        (1, "invoke", "read", None, "b"),
        (1, "ok", "read", 1, "b"),
    )
    result = check(REGISTER, ops, stop_at_first_illegal=False)
    assert result.verdict == "illegal"
    assert {p.key: p.verdict for p in result.partitions} == {"a": "ok", "b": "illegal"}


def test_search_stops_at_the_first_illegal_partition_by_default() -> None:
    ops = history(
        (0, "invoke", "write", 1, "big"),
        (0, "ok", "write", 1, "big"),
        (0, "invoke", "read", None, "big"),
        (0, "ok", "read", 1, "big"),
        (1, "invoke", "read", None, "small"),
        (1, "ok", "read", 5, "small"),
    )
    result = check(REGISTER, ops)
    assert result.verdict == "illegal"
    assert [(p.key, p.verdict, p.checked) for p in result.partitions] == [
        ("small", "illegal", True),
        ("big", "unknown", False),
    ]
    assert result.stats["unchecked_partitions"] == 1 and result.stats["unknown_partitions"] == 0
    everything = check(REGISTER, ops, stop_at_first_illegal=False)
    assert [p.verdict for p in everything.partitions] == ["illegal", "ok"]


def test_empty_and_nemesis_only_histories_are_linearizable_but_check_nothing() -> None:
    assert check(REGISTER, []).verdict == "ok"
    nemesis_only = history(("nemesis", "info", "kill", None), ("nemesis", "info", "kill", None))
    results = check_workload(nemesis_only, "cas-register")
    # trivially linearizable, yet nothing was checked: never reported as valid (the spec)
    assert results["valid"] == "unknown" and results["stats"]["operations"] == 0
    assert results["stats"]["nothing-checked"] == "no ok operation in the history"


def test_values_may_be_json_lists_and_objects() -> None:
    ops = history(
        (0, "invoke", "write", {"x": [1, 2]}),
        (0, "ok", "write", {"x": [1, 2]}),
        (1, "invoke", "read", None),
        (1, "ok", "read", {"x": [1, 2]}),
    )
    assert verdict(REGISTER, ops) == "ok"


def test_history_errors_say_where() -> None:
    with pytest.raises(HistoryError, match="op 0: ok completion of process 3"):
        check(REGISTER, history((3, "ok", "read", None)))
    with pytest.raises(HistoryError, match="invokes again"):
        check(REGISTER, history((0, "invoke", "read", None), (0, "invoke", "read", None)))
    with pytest.raises(HistoryError, match="type 'done'"):
        check(REGISTER, history((0, "invoke", "read", None), (0, "done", "read", None)))


def test_operations_without_time_use_history_order() -> None:
    ops = history((0, "invoke", "write", 1), (0, "ok", "write", 1))
    for op in ops:
        del op["time"]
    operations, _failed, _dropped = operations_from_history(REGISTER, ops)
    assert (operations[0].call, operations[0].ret) == (0.0, 1.0)


# --- key-value ------------------------------------------------------------------------------


def test_kv_append_and_get() -> None:
    ops = history(
        (0, "invoke", "get", None, "k"),
        (0, "ok", "get", "", "k"),
        (0, "invoke", "append", "x", "k"),
        (1, "invoke", "append", "y", "k"),
        (0, "ok", "append", "x", "k"),
        (1, "ok", "append", "y", "k"),
        (2, "invoke", "get", None, "k"),
        (2, "ok", "get", "yx", "k"),
        (2, "invoke", "put", "z", "k"),
        (2, "ok", "put", "z", "k"),
        (2, "invoke", "get", None, "k"),
        (2, "ok", "get", "z", "k"),
        (2, "invoke", "get", None, "other"),
        (2, "ok", "get", None, "other"),
    )
    assert verdict(KV, ops) == "ok"
    assert verdict(KV_UNPARTITIONED, ops) == "ok"
    ops[7]["value"] = "xyx"
    assert verdict(KV, ops) == "illegal"
    assert verdict(KV_UNPARTITIONED, ops) == "illegal"


# --- timeouts and budgets -------------------------------------------------------------------


def hard_history(writers: int = 12) -> list[dict[str, Any]]:
    """Many overlapping writes, then a read of a value nobody wrote: every order is tried."""
    events: list[Event] = [(p, "invoke", "write", p) for p in range(writers)]
    events += [(p, "ok", "write", p) for p in range(writers)]
    events += [(writers, "invoke", "read", None), (writers, "ok", "read", -1)]
    return history(*events)


def test_hard_history_is_illegal_given_time() -> None:
    result = check(REGISTER, hard_history(10))
    assert result.verdict == "illegal"
    assert result.stats["backtracks"] > 1024


def test_timeout_gives_unknown() -> None:
    result = check(REGISTER, hard_history(), timeout_s=0.0)
    assert result.verdict == "unknown"
    assert result.gave_up and result.partitions[0].verdict == "unknown"
    results = check_workload(hard_history(), "register", timeout_s=0.0)
    assert results["valid"] == "unknown" and results["anomaly_types"] == []


def test_parallel_partitions_agree_and_time_out() -> None:
    keyed = [dict(op, key=str(k)) for k in range(3) for op in hard_history(8)]
    for i, op in enumerate(keyed):
        op["index"] = i
    result = check(REGISTER, keyed, workers=2)
    assert result.verdict == "illegal" and result.illegal[0].blocked is not None
    assert check(REGISTER, keyed, timeout_s=0.0, workers=2).verdict == "unknown"
    for op in keyed:
        if op["f"] == "read" and op["type"] == "ok":
            op["value"] = 0  # the write of 0 may have been the last one
    assert check(REGISTER, keyed, workers=2).verdict == "ok"


def test_config_budget_gives_unknown() -> None:
    assert check(REGISTER, hard_history(), max_configs=100).verdict == "unknown"


# --- a brute-force oracle -------------------------------------------------------------------


def brute_force(model: Model, ops: Sequence[Operation]) -> bool:
    """Try every subset of indeterminate ops and every real-time-respecting order."""
    determinate = [op for op in ops if op.ret != INFINITY]
    maybe = [op for op in ops if op.ret == INFINITY]
    for r in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, r):
            included = determinate + list(chosen)
            for order in itertools.permutations(included):
                if any(
                    later.ret < earlier.call
                    for i, earlier in enumerate(order)
                    for later in order[i + 1 :]
                ):
                    continue
                state = model.init()
                for op in order:
                    ok, state = model.step(state, op.input, op.output)
                    if not ok:
                        break
                else:
                    return True
    return False


@st.composite
def random_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    processes = draw(st.integers(1, 3))
    idle = list(range(processes))
    running: dict[int, tuple[str, Any]] = {}
    next_process = processes
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 12))):
        if idle and (not running or draw(st.booleans())):
            process = idle.pop(draw(st.integers(0, len(idle) - 1)))
            f = draw(st.sampled_from(["read", "write", "cas"]))
            value: Any = None
            if f == "write":
                value = draw(st.integers(0, 2))
            elif f == "cas":
                value = [draw(st.sampled_from([None, 0, 1, 2])), draw(st.integers(0, 2))]
            running[process] = (f, value)
            events.append((process, "invoke", f, value))
        elif running:
            process = draw(st.sampled_from(sorted(running)))
            f, value = running.pop(process)
            kind = draw(st.sampled_from(["ok", "ok", "ok", "info", "fail"]))
            if f == "read" and kind == "ok":
                value = draw(st.sampled_from([None, 0, 1, 2]))
            events.append((process, kind, f, value))
            if kind == "info":
                idle.append(next_process)  # an info retires the process
                next_process += 1
            else:
                idle.append(process)
    return history(*events)


# The same model without its speed-ups: only init and step.
PLAIN_CAS_REGISTER = dataclasses.replace(
    CAS_REGISTER, compile_step=None, read_value=None, read_only=None
)


@settings(max_examples=300, deadline=None)
@given(random_histories())
def test_agrees_with_brute_force(ops: list[dict[str, Any]]) -> None:
    operations, _failed, _dropped = operations_from_history(PLAIN_CAS_REGISTER, ops)
    expected = "ok" if brute_force(PLAIN_CAS_REGISTER, operations) else "illegal"
    assert check(CAS_REGISTER, ops).verdict == expected
    assert check(PLAIN_CAS_REGISTER, ops).verdict == expected


# --- user models ----------------------------------------------------------------------------


def test_user_model_with_unhashable_state_gives_equal_and_hash() -> None:
    def step(state: set[Any], input: Any, output: Any) -> tuple[bool, set[Any]]:
        f, value = input
        if f == "add":
            return True, state | {value}
        return sorted(state) == output, state

    grow_only_set = Model(
        name="set",
        init=set,
        step=step,
        equal=lambda a, b: a == b,
        hash=lambda s: hash(frozenset(s)),
    )
    ops = history(
        (0, "invoke", "add", 1),
        (1, "invoke", "add", 2),
        (0, "ok", "add", 1),
        (1, "ok", "add", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", [1, 2]),
    )
    assert check(grow_only_set, ops).verdict == "ok"
    ops[-1]["value"] = [2]
    assert check(grow_only_set, ops).verdict == "illegal"
    without_hash = dataclasses.replace(grow_only_set, equal=None, hash=None)
    with pytest.raises(TypeError, match=r"model set: state .* is not hashable"):
        check(without_hash, ops)


# --- results dict and HTML ------------------------------------------------------------------


def stale_read() -> list[dict[str, Any]]:
    return history(
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "write", 2),
        (1, "ok", "write", 2),
        (2, "invoke", "read", None),
        (2, "ok", "read", 1),
    )


def test_check_workload_results_dict(tmp_path: Path) -> None:
    results = check_workload(stale_read(), "register", out_dir=tmp_path)
    assert results["valid"] is False
    assert results["anomaly_types"] == ["nonlinearizable"]
    [example] = results["anomalies"]["nonlinearizable"]["examples"]
    assert "read() -> 1" in example["explanation"]
    assert example["op"]["invoke"]["index"] == 4
    assert example["op"]["completion"]["value"] == 1
    assert example["prefix_length"] == 2
    json.dumps(results)  # the CLI prints it as JSON
    assert check_workload(stale_read()[:4], "register")["valid"] is True
    with pytest.raises(ValueError, match="cas-register, kv, register"):
        check_workload(stale_read(), "queue")


def test_html_shows_the_illegal_op(tmp_path: Path) -> None:
    check_workload(stale_read(), "register", out_dir=tmp_path)
    page = (tmp_path / "linear.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count('class="op blocked"') == 1
    blocked = page[page.index('class="op blocked"') :]
    assert "read() -&gt; 1" in blocked[:400]
    assert "process 2" in page and "illegal" in page
