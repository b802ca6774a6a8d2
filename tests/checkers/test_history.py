"""history.jsonl loading, validation (with line numbers) and writing."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import orjson
import pytest

from isrlab.checkers.history import (
    HistoryError,
    iter_history,
    load_history,
    validate,
    write_history,
)
from isrlab.pipeline.fixtures.simulate import simulate


def op(i: int, process: Any, typ: str, f: str = "send", **kw: Any) -> dict[str, Any]:
    return {
        "index": i,
        "time": i * 10,
        "process": process,
        "type": typ,
        "f": f,
        "value": None,
        **kw,
    }


def write_lines(tmp_path: Path, lines: list[bytes]) -> Path:
    p = tmp_path / "history.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p


def test_round_trip(tmp_path: Path) -> None:
    ops = simulate(500, seed=3)
    p = tmp_path / "h.jsonl"
    write_history(ops, p)
    assert load_history(p) == ops
    assert list(iter_history(p)) == ops


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    a = orjson.dumps(op(0, 0, "invoke"))
    b = orjson.dumps(op(1, 0, "ok"))
    p = write_lines(tmp_path, [a, b"", b"   ", b])
    assert [o["index"] for o in load_history(p)] == [0, 1]
    bad = write_lines(tmp_path, [a, b"", b"{oops"])
    with pytest.raises(HistoryError) as e:
        load_history(bad)
    assert e.value.line == 3


@pytest.mark.parametrize(
    ("lines", "line", "words"),
    [
        ([b'{"index": 0', b"{}"], 1, "malformed JSON"),
        ([orjson.dumps(op(0, 0, "invoke")), b"[1, 2]"], 2, "JSON object"),
        ([orjson.dumps(op(0, 0, "invoke")), orjson.dumps(op(2, 0, "ok"))], 2, "not dense"),
        ([orjson.dumps(op(0, 0, "ok"))], 1, "without a preceding invoke"),
        (
            [
                orjson.dumps(op(0, 0, "invoke")),
                orjson.dumps(op(1, 0, "info")),
                orjson.dumps(op(2, 0, "invoke")),
            ],
            3,
            "after its info completion",
        ),
        (
            [orjson.dumps(op(0, 0, "invoke")), orjson.dumps(op(1, 0, "invoke"))],
            2,
            "has not completed",
        ),
        (
            [orjson.dumps(op(0, 0, "invoke")), orjson.dumps(op(1, 0, "ok", f="poll"))],
            2,
            "does not match",
        ),
        ([orjson.dumps({**op(0, 0, "invoke"), "type": "started"})], 1, "type must be"),
        ([orjson.dumps({"index": 0, "time": 0, "process": 0, "type": "invoke"})], 1, "'f'"),
        (
            [orjson.dumps({**op(0, 0, "invoke"), "time": 100}), orjson.dumps(op(1, 0, "ok"))],
            2,
            "backwards",
        ),
        ([orjson.dumps(op(0, 1.5, "invoke"))], 1, "process must be"),
    ],
)
def test_errors_name_the_line(tmp_path: Path, lines: list[bytes], line: int, words: str) -> None:
    p = write_lines(tmp_path, lines)
    with pytest.raises(HistoryError) as e:
        load_history(p)
    assert e.value.line == line
    assert words in str(e.value)
    assert str(e.value).startswith(f"line {line}:")
    with pytest.raises(HistoryError) as e2:
        list(iter_history(p))
    assert e2.value.line == line


def test_nemesis_ops_are_not_paired() -> None:
    validate(
        [
            op(0, "nemesis", "info", f="start-partition"),
            op(1, 0, "invoke"),
            op(2, "nemesis", "info", f="start-partition"),
            op(3, 0, "ok"),
        ]
    )


def test_missing_file_is_a_history_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="cannot read"):
        load_history(tmp_path / "nope.jsonl")


def test_truncated_last_line_says_so(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    p.write_bytes(orjson.dumps(op(0, 0, "invoke")) + b'\n{"index": 1, "ti')
    with pytest.raises(HistoryError, match="last line is incomplete") as e:
        load_history(p)
    assert e.value.line == 2


@pytest.mark.parametrize(
    ("raw", "indexes"),
    [
        (b"", []),
        (b" \n\n\t\n", []),
        (b"A\r\nB\r\n", [0, 1]),  # CRLF: the \r is JSON whitespace
        (b"A\nB", [0, 1]),  # no final newline
        (b"A\nB  \n\n \n", [0, 1]),  # trailing blank lines and spaces
        (b" \nA\nB\n", [0, 1]),  # a blank first line is skipped but counted
        (b"A\n\r\nB\n", [0, 1]),  # a CRLF blank line inside
    ],
)
def test_line_endings_and_blank_lines(tmp_path: Path, raw: bytes, indexes: list[int]) -> None:
    a = orjson.dumps(op(0, 0, "invoke"))
    b = orjson.dumps(op(1, 0, "ok"))
    p = tmp_path / "history.jsonl"
    p.write_bytes(raw.replace(b"A", a).replace(b"B", b))
    assert [o["index"] for o in load_history(p)] == indexes
    assert [o["index"] for o in iter_history(p)] == indexes


def test_blank_first_line_keeps_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "history.jsonl"
    p.write_bytes(b"  \n" + orjson.dumps(op(0, 0, "invoke")) + b"\n" + orjson.dumps(op(2, 0, "ok")))
    with pytest.raises(HistoryError, match="not dense") as e:
        load_history(p)
    assert e.value.line == 3


def test_two_values_on_one_line_are_located(tmp_path: Path) -> None:
    first = orjson.dumps(op(0, 0, "invoke"))
    p = write_lines(tmp_path, [first, first + b", " + orjson.dumps(op(1, 0, "ok"))])
    with pytest.raises(HistoryError, match="malformed JSON") as e:
        load_history(p)
    assert e.value.line == 2


def test_non_string_type_is_a_history_error() -> None:
    with pytest.raises(HistoryError, match="type must be") as e:
        validate([{**op(0, 0, "invoke"), "type": ["invoke"]}])
    assert e.value.line == 1


def test_loaded_history_goes_to_the_oldest_gc_generation(tmp_path: Path) -> None:
    # Left in the youngest generation, millions of loaded objects would be walked by the
    # next young collection, as costly as parsing them.
    p = tmp_path / "h.jsonl"
    write_history(simulate(200, seed=5), p)
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        ops = load_history(p)
        young = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
        assert id(ops) not in young and id(ops[-1]["value"]) not in young
        assert gc.isenabled()
    finally:
        if not was_enabled:
            gc.disable()
