"""Jepsen history formats, to and from the op dicts of history format v1.

Two Jepsen renderings are read:

- EDN op maps (``history.edn``): one map per line, ``{:process 0, :type :invoke, :f :append,
  :key "0", :value "x 0 0 y"}``, or one EDN vector holding all of them.  A value written as
  ``#jepsen.independent.Tuple{:key k, :value v}`` (Jepsen's per-key workloads) becomes
  ``key`` ``"k"`` (as a string) and ``value`` ``v``.
- Jepsen's log lines (``jepsen.log``): ``INFO  jepsen.util - 3 :invoke :cas [1 2]``, fields
  separated by tabs or spaces, optionally preceded by a timestamp.  Lines that are not
  ``jepsen.util`` op lines (other loggers) are skipped; a ``jepsen.util`` line that does not
  parse is an error, and so is a file with lines but no op line at all (a misread file must
  not check as an empty history).  In these logs a completion whose value is a bare keyword
  (``:timed-out``) carries an error, not a value.

Both give op dicts: ``index`` dense from 0, ``time`` in ns (Jepsen's ``:time`` when present,
otherwise synthesised: one more than the previous op, so times strictly increase), ``process``
(an int, or ``"nemesis"``), ``type`` (invoke/ok/fail/info), ``f`` (a string without the colon),
``value`` as JSON (nil -> None, vectors and lists -> lists, sets -> sorted lists, keywords and
symbols -> strings, maps -> objects with string keys), ``key`` (as a string), and ``error``/``node`` when
present; other keys are kept under their names.  A read (``read``/``get``) that ends in
``fail`` with ``:timed-out`` is indeterminate, so it becomes ``info`` with ``error`` recorded;
as a process is never used again after an ``info``, a thread that goes on after one continues
under a fresh process id (one above the largest in the file).

``dump_edn`` writes op dicts back as one EDN map per line; loading what it wrote gives the same
op dicts.  Malformed input raises :class:`FormatError` naming the file and line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import edn_format
from edn_format import Keyword, Symbol

__all__ = ["FormatError", "dump_edn", "dumps_edn_op", "load_edn", "load_jepsen_log"]

_TYPES = frozenset({"invoke", "ok", "fail", "info"})
_READS = frozenset({"read", "get"})
_LOG_LINE = re.compile(
    r"jepsen\.util\s+-\s+(?P<process>\S+)\s+(?P<type>:\S+)\s+(?P<f>:\S+)(?:\s+(?P<value>.*?))?\s*$"
)
# Fields written first, in this order; the rest follow in their own order.
_FIELD_ORDER = ("index", "time", "process", "type", "f", "key", "value")


class FormatError(ValueError):
    """A history file that cannot be read, with the file and line it went wrong on."""


class _IndependentTuple:
    """``#jepsen.independent.Tuple{:key k, :value v}``: one op of a per-key workload."""

    __slots__ = ("key", "value")

    def __init__(self, fields: Any) -> None:
        if not isinstance(fields, Mapping):
            raise ValueError("#jepsen.independent.Tuple needs a map {:key .. :value ..}")
        self.key = fields.get(Keyword("key"))
        self.value = fields.get(Keyword("value"))


edn_format.add_tag("jepsen.independent.Tuple", _IndependentTuple)


def to_json(value: Any) -> Any:
    """EDN data (as edn_format parses it) as JSON-shaped Python data."""
    if isinstance(value, Keyword | Symbol):
        return value.name
    if isinstance(value, _IndependentTuple):
        return [to_json(value.key), to_json(value.value)]
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    if isinstance(value, Mapping):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, Set):
        return sorted((to_json(v) for v in value), key=repr)
    if isinstance(value, Sequence):
        return [to_json(v) for v in value]
    # Chars, decimals, instants, uuids, tagged values: their text is what JSON can hold.
    return str(value)


def _json_key(key: Any) -> str:
    converted = to_json(key)
    return converted if isinstance(converted, str) else str(converted)


def _op_from_edn(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise FormatError(f"{where}: expected an op map {{:process .. :type ..}}, got {raw!r}")
    value = raw.get(Keyword("value"))
    op = {_json_key(k): to_json(v) for k, v in raw.items()}
    if isinstance(value, _IndependentTuple) and "key" not in op:
        # Jepsen's independent workloads carry the key inside the value.
        op["key"] = str(to_json(value.key))
        op["value"] = to_json(value.value)
    missing = [name for name in ("process", "type", "f") if name not in op]
    if missing:
        raise FormatError(f"{where}: op map lacks {', '.join(':' + m for m in missing)}")
    return op


_ABSENT: Any = object()  # a field an op map does not have


class _Rules:
    """The per-op rules every reader applies, in history order (see the module docstring).

    Times never go backwards; a read that failed with ``:timed-out`` becomes ``info`` (with
    ``error`` ``timed-out``); a thread that invokes after an ``info`` goes on under a fresh
    process id.  ``fresh`` is one above the largest integer process in the file.
    """

    __slots__ = ("fresh", "last_time", "renamed", "retired")

    def __init__(self, fresh: int) -> None:
        self.fresh = fresh
        self.last_time = -1
        self.renamed: dict[Any, Any] = {}  # process -> the id its thread goes on with
        self.retired: set[Any] = set()  # processes (as renamed) whose last completion was info

    def apply(
        self, process: Any, kind: Any, f: str, time: Any, value: Any, error: Any, where: str
    ) -> tuple[int, Any, str, Any, Any]:
        """(time, process, type, value, error) of the next op; ``error`` may be ``_ABSENT``."""
        if kind not in _TYPES:
            raise FormatError(
                f"{where}: :type must be one of :invoke :ok :fail :info, got {kind!r}"
            )
        if not (isinstance(process, int) or process == "nemesis"):
            raise FormatError(f"{where}: :process must be an integer or :nemesis, got {process!r}")
        original = process
        process = self.renamed.get(process, process)
        if kind == "invoke" and process in self.retired and process != "nemesis":
            # After an info the history format retires the process; Jepsen does too, except
            # for the timed-out reads turned into info below.  The thread goes on as a new one.
            self.retired.discard(process)
            process = self.renamed[original] = self.fresh
            self.fresh += 1
        if isinstance(time, int) and not isinstance(time, bool) and time >= self.last_time:
            self.last_time = time
        else:
            self.last_time += 1
        if kind == "fail" and f in _READS and "timed-out" in (error, value):
            # A read that timed out may still have been served: indeterminate, not failed.
            kind = "info"
            if error is _ABSENT:
                error = "timed-out"
            if value == "timed-out":
                value = None
        if kind == "info":
            self.retired.add(process)
        return self.last_time, process, kind, value, error


def _fresh_process(processes: Iterable[Any]) -> int:
    return 1 + max((p for p in processes if isinstance(p, int)), default=-1)


def _normalise(ops: Iterable[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Dense indexes, increasing times, checked types, timed-out reads as info."""
    result: list[dict[str, Any]] = []
    pairs = list(ops)
    rules = _Rules(_fresh_process(op["process"] for op, _ in pairs))
    for op, where in pairs:
        if not isinstance(op["f"], str):
            op["f"] = str(op["f"])
        time, process, kind, value, error = rules.apply(
            op["process"],
            op.get("type"),
            op["f"],
            op.get("time"),
            op.get("value"),
            op.get("error", _ABSENT),
            where,
        )
        out: dict[str, Any] = {
            "index": len(result),
            "time": time,
            "process": process,
            "type": kind,
            "f": op["f"],
        }
        if "key" in op:
            out["key"] = _key(op["key"])
        out["value"] = value
        for name, val in op.items():
            if name not in out:
                out[name] = val
        if error is not _ABSENT and "error" not in out:
            out["error"] = error  # (a timed-out read's, last as before)
        result.append(out)
    return result


def _key(key: Any) -> Any:
    # The history format's keys are strings; Jepsen's are often integers.
    return key if isinstance(key, str) or key is None else str(key)


def _parse_many(texts: Sequence[str], wheres: Sequence[str], what: str) -> list[Any]:
    """Parse many small EDN texts in one edn_format call (it is slow per call).

    Only when the batch fails are the texts parsed one by one, to name the bad line.
    """
    try:
        parsed = edn_format.loads("[" + "\n".join(texts) + "\n]")
        if len(parsed) == len(texts):
            return list(parsed)
    except Exception:
        pass
    results = []
    for text, where in zip(texts, wheres, strict=True):
        try:
            results.append(edn_format.loads(text))
        except Exception as err:
            raise FormatError(f"{where}: not valid EDN {what} ({err}): {text.strip()!r}") from None
        if text.strip() and len(edn_format.loads_all(text)) != 1:
            raise FormatError(f"{where}: expected exactly one {what}: {text.strip()!r}")
    return results


def load_edn(path: str | Path) -> list[dict[str, Any]]:
    """Read a Jepsen ``history.edn`` (one op map per line, or one vector of maps)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith(("[", "(")):
        try:
            whole = edn_format.loads(stripped)
        except Exception as err:
            raise FormatError(f"{path}: not a valid EDN vector of op maps: {err}") from None
        if not isinstance(whole, Sequence):
            raise FormatError(f"{path}: expected a vector of op maps")
        return _normalise(
            (_op_from_edn(raw, f"{path}: op {i}"), f"{path}: op {i}") for i, raw in enumerate(whole)
        )
    texts: list[str] = []
    wheres: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith(";"):
            texts.append(line)
            wheres.append(f"{path}:{lineno}")
    raws = _parse_many(texts, wheres, "op map")
    return _normalise(
        (_op_from_edn(raw, where), where) for raw, where in zip(raws, wheres, strict=True)
    )


def load_jepsen_log(path: str | Path) -> list[dict[str, Any]]:
    """Read the op lines of a Jepsen log (``INFO  jepsen.util - 3 :invoke :cas [1 2]``)."""
    path = Path(path)
    fields: list[str] = []
    wheres: list[str] = []
    other = 0  # non-blank lines that are not op lines
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if "jepsen.util" not in line:
                other += bool(line.strip())
                continue
            where = f"{path}:{lineno}"
            found = _LOG_LINE.search(line)
            if found is None or found["type"][1:] not in _TYPES:
                raise FormatError(
                    f"{where}: expected 'jepsen.util - <process> :invoke|:ok|:fail|:info "
                    f":<f> <value>', got {line.strip()!r}"
                )
            fields.append(
                f"[{found['process']} {found['type']} {found['f']} {found['value'] or 'nil'}]"
            )
            wheres.append(where)
    if not fields and other:
        # Nothing recognised is a misread file (a JSONL history, say), not an empty history.
        raise FormatError(
            f"{path}: format jepsen-log recognised none of its {other} line(s): no "
            "'jepsen.util - <process> :<type> :<f> <value>' op line; pick the file's format "
            "with --format jsonl|edn|jepsen-log"
        )
    rows = _parse_many(fields, wheres, "log fields")

    def ops() -> Iterable[tuple[dict[str, Any], str]]:
        invoked: dict[Any, Any] = {}
        for row, where in zip(rows, wheres, strict=True):
            if not isinstance(row, Sequence) or len(row) != 4:
                raise FormatError(f"{where}: expected '<process> :<type> :<f> <value>'")
            process, kind, f, raw_value = to_json(row[0]), to_json(row[1]), row[2], row[3]
            op: dict[str, Any] = {"process": process, "type": kind, "f": to_json(f)}
            if kind == "invoke":
                invoked[process] = to_json(raw_value)
                op["value"] = invoked[process]
            elif isinstance(raw_value, Keyword) and process != "nemesis":
                # Jepsen logs the error keyword in the value column of a failed op.
                op["error"] = raw_value.name
                op["value"] = invoked.pop(process, None)
            else:
                invoked.pop(process, None)
                op["value"] = to_json(raw_value)
            yield op, where

    return _normalise(ops())


def _to_edn(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_edn(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_edn(v) for v in value]
    return value


def dumps_edn_op(op: dict[str, Any]) -> str:
    """One op dict as a Jepsen EDN op map (``type`` and ``f`` as keywords)."""
    names = [n for n in _FIELD_ORDER if n in op] + [n for n in op if n not in _FIELD_ORDER]
    parts = []
    for name in names:
        value = op[name]
        if name in ("type", "f") or (name == "process" and value == "nemesis"):
            rendered = edn_format.dumps(Keyword(str(value)))
        else:
            rendered = edn_format.dumps(_to_edn(value))
        parts.append(f":{name} {rendered}")
    return "{" + ", ".join(parts) + "}"


def dump_edn(ops: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write op dicts as a Jepsen ``history.edn``, one op map per line."""
    with Path(path).open("w", encoding="utf-8") as out:
        for op in ops:
            out.write(dumps_edn_op(op))
            out.write("\n")


# -- Straight to the linearizability checker's operations -------------------------------------
#
# ``load_operations`` reads a file into what ``checkers.linear.check_operations`` searches,
# without op dicts: each line is matched by a regular expression for the plain shapes Jepsen
# writes (nil, booleans, integers, strings without escapes, keywords, vectors of those) and only
# a line with anything else goes through edn_format (and ``_op_from_edn``).  The same rules
# (``_Rules``) and the same pairing as ``checkers.linear.operations`` apply, so the operations
# are equal to ``operations_from_history(model, load_edn(path))`` (tests/checkers/
# test_formats.py compares them); anything out of the ordinary (a malformed line, a history
# the pairing rejects, a model whose inputs are not built from f, key and value) is read the
# reference way instead, which also raises its errors.

_KW = r"[A-Za-z_*!?<>=+\-.][\w*!?<>=+\-.]*"
_ATOM = rf'nil|true|false|-?(?:0|[1-9]\d*)|"[^"\\]*"|:{_KW}'
_SCALAR = rf"nil|true|false|-?(?:0|[1-9]\d*)|:{_KW}"
_SIMPLE = rf"(?:{_ATOM}|\[[\s,]*(?:(?:{_SCALAR})(?:[\s,]+(?:{_SCALAR}))*)?[\s,]*\])"
_FIELD = rf":([A-Za-z_][\w\-?!*.]*)[\s,]+({_SIMPLE})"
_MAP_LINE = re.compile(rf"\s*\{{[\s,]*(?:{_FIELD}(?:[\s,]+{_FIELD})*)?[\s,]*\}}\s*")
_FIELDS = re.compile(_FIELD)
_SIMPLE_VALUE = re.compile(_SIMPLE)
_PROCESS = re.compile(r"0|[1-9]\d*")
_CONSTANTS = {"nil": None, "true": True, "false": False}
_SEPARATORS = str.maketrans(",", " ")


class _NotPlain(Exception):
    """The file needs the reference reader (it raises the proper error, if any)."""


def _plain(text: str) -> Any:
    """The JSON value of an EDN text ``_SIMPLE`` matched (keywords as their names)."""
    first = text[0]
    if first == '"' or first == ":":
        return text[1:-1] if first == '"' else text[1:]
    if first == "[":
        return [_plain(t) for t in text[1:-1].translate(_SEPARATORS).split()]
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    return int(text)


def _one_form(text: str) -> Any:
    try:
        forms = edn_format.loads_all(text)
    except Exception:
        raise _NotPlain from None
    if len(forms) != 1:
        raise _NotPlain
    return forms[0]


# A raw op: (process, type, f, key or _ABSENT, value, time or None, error or _ABSENT, where).
_Raw = tuple[Any, Any, Any, Any, Any, Any, Any, str]


def _edn_raw(path: Path) -> list[_Raw]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith(("[", "(")):
        raise _NotPlain
    raws: list[_Raw] = []
    match_line = _MAP_LINE.fullmatch
    fields = _FIELDS.findall
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(";"):
            continue
        where = f"{path}:{lineno}"
        op: dict[str, Any]
        if match_line(line):
            pairs = fields(line)
            op = {name: _plain(value) for name, value in pairs}
            if len(op) != len(pairs):
                raise _NotPlain  # a field given twice
        else:
            op = _op_from_edn(_one_form(line), where)
        try:
            process, kind, f = op["process"], op["type"], op["f"]
        except KeyError:
            raise _NotPlain from None
        raws.append(
            (
                process,
                kind,
                f if isinstance(f, str) else str(f),
                op.get("key", _ABSENT),
                op.get("value"),
                op.get("time"),
                op.get("error", _ABSENT),
                where,
            )
        )
    return raws


def _jepsen_log_raw(path: Path) -> list[_Raw]:
    raws: list[_Raw] = []
    invoked: dict[Any, Any] = {}
    plain = _SIMPLE_VALUE.fullmatch
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if "jepsen.util" not in line:
                continue
            found = _LOG_LINE.search(line)
            if found is None or found["type"][1:] not in _TYPES:
                raise _NotPlain
            process_text, f_text = found["process"], found["f"]
            value_text = found["value"] or "nil"
            keyword = value_text[0] == ":"
            if (
                (_PROCESS.fullmatch(process_text) or process_text == ":nemesis")
                and plain(f_text)
                and plain(value_text)
            ):
                process = int(process_text) if process_text[0] != ":" else "nemesis"
                f: Any = f_text[1:]
                value = _plain(value_text)
            else:
                row = _one_form(f"[{process_text} {found['type']} {f_text} {value_text}]")
                if not isinstance(row, Sequence) or len(row) != 4:
                    raise _NotPlain
                process, f, raw_value = to_json(row[0]), to_json(row[2]), row[3]
                keyword = isinstance(raw_value, Keyword)
                value = raw_value.name if keyword else to_json(raw_value)
            kind = found["type"][1:]
            error: Any = _ABSENT
            if kind == "invoke":
                invoked[process] = value
            elif keyword and process != "nemesis":
                # Jepsen logs the error keyword in the value column of a failed op.
                error = value
                value = invoked.pop(process, None)
            else:
                invoked.pop(process, None)
            raws.append(
                (
                    process,
                    kind,
                    f if isinstance(f, str) else str(f),
                    _ABSENT,
                    value,
                    None,
                    error,
                    "",
                )
            )
    if not raws:
        raise _NotPlain  # empty, or a misread file: the reference reader says which
    return raws


def load_operations(path: str | Path, fmt: str, model: Any) -> tuple[list[Any], int, int]:
    """A Jepsen file (``fmt`` ``edn`` or ``jepsen-log``) as ``model``'s operations.

    Returns what ``checkers.linear.operations.operations_from_history`` returns for the op
    dicts ``load_edn``/``load_jepsen_log`` read, (operations, failed, dropped reads), without
    building those op dicts.  Errors are theirs (``FormatError``, ``HistoryError``).
    """
    from isrlab.checkers.linear.model import (
        INFINITY,
        UNKNOWN,
        Operation,
        default_input_of,
        default_output_of,
    )
    from isrlab.checkers.linear.models import kv_input
    from isrlab.checkers.linear.operations import operations_from_history

    path = Path(path)
    if fmt not in ("edn", "jepsen-log"):
        raise ValueError(f"format {fmt!r}: load_operations reads edn or jepsen-log")

    def reference() -> tuple[list[Any], int, int]:
        ops = load_edn(path) if fmt == "edn" else load_jepsen_log(path)
        return operations_from_history(model, ops)

    with_key = model.input_of is kv_input
    if not (with_key or model.input_of is default_input_of):
        return reference()
    if model.output_of is not default_output_of:
        return reference()
    try:
        raws = _edn_raw(path) if fmt == "edn" else _jepsen_log_raw(path)
        rules = _Rules(_fresh_process(raw[0] for raw in raws))
        apply = rules.apply
        # (invoke position, time, process, f, key, value)
        pending: dict[Any, tuple[int, int, Any, str, Any, Any]] = {}
        paired: list[tuple[tuple[int, int, Any, str, Any, Any], Any]] = []
        failed = 0
        for position, (process, kind, f, key, value, time, error, where) in enumerate(raws):
            time, process, kind, value, error = apply(process, kind, f, time, value, error, where)
            if process == "nemesis":
                continue
            if kind == "invoke":
                if process in pending:
                    raise _NotPlain
                pending[process] = (
                    position,
                    time,
                    process,
                    f,
                    None if key is _ABSENT else _key(key),
                    value,
                )
                continue
            started = pending.pop(process, None)
            if started is None:
                raise _NotPlain
            if kind == "fail":
                failed += 1
                continue
            paired.append((started, (position, time, kind, value, error)))
    except (_NotPlain, FormatError):
        return reference()
    paired.extend((started, None) for started in pending.values())
    paired.sort(key=lambda item: item[0][0])

    read_only = model.read_only
    result: list[Operation] = []
    dropped = 0
    for (invoke_position, call, process, f, key, value), completion in paired:
        model_input = (f, key, value) if with_key else (f, value)
        if completion is None or completion[2] == "info":
            if read_only is not None and read_only(model_input):
                dropped += 1
                continue
            ret = INFINITY
            output = UNKNOWN
        else:
            ret = float(completion[1])
            output = completion[3]
        result.append(
            Operation(
                len(result),
                process,
                f,
                key,
                float(call),
                ret,
                model_input,
                output,
                invoke_position,
                None if completion is None else completion[0],
                None if completion is None or completion[4] is _ABSENT else completion[4],
            )
        )
    return result, failed, dropped
