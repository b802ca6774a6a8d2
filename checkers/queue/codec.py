"""The queue workload's micro-ops: the one codec of their JSON shapes (docs/history-format.md).

A queue op's `value` is a list of micro-ops. This module is the contract of their shapes:
the writers (the harness's queue workload generator and client, the simulated histories)
build them with the encoders, the readers (the checker's loaders, the pipeline's ingest and
counts, the offset diagrams, the workload's own offset tracking) take them apart with the
decoders. Nothing else spells ``["send", k, [o, v]]`` out.

| micro-op | invoke | completion |
|---|---|---|
| send | ``["send", k, v]`` (`send`) | ``["send", k, [offset, v]]`` (`send_result`, offset ``null`` if unknown), or ``["send", k, v]`` when nothing came back |
| poll | ``["poll"]`` (`poll`) | ``["poll", {k: [[offset, v], ...], ...}]`` (`poll_result`) |
| commit | ``["commit", {k: offset, ...}]`` (`commit`) | the same |

Three ways to read them:

- `decode(mop) -> Send | Poll | Commit`, strict, the inverse of `encode`: what a tool
  that wants the whole micro-op uses (`encode(decode(m)) == m` for every well-formed m);
- `sends_in`, `polls_in`, `reads_in`: lenient iterators for readers of what a history
  holds (ingest, counts, diagrams, tracking): they yield the well-formed micro-ops of
  their kind and skip anything else;
- `decode_into(rec, value, line, with_reads)`: the checker's strict, hot decoder, which
  flattens an op's micro-ops into ``rec.sends`` (``(key, offset, value)`` in order) and
  ``rec.reads`` (``{key: pairs}``, every poll's pairs concatenated per key) and raises
  `HistoryError` naming the line on a malformed micro-op. It reads sends and polls
  only: a commit micro-op inside a send, poll or txn op is an error there (offsets sent
  to a transaction are not checked yet). A `commit` op's own micro-ops are read with
  `decode` (`checkers.queue.ops.commit_offsets`).
  `checkers/queue/load.py` inlines its two commonest shapes (one send, one poll) and the
  native screen (`_screen.pyx`) has its own C loop over the same shapes; the tests hold
  both to this decoder (tests/checkers/test_queue_load.py, test_queue_screen.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from isrlab.checkers.history import HistoryError

__all__ = [
    "ASSIGN_FS",
    "COMMIT",
    "DATA_FS",
    "NO_READS",
    "NO_SENDS",
    "POLL",
    "SEND",
    "Commit",
    "MicroOp",
    "Poll",
    "Send",
    "check_pairs_of",
    "commit",
    "decode",
    "decode_into",
    "decode_value",
    "encode",
    "entries_in",
    "poll",
    "poll_result",
    "polls_in",
    "reads_in",
    "send",
    "send_result",
    "sends_in",
]

SEND, POLL, COMMIT = "send", "poll", "commit"
# Op fs whose value is a list of micro-ops; op fs whose value is a list of keys.
DATA_FS = frozenset(("send", "poll", "txn"))
ASSIGN_FS = frozenset(("assign", "subscribe"))

# ----- encoding (what the workload and the simulators write) ------------------------------


def send(key: Any, value: Any) -> list[Any]:
    """A send's invoke, or its completion when nothing came back: ``["send", k, v]``."""
    return [SEND, key, value]


def send_result(key: Any, value: Any, offset: int | None) -> list[Any]:
    """An answered send: ``["send", k, [offset, v]]`` (offset None: acked without one)."""
    return [SEND, key, [offset, value]]


def poll() -> list[Any]:
    """A poll's invoke: ``["poll"]``."""
    return [POLL]


def poll_result(reads: dict[Any, list[list[Any]]]) -> list[Any]:
    """A poll's completion: ``["poll", {k: [[offset, v], ...]}]`` (`reads` is kept, not copied)."""
    return [POLL, reads]


def commit(offsets: dict[Any, int]) -> list[Any]:
    """Offsets to commit (Kafka's meaning: the next offset to read): ``["commit", {k: o}]``."""
    return [COMMIT, offsets]


# ----- the decoded form ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """A send micro-op. `answered`: the third element is ``[offset, v]`` (the broker
    answered; `offset` None when it gave none) rather than the bare value."""

    key: Any
    value: Any
    offset: int | None = None
    answered: bool = False


@dataclass(frozen=True, slots=True)
class Poll:
    """A poll micro-op; `reads` None for the invoke's ``["poll"]``."""

    reads: dict[Any, list[list[Any]]] | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    offsets: dict[Any, int]


MicroOp = Send | Poll | Commit


def encode(m: MicroOp) -> list[Any]:
    """The JSON shape of a decoded micro-op."""
    if isinstance(m, Send):
        return send_result(m.key, m.value, m.offset) if m.answered else send(m.key, m.value)
    if isinstance(m, Poll):
        return poll() if m.reads is None else poll_result(m.reads)
    return commit(m.offsets)


def decode(mop: Any) -> MicroOp:
    """One micro-op's JSON shape, decoded; ValueError saying what is wrong otherwise."""
    if type(mop) is not list or not mop:
        raise ValueError(f"micro-op must be a non-empty list, got {mop!r}")
    name = mop[0]
    if name == SEND:
        if len(mop) != 3:
            raise ValueError(f"send micro-op must be [send, key, value], got {mop!r}")
        x = mop[2]
        if type(x) is list:
            if len(x) != 2:
                raise ValueError(f"send result must be [offset, value], got {x!r}")
            _valid_pair(x[0], x[1])
            return Send(mop[1], x[1], x[0], True)
        _valid_pair(None, x)
        return Send(mop[1], x)
    if name == POLL:
        if len(mop) == 1:
            return Poll()
        if len(mop) != 2 or type(mop[1]) is not dict:
            raise ValueError(f"poll result must be an object of key -> pairs, got {mop!r}")
        for pairs in mop[1].values():
            if type(pairs) is not list:
                raise ValueError(f"poll result must map keys to lists of pairs, got {mop!r}")
            for pair in pairs:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError(f"poll pair must be [offset, value], got {pair!r}")
                _valid_pair(pair[0], pair[1])
        return Poll(mop[1])
    if name == COMMIT:
        if len(mop) != 2 or type(mop[1]) is not dict:
            raise ValueError(f"commit micro-op must be [commit, {{key: offset}}], got {mop!r}")
        if any(type(o) is not int for o in mop[1].values()):
            raise ValueError(f"commit offsets must be integers, got {mop!r}")
        return Commit(mop[1])
    raise ValueError(f"unknown micro-op {name!r} (expected send, poll or commit)")


def decode_value(value: Any) -> list[MicroOp]:
    """A send/poll/txn/commit op's value, decoded (None: no micro-ops)."""
    if value is None:
        return []
    if type(value) is not list:
        raise ValueError(f"value must be a list of micro-ops, got {value!r}")
    return [decode(m) for m in value]


# ----- lenient readers -------------------------------------------------------------------


def sends_in(value: Any) -> Iterator[tuple[int, Any, Any, Any]]:
    """``(micro-op index, key, offset, value)`` of every ``["send", k, x]`` in `value`.

    `x` is read as the spec's completions: ``[offset, v]`` gives (offset, v) (offset may be
    None), anything else is the bare value (offset None). Other entries are skipped."""
    if not isinstance(value, list):
        return
    for i, mop in enumerate(value):
        if isinstance(mop, list) and len(mop) == 3 and mop[0] == SEND:
            x = mop[2]
            if isinstance(x, list) and len(x) == 2:
                yield i, mop[1], x[0], x[1]
            else:
                yield i, mop[1], None, x


def polls_in(value: Any) -> Iterator[tuple[int, Mapping[Any, Any]]]:
    """``(micro-op index, {key: pairs})`` of every completed poll (``["poll", {...}]``)."""
    if not isinstance(value, list):
        return
    for i, mop in enumerate(value):
        if isinstance(mop, list) and len(mop) >= 2 and mop[0] == POLL and isinstance(mop[1], dict):
            yield i, mop[1]


def reads_in(value: Any) -> Iterator[tuple[int, Any, Any, Any]]:
    """``(micro-op index, key, offset, value)`` of every ``[offset, v]`` pair a poll read."""
    for i, reads in polls_in(value):
        for key, pairs in reads.items():
            for pair in pairs or ():
                if isinstance(pair, list) and len(pair) == 2:
                    yield i, key, pair[0], pair[1]


def entries_in(value: Any) -> Iterator[tuple[int, str, Any, Any, Any]]:
    """``(micro-op index, "send" | "read", key, offset, value)`` in micro-op order: every
    send of `sends_in` and every pair of `reads_in`, interleaved as the op holds them."""
    if not isinstance(value, list):
        return
    for i, mop in enumerate(value):
        if not isinstance(mop, list) or len(mop) < 2:
            continue
        if mop[0] == SEND and len(mop) == 3:
            x = mop[2]
            if isinstance(x, list) and len(x) == 2:
                yield i, "send", mop[1], x[0], x[1]
            else:
                yield i, "send", mop[1], None, x
        elif mop[0] == POLL and isinstance(mop[1], dict):
            for key, pairs in mop[1].items():
                for pair in pairs or ():
                    if isinstance(pair, list) and len(pair) == 2:
                        yield i, "read", key, pair[0], pair[1]


# ----- the checker's strict decoder ------------------------------------------------------

# A record's sends/reads until `decode_into` finds one: most ops have only one of the two,
# and a million empty containers cost time to make and to free. Never mutated.
NO_SENDS: list[tuple[Any, Any, Any]] = []
NO_READS: dict[Any, list[Any]] = {}


class Flat(Protocol):
    """What `decode_into` fills: ``sends`` and ``reads``, starting as NO_SENDS / NO_READS."""

    f: str
    sends: list[tuple[Any, Any, Any]]
    reads: dict[Any, list[Any]]


def decode_into(rec: Flat, value: Any, line: int, with_reads: bool) -> None:
    """Append `value`'s sends and (`with_reads`) poll pairs to ``rec.sends`` / ``rec.reads``.

    Raises `HistoryError` at `line` on a malformed micro-op (pairs are checked by
    `check_pairs_of`, only when the fast path has to locate an error)."""
    if value is None:
        return
    if type(value) is not list:
        raise HistoryError(f"{rec.f} value must be a list of micro-ops, got {value!r}", line)
    sends = rec.sends
    reads = rec.reads
    for mop in value:
        if type(mop) is not list or not mop:
            raise HistoryError(f"micro-op must be a non-empty list, got {mop!r}", line)
        name = mop[0]
        if name == SEND:
            if len(mop) != 3:
                raise HistoryError(f"send micro-op must be [send, key, value], got {mop!r}", line)
            x = mop[2]
            if type(x) is list:
                if len(x) != 2:
                    raise HistoryError(f"send result must be [offset, value], got {x!r}", line)
                item = (mop[1], x[0], x[1])
            else:
                item = (mop[1], None, x)
            if sends is NO_SENDS:
                rec.sends = sends = [item]
            else:
                sends.append(item)
        elif name == POLL:
            if not with_reads or len(mop) < 2 or mop[1] is None:
                continue
            m = mop[1]
            if type(m) is not dict:
                raise HistoryError(
                    f"poll result must be an object of key -> pairs, got {m!r}", line
                )
            if reads is NO_READS:
                rec.reads = reads = {}
            for k, pairs in m.items():
                if type(pairs) is not list:
                    raise HistoryError(f"poll result for {k!r} must be a list of pairs", line)
                have = reads.get(k)
                if have is None:
                    reads[k] = pairs
                else:
                    reads[k] = have + pairs
        else:
            raise HistoryError(f"unknown micro-op {name!r} (expected send or poll)", line)


def check_pairs_of(value: Any, line: int) -> None:
    """Strict check of the offsets and values of `value`'s sends and poll pairs."""
    if type(value) is not list:
        return
    for mop in value:
        if type(mop) is list and len(mop) >= 2 and mop[0] == POLL and type(mop[1]) is dict:
            for pairs in mop[1].values():
                for pair in pairs:
                    if type(pair) is not list or len(pair) != 2:
                        raise HistoryError(f"poll pair must be [offset, value], got {pair!r}", line)
                    _check_pair(pair[0], pair[1], line)
        if type(mop) is list and len(mop) == 3 and mop[0] == SEND:
            x = mop[2]
            if type(x) is list:
                if len(x) != 2:
                    raise HistoryError(f"send result must be [offset, value], got {x!r}", line)
                _check_pair(x[0], x[1], line)
            else:
                _check_pair(None, x, line)


def _pair_problem(offset: Any, value: Any) -> str | None:
    if offset is not None and type(offset) is not int:
        return f"offset must be an integer or null, got {offset!r}"
    if type(value) in (list, dict):
        return f"values must be JSON scalars, got {value!r}"
    return None


def _check_pair(offset: Any, value: Any, line: int) -> None:
    problem = _pair_problem(offset, value)
    if problem is not None:
        raise HistoryError(problem, line)


def _valid_pair(offset: Any, value: Any) -> None:
    problem = _pair_problem(offset, value)
    if problem is not None:
        raise ValueError(problem)
