# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
"""The compiled loop of the linearizability search (``checkers.linear.search``).

``search.search`` prepares one partition (the entry list, the twins, the read transitions the
model names) and then runs either its own Python loop, the reference, or ``run`` here: the same
walk, step for step, with the entry list, the stack and the taken flags in C++ arrays, the
model's transitions memoised per (operation, state code) in a hash map, and the memo of
configurations an open-addressing table over (linearized set as a bitset, state code) with an
incrementally kept (Zobrist) hash of the set.  The model itself (its compiled steps) and the
interning of new states stay in Python, in the caller's state table, so the state codes, the
counts and the outcome are the reference's (tests/checkers/test_linear_native.py compares them
on random histories of every built-in model).
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref

import time

__all__ = ["run"]

cdef extern from *:
    """
    #include <cstdint>
    #include <cstring>
    #include <vector>

    static inline uint64_t isr_mix64(uint64_t x) {
        x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 27; x *= 0x94d049bb133111ebULL;
        x ^= x >> 31;
        return x;
    }

    // The set of configurations seen: (linearized set, state) pairs, each stored once as
    // `words` words of the set and one of the state, found by a hash the caller gives.
    struct IsrLinMemo {
        size_t words;
        size_t count;
        size_t mask;
        std::vector<uint64_t> arena;
        std::vector<uint64_t> hashes;
        std::vector<uint32_t> slots;  // entry index + 1; 0 is empty

        IsrLinMemo() : words(1), count(0), mask(1023), slots(1024, 0) {}

        void init(size_t w) { words = w; }

        // Adds (set, state) unless present; true if it was new.
        bool add(const uint64_t* set, uint64_t state, uint64_t h) {
            const size_t stride = words + 1;
            size_t i = h & mask;
            for (uint32_t s = slots[i]; s != 0; s = slots[i]) {
                const size_t at = s - 1;
                if (hashes[at] == h) {
                    const uint64_t* e = arena.data() + at * stride;
                    if (e[words] == state && std::memcmp(e, set, words * 8) == 0) return false;
                }
                i = (i + 1) & mask;
            }
            slots[i] = (uint32_t)(count + 1);
            arena.insert(arena.end(), set, set + words);
            arena.push_back(state);
            hashes.push_back(h);
            ++count;
            if (count * 2 > mask + 1) grow();
            return true;
        }

        void grow() {
            const size_t capacity = (mask + 1) * 2;
            slots.assign(capacity, 0);
            mask = capacity - 1;
            for (size_t at = 0; at < count; ++at) {
                size_t i = hashes[at] & mask;
                while (slots[i] != 0) i = (i + 1) & mask;
                slots[i] = (uint32_t)(at + 1);
            }
        }
    };
    """
    uint64_t isr_mix64(uint64_t x) nogil

    cdef cppclass IsrLinMemo:
        size_t count
        IsrLinMemo() except +
        void init(size_t w)
        cbool add(const uint64_t* set, uint64_t state, uint64_t h) except +


cdef enum:
    DEADLINE_CHECK_EVERY = 1024


def run(
    list op_of,
    list match,
    list steppers,
    list forced,
    list prev_twin,
    list fixed,
    list states,
    object known,
    object intern,
    object deadline,
    object max_configs,
):
    """Search one prepared partition, as ``search._search_python`` does.

    ``op_of``/``match`` are indexed by entry (0 the head, ``2n+1`` the tail); ``steppers``,
    ``forced``, ``prev_twin`` and ``fixed`` (the one accepted state code of a read the model
    named, else -1) by operation.  New states are interned into ``states`` through ``known``
    (the table's dict, plain states) or ``intern`` (custom states, ``known`` None).

    Returns (verdict, linearization or longest prefix, blocked op or None, state code,
    backtracks, configurations memoised).
    """
    cdef Py_ssize_t n = len(steppers)
    cdef Py_ssize_t tail = 2 * n + 1
    cdef Py_ssize_t i, e, m, p, q, o, twin
    cdef vector[int64_t] nxt, prv, c_op_of, c_match, call_op, c_twin, c_fixed
    cdef vector[char] c_forced, taken
    cdef vector[int64_t] stk_e, stk_state, best
    cdef vector[uint64_t] zob, lin
    cdef unordered_map[uint64_t, int64_t] trans
    cdef unordered_map[uint64_t, int64_t].iterator found
    cdef IsrLinMemo memo
    cdef Py_ssize_t words = (n + 63) // 64
    cdef Py_ssize_t depth = 0
    cdef Py_ssize_t best_len = 0
    cdef Py_ssize_t blocked = -1
    cdef int64_t state = 0
    cdef int64_t best_state = 0
    cdef int64_t newst, fx, code
    cdef uint64_t hset = 0
    cdef uint64_t h, bit, tkey
    cdef int64_t backtracks = 0
    cdef cbool was_forced
    cdef cbool plain = known is not None
    cdef int64_t budget = -1 if max_configs is None else max_configs
    cdef str verdict = "ok"

    memo.init(words if words > 0 else 1)
    nxt.resize(tail + 1)
    prv.resize(tail + 1)
    c_op_of.resize(tail + 1)
    c_match.resize(tail + 1)
    call_op.resize(tail + 1)
    for i in range(tail + 1):
        nxt[i] = i + 1 if i < tail else tail
        prv[i] = i - 1 if i > 0 else 0
        c_op_of[i] = op_of[i]
        c_match[i] = match[i]
        # (No conditional expressions assigned to vector items: Cython 3 gives them a
        # reference-typed temporary and stores the value through a dangling pointer.)
        if c_match[i] >= 0:
            call_op[i] = c_op_of[i]
        else:
            call_op[i] = -1
    c_twin.resize(n)
    c_fixed.resize(n)
    c_forced.resize(n)
    taken.resize(n)
    zob.resize(n)
    lin.resize(words if words > 0 else 1)
    for i in range(n):
        c_twin[i] = prev_twin[i]
        c_fixed[i] = fixed[i]
        c_forced[i] = bool(forced[i])
        taken[i] = 0
        zob[i] = isr_mix64(<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ULL)
    stk_e.resize(n + 1)
    stk_state.resize(n + 1)
    best.resize(n + 1)

    e = nxt[0]
    while True:
        o = call_op[e]
        if o >= 0:
            fx = c_fixed[o]
            if fx >= 0:
                newst = fx if state == fx else -1
            else:
                tkey = (<uint64_t>o << 32) | <uint64_t>state
                found = trans.find(tkey)
                if found != trans.end():
                    newst = deref(found).second
                else:
                    ok, after = steppers[o](states[state])
                    if ok:
                        if not plain:
                            code = intern(after)
                        else:
                            try:
                                got = known.get(after)
                            except TypeError:  # unhashable: let intern() say so properly
                                got = intern(after)
                            if got is None:
                                code = len(states)
                                known[after] = code
                                states.append(after)
                            else:
                                code = got
                        newst = code
                    else:
                        newst = -1
                    trans[tkey] = newst
            if newst >= 0:
                twin = c_twin[o]
                if twin >= 0 and not taken[twin]:
                    e = nxt[e]
                    continue
                bit = (<uint64_t>1) << (o & 63)
                lin[o >> 6] |= bit
                h = hset ^ zob[o]
                if memo.add(lin.data(), <uint64_t>newst, isr_mix64(h ^ (<uint64_t>newst * 0xD6E8FEB86659FD93ULL))):
                    stk_e[depth] = e
                    stk_state[depth] = state
                    depth += 1
                    taken[o] = 1
                    state = newst
                    hset = h
                    m = c_match[e]
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
                lin[o >> 6] &= ~bit
            e = nxt[e]
        else:
            if depth > best_len or blocked < 0:
                for i in range(depth):
                    best[i] = c_op_of[stk_e[i]]
                best_len = depth
                blocked = c_op_of[e]
                best_state = state
            if depth == 0:
                verdict = "illegal"
                break
            backtracks += 1
            if backtracks % DEADLINE_CHECK_EVERY == 0 and (
                (deadline is not None and time.monotonic() > deadline)
                or (budget >= 0 and <int64_t>memo.count > budget)
            ):
                verdict = "unknown"
                break
            was_forced = True
            while was_forced and depth > 0:
                depth -= 1
                e = stk_e[depth]
                state = stk_state[depth]
                o = c_op_of[e]
                was_forced = c_forced[o] != 0
                lin[o >> 6] &= ~((<uint64_t>1) << (o & 63))
                hset ^= zob[o]
                taken[o] = 0
                m = c_match[e]
                nxt[prv[m]] = m
                prv[nxt[m]] = m
                nxt[prv[e]] = e
                prv[nxt[e]] = e
            if was_forced:
                verdict = "illegal"
                break
            e = nxt[e]

    if verdict == "ok":
        return (
            verdict,
            [c_op_of[stk_e[i]] for i in range(depth)],
            None,
            state,
            backtracks,
            memo.count,
        )
    return (
        verdict,
        [best[i] for i in range(best_len)],
        blocked if verdict == "illegal" else None,
        best_state,
        backtracks,
        memo.count,
    )
