# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
"""The native screen of a queue history: prove it has no anomaly, or say it needs the checker.

`checkers.queue.screen` documents the contract; this module is its compiled core. One
`Screen` is fed the spec's op dicts in history order (`feed`, a list at a time) and then
`finish`es. It keeps only flat C++ arrays (records, sends, reads, watermarks), no
per-op Python objects, and repeats the explaining checker's passes
(`checkers.queue.analysis.QueueAnalysis`): `_index`, `_order_checks`,
`_lost_and_unseen`, `_op_checks`, `_truncation_checks` and the backward edges that start
`cycles`, each rule once (`Screen.passes`). `finish` runs them as detectors: the first
case of any anomaly stops them and `finish` names it (the caller then explains the
history); otherwise it returns the checker's stats, in the checker's order. `explain`
runs the same passes to the end, counting every case and keeping the first ones' fields
(`checkers.queue.native` writes them).

It accepts less than the checker: integer values and offsets within 64 bits, reads
with offsets, dict watermarks and the structure `checkers.queue.load` accepts.
Anything else raises `GiveUp`, and the caller checks the history the ordinary way.
`finish(prefix=True)` screens the ops fed so far as the start of a longer history (the
probe of `checkers.queue.screen`).
"""

from libc.stdint cimport int8_t, int32_t, int64_t, INT64_MIN
from libcpp cimport bool as cbool
from libcpp.algorithm cimport lower_bound, sort, stable_sort
from libcpp.map cimport map as cmap
from libcpp.unordered_map cimport unordered_map
from libcpp.unordered_set cimport unordered_set
from libcpp.vector cimport vector
from libcpp.utility cimport pair
from cython.operator cimport dereference as deref, preincrement as inc
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.dict cimport PyDict_CheckExact
from cpython.list cimport PyList_CheckExact

__all__ = ["GiveUp", "Screen"]


class GiveUp(Exception):
    """The screen cannot vouch for this history; check it the ordinary way."""


class _Fired(Exception):
    """The first case the screen's passes found (`Screen.hit`): its anomaly's name."""


# The screen's word for an anomaly where it names several (`screen.PERSISTENT`).
SCREEN_WORD = {
    "int-poll-skip": "int-poll-skip or int-nonmonotonic-poll",
    "int-nonmonotonic-poll": "int-poll-skip or int-nonmonotonic-poll",
    "poll-skip": "poll-skip or nonmonotonic-poll",
    "nonmonotonic-poll": "poll-skip or nonmonotonic-poll",
    "hw-regression-realtime": "hw-regression",
}


cdef enum:  # kinds, as checkers.queue.ops
    OK = 0
    INFO = 1
    FAIL = 2

cdef enum:  # fs
    F_SEND = 0
    F_POLL = 1
    F_TXN = 2
    F_ASSIGN = 3
    F_SUBSCRIBE = 4

cdef extern from *:
    """
    #define SCREEN_NONE INT64_MIN
    """
    const int64_t NONE "SCREEN_NONE"  # a null offset, an index not known

cdef struct Rec:
    int64_t pos
    int64_t inv
    int64_t index  # the op's index: its position, or its invoke's if never completed
    int32_t pid
    int8_t kind
    int8_t f
    cbool committed
    cbool assign_list  # assign/subscribe whose value is a list
    cbool idem  # from an idempotent producer session
    int32_t s0, s1  # sends[s0:s1]
    int32_t g0, g1  # groups[g0:g1]
    int32_t w0, w1  # wms[w0:w1]
    int32_t a0, a1  # assign_keys[a0:a1]

cdef struct Send:
    int32_t key
    int64_t off  # NONE: no offset
    int64_t val

cdef struct Group:  # one key's pairs of one op's reads
    int32_t key
    int32_t p0, p1

cdef struct WM:
    int32_t key
    int64_t low  # NONE: absent
    int64_t high  # NONE: absent

cdef struct VInfo:  # per (key, value)
    int32_t writer  # record index, -1 none
    int64_t first_off  # NONE: not in the version order
    int64_t min_off, max_off  # over every offset it sits at
    cbool ok_read
    cbool multi  # at several offsets
    int32_t first_reader  # the first ok record that read it, -1 none

cdef struct Pos:  # a process's last read or send of a key (`_op_checks`' tuples)
    int64_t i
    int64_t v
    int32_t ri

cdef struct Committed:  # `_truncation_checks`: a committed offset's value and first op
    int64_t v
    int64_t pos
    int32_t ri

cdef struct KeyState:
    cbool has_order
    cbool conflict
    cbool multi
    int64_t lo  # dense index: offsets in [lo, lo + len(dense))

cdef extern from *:
    """
    #include <algorithm>
    #include <cstdint>
    #include <unordered_map>
    #include <vector>

    // int64 -> V. Values and offsets of a key are mostly small and dense, so keys in
    // [0, dense.size()) live in a vector, others in a hash map. The vector only grows to
    // hold a key below 65536 + 16 * (entries), so it never takes more than that many
    // slots, whatever the keys. A pointer into the table is valid until the next insertion.
    template <typename V>
    struct IntTable {
        std::vector<V> dense;
        std::vector<uint8_t> used;
        std::unordered_map<int64_t, V> sparse;
        size_t count = 0;

        V* find(int64_t x) {
            if (x >= 0 && (uint64_t)x < dense.size()) {
                if (used[x]) return &dense[x];
            }
            if (sparse.empty()) return nullptr;
            auto it = sparse.find(x);
            return it == sparse.end() ? nullptr : &it->second;
        }
        // The entry of x, made a copy of `blank` if absent (*fresh says which).
        V* get(int64_t x, const V& blank, bool* fresh) {
            V* p = find(x);
            *fresh = p == nullptr;
            if (p) return p;
            count++;
            size_t cap = 65536 + 16 * count;
            if (x >= 0 && (uint64_t)x < cap) {
                if ((uint64_t)x >= dense.size()) {
                    size_t n = std::max((size_t)x + 1, std::min(dense.size() * 2, cap));
                    dense.resize(n);
                    used.resize(n, 0);
                }
                used[x] = 1;
                dense[x] = blank;
                return &dense[x];
            }
            return &sparse.emplace(x, blank).first->second;
        }
        void keys(std::vector<int64_t>& out) {
            out.reserve(out.size() + count);
            for (size_t i = 0; i < dense.size(); i++)
                if (used[i]) out.push_back((int64_t)i);
            for (auto& kv : sparse) out.push_back(kv.first);
        }
        size_t size() { return count; }
    };
    """
    cdef cppclass IntTable[V]:
        IntTable()
        V* find(int64_t x)
        V* get(int64_t x, const V& blank, cbool* fresh)
        void keys(vector[int64_t]& out)
        size_t size()

ctypedef IntTable[VInfo] ValMap
ctypedef IntTable[int64_t] LogMap


cdef inline int8_t f_code(object f):
    """The record kind of an op's f: F_SEND..F_SUBSCRIBE, or -1 for any other f."""
    if f == "send":
        return F_SEND
    if f == "poll":
        return F_POLL
    if f == "txn":
        return F_TXN
    if f == "assign":
        return F_ASSIGN
    if f == "subscribe":
        return F_SUBSCRIBE
    return -1


cdef inline int64_t above_earlier_max(vector[int64_t]* at, vector[int64_t]* top,
                                      vector[int32_t]* rec, int64_t pos, int64_t inv,
                                      int64_t value, int32_t ri):
    """A per-key running maximum over ok completions (`analysis._RunningMax`): record
    `value`, completed at history position `pos` by record `ri`, and find the maximum
    among completions before position `inv` (this op's invoke): its index in `top` and
    `rec` if it lies above `value`, else -1."""
    cdef int64_t j
    if top.empty() or value > top.back():
        at.push_back(pos)
        top.push_back(value)
        rec.push_back(ri)
    elif top.back() > value:
        j = (lower_bound(at.begin(), at.end(), inv) - at.begin()) - 1
        if j >= 0 and deref(top)[j] > value:
            return j
    return -1



cdef inline int64_t as_int(object x) except? -1:
    """An exact int within 64 bits (bools and big ints give up)."""
    cdef int overflow = 0
    cdef long long r
    if not PyLong_CheckExact(x):
        raise GiveUp()
    r = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow or r == INT64_MIN:
        raise GiveUp()
    return r


cdef void keep_only(unordered_map[int32_t, Pos]* table, unordered_set[int32_t]* keep):
    cdef unordered_map[int32_t, Pos].iterator it = table.begin()
    while it != table.end():
        if keep.count(deref(it).first):
            inc(it)
        else:
            it = table.erase(it)




cdef class Screen:
    cdef vector[Rec] recs
    cdef vector[Send] sends
    cdef vector[Group] groups
    cdef vector[int64_t] poffs
    cdef vector[int64_t] pvals
    cdef vector[WM] wms
    cdef vector[int32_t] assign_keys
    cdef vector[KeyState] keys
    cdef vector[ValMap] vals
    cdef vector[LogMap] logs
    cdef vector[vector[int64_t]] offsets  # sealed, per key
    cdef vector[vector[int64_t]] dense  # offset - lo -> index, -1 absent (if compact)
    cdef dict kids  # key -> key index (Python equality, as the checker's dicts)
    cdef unordered_map[int64_t, int32_t] pids  # process -> process index
    cdef vector[int64_t] processes  # process index -> process
    cdef vector[int64_t] open_at  # per process index: position of its open invoke, or -1
    cdef vector[cbool] dead  # per process index: completed an info op
    cdef list open_ops  # per process index: its open invoke's op dict
    cdef readonly int64_t pos
    cdef int64_t last_time
    cdef public cbool saw_subscribe
    # A commit op or a completion's consumer-group rebalance: subscribe-mode rules
    # (`checkers.queue.group`) the screen leaves to the checker.
    cdef public cbool saw_group
    # The op fields' names, as the parser's own string objects once seen (`adopt_keys`).
    cdef object k_index, k_time, k_type, k_f, k_process, k_value, k_watermarks, k_producer
    cdef int64_t n_sends, n_reads
    # (reader, writer) and (writer, earlier writer) record indices of the dependency edges
    # that point against completion order; ww chain edges as (from, to) record indices.
    cdef vector[pair[int64_t, int64_t]] spans
    cdef vector[pair[int32_t, int32_t]] chains
    # What `explain`'s cases need of each key's version order, as
    # `VersionOrder` keeps it: values in the order first seen (`voff`), offsets holding
    # several values and those values (`conflicts`), values at several offsets and the
    # offsets (`multi`), and the keys in the order their version orders began.
    cdef vector[vector[int64_t]] vorder
    cdef vector[vector[int64_t]] conf_offs
    cdef vector[unordered_map[int64_t, vector[int64_t]]] conf_vals
    cdef vector[vector[int64_t]] multi_vals
    cdef vector[unordered_map[int64_t, vector[int64_t]]] multi_offs
    cdef vector[int32_t] order_keys
    cdef dict counts  # anomaly name -> cases (explain)
    cdef dict exs  # anomaly name -> the first max_ex cases' raw fields
    cdef int64_t max_ex
    cdef cbool collect  # the passes count every case (explain), or stop at the first
    cdef cbool derived  # the passes ran: forget what they derived before they run again

    def __cinit__(self):
        self.kids = {}
        self.open_ops = []
        self.k_index, self.k_time, self.k_type, self.k_f = "index", "time", "type", "f"
        self.k_process, self.k_value = "process", "value"
        self.k_watermarks, self.k_producer = "watermarks", "producer"
        self.pos = 0
        self.last_time = INT64_MIN
        self.saw_subscribe = False
        self.saw_group = False
        self.n_sends = 0
        self.n_reads = 0
        self.collect = False
        self.derived = False

    # -- loading: `checkers.queue.load._load_fast`'s checks, into flat arrays ----------------

    cdef int32_t kid(self, object key) except -1:
        cdef object k
        try:
            k = self.kids.get(key)
        except TypeError:
            raise GiveUp()
        if k is None:
            k = len(self.kids)
            self.kids[key] = k
            self.keys.push_back(KeyState(False, False, False, 0))
            self.vals.push_back(ValMap())
            self.logs.push_back(LogMap())
            self.vorder.push_back(vector[int64_t]())
            self.conf_offs.push_back(vector[int64_t]())
            self.conf_vals.push_back(unordered_map[int64_t, vector[int64_t]]())
            self.multi_vals.push_back(vector[int64_t]())
            self.multi_offs.push_back(unordered_map[int64_t, vector[int64_t]]())
        return <int32_t>k

    cdef int32_t pid(self, int64_t process):
        cdef unordered_map[int64_t, int32_t].iterator it = self.pids.find(process)
        cdef int32_t p
        if it != self.pids.end():
            return deref(it).second
        p = <int32_t>self.open_at.size()
        self.pids[process] = p
        self.processes.push_back(process)
        self.open_at.push_back(-1)
        self.dead.push_back(False)
        self.open_ops.append(None)
        return p

    cdef int add_send(self, object key, object x) except -1:
        cdef Send s
        s.key = self.kid(key)
        if PyList_CheckExact(x):
            if len(<list>x) != 2:
                raise GiveUp()
            o = (<list>x)[0]
            s.off = NONE if o is None else as_int(o)
            s.val = as_int((<list>x)[1])
        else:
            s.off = NONE
            s.val = as_int(x)
        self.sends.push_back(s)
        return 0

    cdef int add_reads(self, dict m) except -1:
        cdef Group g
        cdef list pairs
        cdef list pair
        for k, ps in m.items():
            if not PyList_CheckExact(ps):
                raise GiveUp()
            pairs = <list>ps
            if not pairs:
                continue
            g.key = self.kid(k)
            g.p0 = <int32_t>self.poffs.size()
            for p in pairs:
                if not PyList_CheckExact(p) or len(<list>p) != 2:
                    raise GiveUp()
                pair = <list>p
                self.poffs.push_back(as_int(pair[0]))  # a null offset gives up
                self.pvals.push_back(as_int(pair[1]))
            g.p1 = <int32_t>self.poffs.size()
            self.groups.push_back(g)
        return 0

    cdef int parse_mops(self, object value, cbool with_reads) except -1:
        """`checkers.queue.codec.decode_into` (the micro-op shapes' one codec), into the arrays.

        The screen keeps its own loop over the same shapes for speed; tests/checkers/
        test_queue_screen.py holds it to the codec's decoder (via the explaining checker)."""
        if value is None:
            return 0
        cdef object polls = None  # the op's poll results: one dict, or a list of them
        if not PyList_CheckExact(value):
            raise GiveUp()
        for mop in <list>value:
            if not PyList_CheckExact(mop) or not mop:
                raise GiveUp()
            name = (<list>mop)[0]
            if name == "send":
                if len(<list>mop) != 3:
                    raise GiveUp()
                self.add_send((<list>mop)[1], (<list>mop)[2])
            elif name == "poll":
                if not with_reads or len(<list>mop) < 2 or (<list>mop)[1] is None:
                    continue
                m = (<list>mop)[1]
                if not PyDict_CheckExact(m):
                    raise GiveUp()
                if polls is None:
                    polls = m
                elif PyDict_CheckExact(polls):
                    polls = [polls, m]
                else:
                    polls.append(m)
            else:
                raise GiveUp()
        if polls is None:
            return 0
        if PyDict_CheckExact(polls):
            return self.add_reads(<dict>polls)
        # Several polls: their reads concatenated per key, in order (as `decode_into`).
        merged = {}
        for m in polls:
            for k, ps in (<dict>m).items():
                if not PyList_CheckExact(ps):
                    raise GiveUp()
                have = merged.get(k)
                merged[k] = ps if have is None else have + ps
        return self.add_reads(merged)

    cdef int add_record(self, int8_t f, int8_t kind, int64_t pos, int64_t inv, int32_t pid,
                        object value, object wm, cbool with_reads, cbool idem=False,
                        int64_t index=NONE) except -1:
        cdef Rec r
        cdef WM w
        r.pos = pos
        r.inv = inv
        r.index = pos if index == NONE else index
        r.idem = idem
        r.pid = pid
        r.kind = kind
        r.f = f
        r.committed = kind == OK
        r.assign_list = False
        r.s0 = <int32_t>self.sends.size()
        r.g0 = <int32_t>self.groups.size()
        r.w0 = <int32_t>self.wms.size()
        r.a0 = <int32_t>self.assign_keys.size()
        if f <= F_TXN:
            self.parse_mops(value, with_reads)
            if wm:
                if not PyDict_CheckExact(wm):
                    raise GiveUp()
                for k, marks in (<dict>wm).items():
                    if not PyDict_CheckExact(marks):
                        continue
                    # The checker reads `high` as an exact int (type is int) in one pass
                    # and as any int (bools too) in another: only exact ints or none here.
                    high = (<dict>marks).get("high")
                    low = (<dict>marks).get("low")
                    if ((high is not None and not PyLong_CheckExact(high))
                            or (low is not None and not PyLong_CheckExact(low))):
                        raise GiveUp()
                    w.key = self.kid(k)
                    w.high = NONE if high is None else as_int(high)
                    w.low = NONE if low is None else as_int(low)
                    self.wms.push_back(w)
        elif PyList_CheckExact(value):
            r.assign_list = True
            for k in <list>value:
                self.assign_keys.push_back(self.kid(k))
        elif isinstance(value, list):
            raise GiveUp()  # a list of another type: the checker's isinstance takes it
        r.s1 = <int32_t>self.sends.size()
        r.g1 = <int32_t>self.groups.size()
        r.w1 = <int32_t>self.wms.size()
        r.a1 = <int32_t>self.assign_keys.size()
        self.recs.push_back(r)
        return 0

    cdef int adopt_keys(self, dict op) except -1:
        """Look fields up by the very key objects of `op`: orjson hands out one object per
        short key, so dict lookups then succeed on identity instead of comparing text."""
        for key in op:
            if key == "index":
                self.k_index = key
            elif key == "time":
                self.k_time = key
            elif key == "type":
                self.k_type = key
            elif key == "f":
                self.k_f = key
            elif key == "process":
                self.k_process = key
            elif key == "value":
                self.k_value = key
            elif key == "watermarks":
                self.k_watermarks = key
            elif key == "producer":
                self.k_producer = key
        return 0

    def feed(self, list ops):
        """The next ops of the history, in order (the spec's op dicts)."""
        cdef int64_t pos = self.pos
        cdef int64_t t, inv_pos
        cdef int8_t kind, fc
        cdef int32_t p
        cdef dict op
        if ops and PyDict_CheckExact(ops[len(ops) - 1]):
            self.adopt_keys(<dict>ops[len(ops) - 1])
        for o in ops:
            if not PyDict_CheckExact(o):
                raise GiveUp()
            op = <dict>o
            index = op.get(self.k_index)
            time = op.get(self.k_time)
            typ = op.get(self.k_type)
            f = op.get(self.k_f)
            process = op.get(self.k_process)
            if as_int(index) != pos:
                raise GiveUp()
            t = as_int(time)
            if t < self.last_time:
                raise GiveUp()
            self.last_time = t
            if typ == "invoke":
                kind = -1
            elif typ == "ok":
                kind = OK
            elif typ == "info":
                kind = INFO
            elif typ == "fail":
                kind = FAIL
            else:
                raise GiveUp()
            if type(typ) is not str or type(f) is not str:
                raise GiveUp()
            if not PyLong_CheckExact(process):
                if process == "nemesis":
                    pos += 1
                    continue
                raise GiveUp()
            p = self.pid(as_int(process))
            if self.dead[p]:
                raise GiveUp()
            if kind < 0:
                if self.open_at[p] >= 0:
                    raise GiveUp()
                self.open_at[p] = pos
                self.open_ops[p] = op
                pos += 1
                continue
            inv_pos = self.open_at[p]
            if inv_pos < 0 or (<dict>self.open_ops[p]).get(self.k_f) != f:
                raise GiveUp()
            self.open_at[p] = -1
            self.open_ops[p] = None
            if kind == INFO:
                self.dead[p] = True
            if f == "commit" or op.get("rebalance") is not None:
                self.saw_group = True
            fc = f_code(f)
            if fc < 0:
                pos += 1
                continue
            if fc == F_SUBSCRIBE:
                self.saw_subscribe = True
            idem = False
            if fc <= F_TXN:
                producer = op.get(self.k_producer)
                if producer:
                    if not PyDict_CheckExact(producer):
                        raise GiveUp()
                    idem = bool((<dict>producer).get("idempotent"))
            self.add_record(fc, kind, pos, inv_pos, p, op.get(self.k_value),
                            op.get(self.k_watermarks) if fc <= F_TXN else None, True, idem)
            pos += 1
        self.pos = pos

    def close(self):
        """Invokes never completed count as info (`checkers.queue.ops.close_pending`),
        in the order they were invoked."""
        cdef int64_t end = self.pos
        cdef int8_t fc
        cdef int32_t p
        cdef vector[pair[int64_t, int32_t]] still_open
        for p in range(<int32_t>self.open_at.size()):
            if self.open_at[p] >= 0:
                still_open.push_back(pair[int64_t, int32_t](self.open_at[p], p))
        sort(still_open.begin(), still_open.end())
        for i in range(<int64_t>still_open.size()):
            p = still_open[i].second
            inv_op = <dict>self.open_ops[p]
            fc = f_code(inv_op.get(self.k_f))
            if fc == F_SUBSCRIBE:
                self.saw_subscribe = True
            if fc < 0 or fc > F_TXN:
                continue
            self.add_record(fc, INFO, end, self.open_at[p], p, inv_op.get(self.k_value), None, False,
                            False, as_int(inv_op.get(self.k_index)))
            end += 1
        for p in range(<int32_t>self.open_at.size()):
            self.open_at[p] = -1
            self.open_ops[p] = None

    # -- the checker's passes ------------------------------------------------------------
    #
    # One set of passes (`passes`, `op_cases`, `truncation_cases`) gives both answers.
    # `finish` (the screen) runs them as detectors: the first case of any anomaly stops
    # them (`hit` raises `_Fired`), and a history without one gets the checker's stats.
    # `explain` runs them to the end (`collect`), counting every case of every anomaly and
    # keeping the raw fields (record indices, key ids, values, offsets) of the first
    # `max_ex` of each, in the checker's order; `checkers.queue.native` builds the cases'
    # text from them with the checker's own case builders, and the cycles with its own
    # code. tests/checkers/test_queue_screen.py and test_queue_native.py hold both to the
    # checker's results.

    cdef VInfo* vinfo(self, int32_t k, int64_t v):
        """The (key, value) entry, made on first use with no writer and no offset."""
        cdef VInfo fresh
        cdef cbool made
        fresh.writer = -1
        fresh.first_off = NONE
        fresh.min_off = NONE
        fresh.max_off = NONE
        fresh.ok_read = False
        fresh.multi = False
        fresh.first_reader = -1
        return self.vals[k].get(v, fresh, &made)

    cdef inline void extend(self, int32_t k, int64_t o, int64_t v):
        """`VersionOrder.extend` of one pair: its log (first value per offset), `voff`,
        `conflicts` and `multi`."""
        cdef KeyState* ks = &self.keys[k]
        cdef cbool made
        cdef int64_t* at = self.logs[k].get(o, v, &made)
        cdef VInfo* vi
        cdef vector[int64_t]* vals
        cdef size_t j
        if not ks.has_order:
            ks.has_order = True
            self.order_keys.push_back(k)
        if not made:
            if at[0] == v:
                return
            if not ks.conflict or self.conf_vals[k].count(o) == 0:
                self.conf_offs[k].push_back(o)
                vals = &self.conf_vals[k][o]
                vals.push_back(at[0])
                vals.push_back(v)
            else:
                vals = &self.conf_vals[k][o]
                for j in range(vals.size()):
                    if deref(vals)[j] == v:
                        break
                else:
                    vals.push_back(v)
            ks.conflict = True
        vi = self.vinfo(k, v)
        if vi.first_off == NONE:
            vi.first_off = o
            vi.min_off = o
            vi.max_off = o
            self.vorder[k].push_back(v)
        elif vi.first_off != o:
            ks.multi = True
            vals = &self.multi_offs[k][v]
            if not vi.multi:
                vi.multi = True
                self.multi_vals[k].push_back(v)
                vals.push_back(vi.first_off)
                vals.push_back(o)
            else:
                for j in range(vals.size()):
                    if deref(vals)[j] == o:
                        break
                else:
                    vals.push_back(o)
            if o < vi.min_off:
                vi.min_off = o
            if o > vi.max_off:
                vi.max_off = o

    cdef void seal(self, int32_t k):
        cdef vector[int64_t]* offs = &self.offsets[k]
        cdef int64_t lo, span, i
        self.logs[k].keys(offs[0])
        sort(offs.begin(), offs.end())
        if offs.empty():
            return
        lo = deref(offs)[0]
        span = offs.back() - lo + 1
        if span <= 2 * <int64_t>offs.size() + 64:  # compact: a direct table
            self.keys[k].lo = lo
            self.dense[k].assign(span, -1)
            for i in range(<int64_t>offs.size()):
                self.dense[k][deref(offs)[i] - lo] = i

    cdef inline int64_t index_of_offset(self, int32_t k, int64_t o):
        """The index of offset `o` in key k's sealed version order, NONE if absent."""
        cdef int64_t d
        cdef vector[int64_t]* offs
        cdef vector[int64_t].iterator it
        if not self.dense[k].empty():
            d = o - self.keys[k].lo
            if d < 0 or d >= <int64_t>self.dense[k].size():
                return NONE
            d = self.dense[k][d]
            return NONE if d < 0 else d
        offs = &self.offsets[k]
        it = lower_bound(offs.begin(), offs.end(), o)
        if it == offs.end() or o != deref(it):
            return NONE
        return it - offs.begin()

    cdef inline int64_t first_index(self, int32_t k, int64_t v):
        """`VersionOrder.first_index` (a value sits at one offset once `multi` passed)."""
        cdef VInfo* vi = self.vals[k].find(v)
        if vi == NULL or vi.first_off == NONE:
            return NONE
        return self.index_of_offset(k, vi.min_off)

    def finish(self, cbool ww_deps=True, cbool prefix=False):
        """The checker's stats if no pass of it would record an anomaly, else the screen's
        word for the first case its passes find (`SCREEN_WORD`), or why the checker must look.

        prefix=True: the ops fed are the start of a longer history, so invokes still open
        are left open (they complete later) and the passes whose findings later ops may
        undo (lost-write, unseen, garbage-read) are skipped.
        """
        self.collect = False
        try:
            out = self.passes(ww_deps, prefix, None, None)
        except _Fired as e:
            return SCREEN_WORD.get(e.args[0], e.args[0])
        # The cycles (`checkers.queue.cycles._cyclic_core`): with backward edges, the
        # region's graph must have none.
        if not isinstance(out, str) and not self.spans.empty() and self.region_has_cycle(ww_deps):
            return "dependency cycle"
        return out

    def explain(self, cbool ww_deps=True, int64_t max_examples=32):
        """Every pass of the checker over the whole history (fed and not finished as a
        prefix), run to the end: a dict of stats, case counts and the first cases' raw
        fields, or the reason the checker must do it (a str)."""
        self.collect = True
        self.counts = {}
        self.exs = {}
        self.max_ex = max_examples
        unseen = {}
        garbage = []
        stats = self.passes(ww_deps, False, unseen, garbage)
        if isinstance(stats, str):
            return stats
        return {
            "stats": stats,
            "counts": self.counts,
            "examples": self.exs,
            "unseen": unseen,
            "garbage": garbage,
        }

    cdef void reset_derived(self):
        """Forget what the passes derived, keep what `feed` read."""
        cdef int64_t k, ri
        for k in range(<int64_t>self.keys.size()):
            self.keys[k] = KeyState(False, False, False, 0)
            self.vals[k] = ValMap()
            self.logs[k] = LogMap()
            self.vorder[k].clear()
            self.conf_offs[k].clear()
            self.conf_vals[k].clear()
            self.multi_vals[k].clear()
            self.multi_offs[k].clear()
        self.offsets.clear()
        self.dense.clear()
        self.order_keys.clear()
        self.spans.clear()
        self.chains.clear()
        self.n_sends = 0
        self.n_reads = 0
        for ri in range(<int64_t>self.recs.size()):
            self.recs[ri].committed = self.recs[ri].kind == OK

    cdef bint hit(self, object name) except -1:
        """A case of anomaly `name`. The screen stops at its first (raises `_Fired`);
        `explain` counts it and says whether its example is to be kept."""
        if not self.collect:
            raise _Fired(name)
        n = self.counts.get(name, 0) + 1
        self.counts[name] = n
        return n <= self.max_ex

    cdef int keep(self, object name, object case) except -1:
        lst = self.exs.get(name)
        if lst is None:
            self.exs[name] = lst = []
        lst.append(case)
        return 0

    cdef object passes(self, cbool ww_deps, cbool prefix, dict unseen, list garbage):
        """The checker's passes (`QueueAnalysis._index`, `_order_checks`,
        `_lost_and_unseen`, `_op_checks`, `_truncation_checks` and the start of
        `cycles._cyclic_core`: graph nodes, ww chains, backward edges): the checker's
        stats, or why the checker must run them (a str). `explain` also gets the unseen
        values (key id -> [cases, the first 32 (value, record)]) and the reads of values
        no completed op sent (`garbage`: the caller checks them against the invokes)."""
        cdef Rec* r
        cdef Send* s
        cdef Group* g
        cdef VInfo* vi
        cdef int64_t ri, si, gi, pi, nrec, n_keys, o, v, i, j, bound, bound_v, li
        cdef int64_t max_offset = -1
        cdef int64_t n_ok = 0, n_ok_data = 0, n_info = 0, n_fail = 0, n_nodes = 0
        cdef int32_t k, w, prev_w
        cdef size_t oi
        cdef cbool any_ok, all_read, ties
        cdef vector[pair[int64_t, int64_t]] lost  # (last index, position in voff order)
        cdef vector[int32_t] by_id
        if not prefix:
            self.close()
        if self.saw_group:
            return "consumer-group commits or rebalances"
        if self.derived:
            self.reset_derived()
        self.derived = True
        nrec = self.recs.size()
        n_keys = self.keys.size()
        self.offsets.resize(n_keys)
        self.dense.resize(n_keys)
        # ---- _index: writers, ok reads, version orders
        for ri in range(nrec):
            r = &self.recs[ri]
            if r.kind == OK:
                n_ok += 1
                if r.f <= F_TXN:
                    n_ok_data += 1
            elif r.kind == INFO:
                n_info += 1
            else:
                n_fail += 1
            self.n_sends += r.s1 - r.s0
            for si in range(r.s0, r.s1):
                s = &self.sends[si]
                vi = self.vinfo(s.key, s.val)
                if vi.writer < 0 or r.kind < self.recs[vi.writer].kind:
                    vi.writer = <int32_t>ri
                if r.kind == OK and s.off != NONE:
                    self.extend(s.key, s.off, s.val)
            for gi in range(r.g0, r.g1):
                g = &self.groups[gi]
                self.n_reads += g.p1 - g.p0
                for pi in range(g.p0, g.p1):
                    self.extend(g.key, self.poffs[pi], self.pvals[pi])
                    if r.kind == OK:
                        vi = self.vinfo(g.key, self.pvals[pi])
                        vi.ok_read = True
                        if vi.first_reader < 0:
                            vi.first_reader = <int32_t>ri
        if n_ok_data == 0 and not prefix:
            return "nothing checked"  # the checker says so, with its reason
        # proven info ops committed
        for ri in range(nrec):
            r = &self.recs[ri]
            if r.kind != INFO or r.s0 == r.s1:
                continue
            for si in range(r.s0, r.s1):
                s = &self.sends[si]
                vi = self.vinfo(s.key, s.val)
                if vi.ok_read and vi.writer == ri:
                    r.committed = True
                    break
            if r.committed:
                for si in range(r.s0, r.s1):
                    s = &self.sends[si]
                    if s.off != NONE:
                        self.extend(s.key, s.off, s.val)
        for oi in range(self.order_keys.size()):
            k = self.order_keys[oi]
            self.seal(k)
            if self.offsets[k].back() > max_offset:
                max_offset = self.offsets[k].back()
        # ---- _order_checks (the screen looks at the keys by id: its word names the first)
        by_id = self.order_keys
        if not self.collect:
            sort(by_id.begin(), by_id.end())
        for oi in range(by_id.size()):
            k = by_id[oi]
            for j in range(<int64_t>self.conf_offs[k].size()):
                o = self.conf_offs[k][j]
                if self.hit("inconsistent-offsets"):
                    values = [x for x in self.conf_vals[k][o]]
                    writers = []
                    for x in values:
                        vi = self.vals[k].find(x)
                        if vi != NULL and vi.writer >= 0:
                            writers.append(self.recs[vi.writer].index)
                    self.keep("inconsistent-offsets",
                              (k, o, self.index_of_offset(k, o), values, writers))
            for j in range(<int64_t>self.multi_vals[k].size()):
                v = self.multi_vals[k][j]
                w = self.vals[k].find(v).writer
                offs = sorted([x for x in self.multi_offs[k][v]]) if self.collect else None
                if self.hit("duplicate"):
                    self.keep("duplicate", (k, v, offs, w))
                if w >= 0 and self.recs[w].idem and self.hit("idempotence-duplicate"):
                    self.keep("idempotence-duplicate", (k, v, offs, w))
        # ---- _lost_and_unseen (not in a prefix: later ops may read what it has not)
        for oi in range(self.order_keys.size() if not prefix else 0):
            k = self.order_keys[oi]
            any_ok = False
            all_read = True
            ties = False
            bound = -1
            bound_v = 0
            for j in range(<int64_t>self.vorder[k].size()):
                v = self.vorder[k][j]
                vi = self.vals[k].find(v)
                if vi.ok_read:
                    any_ok = True
                    i = self.index_of_offset(k, vi.min_off)
                    if i > bound:
                        bound = i
                        bound_v = v
                        ties = False
                    elif i == bound:
                        ties = True
                else:
                    all_read = False
            if not any_ok or all_read or bound < 0:
                continue
            lost.clear()
            for j in range(<int64_t>self.vorder[k].size()):
                v = self.vorder[k][j]
                vi = self.vals[k].find(v)
                if vi.ok_read:
                    continue
                li = self.index_of_offset(k, vi.max_off)
                if li > bound or vi.writer < 0 or not self.recs[vi.writer].committed:
                    continue
                lost.push_back(pair[int64_t, int64_t](li, j))
            if lost.empty():
                continue
            if ties and self.collect:
                # Which of the values read at the bound the checker names depends on the
                # iteration order of its set of them: its own pass says.
                return "lost writes below a bound two values share"
            sort(lost.begin(), lost.end())
            reader = self.vals[k].find(bound_v).first_reader
            for j in range(<int64_t>lost.size()):
                if self.hit("lost-write"):
                    li = lost[j].first
                    v = self.vorder[k][lost[j].second]
                    self.keep("lost-write", (k, v, li, self.offsets[k][li], bound,
                                             self.offsets[k][bound], bound_v,
                                             self.vals[k].find(v).writer, reader))
        for ri in range(nrec if not prefix else 0):
            r = &self.recs[ri]
            if r.kind != OK:
                continue
            for si in range(r.s0, r.s1):
                s = &self.sends[si]
                vi = self.vals[s.key].find(s.val)
                if vi == NULL or not vi.ok_read:
                    if not self.collect:
                        raise _Fired("unseen")
                    u = unseen.get(s.key)
                    if u is None:
                        unseen[s.key] = u = [0, []]
                    u[0] += 1
                    if len(u[1]) < 32:
                        u[1].append((s.val, ri))
        # ---- _op_checks, then _truncation_checks on the keys it found suspect
        suspect = self.op_cases(prefix, garbage)
        if suspect:
            self.truncation_cases(suspect)
        # ---- the start of cycles._cyclic_core: graph nodes, ww chains, backward edges
        for ri in range(nrec):
            r = &self.recs[ri]
            if r.f <= F_TXN and r.committed:
                n_nodes += 1
        if ww_deps:
            for oi in range(self.order_keys.size()):
                k = self.order_keys[oi]
                prev_w = -1
                for j in range(<int64_t>self.offsets[k].size()):
                    v = self.logs[k].find(self.offsets[k][j])[0]
                    vi = self.vals[k].find(v)
                    w = -1 if vi == NULL else vi.writer
                    if w < 0 or w == prev_w or not self.recs[w].committed:
                        continue
                    if prev_w >= 0:
                        self.chains.push_back(pair[int32_t, int32_t](prev_w, w))
                        if prev_w > w:
                            self.spans.push_back(pair[int64_t, int64_t](w, prev_w))
                    prev_w = w
        return {
            "sends": self.n_sends,
            "reads": self.n_reads,
            "graph_nodes": n_nodes,
            "backward_edges": <int64_t>self.spans.size(),
            "cyclic_nodes": 0,
            "ops": nrec,
            "ok": n_ok,
            "info": n_info,
            "fail": n_fail,
            "keys": <int64_t>self.order_keys.size(),
            "max_offset": max_offset,
        }

    cdef object op_cases(self, cbool prefix, list garbage):
        """`QueueAnalysis._op_checks`; returns the suspect keys (a set of key ids: a gap
        inside a poll, or a conflicting offset) for `truncation_cases`. `explain` gets
        the reads of values nobody completed a send of in `garbage`."""
        cdef Rec* r
        cdef Send* s
        cdef Group* g
        cdef VInfo* vi
        cdef Pos last
        cdef Pos cur
        cdef int64_t ri, si, gi, pi, nrec = self.recs.size(), n_pids = self.open_at.size()
        cdef int64_t n_keys = self.keys.size(), i, j, bi, bv, prev_i, prev_v, first_i, delta
        cdef int64_t o, v, high
        cdef int32_t p, k, w
        cdef cbool is_ok, committed
        cdef vector[unordered_map[int32_t, Pos]] positions = \
            vector[unordered_map[int32_t, Pos]](n_pids)
        cdef vector[unordered_map[int32_t, Pos]] last_sends = \
            vector[unordered_map[int32_t, Pos]](n_pids)
        cdef vector[unordered_map[int32_t, pair[int64_t, int32_t]]] hw_seen = \
            vector[unordered_map[int32_t, pair[int64_t, int32_t]]](n_pids)
        cdef vector[vector[int64_t]] send_pos = vector[vector[int64_t]](n_keys)
        cdef vector[vector[int64_t]] send_top = vector[vector[int64_t]](n_keys)
        cdef vector[vector[int32_t]] send_rec = vector[vector[int32_t]](n_keys)
        cdef vector[vector[int64_t]] hw_pos = vector[vector[int64_t]](n_keys)
        cdef vector[vector[int64_t]] hw_top = vector[vector[int64_t]](n_keys)
        cdef vector[vector[int32_t]] hw_rec = vector[vector[int32_t]](n_keys)
        cdef unordered_map[int32_t, Pos] this_i
        cdef vector[pair[int32_t, Pos]] firsts
        cdef unordered_set[int32_t] keep
        cdef unordered_map[int32_t, Pos].iterator it
        cdef unordered_map[int32_t, pair[int64_t, int32_t]].iterator hit_
        suspect = set()
        for ri in range(nrec):
            r = &self.recs[ri]
            p = r.pid
            if r.f >= F_ASSIGN:
                # assign/subscribe keep the positions of keys still assigned
                if r.kind != FAIL and r.assign_list:
                    keep.clear()
                    for i in range(r.a0, r.a1):
                        keep.insert(self.assign_keys[i])
                    keep_only(&positions[p], &keep)
                    keep_only(&last_sends[p], &keep)
                continue
            is_ok = r.kind == OK
            committed = r.committed
            # ---- reads
            for gi in range(r.g0, r.g1):
                g = &self.groups[gi]
                k = g.key
                prev_i = NONE
                prev_v = 0
                for pi in range(g.p0, g.p1):
                    o = self.poffs[pi]
                    v = self.pvals[pi]
                    vi = self.vals[k].find(v)
                    w = -1 if vi == NULL else vi.writer
                    if w < 0:
                        if self.collect:
                            garbage.append((ri, k, o, v))
                        elif not prefix:  # (a prefix: its writer may not have completed yet)
                            raise _Fired("garbage-read")  # or a value only an invoke tried
                    elif w == ri:
                        if self.hit("precommitted-read"):
                            self.keep("precommitted-read", (ri, k, o, v))
                    elif is_ok and self.recs[w].kind == FAIL:
                        if self.hit("G1a"):
                            self.keep("G1a", (ri, w, k, o, v))
                    elif self.recs[w].pos > r.pos and self.recs[w].committed and committed:
                        # A wr edge against completion order: where cycles may lie.
                        self.spans.push_back(pair[int64_t, int64_t](ri, w))
                    i = self.index_of_offset(k, o)
                    if prev_i != NONE and i != NONE:
                        delta = i - prev_i
                        if delta > 1:
                            suspect.add(k)
                            if self.hit("int-poll-skip"):
                                self.keep("int-poll-skip", (ri, ri, k, prev_v, v, prev_i, i))
                        elif delta < 1:
                            if self.hit("int-nonmonotonic-poll"):
                                self.keep("int-nonmonotonic-poll", (ri, ri, k, prev_v, v, delta))
                    prev_i = i
                    prev_v = v
                first_i = self.index_of_offset(k, self.poffs[g.p0])
                it = positions[p].find(k)
                if it != positions[p].end():
                    last = deref(it).second
                    if last.i != NONE and first_i != NONE:
                        delta = first_i - last.i
                        if delta > 1:
                            if self.hit("poll-skip"):
                                self.keep("poll-skip", (last.ri, ri, k, last.v,
                                                        self.pvals[g.p0], last.i, first_i))
                        elif delta < 1:
                            if self.hit("nonmonotonic-poll"):
                                self.keep("nonmonotonic-poll", (last.ri, ri, k, last.v,
                                                                self.pvals[g.p0], delta))
                if is_ok:
                    cur.i = prev_i
                    cur.v = prev_v
                    cur.ri = <int32_t>ri
                    positions[p][k] = cur
            # ---- sends
            if r.s1 - r.s0 == 1 and committed:
                s = &self.sends[r.s0]
                k = s.key
                i = NONE
                if self.keys[k].has_order:
                    if s.off != NONE:
                        i = self.index_of_offset(k, s.off)
                    if i == NONE:
                        i = self.first_index(k, s.val)
                it = last_sends[p].find(k)
                if it != last_sends[p].end():
                    last = deref(it).second
                    if last.i != NONE and i != NONE and i - last.i < 1:
                        if self.hit("nonmonotonic-send"):
                            self.keep("nonmonotonic-send", (last.ri, ri, k, last.v, s.val,
                                                            i - last.i))
                cur.i = i
                cur.v = s.val
                cur.ri = <int32_t>ri
                last_sends[p][k] = cur
            elif r.s1 > r.s0:
                this_i.clear()
                firsts.clear()
                for si in range(r.s0, r.s1):
                    s = &self.sends[si]
                    k = s.key
                    if not self.keys[k].has_order:
                        i = NONE
                    elif committed and s.off != NONE:
                        i = self.index_of_offset(k, s.off)
                    else:
                        i = self.first_index(k, s.val)
                    cur.i = i
                    cur.v = s.val
                    cur.ri = <int32_t>ri
                    it = this_i.find(k)
                    if it == this_i.end():
                        firsts.push_back(pair[int32_t, Pos](k, cur))
                    else:
                        bi = deref(it).second.i
                        bv = deref(it).second.v
                        if bi != NONE and i != NONE:
                            delta = i - bi
                            if delta > 1:
                                if self.hit("int-send-skip"):
                                    self.keep("int-send-skip", (ri, ri, k, bv, s.val, bi, i))
                            elif delta < 1:
                                if self.hit("int-nonmonotonic-send"):
                                    self.keep("int-nonmonotonic-send",
                                              (ri, ri, k, bv, s.val, delta))
                    this_i[k] = cur
                if committed:
                    for j in range(<int64_t>firsts.size()):
                        k = firsts[j].first
                        i = firsts[j].second.i
                        it = last_sends[p].find(k)
                        if it != last_sends[p].end():
                            last = deref(it).second
                            if last.i != NONE and i != NONE and i - last.i < 1:
                                if self.hit("nonmonotonic-send"):
                                    self.keep("nonmonotonic-send",
                                              (last.ri, ri, k, last.v, firsts[j].second.v,
                                               i - last.i))
                        last_sends[p][k] = this_i[k]
            if not is_ok:
                continue
            # ---- realtime send order: no ok send below a send completed before its invoke
            for si in range(r.s0, r.s1):
                s = &self.sends[si]
                if s.off == NONE:
                    continue
                k = s.key
                j = above_earlier_max(&send_pos[k], &send_top[k], &send_rec[k], r.pos, r.inv,
                                      s.off, <int32_t>ri)
                if j >= 0 and self.hit("realtime-send-order"):
                    self.keep("realtime-send-order", (send_rec[k][j], send_top[k][j], ri,
                                                      k, s.off, s.val))
            # ---- watermarks: no ok op sees a high watermark below one its process saw
            # before, or one seen before it was invoked
            for i in range(r.w0, r.w1):
                high = self.wms[i].high
                if high == NONE:
                    continue
                k = self.wms[i].key
                if self.collect:
                    # The screen needs no per-process pass: a process's previous op
                    # completed before its next was invoked, so every per-process
                    # regression is also a real-time one.
                    hit_ = hw_seen[p].find(k)
                    if hit_ != hw_seen[p].end() and high < deref(hit_).second.first:
                        if self.hit("hw-regression"):
                            self.keep("hw-regression", (deref(hit_).second.second,
                                                        deref(hit_).second.first, ri, k, high))
                    hw_seen[p][k] = pair[int64_t, int32_t](high, <int32_t>ri)
                j = above_earlier_max(&hw_pos[k], &hw_top[k], &hw_rec[k], r.pos, r.inv, high,
                                      <int32_t>ri)
                if j >= 0 and self.hit("hw-regression-realtime"):
                    self.keep("hw-regression-realtime", (hw_rec[k][j], hw_top[k][j], ri, k, high))
        for k in range(<int32_t>n_keys):
            if self.keys[k].conflict:
                suspect.add(k)
        return suspect

    cdef void region(self, cbool ww_deps, vector[int32_t]* nodes, vector[vector[int32_t]]* adj):
        """The reduced dependency graph of `cycles._cyclic_core` over the region the
        backward edges span: `nodes`, the region's record indices in completion order;
        `adj`, adjacency lists, the realtime chain's virtual nodes after the region's.

        Ops in completion order, realtime edges point forward, so every cycle lies inside
        the span of one of its backward edges (`spans`). The committed ops inside their
        union (the region) get a graph that keeps reachability: ww chain edges, a wr edge
        from the writer of the highest pair each op read of a key (all its reads' writers
        without ww_deps, or where the key's offsets conflict), and realtime order as a
        chain of virtual nodes.
        """
        cdef int64_t nrec = self.recs.size(), i, j, a, lo, hi, n_inv, n_real, best
        cdef int32_t ri, w, k, last, v
        cdef cbool fresh
        cdef Rec* r
        cdef Group* g
        cdef VInfo* vi
        cdef vector[int32_t] ridx = vector[int32_t](nrec, -1)
        cdef vector[pair[int64_t, int32_t]] invs
        cdef vector[pair[int64_t, int64_t]] spans = self.spans
        sort(spans.begin(), spans.end())
        i = 0
        while i < <int64_t>spans.size():
            lo = spans[i].first
            hi = spans[i].second
            i += 1
            while i < <int64_t>spans.size() and spans[i].first <= hi:
                if spans[i].second > hi:
                    hi = spans[i].second
                i += 1
            for a in range(lo, hi + 1):
                r = &self.recs[a]
                if r.f <= F_TXN and r.committed and ridx[a] < 0:
                    ridx[a] = <int32_t>nodes.size()
                    nodes.push_back(<int32_t>a)
        n_real = nodes.size()
        adj.resize(n_real)
        for j in range(<int64_t>self.chains.size()):
            if ridx[self.chains[j].first] >= 0 and ridx[self.chains[j].second] >= 0:
                adj[0][ridx[self.chains[j].first]].push_back(ridx[self.chains[j].second])
        for i in range(n_real):
            ri = deref(nodes)[i]
            r = &self.recs[ri]
            for j in range(r.g0, r.g1):
                g = &self.groups[j]
                k = g.key
                if ww_deps and not self.keys[k].conflict:
                    best = g.p0  # the highest (offset, value) pair read, as max(pairs)
                    for a in range(g.p0 + 1, g.p1):
                        if (self.poffs[a] > self.poffs[best] or (self.poffs[a] == self.poffs[best]
                                and self.pvals[a] > self.pvals[best])):
                            best = a
                    vi = self.vals[k].find(self.pvals[best])
                    if vi != NULL and vi.writer >= 0 and vi.writer != ri:
                        w = vi.writer
                        if self.recs[w].committed:
                            if ridx[w] >= 0:
                                adj[0][ridx[w]].push_back(<int32_t>i)
                            continue
                for a in range(g.p0, g.p1):
                    vi = self.vals[k].find(self.pvals[a])
                    if vi == NULL or vi.writer < 0 or vi.writer == ri:
                        continue
                    w = vi.writer
                    if self.recs[w].committed and ridx[w] >= 0:
                        adj[0][ridx[w]].push_back(<int32_t>i)
        # realtime: op i reaches op j through virtual nodes when i completed ok before j
        # was invoked (`cycles._link_realtime`)
        for i in range(n_real):
            if self.recs[deref(nodes)[i]].inv >= 0:
                invs.push_back(pair[int64_t, int32_t](self.recs[deref(nodes)[i]].inv, <int32_t>i))
        sort(invs.begin(), invs.end())
        n_inv = invs.size()
        j = 0
        last = -1
        fresh = False
        for i in range(n_real):
            r = &self.recs[deref(nodes)[i]]
            while j < n_inv and invs[j].first < r.pos:
                if last >= 0:
                    adj[0][last].push_back(invs[j].second)
                    fresh = True
                j += 1
            if r.kind == OK:
                if last < 0 or fresh:
                    v = <int32_t>adj.size()
                    adj.push_back(vector[int32_t]())
                    if last >= 0:
                        adj[0][last].push_back(v)
                    last = v
                    fresh = False
                adj[0][i].push_back(last)
        if last >= 0:
            while j < n_inv:
                adj[0][last].push_back(invs[j].second)
                j += 1

    cdef cbool region_has_cycle(self, cbool ww_deps):
        """Whether the dependency graph has a cycle, found as `cycles._cyclic_core` does:
        a strongly connected component of two or more nodes exists exactly when the
        region's graph (`region`) is not acyclic, which Kahn's algorithm tells."""
        cdef int64_t i, j, n_all, removed, node
        cdef vector[int32_t] nodes
        cdef vector[vector[int32_t]] adj
        cdef vector[int32_t] indeg
        cdef vector[int32_t] ready
        self.region(ww_deps, &nodes, &adj)
        # Kahn: peel nodes without predecessors; what cannot be peeled lies on a cycle
        n_all = adj.size()
        indeg.assign(n_all, 0)
        for i in range(n_all):
            for j in range(<int64_t>adj[i].size()):
                indeg[adj[i][j]] += 1
        for i in range(n_all):
            if indeg[i] == 0:
                ready.push_back(<int32_t>i)
        removed = 0
        while not ready.empty():
            node = ready.back()
            ready.pop_back()
            removed += 1
            for j in range(<int64_t>adj[node].size()):
                indeg[adj[node][j]] -= 1
                if indeg[adj[node][j]] == 0:
                    ready.push_back(adj[node][j])
        return removed < n_all

    cdef int truncation_cases(self, set suspect) except -1:
        """`QueueAnalysis._truncation_checks` over the suspect keys."""
        cdef Rec* r
        cdef Group* g
        cdef Send* s
        cdef Committed c
        cdef int64_t ri, gi, pi, si, wi, nrec = self.recs.size(), n_keys = self.keys.size()
        cdef int64_t o, v, lo, prev_o, high, lw
        cdef int32_t k
        cdef vector[cbool] is_suspect = vector[cbool](n_keys, False)
        cdef vector[cmap[int64_t, Committed]] cm = vector[cmap[int64_t, Committed]](n_keys)
        cdef vector[int64_t] low = vector[int64_t](n_keys, -1)
        cdef cmap[int64_t, Committed].iterator it
        for x in suspect:
            is_suspect[<int32_t>x] = True
        for ri in range(nrec):
            r = &self.recs[ri]
            if r.kind != OK or r.f > F_TXN:
                continue
            for gi in range(r.g0, r.g1):
                g = &self.groups[gi]
                k = g.key
                if not is_suspect[k] or cm[k].empty():
                    continue
                lo = low[k]
                prev_o = NONE
                for pi in range(g.p0, g.p1):
                    o = self.poffs[pi]
                    v = self.pvals[pi]
                    it = cm[k].find(o)
                    if it != cm[k].end():
                        c = deref(it).second
                        if c.pos < r.inv and c.v != v and o >= lo:
                            if self.hit("committed-truncation"):
                                self.keep("committed-truncation", (False, c.ri, k, o, c.v, ri, v))
                    if prev_o != NONE and o > prev_o + 1:
                        it = cm[k].lower_bound(prev_o + 1)
                        while it != cm[k].end() and deref(it).first < o:
                            c = deref(it).second
                            if c.pos < r.inv and deref(it).first >= lo:
                                if self.hit("committed-truncation"):
                                    self.keep("committed-truncation",
                                              (True, c.ri, k, deref(it).first, c.v, ri,
                                               prev_o, o))
                            inc(it)
                    prev_o = o
            for wi in range(r.w0, r.w1):
                k = self.wms[wi].key
                if not is_suspect[k]:
                    continue
                lw = self.wms[wi].low
                if lw != NONE and lw > low[k]:
                    low[k] = lw
                high = self.wms[wi].high
                if high == NONE:
                    continue
                c.pos = r.pos
                c.ri = <int32_t>ri
                for gi in range(r.g0, r.g1):
                    g = &self.groups[gi]
                    if g.key != k:
                        continue
                    for pi in range(g.p0, g.p1):
                        o = self.poffs[pi]
                        if o < high and cm[k].count(o) == 0:
                            c.v = self.pvals[pi]
                            cm[k][o] = c
                for si in range(r.s0, r.s1):
                    s = &self.sends[si]
                    if s.key == k and s.off != NONE and s.off < high and cm[k].count(s.off) == 0:
                        c.v = s.val
                        cm[k][s.off] = c
        return 0

    # -- what `checkers.queue.native` reads after `explain` -------------------------------

    def key_ids(self):
        """key -> key id."""
        return self.kids

    def record(self, int64_t ri):
        """(f, kind, pos, index, inv, process, committed, idem, sends, reads) of a record:
        sends as [(key id, offset or None, value)], reads as [(key id, [[o, v], ...])]."""
        cdef Rec* r = &self.recs[ri]
        cdef Send* s
        cdef Group* g
        cdef int64_t si, gi, pi
        sends = []
        for si in range(r.s0, r.s1):
            s = &self.sends[si]
            sends.append((s.key, None if s.off == NONE else s.off, s.val))
        reads = []
        for gi in range(r.g0, r.g1):
            g = &self.groups[gi]
            reads.append((g.key, [[self.poffs[pi], self.pvals[pi]] for pi in range(g.p0, g.p1)]))
        return (("send", "poll", "txn", "assign", "subscribe")[r.f], r.kind, r.pos, r.index,
                r.inv, self.processes[r.pid], r.committed, r.idem, sends, reads)

    def writer_of(self, int32_t k, int64_t v):
        """The record index of the writer of (key id, value), -1 if none."""
        cdef VInfo* vi = self.vals[k].find(v)
        return -1 if vi == NULL else vi.writer

    def order_parts(self, int32_t k):
        """Key k's version order: (offsets, their first values, [(value, first offset)]
        in the order first seen, {value: offsets} of values at several, {offset: values}
        of conflicting offsets in the order found); None if it has none."""
        cdef int64_t j, o
        if not self.keys[k].has_order:
            return None
        offsets = [o for o in self.offsets[k]]
        values = [self.logs[k].find(o)[0] for o in self.offsets[k]]
        voff = [(v, self.vals[k].find(v).first_off) for v in self.vorder[k]]
        multi = {v: set(self.multi_offs[k][v]) for v in self.multi_vals[k]}
        conflicts = {}
        for j in range(<int64_t>self.conf_offs[k].size()):
            o = self.conf_offs[k][j]
            conflicts[o] = [v for v in self.conf_vals[k][o]]
        return offsets, values, voff, multi, conflicts

    def chains_among(self, list alive):
        """The ww chain edges (`explain`'s, in its order) between the records `alive`, as
        completion positions."""
        cdef unordered_set[int32_t] members
        cdef size_t j
        for ri in alive:
            members.insert(<int32_t>ri)
        out = []
        for j in range(self.chains.size()):
            if members.count(self.chains[j].first) and members.count(self.chains[j].second):
                out.append((self.recs[self.chains[j].first].pos,
                            self.recs[self.chains[j].second].pos))
        return out

    def region_graph(self, cbool ww_deps=True):
        """`region`, for `checkers.queue.native`: (the region's record indices in completion
        order, adjacency lists with the realtime chain's virtual nodes after the region's)."""
        cdef vector[int32_t] nodes
        cdef vector[vector[int32_t]] adj
        self.region(ww_deps, &nodes, &adj)
        return nodes, adj
