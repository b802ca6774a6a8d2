"""The linearizability search over one partition (Wing & Gong, with Lowe's memoisation).

The history is a doubly-linked list of call and return entries in time order.  The search walks
the list from the front: at a call entry it tries to linearize that operation now (the model
accepts it in the current state and the pair (set of linearized operations, new state) has not
been seen before); if so it lifts the call and its return out of the list, pushes what it did and
starts again from the front.  Reaching a return entry means the operation that returns there
had to be linearized by then and could not be: the search pops the last choice, puts its entries
back (unlift) and tries the next call after it.  An empty list is a linearization; an empty
stack at a return entry means there is none.

Speed (this is the hot loop of the whole checker): entries are integers with ``nxt``/``prv``
arrays instead of node objects; the linearized set is a Python int bitset whose low 32 bits are
left free, so ``bitset | state_code`` is the memo key with no tuple; states are interned to
small integer codes and each operation's transitions are memoised per state code, so the model
is called once per distinct (operation, state) and the loop itself only does dict and list
lookups; a determinate read whose accepted state the model names (``read_value``) has its one
transition filled in up front.

The loop exists twice: below in Python, the reference, and compiled in ``_search.pyx`` (C++
arrays for the list, the stack and the memo, the linearized set a bitset with an incremental
hash), which ``search`` runs when it is built.  Both take the same steps and give the same
outcome; tests/checkers/test_linear_native.py compares them on random histories.

Two sound prunings on top of Porcupine's search (both checked against a brute-force oracle):

- a read-only operation the model accepts is linearized without trying alternatives at that
  point: if nothing works after it, nothing works without it either;
- indeterminate operations with equal inputs ("twins") are only linearized in call order,
  since any linearization can be rearranged that way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from isrlab.checkers.linear.model import Model, Operation

try:
    from isrlab.checkers.linear import _search as _native
except ImportError:  # not built: the Python loop alone (slower)
    _native = None  # type: ignore[assignment]

__all__ = ["NATIVE", "SearchOutcome", "StateTable", "search"]

# Whether the compiled loop (_search.pyx) is built and used by default.
NATIVE = _native is not None

Verdict = Literal["ok", "illegal", "unknown"]

_STATE_BITS = 32
_DEADLINE_CHECK_EVERY = 1024


class _Custom:
    """A state wrapped with the model's own equal/hash so it can live in a dict."""

    __slots__ = ("equal", "hashed", "state")

    def __init__(self, state: Any, model: Model) -> None:
        assert model.equal is not None and model.hash is not None
        self.state = state
        self.equal = model.equal
        self.hashed = model.hash(state)

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Custom) and self.equal(self.state, other.state)


class StateTable:
    """Interns model states as dense integer codes (code 0 is the initial state)."""

    def __init__(self, model: Model) -> None:
        if (model.equal is None) != (model.hash is None):
            raise ValueError(f"model {model.name}: give both equal and hash, or neither")
        self.model = model
        self.custom = model.equal is not None
        self.codes: dict[Any, int] = {}
        self.states: list[Any] = []
        self.code(model.init())

    def code(self, state: Any) -> int:
        key = _Custom(state, self.model) if self.custom else state
        try:
            found = self.codes.get(key)
        except TypeError:
            raise TypeError(
                f"model {self.model.name}: state {state!r} is not hashable; "
                "use immutable states (tuples, frozensets) or give equal and hash"
            ) from None
        if found is None:
            found = len(self.states)
            # (The search inlines this for plain states; 2**32 states would not fit in memory
            # long before they overflowed the low bits of the memo key.)
            self.codes[key] = found
            self.states.append(state)
        return found


@dataclass
class SearchOutcome:
    """The result of searching one partition.

    ``linearization`` is a full linearization (verdict ok) or the longest linearizable prefix
    found (illegal, unknown), as positions in the partition's operation list; ``blocked`` is the
    position of the operation that could not be placed after that prefix (illegal only), and
    ``state`` the model state after the prefix.
    """

    verdict: Verdict
    linearization: list[int]
    blocked: int | None
    state: Any
    steps: int
    cache_size: int
    elapsed_s: float
    states_seen: int = 0


def _bind(
    step: Callable[[Any, Any, Any], tuple[bool, Any]], input: Any, output: Any
) -> Callable[[Any], tuple[bool, Any]]:
    return lambda state: step(state, input, output)


def search(
    model: Model,
    ops: Sequence[Operation],
    deadline: float | None = None,
    table: StateTable | None = None,
    max_configs: int | None = None,
    *,
    native: bool | None = None,
) -> SearchOutcome:
    """Search for a linearization of ``ops`` (one partition).

    Gives up with verdict ``unknown`` after ``deadline`` (a ``time.monotonic()`` value) or once
    more than ``max_configs`` configurations are memoised (each costs a few hundred bytes).
    ``native`` picks the loop: the compiled one (``_search.pyx``; True fails if it is not
    built), the Python reference (False), or the compiled one when built (None, the default).
    Both give the same outcome, step for step.
    """
    if native is None:
        native = NATIVE
    elif native and _native is None:
        raise RuntimeError("the compiled search (checkers/linear/_search.pyx) is not built")
    started = time.monotonic()
    table = table if table is not None else StateTable(model)
    n = len(ops)
    if n == 0:
        return SearchOutcome("ok", [], None, table.states[0], 0, 0, 0.0)

    # Entries 1..2n in time order (calls before returns at equal times); 0 is the head
    # sentinel and 2n+1 the tail sentinel, so lift/unlift never test for a missing neighbour.
    events = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)] + [(op.ret, 1, i) for i, op in enumerate(ops)]
    )
    tail = 2 * n + 1
    nxt = [*range(1, tail + 1), tail]
    prv = [0, *range(0, tail)]
    op_of = [-1] * (tail + 1)
    match = [-1] * (tail + 1)  # call entry -> its return entry; -1 for returns
    call_of = [-1] * (tail + 1)  # return entry -> its call entry
    call_entry = [0] * n
    returns: list[int] = []
    for entry, (_t, kind, i) in enumerate(events, start=1):
        op_of[entry] = i
        if kind:
            returns.append(entry)
            match[call_entry[i]] = entry
            call_of[entry] = call_entry[i]
        else:
            call_entry[i] = entry

    # The op of a call entry, or -1 for a return entry: what the loop asks first.
    call_op = [op_of[entry] if match[entry] >= 0 else -1 for entry in range(tail + 1)]
    bits = [1 << (i + _STATE_BITS) for i in range(n)]
    compile_step = model.compile_step
    if compile_step is not None:
        steppers = [compile_step(op.input, op.output) for op in ops]
    else:
        steppers = [_bind(model.step, op.input, op.output) for op in ops]
    read_only = model.read_only
    forced = [read_only is not None and bool(read_only(op.input)) for op in ops]
    # Indeterminate ops with equal inputs ("twins") are interchangeable once both are pending:
    # neither has a return to respect, and the one called first has the weaker constraints.
    # So any linearization can be rearranged to take twins in call order, and the search only
    # offers a twin once the one before it is linearized.
    prev_twin = [-1] * n
    last_of_kind: dict[str, int] = {}
    for entry in range(1, tail):
        if match[entry] >= 0 and ops[op_of[entry]].indeterminate:
            twin_key = repr(ops[op_of[entry]].input)
            prev_twin[op_of[entry]] = last_of_kind.get(twin_key, -1)
            last_of_kind[twin_key] = op_of[entry]
    taken = [False] * n
    # trans[i][state code] -> bits[i] | new state code, or 0 where the model rejects op i:
    # OR-ing it into the linearized set gives the memo key in one big-int operation.
    trans: list[dict[int, int]] = [{} for _ in range(n)]
    intern = table.code
    # Interning inlined for plain hashable states (the common case): one dict lookup.
    known = None if table.custom else table.codes
    # What a miss in trans means: None = not computed yet (ask the model); 0 = rejected.  A
    # determinate read the model can name the one accepted state of has that single
    # transition filled in now and every miss rejects, so reads never call the model.
    on_miss: list[int | None] = [None] * n
    read_value = model.read_value
    if read_value is not None:
        for i, op in enumerate(ops):
            if forced[i] and not op.indeterminate:
                expected = intern(read_value(op.input, op.output))
                trans[i][expected] = bits[i] | expected
                on_miss[i] = 0
    states = table.states

    if native:
        assert _native is not None
        fixed = [-1] * n
        for i in range(n):
            if on_miss[i] == 0:
                (fixed[i],) = trans[i]
        outcome, found, stopped_at, end, native_steps, memoised = _native.run(
            op_of,
            match,
            steppers,
            forced,
            prev_twin,
            fixed,
            states,
            known,
            intern,
            deadline,
            max_configs,
        )
        return SearchOutcome(
            outcome,
            found,
            stopped_at,
            states[end],
            native_steps,
            memoised,
            time.monotonic() - started,
            len(states),
        )

    state_mask = (1 << _STATE_BITS) - 1

    cache: set[int] = set()
    stack: list[tuple[int, int, int, bool]] = []
    push = stack.append
    pop = stack.pop
    state = 0
    linearized = 0
    best: list[int] = []
    best_len = 0
    blocked: int | None = None
    best_state = 0
    backtracks = 0
    verdict: Verdict = "ok"

    # Pending calls are tried in call order, as in Porcupine.  (Trying the op that returns
    # first, or read-only ops, first was measured on the bench histories: no fewer configs.)
    e = nxt[0]
    while True:
        o = call_op[e]
        if o >= 0:
            t = trans[o]
            delta = t.get(state, on_miss[o])
            if delta is None:
                ok, after = steppers[o](states[state])
                if ok:
                    if known is None:
                        code: int | None = intern(after)
                    else:
                        try:
                            code = known.get(after)
                        except TypeError:  # unhashable: let intern() say so properly
                            code = intern(after)
                        if code is None:
                            code = len(states)
                            known[after] = code
                            states.append(after)
                    assert code is not None
                    delta = bits[o] | code
                else:
                    delta = 0
                t[state] = delta
            if delta:
                twin = prev_twin[o]
                if twin >= 0 and not taken[twin]:
                    e = nxt[e]
                    continue
                key = linearized | delta
                if key not in cache:
                    cache.add(key)
                    push((e, state, linearized, forced[o]))
                    taken[o] = True
                    m = match[e]
                    state = key & state_mask
                    linearized = key ^ state
                    p = prv[e]
                    q = nxt[e]
                    nxt[p] = q
                    prv[q] = p
                    p = prv[m]
                    q = nxt[m]
                    nxt[p] = q
                    prv[q] = p
                    e = nxt[0]
                    if e == tail:
                        break
                    continue
            e = nxt[e]
        else:
            if len(stack) > best_len or blocked is None:
                best = [op_of[s[0]] for s in stack]
                best_len = len(best)
                blocked = op_of[e]
                best_state = state
            if not stack:
                verdict = "illegal"
                break
            backtracks += 1
            if backtracks % _DEADLINE_CHECK_EVERY == 0 and (
                (deadline is not None and time.monotonic() > deadline)
                or (max_configs is not None and len(cache) > max_configs)
            ):
                verdict = "unknown"
                break
            # A read-only op the model accepts may as well be linearized at once: moving it
            # to the front of any linearization that places it later keeps that linearization
            # valid.  So when nothing works after it, nothing works without it either, and
            # the configuration it was taken in is dead too.
            was_forced = True
            while was_forced and stack:
                e, state, linearized, was_forced = pop()
                taken[op_of[e]] = False
                m = match[e]
                nxt[prv[m]] = m
                prv[nxt[m]] = m
                nxt[prv[e]] = e
                prv[nxt[e]] = e
            if was_forced:
                verdict = "illegal"
                break
            e = nxt[e]

    elapsed = time.monotonic() - started
    if verdict == "ok":
        return SearchOutcome(
            "ok",
            [op_of[s[0]] for s in stack],
            None,
            states[state],
            backtracks,
            len(cache),
            elapsed,
            len(states),
        )
    return SearchOutcome(
        verdict,
        best,
        blocked if verdict == "illegal" else None,
        states[best_state],
        backtracks,
        len(cache),
        elapsed,
        len(states),
    )
