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


def _normalise(ops: Iterable[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Dense indexes, increasing times, checked types, timed-out reads as info."""
    result: list[dict[str, Any]] = []
    last_time = -1
    pairs = list(ops)
    fresh = 1 + max(
        (op["process"] for op, _ in pairs if isinstance(op.get("process"), int)), default=-1
    )
    renamed: dict[Any, Any] = {}  # process -> the id its thread goes on with
    retired: set[Any] = set()  # processes (as renamed) whose last completion was info
    for op, where in pairs:
        kind = op.get("type")
        if kind not in _TYPES:
            raise FormatError(
                f"{where}: :type must be one of :invoke :ok :fail :info, got {kind!r}"
            )
        process = op["process"]
        if not (isinstance(process, int) or process == "nemesis"):
            raise FormatError(f"{where}: :process must be an integer or :nemesis, got {process!r}")
        original = process
        process = renamed.get(process, process)
        if kind == "invoke" and process in retired and process != "nemesis":
            # After an info the history format retires the process; Jepsen does too, except
            # for the timed-out reads turned into info below.  The thread goes on as a new one.
            retired.discard(process)
            process = renamed[original] = fresh
            fresh += 1
        if not isinstance(op["f"], str):
            op["f"] = str(op["f"])
        time = op.get("time")
        if isinstance(time, int) and not isinstance(time, bool) and time >= last_time:
            last_time = time
        else:
            last_time += 1
        if (
            kind == "fail"
            and op["f"] in _READS
            and "timed-out" in (op.get("error"), op.get("value"))
        ):
            # A read that timed out may still have been served: indeterminate, not failed.
            kind = "info"
            op.setdefault("error", "timed-out")
            if op.get("value") == "timed-out":
                op["value"] = None
        if kind == "info":
            retired.add(process)
        out: dict[str, Any] = {
            "index": len(result),
            "time": last_time,
            "process": process,
            "type": kind,
            "f": op["f"],
        }
        if "key" in op:
            key = op["key"]
            # The history format's keys are strings; Jepsen's are often integers.
            out["key"] = key if isinstance(key, str) or key is None else str(key)
        out["value"] = op.get("value")
        for name, val in op.items():
            if name not in out:
                out[name] = val
        result.append(out)
    return result


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
