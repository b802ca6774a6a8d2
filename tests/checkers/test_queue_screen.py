"""The native screen (checkers.queue.screen) against the explaining checker.

The screen may send any history to the checker, but a history it calls clean must be
one the checker finds no anomaly in, with exactly the checker's stats, so that
`check_queue` gives the same results either way. Checked here on simulated histories
of a correct log (which it should prove clean, late acknowledgements included), on
mutated ones (each mutation models a broker bug or an odd but valid shape), on histories
with dependency cycles, on files, on `isrlab check`'s output, and on what it must refuse
to read. The hand-written anomaly histories of test_queue_anomalies.py are checked both
ways too.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from isrlab.checkers.api import load_for_check
from isrlab.checkers.history import validate, write_history
from isrlab.checkers.queue import check_queue, screen
from isrlab.checkers.queue._screen import GiveUp, Screen
from isrlab.checkers.queue.load import QueueFile
from isrlab.pipeline.fixtures.simulate import simulate
from tests.checkers.hist import H
from tests.checkers.test_queue_index import mutated
from tests.checkers.test_queue_load import Ops, _history

ROOT = Path(__file__).resolve().parents[2]


def _checker(ops: Ops, **opts: Any) -> dict[str, Any]:
    return check_queue(ops, screen=False, **opts)


def test_the_screen_is_built_from_the_current_source() -> None:
    assert screen.AVAILABLE, "the native screen is not built: run `make build`"
    src = ROOT / "checkers/queue/_screen.pyx"
    built = list((ROOT / "checkers/queue").glob("_screen.*.so"))
    assert built, "no compiled _screen module beside its source: run `make build`"
    assert max(p.stat().st_mtime for p in built) >= src.stat().st_mtime, (
        "checkers/queue/_screen.pyx changed since it was compiled: run `make build`"
    )


@pytest.mark.parametrize("ww_deps", [True, False])
def test_correct_histories_are_proven_clean_with_the_checkers_stats(ww_deps: bool) -> None:
    for seed in range(40):
        ops = _history(seed, interleave=False)
        got = screen.screen_ops(ops, ww_deps=ww_deps)
        want = _checker(ops, ww_deps=ww_deps)
        assert want["anomaly_types"] == [], seed
        assert got.needs_checker == "", (seed, got.needs_checker)
        assert got.stats is not None
        assert {**got.stats, "subscribe_mode": got.saw_subscribe} == want["stats"], seed
        assert check_queue(ops, ww_deps=ww_deps) == want


def test_a_history_with_anomalies_goes_to_the_checker() -> None:
    # Interleaved transactions show G0 and int-send-skip (allowed, but still reported).
    sent_on = 0
    for seed in range(12):
        ops = _history(seed, interleave=True)
        want = _checker(ops)
        got = screen.screen_ops(ops)
        if want["anomaly_types"]:
            assert got.stats is None and got.needs_checker, seed
            sent_on += 1
        assert check_queue(ops) == want
    assert sent_on >= 6


def test_the_screen_never_clears_what_the_checker_flags() -> None:
    cleared = flagged = 0
    reasons: set[str] = set()
    for seed in range(400):
        rng = random.Random(seed)
        ops = mutated(seed, seed % 4 == 3, rng, (1, 3))
        for opts in ({}, {"ww_deps": False}):
            got = screen.screen_ops(ops, **opts)
            try:
                want = _checker(ops, **opts)
            except ValueError:
                assert got.stats is None, seed  # a history the checker rejects
                continue
            if got.stats is None:
                reasons.add(got.needs_checker)
                flagged += 1
                continue
            cleared += 1
            assert want["anomaly_types"] == [], (seed, opts, want["anomaly_types"])
            assert {**got.stats, "subscribe_mode": got.saw_subscribe} == want["stats"], seed
    # Both answers were given, for several reasons.
    assert cleared > 20 and flagged > 200, (cleared, flagged)
    assert {"lost-write", "unseen", "garbage-read", "duplicate"} <= reasons, reasons


def test_a_file_is_screened_where_it_lies(tmp_path: Path) -> None:
    ops = simulate(400, processes=4, keys=3, seed=5, assign_rate=0.05)
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    h = load_for_check(p, "jsonl", "queue")
    assert isinstance(h, QueueFile)
    results = check_queue(h)
    assert results == _checker(ops)
    assert h.n_ops == len(ops) and list(h) == ops  # counted by the screen, never loaded
    assert h._loaded is None
    # A last line without its newline is read too.
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    assert check_queue(QueueFile(p)) == results


def _file_case(tmp_path: Path, name: str, ops: Ops, raw: bytes | None = None) -> Path:
    p = tmp_path / f"{name}.jsonl"
    if raw is None:
        p.write_bytes(b"".join(orjson.dumps(op) + b"\n" for op in ops))
    else:
        p.write_bytes(raw)
    return p


def test_what_the_screen_does_not_read_goes_to_the_checker(tmp_path: Path) -> None:
    base = simulate(200, processes=3, keys=2, seed=9)
    assert screen.screen_ops(base).stats is not None

    def edited(fn: Any) -> Ops:
        ops = copy.deepcopy(base)
        for op in ops:
            if fn(op):
                break
        return ops

    def first_read(op: dict[str, Any]) -> bool:
        for mop in op.get("value") or ():
            if op["type"] == "ok" and mop[0] == "poll" and any(mop[1].values()):
                pairs = next(p for p in mop[1].values() if p)
                pairs[0][1] = "a string"
                return True
        return False

    def null_offset(op: dict[str, Any]) -> bool:
        for mop in op.get("value") or ():
            if op["type"] == "ok" and mop[0] == "poll" and any(mop[1].values()):
                next(p for p in mop[1].values() if p)[0][0] = None
                return True
        return False

    def big_value(op: dict[str, Any]) -> bool:
        for mop in op.get("value") or ():
            if op["type"] == "ok" and mop[0] == "send":
                mop[2][1] = 2**70
                return True
        return False

    for fn in (first_read, null_offset, big_value):
        ops = edited(fn)
        got = screen.screen_ops(ops)
        assert got.stats is None and "outside what the screen reads" in got.needs_checker
        assert check_queue(ops) == _checker(ops)
    # Files: blank lines, bad JSON, a missing invoke are the loader's to word.
    lines = [orjson.dumps(op) for op in base]
    for name, raw in {
        "blank": b"\n".join(lines[:5]) + b"\n\n" + b"\n".join(lines[5:]) + b"\n",
        "json": b"\n".join(lines[:5]) + b"\n{oops\n" + b"\n".join(lines[5:]) + b"\n",
        "order": b"\n".join(lines[1:]) + b"\n",
    }.items():
        p = _file_case(tmp_path, name, base, raw)
        assert screen.screen_file(p).stats is None, name


def test_without_the_native_module_every_history_goes_to_the_checker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ops = simulate(200, processes=3, keys=2, seed=3)
    monkeypatch.setattr(screen, "AVAILABLE", False)
    got = screen.screen_ops(ops)
    assert got.stats is None and "not built" in got.needs_checker
    assert check_queue(ops) == _checker(ops)


def _alone() -> dict[str, tuple[H, str]]:
    """Histories whose only anomaly is the named one, and the screen's word for it."""
    cases: dict[str, tuple[H, str]] = {}

    def case(name: str, reason: str) -> H:
        h = H()
        cases[name] = (h, reason)
        return h

    h = case("realtime-send-order", "realtime-send-order")
    h.send(0, "k", 1, 1)
    h.send(1, "k", 2, 0)  # invoked after offset 1 was acked, yet acked below it
    h.poll(2, {"k": [[0, 2], [1, 1]]})
    h = case("nonmonotonic-send", "nonmonotonic-send")
    h.send(0, "k", 1, None)  # no offsets acked: no realtime order to break
    h.send(0, "k", 2, None)
    h.poll(2, {"k": [[0, 2], [1, 1]]})
    h = case("nonmonotonic-send (txn)", "nonmonotonic-send")
    h.send(0, "k", 1, None)
    h.txn(0, [["send", "k", [None, 2]], ["send", "k", [None, 3]]])
    h.poll(2, {"k": [[0, 2], [1, 3], [2, 1]]})
    h = case("int-send-skip", "int-send-skip")
    h.txn(0, [["send", "k", [None, 1]], ["send", "k", [None, 3]]])
    h.send(1, "k", 2, None)
    h.poll(2, {"k": [[0, 1], [1, 2], [2, 3]]})
    h = case("int-nonmonotonic-send", "int-nonmonotonic-send")
    h.txn(0, [["send", "k", [None, 2]], ["send", "k", [None, 1]]])
    h.poll(2, {"k": [[0, 1], [1, 2]]})
    h = case("hw-regression-realtime", "hw-regression")
    sent(h, "k", [1, 2])
    h.poll(1, {"k": [[0, 1], [1, 2]]}, watermarks={"k": {"low": 0, "high": 2}})
    h.poll(2, {"k": [[0, 1], [1, 2]]}, watermarks={"k": {"low": 0, "high": 1}})
    h = case("poll-skip", "poll-skip or nonmonotonic-poll")
    sent(h, "k", [1, 2, 3])
    h.poll(1, {"k": [[0, 1], [1, 2], [2, 3]]})
    h.poll(2, {"k": [[0, 1]]})
    h.poll(2, {"k": [[2, 3]]})
    h = case("lost-write", "lost-write")
    # An info transaction, proven committed by a read of one of its values; its other
    # value, below what ok ops read, was read by a failed op only.
    h.txn(0, [["send", "k", [None, 1]], ["send", "k", [None, 2]]], typ="info")
    h.send(1, "k", 3, 2)
    h.poll(2, {"k": [[0, 1]]}, typ="fail")
    h.poll(3, {"k": [[1, 2], [2, 3]]})
    return cases


def sent(h: H, k: str, values: list[Any]) -> None:
    for i, v in enumerate(values):
        h.send(0, k, v, i)


@pytest.mark.parametrize("name", sorted(_alone()))
def test_each_detector_alone(name: str) -> None:
    h, reason = _alone()[name]
    validate(h.ops)
    # A send out of order is also a ww edge against process or real-time order (G0):
    # without ww dependencies it is the only anomaly.
    opts = {"ww_deps": False}
    want = _checker(h.ops, **opts)
    assert want["anomaly_types"] == [name.split(" ")[0]], want["anomaly_types"]
    got = screen.screen_ops(h.ops, **opts)
    assert got.stats is None and got.needs_checker == reason
    assert check_queue(h.ops, **opts) == want


def test_what_a_prefix_shows_the_whole_history_shows_too() -> None:
    """The probe (`screen._run`) sends a history to the checker when its first ops show
    something in PERSISTENT: the screen of the whole history must not prove it clean
    either (the probe only saves its time)."""
    probed = 0
    for seed in range(300):
        rng = random.Random(seed)
        ops = mutated(seed, seed % 3 == 0, rng, (0, 2))
        cut = rng.randint(1, len(ops))
        probe = Screen()
        try:
            probe.feed(ops[:cut])
        except GiveUp:
            continue
        early = probe.finish(True, True)
        if isinstance(early, str) and early in screen.PERSISTENT:
            probed += 1
            assert screen.screen_ops(ops).stats is None, (seed, cut, early)
    assert probed > 50


def test_an_anomaly_in_the_first_ops_skips_the_rest_of_the_screen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(screen, "PROBE_OPS", 100)
    monkeypatch.setattr(screen, "_SLICE", 50)
    ops = simulate(2000, processes=4, keys=2, seed=1, interleave=True)
    got = screen.screen_ops(ops)
    assert got.stats is None and "(in the first 100 ops)" in got.needs_checker
    assert check_queue(ops) == _checker(ops)
    # A clean history passes the probe and the whole screen.
    clean = simulate(2000, processes=4, keys=2, seed=1)
    assert screen.screen_ops(clean).stats is not None


def test_isrlab_check_prints_and_writes_the_same_bytes_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean history through `isrlab check`, screened and not: the same output, exit
    code, results.json and summary.txt, byte for byte."""
    from typer.testing import CliRunner

    from isrlab.checkers.queue import analysis
    from tests.checkers.test_queue_load import app

    ops = simulate(600, processes=4, keys=3, seed=11, assign_rate=0.05)
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    outs = {}
    for screened in (True, False):
        with monkeypatch.context() as m:
            if not screened:
                refuse = lambda *a, **k: screen.ScreenResult(None, needs_checker="off")  # noqa: E731
                m.setattr(analysis, "screen_file", refuse)
                m.setattr(analysis, "screen_ops", refuse)
            d = tmp_path / f"out-{screened}"
            runs = [
                CliRunner().invoke(app, [str(p), "-w", "queue", *extra])
                for extra in (["--json"], [], ["--json", "--out", str(d)])
            ]
        outs[screened] = (
            [(r.exit_code, r.output) for r in runs],
            {f.name: f.read_bytes() for f in sorted(d.iterdir())},
        )
    assert outs[True] == outs[False]
    assert outs[True][0][0][0] == 0
    assert set(outs[True][1]) == {"results.json", "summary.txt"}


def _remap(ops: Ops, value: Any, offset: Any) -> Ops:
    """The history with every value and offset mapped (sends, reads, watermarks)."""
    out = copy.deepcopy(ops)
    for op in out:
        mops = op.get("value")
        if op.get("f") not in ("send", "poll", "txn") or not isinstance(mops, list):
            continue
        for mop in mops:
            if mop[0] == "send":
                x = mop[2]
                if isinstance(x, list):
                    mop[2] = [None if x[0] is None else offset(x[0]), value(x[1])]
                else:
                    mop[2] = value(x)
            elif mop[0] == "poll" and len(mop) > 1 and mop[1]:
                for pairs in mop[1].values():
                    pairs[:] = [[offset(o), value(v)] for o, v in pairs]
        for marks in (op.get("watermarks") or {}).values():
            marks["high"] = offset(marks["high"])
    return out


@pytest.mark.parametrize(
    "value, offset",
    [
        (lambda v: v * 1_000_003 + 10**15, lambda o: o + 10**12),  # sparse: hash tables
        (lambda v: -v - 1, lambda o: o),  # negative values
        (lambda v: v * 97, lambda o: o * 3),  # gaps in both
    ],
)
def test_values_and_offsets_of_any_spread(value: Any, offset: Any) -> None:
    for seed in range(6):
        ops = _remap(_history(seed, interleave=False), value, offset)
        got = screen.screen_ops(ops)
        want = _checker(ops)
        assert want["anomaly_types"] == [] and got.stats is not None, (seed, got)
        assert {**got.stats, "subscribe_mode": got.saw_subscribe} == want["stats"]
    # And a mutation is still caught there.
    ops = _remap(_history(3, interleave=False), value, offset)
    for op in ops:
        if op["type"] == "ok" and op["f"] == "poll" and any(op["value"][0][1].values()):
            pairs = next(p for p in op["value"][0][1].values() if p)
            pairs.append([pairs[-1][0] + offset(2) - offset(0), pairs[-1][1]])  # a dup
            break
    assert screen.screen_ops(ops).stats is None
    assert _checker(ops)["anomaly_types"]


def test_late_acks_leave_a_history_clean_and_the_screen_agrees() -> None:
    backward = 0
    for seed in range(60):
        rng = random.Random(seed)
        ops = simulate(
            rng.randint(60, 500),
            processes=rng.randint(2, 6),
            keys=rng.randint(1, 4),
            seed=seed,
            txn_rate=rng.choice([0.0, 0.3, 0.8]),
            info_rate=rng.choice([0.0, 0.05]),
            fail_rate=rng.choice([0.0, 0.05]),
            assign_rate=rng.choice([0.0, 0.05]),
            late_acks=rng.choice([0.2, 0.6, 1.0]),
        )
        for opts in ({}, {"ww_deps": False}):
            want = _checker(ops, **opts)
            got = screen.screen_ops(ops, **opts)
            if want["anomaly_types"]:
                assert got.stats is None, (seed, opts)
                continue
            assert got.stats is not None, (seed, opts, got.needs_checker)
            assert {**got.stats, "subscribe_mode": got.saw_subscribe} == want["stats"]
            backward += want["stats"]["backward_edges"] > 0
    assert backward > 40  # the region's cycle check ran, and found no cycle


def test_cycles_are_sent_to_the_checker() -> None:
    from tests.checkers.test_queue_cycle_region import cross_reads

    cyclic = 0
    for seed in range(80):
        rng = random.Random(seed)
        ops = simulate(300, processes=4, keys=3, seed=seed, txn_rate=0.3, late_acks=0.3)
        cross_reads(ops, rng, rng.randint(1, 4))
        for opts in ({}, {"ww_deps": False}):
            want = _checker(ops, **opts)
            got = screen.screen_ops(ops, **opts)
            if want["stats"].get("cyclic_nodes"):
                cyclic += 1
                assert got.stats is None, (seed, opts)
            if got.stats is not None:
                assert want["anomaly_types"] == [], (seed, opts)
                assert {**got.stats, "subscribe_mode": got.saw_subscribe} == want["stats"]
    assert cyclic > 20
