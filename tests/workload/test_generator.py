"""Generators, driven deterministically by a simulated single-threaded interpreter."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from isrlab.checkers.queue import codec
from isrlab.harness import generator as g
from isrlab.harness.generator import NS, Context, Pending
from isrlab.harness.workloads.queue.generator import QueueWorkload, queue_test

Op = dict[str, Any]
Reply = Callable[[Op, int | str], Op]


def ok(op: Op, process: int | str) -> Op:
    return {**op, "type": "ok"}


def drive(
    gen: g.Generator,
    threads: list[int | str],
    *,
    seed: int = 7,
    reply: Reply = ok,
    step_ns: int = NS // 1000,
    max_steps: int = 100_000,
    concurrency: int | None = None,
) -> list[tuple[int, int | str, Op]]:
    """Round-robin the threads over a fake clock; every op completes at once via `reply`.

    Returns (time, thread, invoke) triples. A thread that gets None is retired; after an
    info completion its process advances by the number of client threads.
    """
    rng = random.Random(seed)
    n = concurrency or sum(1 for t in threads if isinstance(t, int))
    process: dict[int | str, int | str] = {t: t for t in threads}
    live = list(threads)
    now = 0
    out: list[tuple[int, int | str, Op]] = []
    for _ in range(max_steps):
        if not live:
            return out
        progressed = False
        wake: list[int] = []
        for t in list(live):
            ctx = Context(now, t, process[t], threads, rng)
            r = gen.op(ctx)
            if r is None:
                live.remove(t)
                continue
            if isinstance(r, Pending):
                if r.at is not None:
                    wake.append(r.at)
                continue
            progressed = True
            inv = {**r, "process": process[t], "type": "invoke"}
            gen.update(ctx, inv)
            out.append((now, t, inv))
            done = reply(inv, process[t])
            gen.update(Context(now, t, process[t], threads, rng), done)
            if done["type"] == "info" and isinstance(t, int):
                process[t] = int(process[t]) + n
        now = max(now + step_ns, min(wake)) if (wake and not progressed) else now + step_ns
    raise AssertionError("generator did not finish")


def test_limit_once_repeat_seq() -> None:
    gen = g.seq(g.once({"f": "a"}), g.limit(3, g.repeat({"f": "b", "value": 1})))
    fs = [op["f"] for _, _, op in drive(gen, [0, 1])]
    assert fs == ["a", "b", "b", "b"]


def test_time_limit_and_sleep() -> None:
    gen = g.seq(g.time_limit(0.01, g.repeat({"f": "x"})), g.sleep(0.5), g.once({"f": "y"}))
    ops = drive(gen, [0], step_ns=NS // 1000)
    xs = [t for t, _, op in ops if op["f"] == "x"]
    ys = [t for t, _, op in ops if op["f"] == "y"]
    assert len(xs) == 10 and max(xs) < 0.01 * NS
    assert len(ys) == 1 and ys[0] >= 0.51 * NS - NS // 1000


def test_stagger_spreads_ops_over_all_threads() -> None:
    gen = g.time_limit(10, g.stagger(0.1, g.repeat({"f": "x"})))
    ops = drive(gen, [0, 1, 2, 3], step_ns=NS // 100)
    # mean interval 0.1 s over 10 s: about 100 ops in total, not per thread
    assert 70 <= len(ops) <= 130
    assert g.rate(0, {"f": "x"}) is not None  # rate 0 = unlimited, no wrapper


def test_mix_weights_and_exhaustion() -> None:
    gen = g.limit(4000, g.mix([g.repeat({"f": "a"}), g.limit(5, g.repeat({"f": "b"}))], [1.0, 1.0]))
    c = Counter(op["f"] for _, _, op in drive(gen, [0]))
    assert c == {"a": 3995, "b": 5}
    with pytest.raises(ValueError):
        g.mix([{"f": "a"}], [1.0, 2.0])


def test_phases_wait_for_every_thread() -> None:
    # Thread 0 has 1 op in phase one, thread 1 has 5: phase two starts after all six.
    extra = g.fn(lambda ctx: None)
    counts = {0: 1, 1: 5}

    def phase1(ctx: Context) -> Op | None:
        if counts[int(ctx.thread)] == 0:
            return None
        counts[int(ctx.thread)] -= 1
        return {"f": "p1"}

    gen = g.phases(g.fn(phase1), extra, g.each_thread(lambda: g.once({"f": "p2"})))
    ops = drive(gen, [0, 1])
    fs = [op["f"] for _, _, op in ops]
    assert fs == ["p1"] * 6 + ["p2", "p2"]


def test_clients_and_nemesis_routing() -> None:
    gen = g.any_of(
        g.clients(g.limit(6, g.repeat({"f": "c"}))),
        g.nemesis(g.limit(2, g.repeat({"f": "start-pause"}))),
    )
    ops = drive(gen, [0, 1, "nemesis"])
    by = Counter((t == "nemesis", op["f"]) for _, t, op in ops)
    assert by == {(False, "c"): 6, (True, "start-pause"): 2}


def test_until_ok() -> None:
    replies = iter(["fail", "info", "ok", "ok"])

    def reply(op: Op, p: int | str) -> Op:
        return {**op, "type": next(replies)}

    ops = drive(g.until_ok(g.repeat({"f": "x"})), [0], reply=reply)
    assert len(ops) == 3


def test_map_filter() -> None:
    src = g.limit(10, g.fn(lambda ctx: {"f": "x", "value": int(ctx.time // 1000)}))
    evens = g.gen_filter(lambda op: op["value"] % 2 == 0, src)
    doubled = g.gen_map(lambda op: {**op, "value": op["value"] * 10}, evens)
    vals = [op["value"] for _, _, op in drive(doubled, [0], step_ns=1000)]
    assert vals and all(v % 20 == 0 for v in vals)


def _queue_reply(state: dict[str, list[int]]) -> Reply:
    """A perfect single-log broker: sends get the next offset, polls read everything new."""
    pos: dict[int | str, dict[str, int]] = {}

    def reply(op: Op, p: int | str) -> Op:
        if op["f"] in ("assign", "subscribe"):
            pos[p] = {k: pos.get(p, {}).get(k, 0) for k in op["value"]}
            return {**op, "type": "ok"}
        if op["f"] == "commit":
            return {**op, "type": "ok", "value": [["commit", dict(pos.get(p, {}))]]}
        if op["f"] == "crash":
            return {**op, "type": "info"}
        out = []
        for mop in op["value"]:
            if mop[0] == "send":
                log = state.setdefault(mop[1], [])
                log.append(mop[2])
                out.append(["send", mop[1], [len(log) - 1, mop[2]]])
            else:
                read = {}
                for k, at in pos.get(p, {}).items():
                    log = state.get(k, [])
                    if at < len(log):
                        read[k] = [[o, log[o]] for o in range(at, len(log))]
                        pos[p][k] = len(log)
                out.append(["poll", read])
        return {**op, "type": "ok", "value": out}

    return reply


KEYS = [f"t{i}/0" for i in range(4)]


def _workload_ops(seed: int, **extra: Any) -> list[tuple[int, int | str, Op]]:
    test = {"keys": KEYS, "concurrency": 3, "time_limit": 0.05, "final_time_limit": 5}
    test.update(extra)
    w = QueueWorkload(test)
    return drive(queue_test(w, test), [0, 1, 2], seed=seed, reply=_queue_reply({}))


def test_queue_workload_is_deterministic_with_a_seed() -> None:
    a, b, c = _workload_ops(1), _workload_ops(1), _workload_ops(2)
    assert a == b
    assert a != c


def test_queue_workload_shapes_and_values() -> None:
    ops = _workload_ops(3)
    first: dict[int | str, str] = {}
    sent: dict[str, list[int]] = {}
    for _, _, op in ops:
        first.setdefault(op["process"], op["f"])
        # only hints for the client (stripped by the interpreter) besides the spec's fields
        assert set(op) - {"process", "type", "f", "value"} <= {"_poll_ms", "_seek"}
        if op["f"] == "send":
            assert 1 <= len(op["value"]) <= 1  # Jepsen: one send per op without txn
            for m, k, v in op["value"]:
                assert m == "send" and k in KEYS
                sent.setdefault(k, []).append(v)
        elif op["f"] == "poll":
            assert op["value"] == [["poll"]]
        elif op["f"] == "assign":
            assert op["value"] and set(op["value"]) <= set(KEYS)
            assert op["value"] == sorted(op["value"])
        else:
            assert op["f"] == "crash" and op["value"] is None
    # every process starts by assigning; values are unique and increasing per key
    assert set(first.values()) == {"assign"}
    for vs in sent.values():
        assert vs == sorted(vs) and len(set(vs)) == len(vs)
    assert sum(len(v) for v in sent.values()) > 20


def test_workload_ops_are_the_codecs_shapes() -> None:
    # The generator writes what the checker's codec reads: every invoke of every data op
    # decodes, and encoding the decoded micro-ops gives the same value back.
    ops = [
        op for seed in (1, 2) for txn in (False, True) for _, _, op in _workload_ops(seed, txn=txn)
    ]
    data = [op for op in ops if op["f"] in codec.DATA_FS]
    assert {op["f"] for op in data} >= {"send", "poll"}
    for op in data:
        mops = codec.decode_value(op["value"])
        assert [codec.encode(m) for m in mops] == op["value"]
        assert all(isinstance(m, codec.Send | codec.Poll) for m in mops)
        assert all(m.reads is None for m in mops if isinstance(m, codec.Poll))


def test_final_drain_polls_until_every_offset_is_read() -> None:
    state: dict[str, list[int]] = {}
    test = {"keys": KEYS, "concurrency": 2, "time_limit": 0.02, "final_time_limit": 5}
    w = QueueWorkload(test)
    ops = drive(queue_test(w, test), [0, 1], seed=5, reply=_queue_reply(state))
    assert w.max_offsets == {k: len(v) - 1 for k, v in state.items()}
    final_start = min(i for i, (t, _, _) in enumerate(ops) if t >= 0.02 * NS)
    tail = [(th, op) for _, th, op in ops[final_start:]]
    for th in (0, 1):
        mine = [op["f"] for t, op in tail if t == th]
        # crash (new client), assign everything from the beginning, then polls; then stop
        assert mine[:2] == ["crash", "assign"] and set(mine[2:]) == {"poll"}
        assert len(mine) <= 4  # the perfect broker hands everything over in one poll
    assigns = [op for _, op in tail if op["f"] == "assign"]
    assert all(op["value"] == sorted(KEYS) for op in assigns)


def test_final_drain_gives_up_at_the_final_time_limit() -> None:
    def never_reads(op: Op, p: int | str) -> Op:
        if op["f"] == "poll":
            return {**op, "type": "ok", "value": [["poll", {}]]}
        if op["f"] == "send":
            return {**op, "type": "ok", "value": [["send", k, [9, v]] for _, k, v in op["value"]]}
        return {**op, "type": "info" if op["f"] == "crash" else "ok"}

    test = {"keys": KEYS, "concurrency": 1, "time_limit": 0.01, "final_time_limit": 0.05}
    w = QueueWorkload(test)
    ops = drive(queue_test(w, test), [0], reply=never_reads)
    assert ops[-1][0] < 0.01 * NS + 0.05 * NS + NS // 100


def test_txn_ops_and_crashes() -> None:
    ops = _workload_ops(4, txn=True, crash_clients=True, crash_client_interval=0.01)
    fs = Counter(op["f"] for _, _, op in ops)
    assert fs["txn"] > 5 and fs["crash"] >= 2
    lengths = {len(op["value"]) for _, _, op in ops if op["f"] == "txn"}
    assert max(lengths) <= 4 and len(lengths) > 1
    # after a crash (info) the thread continues as process + concurrency
    procs = {op["process"] for _, _, op in ops}
    assert any(isinstance(p, int) and p >= 3 for p in procs)


def test_poll_unseen_steers_assignments() -> None:
    w = QueueWorkload({"keys": KEYS, "assign_keys": 1})
    ctx = Context(0, 0, 0, [0], random.Random(1))
    w._track(ctx, {"type": "ok", "f": "send", "value": [["send", "t3/0", [4, 0]]]})
    assert w.sent == {"t3/0": 4}
    steered = [w.assign_op(random.Random(i))["value"] for i in range(60)]
    assert sum("t3/0" in v for v in steered) > 60 // 4 + 60 // 3 // 2
    w._track(ctx, {"type": "ok", "f": "poll", "value": [["poll", {"t3/0": [[4, 0]]}]]})
    assert w.sent == {}


def test_workload_needs_keys() -> None:
    with pytest.raises(ValueError, match="keys"):
        QueueWorkload({})
    with pytest.raises(ValueError, match="sub_via"):
        QueueWorkload({"keys": KEYS, "sub_via": ["seek"]})


def test_sub_via_mixes_assign_and_subscribe() -> None:
    w = QueueWorkload({"keys": KEYS, "sub_via": ["assign", "subscribe"]})
    rng = random.Random(3)
    assert {w.assign_op(rng)["f"] for _ in range(50)} == {"assign", "subscribe"}


def test_each_process_restarts_after_info() -> None:
    kinds = iter(["ok", "info", "ok", "ok", "ok", "ok"])

    def reply(op: Op, p: int | str) -> Op:
        return {**op, "type": next(kinds)}

    gen = g.limit(5, g.each_process(lambda: g.seq({"f": "open"}, g.repeat({"f": "work"}))))
    ops = [(op["process"], op["f"]) for _, _, op in drive(gen, [0], reply=reply)]
    assert ops == [(0, "open"), (0, "work"), (1, "open"), (1, "work"), (1, "work")]


def test_stuck_final_drain_starts_over_with_a_fresh_client() -> None:
    def never_reads(op: Op, p: int | str) -> Op:
        if op["f"] == "poll":
            return {**op, "type": "ok", "value": [["poll", {}]]}
        if op["f"] == "send":
            return {**op, "type": "ok", "value": [["send", k, [9, v]] for _, k, v in op["value"]]}
        return {**op, "type": "info" if op["f"] == "crash" else "ok"}

    test = {
        "keys": KEYS,
        "concurrency": 1,
        "time_limit": 0.01,
        "final_time_limit": 0.25,
        "final_restart_s": 0.1,
    }
    ops = drive(queue_test(QueueWorkload(test), test), [0], reply=never_reads)
    final = [op["f"] for t, _, op in ops if t >= 0.01 * NS]
    assert final.count("crash") == 3 and final.count("assign") == 3


# ----- consumer groups: subscribe and commit ops ------------------------------------------


def _main_phase(ops: list[tuple[int, int | str, Op]]) -> list[Op]:
    return [op for t, _, op in ops if t < 0.05 * NS]


def test_by_default_no_process_subscribes_or_commits() -> None:
    for seed in (1, 2, 3):
        ops = _workload_ops(seed, assign_p=0.2)
        assert {op["f"] for _, _, op in ops} <= {"assign", "send", "poll", "crash"}
        # a share of 0 given explicitly draws nothing more: the very same ops
        assert _workload_ops(seed, assign_p=0.2, sub_p=0.0) == ops


def test_subscribe_makes_every_reassignment_a_subscribe() -> None:
    ops = _workload_ops(4, subscribe=True, assign_p=0.2)
    main = _main_phase(ops)
    first: dict[int | str, str] = {}
    for op in main:
        first.setdefault(op["process"], op["f"])
    assert set(first.values()) == {"subscribe"}
    reassign = [op["f"] for op in main if op["f"] in ("assign", "subscribe")]
    assert len(reassign) > len(first) and set(reassign) == {"subscribe"}
    # the final drain still assigns every key from the beginning (Jepsen's final polls)
    drain = [op for t, _, op in ops if t >= 0.05 * NS and op["f"] == "assign"]
    assert drain and all(op["_seek"] == "beginning" for op in drain)


def test_sub_p_mixes_subscribe_into_reassignments() -> None:
    w = QueueWorkload({"keys": KEYS, "sub_p": 0.25})
    rng = random.Random(5)
    fs = Counter(w.assign_op(rng)["f"] for _ in range(4000))
    assert set(fs) == {"assign", "subscribe"}
    assert 0.2 < fs["subscribe"] / 4000 < 0.3
    # sub_via, Jepsen's name, is a share too: both of them half and half
    w = QueueWorkload({"keys": KEYS, "sub_via": ["assign", "subscribe"]})
    assert w.sub_share == 0.5
    assert QueueWorkload({"keys": KEYS, "sub_via": ["subscribe"]}).sub_share == 1.0


def test_only_subscribed_processes_commit() -> None:
    ops = _workload_ops(6, sub_p=0.5, commit_p=0.3, assign_p=0.2)
    main = _main_phase(ops)
    last: dict[int | str, str] = {}
    commits = 0
    for op in main:
        if op["f"] in ("assign", "subscribe"):
            last[op["process"]] = op["f"]
        elif op["f"] == "commit":
            commits += 1
            assert last[op["process"]] == "subscribe"
            # the offsets are the client's to fill in: the invoke cannot know them
            assert op["value"] == [["commit", {}]]
    assert commits > 5
    # processes that assigned run too, and they never commit
    assert "assign" in last.values()
    assert not [op for t, _, op in ops if t >= 0.05 * NS and op["f"] == "commit"]


def test_a_subscribed_process_commits_only_what_it_has_read() -> None:
    # polls read a record except every third one, which carries a rebalance and reads nothing;
    # a commit is an info every other time (it ends the process)
    polls = commits = 0

    def reply(op: Op, p: int | str) -> Op:
        nonlocal polls, commits
        if op["f"] == "poll":
            polls += 1
            if polls % 3 == 0:
                reb = {"generation": polls, "assigned": ["t0/0"], "revoked": ["t0/0"]}
                return {**op, "type": "ok", "value": [["poll", {}]], "rebalance": reb}
            return {**op, "type": "ok", "value": [["poll", {"t0/0": [[polls, polls]]}]]}
        if op["f"] == "commit":
            commits += 1
            return {**op, "type": "info" if commits % 2 == 0 else "ok"}
        return {**op, "type": "ok"}

    w = QueueWorkload({"keys": KEYS, "subscribe": True, "commit_p": 1.0, "send_p": 0.0})
    ops = [op for _, _, op in drive(g.limit(300, w.generator()), [0], reply=reply)]
    read_since: dict[int | str, bool] = {}
    seen = n = 0
    for op in ops:
        p, f = op["process"], op["f"]
        if f == "subscribe":
            read_since[p] = False
        elif f == "commit":
            assert read_since[p], "a commit with nothing read since the last (re)assignment"
            seen += 1
        elif f == "poll":
            n += 1  # the reply above, replayed: every third poll rebalances, reads nothing
            read_since[p] = n % 3 != 0
    assert seen > 20 and n > seen / 2
    # an info commit ends its process: the next process subscribes first
    procs = [op["process"] for op in ops]
    assert len(set(procs)) > 5 and all(
        next(o["f"] for o in ops if o["process"] == q) == "subscribe" for q in set(procs)
    )
