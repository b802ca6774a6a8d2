"""A queue-workload client that completes every op at once, without any network.

`NullClient` stands in for `QueueClient` when measuring what the harness itself costs: the
generator, the interpreter, its threads and the history writer run exactly as in a real test,
but a send is "acked" at the next offset of an in-memory log shared by all the clients of one
`NullClient.factory(...)`, and a poll returns what that log holds past the client's position
in its assigned keys (at most `max_poll_records` records a poll, as a real consumer's
prefetch is bounded). Completions have the shapes `QueueClient` writes (see
`checkers.queue.codec`), so the final drain ends when it has read every offset.

Used by `benchmarks/bench_harness.py` for its null-client harness rate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from isrlab.checkers.queue import codec

__all__ = ["NullClient", "NullLog"]

Op = dict[str, Any]


class NullLog:
    """The records of every key, as a list of values per key (offset = index)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[str, list[Any]] = {}

    def append(self, key: str, value: Any) -> int:
        with self.lock:
            log = self.records.setdefault(key, [])
            log.append(value)
            return len(log) - 1

    def read(self, key: str, start: int, limit: int) -> list[list[Any]]:
        with self.lock:
            values = self.records.get(key, [])[start : start + limit]
        return [[start + i, v] for i, v in enumerate(values)]


class NullClient:
    """One process's client: ops complete at once against a shared `NullLog`."""

    def __init__(self, process: int, log: NullLog, max_poll_records: int = 500) -> None:
        self.process = process
        self.log = log
        self.max_poll_records = max_poll_records
        self.broken = False
        self.positions: dict[str, int] = {}  # assigned key -> next offset to read
        self._open = False

    @classmethod
    def factory(cls, max_poll_records: int = 500) -> Callable[[int, int], NullClient]:
        """A client factory for `Interpreter`; its clients share one new `NullLog`."""
        log = NullLog()

        def make(process: int, thread: int) -> NullClient:
            return cls(process, log, max_poll_records)

        return make

    def open(self) -> NullClient:
        self._open = True
        return self

    def close(self) -> None:
        self._open = False
        self.positions.clear()

    def invoke(self, op: Mapping[str, Any]) -> Op:
        f = op["f"]
        base: Op = {k: v for k, v in op.items() if not k.startswith("_")}
        base["node"] = "null"
        if f == "crash":
            self.close()
            return {**base, "type": "info", "value": None}
        if not self._open:
            return {**base, "type": "fail", "error": "client-not-open"}
        if f in codec.ASSIGN_FS:
            wanted = set(op["value"] or [])
            beginning = op.get("_seek") == "beginning"
            self.positions = {
                k: 0 if beginning else self.positions.get(k, 0) for k in sorted(wanted)
            }
            return {**base, "type": "ok"}
        if f == "commit":
            return {**base, "type": "ok"}
        if f in codec.DATA_FS:
            out: list[Any] = []
            has_send = False
            for m in op["value"] or []:
                if m[0] == codec.SEND:
                    has_send = True
                    _, k, v = m
                    out.append(codec.send_result(k, v, self.log.append(k, v)))
                elif m[0] == codec.POLL:
                    out.append(codec.poll_result(self._poll()))
                else:
                    out.append(list(m))
            done: Op = {**base, "type": "ok", "value": out}
            if has_send:
                done["producer"] = {
                    "id": self.process,
                    "epoch": 0,
                    "idempotent": True,
                    "transactional_id": "",
                }
            return done
        return {**base, "type": "fail", "error": f"unknown-f:{f}"}

    def _poll(self) -> dict[str, list[list[Any]]]:
        reads: dict[str, list[list[Any]]] = {}
        left = self.max_poll_records
        for k, pos in self.positions.items():
            if left <= 0:
                break
            recs = self.log.read(k, pos, left)
            if recs:
                reads[k] = recs
                self.positions[k] = pos + len(recs)
                left -= len(recs)
        return reads
