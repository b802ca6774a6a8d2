"""Jepsen EDN and log import, EDN export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.formats import FormatError, dump_edn, load_edn, load_jepsen_log

BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "bench-data" / "porcupine"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


EDN = """\
{:process 0, :type :invoke, :f :append, :key "0", :value "x 0 0 y"}
{:process 0, :type :ok, :f :append, :key "0", :value "x 0 0 y"}

{:process :nemesis, :type :info, :f :start-partition, :value {:n1 #{:n2 :n3}}}
{:process 1, :type :invoke, :f :cas, :value [1 2], :time 500, :key 7}
{:process 1, :type :fail, :f :cas, :value [1 2], :error :mismatch, :time 400}
{:process 2, :type :invoke, :f :read, :value nil, :node "n1"}
{:process 2, :type :fail, :f :read, :value nil, :error :timed-out}
"""


def test_load_edn_converts_to_op_dicts(tmp_path: Path) -> None:
    ops = load_edn(write(tmp_path, "history.edn", EDN))
    assert [op["index"] for op in ops] == list(range(7))
    assert ops[0] == {
        "index": 0,
        "time": 0,
        "process": 0,
        "type": "invoke",
        "f": "append",
        "key": "0",
        "value": "x 0 0 y",
    }
    assert ops[2]["process"] == "nemesis" and ops[2]["f"] == "start-partition"
    assert ops[2]["value"] == {"n1": ["n2", "n3"]}
    assert ops[3]["value"] == [1, 2] and ops[3]["time"] == 500 and ops[3]["key"] == "7"
    # Times never go backwards: a smaller :time is bumped past the previous op.
    times = [op["time"] for op in ops]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert ops[4]["type"] == "fail" and ops[4]["error"] == "mismatch"
    assert ops[5]["node"] == "n1" and ops[5]["value"] is None
    # A timed-out read is indeterminate, not failed.
    assert ops[6]["type"] == "info" and ops[6]["error"] == "timed-out"


def test_load_edn_reads_independent_tuples(tmp_path: Path) -> None:
    text = (
        "{:process 0, :type :invoke, :f :cas, :value #jepsen.independent.Tuple{:key 5, :value [1 2]}}\n"
        "{:process 0, :type :ok, :f :cas, :value #jepsen.independent.Tuple{:key 5, :value [1 2]}}\n"
        "{:process 1, :type :invoke, :f :read, :value #jepsen.independent.Tuple{:key 6, :value nil}}\n"
    )
    ops = load_edn(write(tmp_path, "independent.edn", text))
    assert [(op["key"], op["value"]) for op in ops] == [("5", [1, 2]), ("5", [1, 2]), ("6", None)]


def test_load_edn_unknown_tag_names_the_line(tmp_path: Path) -> None:
    text = "{:process 0, :type :invoke, :f :read}\n{:process 0, :type :ok, :f :read, :value #foo/bar 1}\n"
    with pytest.raises(FormatError, match=r"t\.edn:2: not valid EDN"):
        load_edn(write(tmp_path, "t.edn", text))


def test_load_edn_accepts_one_vector(tmp_path: Path) -> None:
    vector = "[" + EDN + "]"
    assert load_edn(write(tmp_path, "v.edn", vector)) == load_edn(write(tmp_path, "l.edn", EDN))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{:process 0, :type :invoke, :f :read}\n{:process 0 :type\n",
            r"bad\.edn:2: not valid EDN",
        ),
        ("{:process 0, :type :invoke, :f :read}\n\n[1 2]\n", r"bad\.edn:3: expected an op map"),
        ("{:process 0, :type :invoke}\n", r"bad\.edn:1: op map lacks :f"),
        ("{:process 0, :type :done, :f :read}\n", r"bad\.edn:1: :type must be one of"),
        ('{:process "p", :type :ok, :f :read}\n', r"bad\.edn:1: :process must be"),
        ("{:process 0, :type :ok, :f :read} {:process 1}\n", r"bad\.edn:1: expected exactly one"),
    ],
)
def test_load_edn_malformed_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        load_edn(write(tmp_path, "bad.edn", text))


LOG = (
    "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n"
    "2017-03-01 10:00:00,123{GMT}\tINFO\t[jepsen worker 1] jepsen.util - 1   :invoke :cas    [1 2]\n"
    "INFO  jepsen.core - some other logger line, skipped\n"
    "INFO  jepsen.util - 0\t:ok\t:read\t3\n"
    "INFO  jepsen.util - 1   :info   :cas    :timed-out\n"
    "INFO  jepsen.util - 2\t:invoke\t:read\tnil\n"
    "INFO  jepsen.util - 2\t:fail\t:read\t:timed-out\n"
    "INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n"
    "INFO  jepsen.util - 2\t:invoke\t:write\t4\n"
    "INFO  jepsen.util - 2\t:ok\t:write\t4\n"
)


def test_load_jepsen_log(tmp_path: Path) -> None:
    ops = load_jepsen_log(write(tmp_path, "jepsen.log", LOG))
    assert [(op["process"], op["type"], op["f"]) for op in ops] == [
        (0, "invoke", "read"),
        (1, "invoke", "cas"),
        (0, "ok", "read"),
        (1, "info", "cas"),
        (2, "invoke", "read"),
        (2, "info", "read"),
        ("nemesis", "info", "start"),
        # The thread of process 2 goes on after its read became info: a new process.
        (3, "invoke", "write"),
        (3, "ok", "write"),
    ]
    assert ops[1]["value"] == [1, 2]
    assert ops[2]["value"] == 3
    # The keyword in the value column is an error; the value is the invoke's.
    assert ops[3]["error"] == "timed-out" and ops[3]["value"] == [1, 2]
    assert ops[5]["error"] == "timed-out" and ops[5]["value"] is None
    assert [op["index"] for op in ops] == list(range(9))
    assert [op["time"] for op in ops] == list(range(9))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("INFO  jepsen.util - 0\t:invoke\n", "expected 'jepsen.util"),
        ("INFO  jepsen.util - 0\t:started\t:read\tnil\n", "expected 'jepsen.util"),
        ("INFO  jepsen.util - 0\t:ok\t:read\t[1 2\n", "not valid EDN"),
    ],
)
def test_load_jepsen_log_malformed_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "bad.log", "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n" + line)
    with pytest.raises(FormatError, match=rf"bad\.log:2: {message}"):
        load_jepsen_log(path)


def test_dump_edn_round_trips(tmp_path: Path) -> None:
    ops: list[dict[str, Any]] = [
        {
            "index": 0,
            "time": 5,
            "process": 0,
            "type": "invoke",
            "f": "write",
            "value": 'say "hi"\n',
        },
        {"index": 1, "time": 9, "process": 0, "type": "ok", "f": "write", "value": 'say "hi"\n'},
        {
            "index": 2,
            "time": 12,
            "process": "nemesis",
            "type": "info",
            "f": "start-partition",
            "value": {"n1": ["n2", "n3"]},
        },
        {
            "index": 3,
            "time": 20,
            "process": 3,
            "type": "fail",
            "f": "cas",
            "key": "k",
            "value": [None, 1.5, True],
            "error": ["not-found", "x"],
            "node": "n2",
        },
    ]
    path = tmp_path / "out.edn"
    dump_edn(ops, path)
    text = path.read_text()
    assert ":type :invoke" in text and ":process :nemesis" in text and "nil" in text
    assert load_edn(path) == ops


@pytest.mark.skipif(not BENCH.exists(), reason="Porcupine bench data not present")
def test_bench_kv_file_round_trips(tmp_path: Path) -> None:
    ops = load_edn(BENCH / "kv" / "c10-bad.txt")
    assert len(ops) == 810 and {op["f"] for op in ops} == {"get", "put", "append"}
    dump_edn(ops, tmp_path / "again.edn")
    assert load_edn(tmp_path / "again.edn") == ops


@pytest.mark.skipif(not BENCH.exists(), reason="Porcupine bench data not present")
def test_bench_histories_load_as_valid_histories() -> None:
    ops = load_jepsen_log(BENCH / "jepsen" / "etcd_000.log")
    assert len(ops) == 170
    kinds = {op["type"] for op in ops}
    assert kinds <= {"invoke", "ok", "fail", "info"} and "info" in kinds
    # What the history format requires (checkers.history.validate checks the same).
    for path in [*sorted((BENCH / "jepsen").glob("*.log")), *sorted((BENCH / "kv").glob("c*"))]:
        ops = load_jepsen_log(path) if path.suffix == ".log" else load_edn(path)
        assert [op["index"] for op in ops] == list(range(len(ops)))
        retired: set[Any] = set()
        for op in ops:
            assert not (op["type"] == "invoke" and op["process"] in retired), (path, op)
            if op["type"] == "info":
                retired.add(op["process"])


# -- load_operations: straight to the linearizability checker's operations -------------------

HISTORY_EDN = """\
{:process 0, :type :invoke, :f :write, :key "a", :value 1, :time 10}
{:process 1, :type :invoke, :f :read, :key "a", :value nil, :time 12}
{:process 0, :type :ok, :f :write, :key "a", :value 1, :time 15}
{:process :nemesis, :type :info, :f :start-partition, :value {:n1 #{:n2 :n3}}}
{:process 1, :type :ok, :f :read, :key "a", :value 1, :time 9}
{:process 2, :type :invoke, :f :cas, :key 7, :value [1 2]}
{:process 2, :type :info, :f :cas, :key 7, :value [1 2], :error :timeout}
{:process 2, :type :invoke, :f :write, :key "b", :value "say \\"hi\\""}
{:process 2, :type :ok, :f :write, :key "b", :value "say \\"hi\\""}
{:process 3, :type :invoke, :f :read, :value nil} ; a comment
{:process 3, :type :fail, :f :read, :value nil, :error :timed-out}
{:process 3, :type :invoke, :f :append, :key "a", :value "x 3 0 y"}
{:type :ok, :f :append, :process 3, :value "x 3 0 y", :key "a", :node "n1"}
{:process 4, :type :invoke, :f :cas, :value #jepsen.independent.Tuple{:key 5, :value [1 2]}}
{:process 4, :type :fail, :f :cas, :value #jepsen.independent.Tuple{:key 5, :value [1 2]}}
{:process 5, :type :invoke, :f :get, :key "a", :value nil}
{:process 6, :type :invoke, :f :put, :key :k, :value true}
"""


def _models() -> list[Any]:
    import dataclasses

    from isrlab.checkers.linear import CAS_REGISTER, KV, KV_UNPARTITIONED, REGISTER

    # A model whose inputs are not (f, value) or (f, key, value): read the reference way.
    custom = dataclasses.replace(REGISTER, input_of=lambda op: (op["f"], op["process"]))
    return [REGISTER, CAS_REGISTER, KV, KV_UNPARTITIONED, custom]


def _same_operations(path: Path, fmt: str) -> None:
    from isrlab.checkers.formats import load_operations
    from isrlab.checkers.linear.operations import operations_from_history

    ops = load_edn(path) if fmt == "edn" else load_jepsen_log(path)
    for model in _models():
        assert load_operations(path, fmt, model) == operations_from_history(model, ops), (
            path,
            model.name,
        )


def test_load_operations_equals_the_op_dict_path(tmp_path: Path) -> None:
    _same_operations(write(tmp_path, "h.edn", HISTORY_EDN), "edn")
    _same_operations(write(tmp_path, "e.edn", EDN), "edn")
    _same_operations(write(tmp_path, "v.edn", "[" + EDN + "]"), "edn")
    _same_operations(write(tmp_path, "j.log", LOG), "jepsen-log")
    odd_log = LOG + (
        'INFO  jepsen.util - -1\t:invoke\t:write\t"s"\n'
        'INFO  jepsen.util - -1\t:ok\t:write\t"s"\n'
        "INFO  jepsen.util - 4\t:invoke\t:cas\t[nil 1.5]\n"
        "INFO  jepsen.util - 4\t:fail\t:cas\t:ns/mismatch\n"
        "INFO  jepsen.util - :nemesis\t:info\t:stop\t{:n1 :ok}\n"
        "INFO  jepsen.util - 5\t:invoke\t:write\t\n"
    )
    _same_operations(write(tmp_path, "odd.log", odd_log), "jepsen-log")


def test_load_operations_reads_plain_lines_without_edn_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from isrlab.checkers import formats
    from isrlab.checkers.linear import CAS_REGISTER, KV

    kv_text = "".join(line + "\n" for line in HISTORY_EDN.splitlines()[:3])
    expected_kv = formats.load_operations(write(tmp_path, "kv.edn", kv_text), "edn", KV)
    expected_log = formats.load_operations(
        write(tmp_path, "j.log", LOG), "jepsen-log", CAS_REGISTER
    )

    def refuse(*args: Any) -> Any:
        raise AssertionError("edn_format called for a plain line")

    monkeypatch.setattr(formats.edn_format, "loads", refuse)
    monkeypatch.setattr(formats.edn_format, "loads_all", refuse)
    assert formats.load_operations(tmp_path / "kv.edn", "edn", KV) == expected_kv
    assert formats.load_operations(tmp_path / "j.log", "jepsen-log", CAS_REGISTER) == expected_log
    # (the read never completed: indeterminate, so dropped)
    assert (len(expected_kv[0]), expected_kv[2]) == (1, 1) and len(expected_log[0]) == 3


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{:process 0, :type :done, :f :read}\n", FormatError),
        ("{:process 0, :type :invoke, :f :read}\n{:process 0 :type\n", FormatError),
        ("{:process 0, :type :ok, :f :read, :value 1}\n", "HistoryError"),
        (
            "{:process 0, :type :invoke, :f :read}\n{:process 0, :type :invoke, :f :read}\n",
            "HistoryError",
        ),
        ("{:process 0, :type :invoke, :f :read, :f :write}\n", None),
    ],
)
def test_load_operations_errors_are_the_op_dict_paths(
    tmp_path: Path, text: str, error: Any
) -> None:
    from isrlab.checkers.formats import load_operations
    from isrlab.checkers.linear import REGISTER
    from isrlab.checkers.linear.operations import HistoryError, operations_from_history

    path = write(tmp_path, "bad.edn", text)
    if error is None:  # edn_format's own verdict on a field given twice, whatever it is
        try:
            expected: Any = operations_from_history(REGISTER, load_edn(path))
        except Exception as err:
            expected = type(err)
        try:
            got: Any = load_operations(path, "edn", REGISTER)
        except Exception as err:
            got = type(err)
        assert got == expected
        return
    kind = HistoryError if error == "HistoryError" else error
    with pytest.raises(kind):
        operations_from_history(REGISTER, load_edn(path))
    with pytest.raises(kind):
        load_operations(path, "edn", REGISTER)


def test_load_operations_misread_log_says_so(tmp_path: Path) -> None:
    from isrlab.checkers.formats import load_operations
    from isrlab.checkers.linear import CAS_REGISTER

    with pytest.raises(FormatError, match="recognised none"):
        load_operations(
            write(tmp_path, "h.log", '{"type": "invoke"}\n'), "jepsen-log", CAS_REGISTER
        )
    assert load_operations(write(tmp_path, "empty.log", ""), "jepsen-log", CAS_REGISTER) == (
        [],
        0,
        0,
    )


@pytest.mark.skipif(not BENCH.exists(), reason="Porcupine bench data not present")
def test_load_operations_on_the_bench_histories() -> None:
    for path in sorted((BENCH / "kv").glob("c*.txt")):
        _same_operations(path, "edn")
    for path in sorted((BENCH / "jepsen").glob("*.log"))[::7]:
        _same_operations(path, "jepsen-log")
