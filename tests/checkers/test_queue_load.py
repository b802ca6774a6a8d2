"""Differential tests: the queue fast path (`load_queue` records) against the op-dict path.

`isrlab check FILE --workload queue` loads a jsonl file with `checkers.queue.load` into
compact records; the library path loads op dicts (`load_history`) and checks those.
Both must give the same results, the same errors and the same CLI output, for clean
simulated histories (with and without interleaved transactions and copiers), for
mutated ones (anomalies, odd but valid shapes) and for malformed files.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from isrlab.checkers import api, cli
from isrlab.checkers.cli import check_command
from isrlab.checkers.history import HistoryError, load_history, write_history
from isrlab.checkers.queue import check_queue
from isrlab.checkers.queue.load import QueueHistory, load_queue
from isrlab.pipeline.fixtures.simulate import eos_keys, simulate

Ops = list[dict[str, Any]]


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """('ok', results JSON) or (exception type, message) of fn()."""
    try:
        r = fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok", orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS).decode()


def _dict_path(path: Path, **opts: Any) -> tuple[str, str]:
    return _outcome(lambda: check_queue(load_history(path), **opts))


def _fast_path(path: Path, **opts: Any) -> tuple[str, str]:
    return _outcome(lambda: check_queue(load_queue(path), **opts))


# Integers beyond 64 bits, which orjson reads as floats (and cannot write): written
# through a placeholder.
_BIG = {"__big70__": str(2**70).encode(), "__negbig65__": str(-(2**65)).encode()}


def _write(ops: Ops, path: Path) -> None:
    write_history(ops, path)
    data = path.read_bytes()
    for name, digits in _BIG.items():
        data = data.replace(b'"' + name.encode() + b'"', digits)
    path.write_bytes(data)


def _renumber(ops: Ops) -> Ops:
    for i, op in enumerate(ops):
        op["index"] = i
    return ops


def _completions(ops: Ops, f: tuple[str, ...] = ("send", "poll", "txn")) -> list[int]:
    return [i for i, op in enumerate(ops) if op["type"] != "invoke" and op["f"] in f]


def _reads(ops: Ops, rng: random.Random) -> tuple[list[Any], int] | None:
    """A random non-empty read list [[offset, value], ...] of some completion."""
    cands = []
    for i in _completions(ops):
        for mop in ops[i]["value"] or ():
            if mop[0] == "poll" and len(mop) > 1:
                cands.extend((pairs, i) for pairs in mop[1].values() if pairs)
    return rng.choice(cands) if cands else None


def _sends(ops: Ops, typ: str | None = None) -> list[tuple[dict[str, Any], list[Any]]]:
    out = []
    for i in _completions(ops, ("send", "txn")):
        if typ is not None and ops[i]["type"] != typ:
            continue
        out.extend((ops[i], m) for m in ops[i]["value"] or () if m[0] == "send")
    return out


# -- mutations that keep a history well-formed (each may or may not create anomalies) ------


def m_shift_offset(ops: Ops, rng: random.Random) -> None:
    r = _reads(ops, rng)
    if r:
        pair = rng.choice(r[0])
        pair[0] += rng.choice([-2, -1, 1, 3])


def m_garbage(ops: Ops, rng: random.Random) -> None:
    r = _reads(ops, rng)
    if r:
        rng.choice(r[0])[1] = rng.choice([10**9, "zz", 2.5, None, True])


def m_null_offset(ops: Ops, rng: random.Random) -> None:
    r = _reads(ops, rng)
    if r:
        rng.choice(r[0])[0] = None


def m_reorder(ops: Ops, rng: random.Random) -> None:
    r = _reads(ops, rng)
    if r and len(r[0]) > 1:
        r[0].reverse()


def m_drop_read(ops: Ops, rng: random.Random) -> None:
    r = _reads(ops, rng)
    if r:
        del r[0][rng.randrange(len(r[0]))]


def m_flip_type(ops: Ops, rng: random.Random) -> None:
    """An ok completion becomes info or fail (its process is not used again after info)."""
    cands = [i for i in _completions(ops) if ops[i]["type"] == "ok"]
    if not cands:
        return
    i = rng.choice(cands)
    new = rng.choice(["info", "fail"])
    p = ops[i]["process"]
    if new == "info" and any(op["process"] == p for op in ops[i + 1 :]):
        new = "fail"
    ops[i]["type"] = new


def m_fail_without_value(ops: Ops, rng: random.Random) -> None:
    """A send's completion says nothing: its value is only in the invoke (garbage check)."""
    cands = [op for op, _m in _sends(ops)]
    if cands:
        op = rng.choice(cands)
        op["type"] = "fail"
        op["value"] = rng.choice([None, []])


def m_send_offset(ops: Ops, rng: random.Random) -> None:
    s = _sends(ops, "ok")
    if s:
        _op, m = rng.choice(s)
        if isinstance(m[2], list):
            m[2][0] = rng.choice([None, m[2][0] + 1, 0])
        else:
            m[2] = [0, m[2]]


def m_bare_send(ops: Ops, rng: random.Random) -> None:
    s = _sends(ops)
    if s:
        _op, m = rng.choice(s)
        if isinstance(m[2], list):
            m[2] = m[2][1]


def m_duplicate(ops: Ops, rng: random.Random) -> None:
    """A value read at a second offset, from an idempotent producer."""
    s = _sends(ops, "ok")
    r = _reads(ops, rng)
    if s and r:
        op, m = rng.choice(s)
        op["producer"] = {"id": 1, "epoch": 0, "idempotent": rng.random() < 0.7}
        v = m[2][1] if isinstance(m[2], list) else m[2]
        r[0].append([max(p[0] or 0 for p in r[0]) + 1, v])


def m_watermarks(ops: Ops, rng: random.Random) -> None:
    cands = [op for op in ops if op.get("watermarks")]
    if cands:
        wm = rng.choice(cands)["watermarks"]
        k = rng.choice(list(wm))
        wm[k] = rng.choice(
            [{"low": 0, "high": 0}, {"low": 5, "high": 10**6}, {"high": "x"}, None, 3, {}]
        )


def m_truncate(ops: Ops, rng: random.Random) -> None:
    """The recorder stopped: invokes are left open (they count as info)."""
    del ops[rng.randrange(len(ops) // 2, len(ops)) :]


def m_nemesis_and_extras(ops: Ops, rng: random.Random) -> None:
    i = rng.randrange(len(ops))
    t = ops[i]["time"]
    for typ_value in (["start-partition", {"n1": ["n2"]}], ["stop-partition", None]):
        ops.insert(
            i,
            {
                "index": 0,
                "time": t,
                "process": "nemesis",
                "type": "info",
                "f": typ_value[0],
                "value": typ_value[1],
            },
        )
    ops[min(i + 3, len(ops) - 1)]["node"] = "n1"
    ops[min(i + 4, len(ops) - 1)]["error"] = ["timeout", 3]


def m_subscribe(ops: Ops, rng: random.Random) -> None:
    cands = [i for i, op in enumerate(ops) if op["f"] == "assign"]
    if cands:
        i = rng.choice(cands)
        p = ops[i]["process"]
        for op in ops:
            if op["process"] == p and op["f"] == "assign":
                op["f"] = "subscribe"


def m_big_numbers(ops: Ops, rng: random.Random) -> None:
    """Numbers orjson reads as floats (beyond 64 bits) and floats as values."""
    r = _reads(ops, rng)
    if r:
        rng.choice(r[0])[1] = rng.choice([*_BIG, 1.5e300, 0.1])


MUTATIONS = [
    m_shift_offset,
    m_garbage,
    m_null_offset,
    m_reorder,
    m_drop_read,
    m_flip_type,
    m_fail_without_value,
    m_send_offset,
    m_bare_send,
    m_duplicate,
    m_watermarks,
    m_truncate,
    m_nemesis_and_extras,
    m_subscribe,
    m_big_numbers,
]


def _history(seed: int, interleave: bool, copiers: int = 0, keys: int = 0) -> Ops:
    rng = random.Random(seed)
    return simulate(
        rng.randint(60, 500),
        processes=rng.randint(1, 6),
        keys=keys or rng.randint(1, 4),
        seed=seed,
        txn_rate=rng.choice([0.0, 0.3, 0.8]),
        info_rate=rng.choice([0.0, 0.05, 0.2]),
        fail_rate=rng.choice([0.0, 0.05, 0.2]),
        crash_rate=rng.choice([0.0, 0.02]),
        assign_rate=rng.choice([0.0, 0.05]),
        interleave=interleave,
        copiers=copiers,
    )


@pytest.mark.parametrize("interleave", [False, True])
def test_simulated_histories_agree(tmp_path: Path, interleave: bool) -> None:
    found: set[str] = set()
    for seed in range(25):
        copiers = seed % 3
        ops = _history(seed, interleave, copiers, keys=3)
        p = tmp_path / f"h{seed}.jsonl"
        write_history(ops, p)
        loaded = load_queue(p)
        assert isinstance(loaded, QueueHistory), "a clean history must take the fast path"
        assert len(loaded) == len(ops)
        assert list(loaded) == ops  # re-read op dicts, for render and the garbage check
        opts: dict[str, Any] = {"eos": eos_keys(3, copiers)} if copiers else {}
        fast = _fast_path(p, **opts)
        assert fast == _dict_path(p, **opts), seed
        assert fast[0] == "ok"
        # The same records checked twice (a check marks proven info ops committed).
        first, second = check_queue(loaded, **opts), check_queue(loaded, **opts)
        assert first == second == orjson.loads(fast[1])
        found.update(orjson.loads(fast[1])["anomaly_types"])
    if interleave:
        assert "G0" in found  # the cycle code ran on both paths


def test_mutated_histories_agree(tmp_path: Path) -> None:
    outcomes: set[str] = set()
    anomalies: set[str] = set()
    fast_taken = 0
    for seed in range(120):
        rng = random.Random(seed)
        ops = copy.deepcopy(_history(seed, seed % 2 == 1))
        for _ in range(rng.randint(1, 3)):
            rng.choice(MUTATIONS)(ops, rng)
        _renumber(ops)
        p = tmp_path / f"m{seed}.jsonl"
        _write(ops, p)
        fast_taken += isinstance(load_queue(p), QueueHistory)
        for opts in ({}, {"ww_deps": False, "max_examples": 2}):
            fast = _fast_path(p, **opts)
            assert fast == _dict_path(p, **opts), (seed, opts)
            outcomes.add(fast[0])
            if fast[0] == "ok":
                anomalies.update(orjson.loads(fast[1])["anomaly_types"])
    assert fast_taken > 100
    # The mutations did reach the checks that differ between shapes of input.
    assert {"garbage-read", "duplicate", "G1a", "idempotence-duplicate"} <= anomalies, anomalies
    assert "ok" in outcomes


def _malformed(base: Ops) -> dict[str, bytes]:
    """name -> file content that either path must reject (or accept) the same way."""
    lines = [orjson.dumps(op) for op in base]
    out: dict[str, bytes] = {}

    def edit(name: str, i: int, fn: Callable[[dict[str, Any]], Any]) -> None:
        ops = copy.deepcopy(base)
        fn(ops[i])
        data = b"\n".join(orjson.dumps(op) for op in ops) + b"\n"
        for placeholder, digits in _BIG.items():
            data = data.replace(b'"' + placeholder.encode() + b'"', digits)
        out[name] = data

    j = next(i for i, op in enumerate(base) if op["type"] == "ok" and op["f"] == "poll")
    s = next(i for i, op in enumerate(base) if op["type"] == "ok" and op["f"] == "send")
    mid = len(lines) // 2
    out["blank line"] = b"\n".join([*lines[:mid], b"", *lines[mid:]]) + b"\n"
    out["whitespace line"] = b"\n".join([*lines[:mid], b"  \t", *lines[mid:]]) + b"\n"
    out["blank first"] = b"\n" + b"\n".join(lines) + b"\n"
    out["no final newline"] = b"\n".join(lines)
    out["trailing blanks"] = b"\n".join(lines) + b"\n\n  \n"
    out["crlf"] = b"\r\n".join(lines) + b"\r\n"
    out["truncated last line"] = b"\n".join(lines)[:-7]
    out["bad json"] = b"\n".join([*lines[:mid], b'{"index": ', *lines[mid:]]) + b"\n"
    out["two values"] = b"\n".join(
        [*lines[:mid], lines[mid] + b"," + lines[mid + 1], *lines[mid + 2 :]]
    )
    out["not an object"] = b"\n".join([*lines[:mid], b"[1, 2]", *lines[mid + 1 :]]) + b"\n"
    out["empty"] = b""
    out["only newlines"] = b"\n\n"
    out["bom"] = b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n"
    edit("non-dense index", mid, lambda op: op.update(index=op["index"] + 1))
    edit("float index", mid, lambda op: op.update(index=float(op["index"])))
    edit("time backwards", mid, lambda op: op.update(time=-1))
    edit("huge time", len(base) - 1, lambda op: op.update(time="__big70__"))
    edit("bad type", mid, lambda op: op.update(type="done"))
    edit("f not a string", mid, lambda op: op.update(f=["send"]))
    edit("process string", mid, lambda op: op.update(process="p1"))
    edit("process bool", mid, lambda op: op.update(process=True))
    edit("missing field", mid, lambda op: op.pop("time"))
    edit("f mismatch", j, lambda op: op.update(f="send"))
    edit("not a list value", j, lambda op: op.update(value={"poll": 1}))
    edit("empty micro-op", j, lambda op: op.update(value=[[]]))
    edit("unknown micro-op", j, lambda op: op.update(value=[["peek", {}]]))
    edit("poll not a dict", j, lambda op: op.update(value=[["poll", [1, 2]]]))
    edit("poll pairs not a list", j, lambda op: op.update(value=[["poll", {"t0/0": 3}]]))
    edit("pair offset string", j, lambda op: op.update(value=[["poll", {"t0/0": [["a", 1]]}]]))
    edit("pair too long", j, lambda op: op.update(value=[["poll", {"t0/0": [[0, 1, 2]]}]]))
    edit("value a dict", s, lambda op: op["value"][0].__setitem__(2, [0, {"a": 1}]))
    edit("send arity", s, lambda op: op.update(value=[["send", "t0/0"]]))
    edit("send result arity", s, lambda op: op["value"][0].__setitem__(2, [0, 1, 2]))
    edit("producer a list", s, lambda op: op.update(producer=[1]))
    edit("watermarks a list", s, lambda op: op.update(watermarks=[1]))
    edit("value list key", s, lambda op: op["value"][0].__setitem__(1, ["k"]))
    # Pairing: delete an invoke, reuse a process after info, invoke twice.
    k = next(i for i, op in enumerate(base) if op["type"] == "invoke" and op["f"] == "poll")
    ops = copy.deepcopy(base)
    del ops[k]
    out["completion without invoke"] = b"".join(
        orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE) for op in _renumber(ops)
    )
    ops = copy.deepcopy(base)
    ops[j]["type"] = "info"
    ops.append({**ops[j - 1], "type": "invoke", "f": "poll", "value": [["poll"]]})
    ops[-1]["time"] = ops[-2]["time"]
    out["process reused after info"] = b"".join(
        orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE) for op in _renumber(ops)
    )
    ops = copy.deepcopy(base)
    ops.insert(k + 1, copy.deepcopy(ops[k]))
    out["invoke twice"] = b"".join(
        orjson.dumps(op, option=orjson.OPT_APPEND_NEWLINE) for op in _renumber(ops)
    )
    return out


@pytest.mark.parametrize("interleave", [False, True])
def test_malformed_files_fail_the_same_way(tmp_path: Path, interleave: bool) -> None:
    base = simulate(300, processes=4, keys=2, seed=7, interleave=interleave)
    kinds = set()
    for name, content in _malformed(base).items():
        p = tmp_path / "history.jsonl"
        p.write_bytes(content)
        fast = _fast_path(p)
        assert fast == _dict_path(p), name
        kinds.add(fast[0])
    assert {"HistoryError", "ok"} <= kinds
    missing = tmp_path / "nope.jsonl"
    assert _fast_path(missing) == _dict_path(missing)
    assert _fast_path(missing)[0] == "HistoryError"


# -- the CLI: byte-identical output, exit codes and artefacts --------------------------------

app = typer.Typer()
app.command()(check_command)


def _cli(args: list[str], monkeypatch: pytest.MonkeyPatch, dict_path: bool) -> tuple[int, str]:
    with monkeypatch.context() as m:
        if dict_path:
            m.setattr(cli, "load_for_check", lambda path, fmt, wl: api.load(path, fmt))
        r = CliRunner().invoke(app, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def test_cli_output_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    ops = copy.deepcopy(simulate(400, processes=3, keys=2, seed=3))
    for mutation in (m_duplicate, m_shift_offset, m_drop_read, m_garbage):
        mutation(ops, rng)
    p = tmp_path / "history.jsonl"
    write_history(ops, p)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(p.read_bytes().replace(b'"index":10,', b'"index":11,'))
    for target in (p, bad):
        for extra in (["--json"], [], ["--allow", "duplicate"]):
            args = [str(target), "--workload", "queue", *extra]
            assert _cli(args, monkeypatch, False) == _cli(args, monkeypatch, True), (target, extra)
    code, out = _cli([str(bad), "-w", "queue"], monkeypatch, False)
    assert code == 2 and "not dense" in out
    outs = {}
    for dict_path in (False, True):
        d = tmp_path / f"out{dict_path}"
        code, _ = _cli([str(p), "-w", "queue", "--json", "--out", str(d)], monkeypatch, dict_path)
        assert code == 1
        outs[dict_path] = {
            f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.suffix != ".svg"
        }
    assert outs[False] == outs[True]
    assert {"results.json", "summary.txt"} < set(outs[False])
    assert any(name.endswith(".png") for name in outs[False])


def test_history_error_type_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    p.write_bytes(b'{"index": 0, "time": 0, "process": 0, "type": "ok", "f": "poll"}\n')
    with pytest.raises(HistoryError, match="without a preceding invoke"):
        load_queue(p)
