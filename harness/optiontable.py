"""Option tables: a frozen dataclass whose fields declare options, and the rows read from it.

A table is a frozen dataclass; each option is a field declared with `option_field` (default,
help, allowed values, bounds, and what else the table's owner derives from it: flag, broker
key, report column...). `table(cls)` reads the declarations as `Option` rows, and
`Option.check` validates and coerces a value with one message style (`ConfigError`, naming the
option and what it accepts). The test table (`harness.testconfig.TestConfig`) and each
workload's table of knobs (`harness.workloads.queue.options.QueueOptions`) are declared this
way, so every option, wherever it lives, is validated by the same code.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints

__all__ = ["ConfigError", "Option", "option_field", "table"]


class ConfigError(ValueError):
    """An option has a bad value; the message names the option and what it accepts."""


_UNSET: Any = object()


def option_field(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    aliases: Mapping[str, str] | None = None,
    minimum: float | None = None,
    above: bool = False,
    maximum: float | None = None,
    flag: str | None = "",
    broker_key: str | None = None,
    column: str | None = None,
    absent: Any = _UNSET,
    always_in_json: bool = True,
    switch: bool = False,
    setting: bool = False,
) -> Any:
    """One option's declaration (see `Option` for the meaning of each argument)."""
    meta = {
        "help": help,
        "choices": choices,
        "aliases": dict(aliases or {}),
        "minimum": minimum,
        "above": above,
        "maximum": maximum,
        "flag": flag,
        "broker_key": broker_key,
        "column": column,
        "absent": default if absent is _UNSET else absent,
        "always_in_json": always_in_json,
        "switch": switch,
        "setting": setting,
    }
    return field(default=default, metadata={"option": meta})


@dataclass(frozen=True)
class Option:
    """One row of a table.

    ``kind`` is the value type (``list`` for a comma list, ``dict`` for a mapping) and
    ``optional`` whether None is a value; ``choices`` the allowed values (of each item, for a
    list) and ``aliases`` other spellings of them; ``minimum`` the smallest allowed number
    (``above``: strictly above it) and ``maximum`` the largest; ``text_values``: a mapping's
    values are turned into text (``dict[str, str]``) rather than kept as given
    (``dict[str, Any]``); ``flag`` the command-line flag (None: not on the command line);
    ``broker_key`` the server.properties key it sets; ``column`` the Spark DDL type of its
    report column (None: not a column); ``absent`` the value a stored run without the key ran
    with; ``always_in_json``: written to test.json even when unset; ``switch`` / ``setting``:
    a matrix ``--switch`` / ``--set`` name.
    """

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...]
    aliases: Mapping[str, str]
    minimum: float | None
    above: bool
    maximum: float | None
    text_values: bool
    flag: str | None
    broker_key: str | None
    column: str | None
    absent: Any
    always_in_json: bool
    switch: bool
    setting: bool

    @property
    def label(self) -> str:
        """How errors name the option: the test.json key and the flag that sets it."""
        return f"{self.name} ({self.flag})" if self.flag else self.name

    @property
    def allowed(self) -> str:
        """The allowed values in words (for references): choices or bounds."""
        if self.choices:
            return ", ".join(self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append(f"{'>' if self.above else '>='} {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum:g}")
        return ", ".join(bounds)

    def _fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.label} {what}")

    def _item(self, raw: Any) -> Any:
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise self._fail(f"takes true or false, not {raw!r}")
        if self.kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise self._fail(f"takes an integer, not {raw!r}")
            try:
                value: Any = int(str(raw).strip()) if isinstance(raw, str) else int(raw)
            except (TypeError, ValueError):
                raise self._fail(f"takes an integer, not {raw!r}") from None
        elif self.kind is float:
            if isinstance(raw, bool):
                raise self._fail(f"takes a number, not {raw!r}")
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise self._fail(f"takes a number, not {raw!r}") from None
            if not math.isfinite(value):
                raise self._fail(f"takes a finite number, not {raw!r}")
        elif self.kind is dict:
            if not isinstance(raw, Mapping):
                raise self._fail(f"takes a mapping of key to value, not {raw!r}")
            if self.text_values:
                return {str(k): str(v) for k, v in raw.items()}
            return {str(k): v for k, v in raw.items()}
        else:
            if not isinstance(raw, str | int) or isinstance(raw, bool):
                raise self._fail(f"takes text, not {raw!r}")
            value = self.aliases.get(str(raw).strip(), str(raw).strip())
            if self.choices and value not in self.choices:
                raise self._fail(f"must be one of {', '.join(self.choices)}, not {raw!r}")
            if not value and self.kind is str and not self.optional:
                raise self._fail("must not be empty")
            return value
        if self.minimum is not None and (
            value <= self.minimum if self.above else value < self.minimum
        ):
            bound = "above" if self.above else "at least"
            raise self._fail(f"must be {bound} {self.minimum:g}, not {raw!r}")
        if self.maximum is not None and value > self.maximum:
            raise self._fail(f"must be at most {self.maximum:g}, not {raw!r}")
        return value

    def check(self, raw: Any) -> Any:
        """``raw`` as this option's value (a comma string or a sequence for lists)."""
        if raw is None:
            if self.optional:
                return None
            raise self._fail("must be given")
        if self.kind is not list:
            return self._item(raw)
        if isinstance(raw, str):
            items = [s.strip() for s in raw.split(",") if s.strip()]
        elif isinstance(raw, list | tuple):
            items = [str(s).strip() for s in raw]
        else:
            raise self._fail(f"takes a comma list, not {raw!r}")
        inner = dataclasses.replace(self, kind=str, optional=False)
        return tuple(inner._item(s) for s in items)


def _kind_of(hint: Any) -> tuple[type, bool, bool]:
    """(kind, optional, text_values) of a field's type hint."""
    optional = False
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        (hint,) = args
    origin = get_origin(hint) or hint
    if origin is tuple:
        return list, optional, False
    if origin in (dict, Mapping):
        item_types = get_args(hint)
        return dict, optional, bool(item_types) and item_types[1] is str
    return origin, optional, False


def table(cls: type) -> tuple[Option, ...]:
    """The rows declared by ``cls``'s `option_field` fields, in declaration order."""
    hints = get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        kind, optional, text_values = _kind_of(hints[f.name])
        flag = meta["flag"]
        rows.append(
            Option(
                name=f.name,
                kind=kind,
                optional=optional,
                default=f.default,
                text_values=text_values,
                **{**meta, "flag": "--" + f.name.replace("_", "-") if flag == "" else flag},
            )
        )
    return tuple(rows)
