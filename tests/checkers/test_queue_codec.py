"""The queue micro-op codec (`checkers.queue.codec`): encode and decode are inverses over
every shape of docs/history-format.md, the lenient readers agree with the strict decoder on
well-formed values and skip what is malformed, and the checker's flattening decoder gives
what `decode` gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from isrlab.checkers.history import HistoryError
from isrlab.checkers.queue import codec
from isrlab.checkers.queue.codec import Commit, Poll, Send
from isrlab.checkers.queue.ops import QueueOp

keys = st.sampled_from(["t0/0", "t1/0", "t1/1", "out/0"])
scalars = st.one_of(
    st.integers(-(2**40), 2**40),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
    st.floats(-1e9, 1e9),
)
offsets = st.one_of(st.none(), st.integers(0, 2**40))
pairs = st.lists(st.tuples(st.integers(0, 2**40), scalars).map(list), max_size=4)

sends = st.one_of(
    st.builds(Send, keys, scalars),  # invoke, or a completion with nothing back
    st.builds(lambda k, v, o: Send(k, v, o, True), keys, scalars, offsets),  # answered
)
polls = st.one_of(st.just(Poll()), st.builds(Poll, st.dictionaries(keys, pairs, max_size=3)))
commits = st.builds(Commit, st.dictionaries(keys, st.integers(0, 2**40), max_size=3))
micro_ops = st.one_of(sends, polls, commits)
values = st.lists(micro_ops, min_size=1, max_size=6)


def _json(x: Any) -> Any:
    """Through JSON and back, as a history file carries it."""
    return orjson.loads(orjson.dumps(x))


@given(micro_ops)
def test_decode_inverts_encode(m: codec.MicroOp) -> None:
    assert codec.decode(codec.encode(m)) == m
    assert codec.decode(_json(codec.encode(m))) == m


@given(values)
def test_encode_inverts_decode(ms: list[codec.MicroOp]) -> None:
    raw = _json([codec.encode(m) for m in ms])
    assert [codec.encode(m) for m in codec.decode_value(raw)] == raw


def test_the_spec_shapes() -> None:
    assert codec.send("t0/0", 3) == ["send", "t0/0", 3]
    assert codec.send_result("t0/0", 3, 17) == ["send", "t0/0", [17, 3]]
    assert codec.send_result("t0/0", 3, None) == ["send", "t0/0", [None, 3]]
    assert codec.poll() == ["poll"]
    assert codec.poll_result({"t0/0": [[1, 2]]}) == ["poll", {"t0/0": [[1, 2]]}]
    assert codec.commit({"t0/0": 5}) == ["commit", {"t0/0": 5}]
    # The three completions of a send: offset known, acked without one, nothing back.
    assert codec.decode(["send", "k", [4, 9]]) == Send("k", 9, 4, True)
    assert codec.decode(["send", "k", [None, 9]]) == Send("k", 9, None, True)
    assert codec.decode(["send", "k", 9]) == Send("k", 9, None, False)


@pytest.mark.parametrize(
    ("mop", "says"),
    [
        ([], "non-empty list"),
        ("send", "non-empty list"),
        (["send", "k"], "[send, key, value]"),
        (["send", "k", [1, 2, 3]], "[offset, value]"),
        (["send", "k", ["x", 2]], "offset must be an integer"),
        (["send", "k", [1, [2]]], "JSON scalars"),
        (["poll", [[1, 2]]], "key -> pairs"),
        (["poll", {"k": [[1]]}], "[offset, value]"),
        (["poll", {"k": 3}], "lists of pairs"),
        (["commit", {"k": "x"}], "integers"),
        (["read", "k"], "unknown micro-op 'read'"),
    ],
)
def test_decode_says_what_is_wrong(mop: Any, says: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        codec.decode(mop)
    assert says in str(e.value)


@given(values)
def test_lenient_readers_agree_with_decode(ms: list[codec.MicroOp]) -> None:
    raw = _json([codec.encode(m) for m in ms])
    want_sends = [(i, m.key, m.offset, m.value) for i, m in enumerate(ms) if isinstance(m, Send)]
    assert list(codec.sends_in(raw)) == want_sends
    want_reads = [
        (i, k, p[0], p[1])
        for i, m in enumerate(ms)
        if isinstance(m, Poll) and m.reads is not None
        for k, ps in m.reads.items()
        for p in ps
    ]
    assert list(codec.reads_in(raw)) == want_reads
    entries = list(codec.entries_in(raw))
    assert [(i, k, o, v) for i, w, k, o, v in entries if w == "send"] == want_sends
    assert [(i, k, o, v) for i, w, k, o, v in entries if w == "read"] == want_reads
    assert [e[0] for e in entries] == sorted(e[0] for e in entries)


def test_lenient_readers_skip_what_is_malformed() -> None:
    value = [["send", "k"], "x", [], ["poll", 3], ["poll", {"k": [[1], [2, 5]]}], ["send", "k", 4]]
    assert list(codec.sends_in(value)) == [(5, "k", None, 4)]
    assert list(codec.reads_in(value)) == [(4, "k", 2, 5)]
    assert list(codec.sends_in(None)) == list(codec.reads_in({"k": 1})) == []


@given(st.lists(st.one_of(sends, polls), min_size=1, max_size=6))
def test_decode_into_flattens_what_decode_reads(ms: list[codec.MicroOp]) -> None:
    raw = _json([codec.encode(m) for m in ms])
    rec = QueueOp("txn", 0, 0, 0, -1, 1)
    codec.decode_into(rec, raw, 1, True)
    assert rec.sends == [(m.key, m.offset, m.value) for m in ms if isinstance(m, Send)]
    reads: dict[Any, list[Any]] = {}
    for m in ms:
        if isinstance(m, Poll) and m.reads is not None:
            for k, ps in m.reads.items():
                reads[k] = reads.get(k, []) + ps
    assert rec.reads == reads
    # The shared empties stay empty: a record without sends or reads points at them.
    assert codec.NO_SENDS == [] and codec.NO_READS == {}


def test_decode_into_names_the_line() -> None:
    rec = QueueOp("txn", 0, 0, 0, -1, 1)
    with pytest.raises(HistoryError, match="line 7: unknown micro-op 'commit'"):
        codec.decode_into(rec, [codec.commit({"k": 1})], 7, True)
    with pytest.raises(HistoryError, match="line 3: txn value must be a list"):
        codec.decode_into(rec, {"send": 1}, 3, True)
