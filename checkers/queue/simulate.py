"""Histories from a correct in-memory model of a replicated log, for tests and benchmarks.

`simulate(...)` runs concurrent client threads against one model log per key and records
a spec-format history (shared/spec/history-format.md) of `send`, `poll`, `txn`,
`assign` and `crash` ops with their invokes and completions interleaved. The model is
correct by construction, so the queue checker must find it valid:

- an op takes effect atomically at its completion (ok) or not at all (fail); an `info`
  op takes effect or not at random, and its thread continues as a new process;
- committed transactions are followed by a marker offset per key written (gaps in the
  offsets that are not skips) and aborted transactions leave invisible offsets;
- a consumer reads from its position and only an ok op moves it; a failed poll re-reads;
- ok completions report the key's watermarks; a final drain reads every key from 0.

Values are per-key increasing integers, so every record is traceable to its send.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["eos_keys", "simulate"]


class _Thread:
    __slots__ = ("assigned", "early", "op", "positions", "process")

    def __init__(self, process: int, keys: list[str]) -> None:
        self.process = process
        self.assigned = list(keys)
        self.positions: dict[str, int] = {}
        self.op: dict[str, Any] | None = None
        self.early: dict[int, int] = {}  # micro-op slot -> offset reserved at invoke


def eos_keys(keys: int, copiers: int) -> dict[str, list[str]]:
    """The `eos` option matching simulate(keys=keys, copiers=copiers)."""
    n = min(keys, copiers)
    return {"input": [f"t{i % 4}/{i}" for i in range(n)], "output": [f"out/{i}" for i in range(n)]}


def simulate(
    n_ops: int = 2000,
    *,
    processes: int = 5,
    keys: int = 3,
    seed: int = 0,
    txn_rate: float = 0.3,
    info_rate: float = 0.02,
    fail_rate: float = 0.03,
    crash_rate: float = 0.005,
    assign_rate: float = 0.01,
    max_batch: int = 4,
    assigned_keys: int = 2,
    watermarks: bool = True,
    final_drain: bool = True,
    interleave: bool = False,
    copiers: int = 0,
    late_acks: float = 0.0,
) -> list[dict[str, Any]]:
    """Return a valid history of about `n_ops` ops (lines), deterministic in `seed`.

    interleave=True models Kafka's non-isolated transactional writes: each send of a
    transaction lands in the log either at the invoke or at the commit, so concurrent
    transactions interleave (G0 / G1c-ww cycles and int-send-skip, all allowed), while
    read_committed consumers stop at the first undecided record (the LSO).

    copiers=N adds N exactly-once copier threads: copier i owns input key `key_names[i]`
    and copies what it polls, verbatim and in one transaction with its consumed position
    (a consumer-group offset that survives the copier's crash), to output key `out/i`.
    Check such histories with eos={"input": [...], "output": [...]} (see `eos_keys`).

    late_acks=x delivers that fraction of ok send/txn completions later, at a random
    point before their process's next op, as acknowledgements arrive late on a real
    cluster: ops in between may already have read the values (wr edges against
    completion order, the cycle search's work), and the history stays valid.
    """
    rng = random.Random(seed)
    key_names = [f"t{i % 4}/{i}" for i in range(keys)]
    logs: dict[str, list[Any]] = {k: [] for k in key_names}  # offset -> value or None (gap)
    undecided: dict[str, set[int]] = {k: set() for k in key_names}  # open txn records
    next_value = dict.fromkeys(key_names, 0)
    threads = [
        _Thread(p, rng.sample(key_names, min(assigned_keys, len(key_names))))
        for p in range(processes)
    ]
    next_process = processes
    inputs = key_names[: min(copiers, len(key_names))]
    outputs = [f"out/{i}" for i in range(len(inputs))]
    for k in outputs:
        logs[k] = []
        undecided[k] = set()
    group: dict[str, int] = dict.fromkeys(inputs, 0)  # committed input offsets
    copier_threads = []
    for k in inputs:
        th = _Thread(next_process, [k])
        th.positions = {k: 0}
        copier_threads.append(th)
        next_process += 1
    history: list[dict[str, Any]] = []
    t = 0

    def emit(process: Any, typ: str, f: str, value: Any, **extra: Any) -> dict[str, Any]:
        nonlocal t
        t += rng.randint(1, 5000)
        op = {"index": len(history), "time": t, "process": process, "type": typ, "f": f}
        op["value"] = value
        op.update(extra)
        history.append(op)
        return op

    def read(th: _Thread, k: str) -> list[list[Any]]:
        log = logs[k]
        pos = th.positions.get(k, 0)
        out: list[list[Any]] = []
        limit = rng.randint(0, max_batch)
        lso = undecided[k]
        while pos < len(log) and len(out) < limit and pos not in lso:
            v = log[pos]
            if v is not None:
                out.append([pos, v])
            pos += 1
        return out

    def wm(ks: set[str]) -> dict[str, Any]:
        return {"watermarks": {k: {"low": 0, "high": len(logs[k])} for k in sorted(ks)}}

    def invoke(th: _Thread) -> None:
        r = rng.random()
        if r < crash_rate:
            th.op = emit(th.process, "invoke", "crash", None)
            return
        if r < crash_rate + assign_rate:
            ks = sorted(
                rng.sample(key_names, rng.randint(1, min(len(key_names), assigned_keys + 1)))
            )
            th.op = emit(th.process, "invoke", "assign", ks)
            return
        mops: list[list[Any]] = []
        if rng.random() < txn_rate:
            f = "txn"
            for _ in range(rng.randint(1, 4)):
                if rng.random() < 0.5:
                    k = rng.choice(key_names)
                    mops.append(["send", k, next_value[k]])
                    next_value[k] += 1
                else:
                    mops.append(["poll"])
        elif rng.random() < 0.5:
            f = "send"
            k = rng.choice(key_names)
            mops.append(["send", k, next_value[k]])
            next_value[k] += 1
        else:
            f = "poll"
            mops.append(["poll"])
        th.op = emit(th.process, "invoke", f, mops)
        if interleave and f == "txn":
            deferred: set[str] = set()  # one producer keeps its order within a partition
            for slot, mop in enumerate(mops):
                if mop[0] != "send":
                    continue
                if mop[1] in deferred or rng.random() < 0.5:
                    deferred.add(mop[1])
                else:
                    logs[mop[1]].append(mop[2])
                    th.early[slot] = len(logs[mop[1]]) - 1
                    undecided[mop[1]].add(th.early[slot])

    def complete(th: _Thread) -> None:
        nonlocal next_process
        inv = th.op
        assert inv is not None
        th.op = None
        f = inv["f"]
        p = th.process
        if f == "crash":
            emit(p, "info", "crash", None)
            th.process = next_process
            next_process += 1
            th.positions.clear()
            return
        r = rng.random()
        typ = "info" if r < info_rate else "fail" if r < info_rate + fail_rate else "ok"
        if f == "assign":
            if typ == "fail":
                emit(p, "fail", f, inv["value"])
                return
            keep = set(inv["value"])
            th.assigned = list(inv["value"])
            th.positions = {k: x for k, x in th.positions.items() if k in keep}
            emit(p, typ, f, inv["value"])
            if typ == "info":
                th.process = next_process
                next_process += 1
                th.positions.clear()
            return
        applies = typ == "ok" or (typ == "info" and rng.random() < 0.5)
        out: list[list[Any]] = []
        touched: set[str] = set()
        reads_at: dict[str, int] = {}
        sent_keys: list[str] = []
        pending_sends: list[tuple[int, str, Any]] = []
        for mop in inv["value"]:
            if mop[0] == "send":
                touched.add(mop[1])
                pending_sends.append((len(out), mop[1], mop[2]))
                out.append([])
            else:
                polled: dict[str, list[list[Any]]] = {}
                for k in th.assigned:
                    pairs = read(th, k)
                    polled[k] = pairs
                    if pairs:
                        th.positions[k] = pairs[-1][0] + 1
                        reads_at.setdefault(k, pairs[0][0])
                    touched.add(k)
                out.append(["poll", polled])
        # Sends take effect at commit, after the op's own polls (no precommitted reads).
        early = th.early
        th.early = {}
        for slot, k, v in pending_sends:
            reserved = early.get(slot)
            if reserved is not None:
                undecided[k].discard(reserved)
                if not applies:
                    logs[k][reserved] = None  # aborted: the offset stays, invisible
            if applies:
                if reserved is None:
                    logs[k].append(v)
                offset = len(logs[k]) - 1 if reserved is None else reserved
                sent_keys.append(k)
                out[slot] = ["send", k, [offset, v] if typ == "ok" else v]
            else:
                if reserved is None and f == "txn" and rng.random() < 0.5:
                    logs[k].append(None)  # an aborted record occupies an offset
                out[slot] = ["send", k, v]
        if f == "txn" and applies:
            for k in sorted(set(sent_keys)):
                logs[k].append(None)  # commit marker
        if typ != "ok":
            # Only ok ops move the consumer: rewind what this op read.
            for k, start in reads_at.items():
                th.positions[k] = start
        extra = wm(touched) if (watermarks and typ == "ok" and touched) else {}
        emit(p, typ, f, out, **extra)
        if typ == "info":
            th.process = next_process
            next_process += 1
            th.positions.clear()

    def copy(th: _Thread) -> None:
        nonlocal next_process
        if th.op is None:
            th.op = emit(th.process, "invoke", "txn", [["poll"]])
            return
        th.op = None
        (k,) = th.assigned
        out_key = outputs[inputs.index(k)]
        r = rng.random()
        typ = "info" if r < info_rate else "fail" if r < info_rate + fail_rate else "ok"
        applies = typ == "ok" or (typ == "info" and rng.random() < 0.5)
        pairs = read(th, k)
        value: list[list[Any]] = [["poll", {k: pairs}]]
        for _o, v in pairs:
            if applies:
                logs[out_key].append(v)
                offset = len(logs[out_key]) - 1
                value.append(["send", out_key, [offset, v] if typ == "ok" else v])
            else:
                value.append(["send", out_key, v])
        if applies and pairs:
            logs[out_key].append(None)  # commit marker
            group[k] = pairs[-1][0] + 1
        th.positions = {k: group[k]}
        extra = wm({k, out_key}) if (watermarks and typ == "ok") else {}
        emit(th.process, typ, "txn", value, **extra)
        if typ == "info":
            th.process = next_process
            next_process += 1

    while len(history) < n_ops:
        i = rng.randrange(len(threads) + len(copier_threads))
        if i >= len(threads):
            copy(copier_threads[i - len(threads)])
            continue
        th = threads[i]
        if th.op is None:
            invoke(th)
        else:
            complete(th)
    for th in threads:
        if th.op is not None:
            complete(th)
    for th in copier_threads:
        if th.op is not None:
            copy(th)
    if late_acks:
        _delay_acks(history, rng, late_acks)
    if final_drain:
        drain = _Thread(next_process, key_names)
        for k in key_names + outputs:
            emit(drain.process, "invoke", "assign", [k])
            emit(drain.process, "ok", "assign", [k])
            emit(drain.process, "invoke", "poll", [["poll"]])
            pairs = [[o, v] for o, v in enumerate(logs[k]) if v is not None]
            emit(drain.process, "ok", "poll", [["poll", {k: pairs}]], **wm({k}))
    return history


def _delay_acks(history: list[dict[str, Any]], rng: random.Random, fraction: float) -> None:
    """Move `fraction` of the ok send/txn completions later (see `simulate`), in place."""
    n = len(history)
    next_of_process = [n] * n  # index of the same process's next line
    seen: dict[Any, int] = {}
    for i in range(n - 1, -1, -1):
        p = history[i]["process"]
        next_of_process[i] = seen.get(p, n)
        seen[p] = i
    keys: list[float] = []
    for i, op in enumerate(history):
        key = float(i)
        if op["type"] == "ok" and op["f"] in ("send", "txn") and rng.random() < fraction:
            j = next_of_process[i]
            if j - 1 > i:
                key = rng.randint(i + 1, j - 1) + 0.5  # just after that line
        keys.append(key)
    order = sorted(range(n), key=keys.__getitem__)
    moved = [history[i] for i in order]
    last_time = -(2**63)
    for i, op in enumerate(moved):
        op["index"] = i
        last_time = op["time"] = max(op["time"], last_time)
    history[:] = moved
