"""Property tests: histories of a correct log are valid; injected faults are named correctly.

Histories come from `pipeline.fixtures.simulate` (concurrency, info timeouts, failed ops,
crashes, reassignments, transactions with markers and aborted offsets), driven by
hypothesis-chosen seeds and shapes. Each mutation models one kind of broker bug and must
be reported under its anomaly name.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from isrlab.checkers.history import validate
from isrlab.checkers.queue import check_queue, keys_of, merge_results, project_key
from isrlab.pipeline.fixtures.simulate import eos_keys, simulate

shapes = st.fixed_dictionaries(
    {
        "n_ops": st.integers(50, 600),
        "processes": st.integers(1, 6),
        "keys": st.integers(1, 4),
        "seed": st.integers(0, 2**32 - 1),
        "txn_rate": st.sampled_from([0.0, 0.3, 0.8]),
        "info_rate": st.sampled_from([0.0, 0.05, 0.2]),
        "fail_rate": st.sampled_from([0.0, 0.05, 0.2]),
        "crash_rate": st.sampled_from([0.0, 0.02]),
        "assign_rate": st.sampled_from([0.0, 0.05]),
        "late_acks": st.sampled_from([0.0, 0.0, 0.3]),
    }
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def drains(ops: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """key -> the final drain's ok poll completion (it reads every record of the key)."""
    drain_process = ops[-1]["process"]
    out = {}
    for op in ops:
        if op["process"] == drain_process and op["type"] == "ok" and op["f"] == "poll":
            (k,) = op["value"][0][1].keys()
            out[k] = op
    return out


def known_elsewhere(ops: list[dict[str, Any]], skip: dict[str, Any]) -> set[tuple[str, Any]]:
    """(key, value) pairs whose offset some op other than `skip` establishes."""
    known = set()
    for op in ops:
        if op is skip or op["type"] != "ok" or op["f"] not in ("send", "poll", "txn"):
            continue
        for mop in op["value"]:
            if mop[0] == "send" and isinstance(mop[2], list) and mop[2][0] is not None:
                known.add((mop[1], mop[2][1]))
            elif mop[0] == "poll":
                for k, pairs in mop[1].items():
                    known.update((k, v) for _o, v in pairs)
    return known


@SETTINGS
@given(shapes)
def test_correct_log_histories_are_valid(shape: dict[str, Any]) -> None:
    ops = simulate(**shape)
    validate(ops)
    r = check_queue(ops)
    assert r["valid"] is True, r["anomalies"]
    assert r["anomaly_types"] == []


@SETTINGS
@given(shapes)
def test_per_key_checks_agree_with_the_whole(shape: dict[str, Any]) -> None:
    ops = simulate(**{**shape, "txn_rate": 0.0})
    parts = [check_queue(project_key(ops, k)) for k in keys_of(ops)]
    merged = merge_results(parts)
    assert merged["valid"] is True and merged["anomaly_types"] == []


@SETTINGS
@given(shapes, st.data())
def test_dropped_read_is_a_skip(shape: dict[str, Any], data: st.DataObject) -> None:
    ops = simulate(**shape)
    d = drains(ops)
    k = data.draw(st.sampled_from(sorted(d)))
    drain = d[k]
    pairs = drain["value"][0][1][k]
    known = known_elsewhere(ops, drain)
    middle = [i for i in range(1, len(pairs) - 1) if (k, pairs[i][1]) in known]
    assume(middle)
    i = data.draw(st.sampled_from(middle))
    del pairs[i]
    r = check_queue(ops)
    assert "int-poll-skip" in r["anomaly_types"]
    assert r["valid"] is False


@SETTINGS
@given(shapes, st.data())
def test_duplicated_record_is_a_duplicate(shape: dict[str, Any], data: st.DataObject) -> None:
    ops = simulate(**shape)
    d = drains(ops)
    candidates = [k for k in sorted(d) if d[k]["value"][0][1][k]]
    assume(candidates)
    k = data.draw(st.sampled_from(candidates))
    pairs = d[k]["value"][0][1][k]
    _o, v = data.draw(st.sampled_from(pairs))
    pairs.append([pairs[-1][0] + 1, v])
    r = check_queue(ops)
    assert "duplicate" in r["anomaly_types"] and r["valid"] is False
    assert any(ex["value"] == v for ex in r["anomalies"]["duplicate"]["examples"])


@SETTINGS
@given(shapes, st.data())
def test_swapped_offsets_are_inconsistent(shape: dict[str, Any], data: st.DataObject) -> None:
    ops = simulate(**shape)
    d = drains(ops)
    k = data.draw(st.sampled_from(sorted(d)))
    drain = d[k]
    pairs = drain["value"][0][1][k]
    known = known_elsewhere(ops, drain)
    idx = [i for i, (_o, v) in enumerate(pairs) if (k, v) in known]
    assume(len(idx) >= 2)
    i, j = sorted(data.draw(st.lists(st.sampled_from(idx), min_size=2, max_size=2, unique=True)))
    pairs[i][0], pairs[j][0] = pairs[j][0], pairs[i][0]
    r = check_queue(ops)
    assert "inconsistent-offsets" in r["anomaly_types"] and r["valid"] is False


@SETTINGS
@given(shapes, st.data())
def test_lowered_watermark_is_a_regression(shape: dict[str, Any], data: st.DataObject) -> None:
    ops = simulate(**shape)
    seen: dict[tuple[Any, str], int] = {}
    candidates = []
    for op in ops:
        for k, m in (op.get("watermarks") or {}).items():
            prior = seen.get((op["process"], k))
            if prior is not None and prior >= 1:
                candidates.append((op["index"], k, prior))
            seen[(op["process"], k)] = m["high"]
    assume(candidates)
    index, k, prior = data.draw(st.sampled_from(candidates))
    mutated = copy.deepcopy(ops)
    mutated[index]["watermarks"][k]["high"] = prior - 1
    r = check_queue(mutated)
    assert "hw-regression" in r["anomaly_types"] and r["valid"] is False
    assert "hw-regression-realtime" in r["anomaly_types"]


@SETTINGS
@given(shapes)
def test_interleaved_transactions_only_show_allowed_anomalies(shape: dict[str, Any]) -> None:
    # Kafka does not isolate transactional writes: cycles through ww edges are expected.
    ops = simulate(**{**shape, "interleave": True})
    r = check_queue(ops)
    assert r["valid"] is True, {k: r["anomalies"][k] for k in r["not_allowed"]}
    assert set(r["anomaly_types"]) <= {
        "int-send-skip",
        "G0",
        "G0-process",
        "G0-realtime",
        "G1c-ww",
        "G1c-ww-process",
        "G1c-ww-realtime",
    }


def copier_history(shape: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    keys = max(shape["keys"], 2)
    ops = simulate(**{**shape, "keys": keys, "copiers": 2})
    return ops, eos_keys(keys, 2)


@SETTINGS
@given(shapes)
def test_exactly_once_copies_are_valid(shape: dict[str, Any]) -> None:
    ops, eos = copier_history(shape)
    r = check_queue(ops, eos=eos)
    assert r["valid"] is True, {k: r["anomalies"][k] for k in r["not_allowed"]}
    assert not {"eos-duplicate", "eos-missing"} & set(r["anomaly_types"])


@SETTINGS
@given(shapes, st.data())
def test_copied_twice_is_eos_duplicate(shape: dict[str, Any], data: st.DataObject) -> None:
    ops, eos = copier_history(shape)
    out = drains(ops)[eos["output"][0]]
    pairs = out["value"][0][1][eos["output"][0]]
    assume(pairs)
    _o, v = data.draw(st.sampled_from(pairs))
    pairs.append([pairs[-1][0] + 1, v])
    r = check_queue(ops, eos=eos)
    assert "eos-duplicate" in r["anomaly_types"] and r["valid"] is False
    assert any(ex["value"] == v for ex in r["anomalies"]["eos-duplicate"]["examples"])


@SETTINGS
@given(shapes, st.data())
def test_never_copied_is_eos_missing(shape: dict[str, Any], data: st.DataObject) -> None:
    ops, eos = copier_history(shape)
    out_key = eos["output"][0]
    copied = [p[1] for p in drains(ops)[out_key]["value"][0][1][out_key]]
    assume(len(copied) >= 2)
    # A later copy by an ok copier transaction proves the copiers moved past v (info copies
    # do not count: their proof may belong to a retried attempt).
    ok_sent = {
        (x[1] if isinstance(x, list) else x)
        for op in ops
        if op["type"] == "ok" and op["f"] == "txn"
        for mop in op["value"]
        if mop[0] == "send" and mop[1] == out_key
        for x in [mop[2]]
    }
    assume(copied[-1] in ok_sent)
    v = data.draw(st.sampled_from(copied[:-1]))
    # Values are compared without their key, so take v out of every output key.
    outs = set(eos["output"])
    for op in ops:
        if op["type"] == "invoke" or op["f"] not in ("txn", "poll"):
            continue
        kept = []
        for mop in op["value"]:
            if mop[0] == "send" and mop[1] in outs:
                x = mop[2]
                if (x[1] if isinstance(x, list) else x) == v:
                    continue
            elif mop[0] == "poll":
                for k in outs & set(mop[1]):
                    mop[1][k] = [p for p in mop[1][k] if p[1] != v]
            kept.append(mop)
        op["value"] = kept
    r = check_queue(ops, eos=eos)
    assert "eos-missing" in r["anomaly_types"] and r["valid"] is False
    assert any(ex["value"] == v for ex in r["anomalies"]["eos-missing"]["examples"])


def test_an_output_key_written_only_by_info_copies_is_still_checked() -> None:
    """The case hypothesis found: value 0 reached out/0 through a copier transaction whose
    outcome is unknown (info); an output key only info copies wrote must still be linked to
    the input keys they read, or a second copy of 0 there is a plain duplicate and not the
    exactly-once violation it is."""
    shape = {
        "n_ops": 50,
        "processes": 4,
        "keys": 3,
        "seed": 1_372_493_235,
        "txn_rate": 0.0,
        "info_rate": 0.2,
        "fail_rate": 0.0,
        "crash_rate": 0.0,
        "assign_rate": 0.0,
        "late_acks": 0.0,
    }
    ops, eos = copier_history(shape)
    out = drains(ops)[eos["output"][0]]
    pairs = out["value"][0][1][eos["output"][0]]
    assert pairs == [[0, 0]]
    pairs.append([1, 0])
    r = check_queue(ops, eos=eos)
    assert "eos-duplicate" in r["anomaly_types"] and r["valid"] is False
