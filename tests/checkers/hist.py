"""A tiny builder for hand-written queue histories in the spec's format (tests only)."""

from __future__ import annotations

from typing import Any


def _invoke_form(mops: list[list[Any]]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for m in mops:
        if m[0] == "send":
            v = m[2][1] if isinstance(m[2], list) else m[2]
            out.append(["send", m[1], v])
        else:
            out.append(["poll"])
    return out


class H:
    """Appends invoke/completion pairs; every method returns the completion's index."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.t = 0

    def _add(self, process: Any, typ: str, f: str, value: Any, **extra: Any) -> int:
        self.t += 1000
        op = {
            "index": len(self.ops),
            "time": self.t,
            "process": process,
            "type": typ,
            "f": f,
            "value": value,
        }
        op.update(extra)
        self.ops.append(op)
        return op["index"]

    def invoke(self, process: Any, f: str, value: Any) -> int:
        return self._add(process, "invoke", f, value)

    def complete(self, process: Any, typ: str, f: str, value: Any, **extra: Any) -> int:
        return self._add(process, typ, f, value, **extra)

    def txn(
        self, process: Any, mops: list[list[Any]], typ: str = "ok", f: str = "txn", **extra: Any
    ) -> int:
        self.invoke(process, f, _invoke_form(mops))
        return self.complete(process, typ, f, mops, **extra)

    def send(
        self, process: Any, k: str, v: Any, offset: int | None, typ: str = "ok", **extra: Any
    ) -> int:
        return self.txn(process, [["send", k, [offset, v]]], typ, "send", **extra)

    def poll(
        self, process: Any, reads: dict[str, list[list[Any]]], typ: str = "ok", **extra: Any
    ) -> int:
        return self.txn(process, [["poll", reads]], typ, "poll", **extra)

    def assign(self, process: Any, keys: list[str], typ: str = "ok", f: str = "assign") -> int:
        self.invoke(process, f, keys)
        return self.complete(process, typ, f, keys)
