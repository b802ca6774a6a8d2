"""The interpreter's bounds: a client call that never returns, and a run that never ends.

Fake clients block on a threading.Event nobody sets (as a librdkafka close, flush or
commit can): the run must still end, the blocked op must get an `info` completion, the
thread must go on under a fresh process, and the history must stay well formed. The
only timing asserted is that `run()` returns (pytest-timeout fails a run that hangs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from isrlab.checkers.history import load_history
from isrlab.harness import generator as g
from isrlab.harness.history import HistoryWriter
from isrlab.harness.interpreter import Interpreter, bounds

pytestmark = pytest.mark.timeout(60)

Op = dict[str, Any]

N = 3  # client threads


class Blocking:
    """A client that blocks forever (until `release`) where `hang(op, process, stage)` says:
    stage "invoke" or "close"."""

    release = threading.Event()
    blocked: list[tuple[int, str]] = []
    lock = threading.Lock()

    def __init__(self, process: int, hang: Callable[[Op, int, str], bool]) -> None:
        self.process = process
        self.hang = hang
        self.broken = False

    def open(self) -> Blocking:
        return self

    def _maybe_block(self, op: Op, stage: str) -> None:
        if self.hang(op, self.process, stage):
            with Blocking.lock:
                Blocking.blocked.append((self.process, stage))
            Blocking.release.wait()

    def invoke(self, op: Op) -> Op:
        self._maybe_block(op, "invoke")
        kind = "info" if op["f"] == "crash" else "ok"
        return {**op, "type": kind}

    def close(self) -> None:
        self._maybe_block({"f": "close"}, "close")


@pytest.fixture(autouse=True)
def _release_blocked() -> Any:
    Blocking.release = threading.Event()
    Blocking.blocked = []
    yield
    Blocking.release.set()  # let the abandoned threads end


def run(
    tmp_path: Path,
    gen: g.Generator,
    hang: Callable[[Op, int, str], bool],
    **kw: Any,
) -> tuple[list[Op], Interpreter, Path]:
    path = tmp_path / "h.jsonl"
    h = HistoryWriter(path)
    it = Interpreter(gen, h, lambda p, t: Blocking(p, hang), N, **kw)
    it.run()
    h.close()
    return load_history(path), it, path  # load_history validates the structure


def completions_per_invoke(ops: list[Op]) -> None:
    """Every client invoke has exactly one completion (the validator allows none)."""
    open_: dict[Any, Op] = {}
    for o in ops:
        if o["process"] == "nemesis":
            continue
        if o["type"] == "invoke":
            open_[o["process"]] = o
        else:
            del open_[o["process"]]
    assert open_ == {}


def first_hang_only(f: str, stage: str = "invoke", process: int = 0) -> Callable[..., bool]:
    """Hang process `process` the first time it does `f` at `stage`."""
    done: set[tuple[int, str]] = set()

    def hang(op: Op, p: int, st: str) -> bool:
        if p == process and st == stage and op["f"] == f and (p, st) not in done:
            done.add((p, st))
            return True
        return False

    return hang


def test_hung_invoke_in_main_phase_is_completed_as_info_and_the_thread_goes_on(
    tmp_path: Path,
) -> None:
    gen = g.phases(
        g.time_limit(1.0, g.clients(g.repeat({"f": "x", "value": 1}))),
        g.time_limit(0.5, g.clients(g.repeat({"f": "final", "value": 2}))),
    )
    ops, it, path = run(tmp_path, gen, first_hang_only("x"), hang_timeout=0.5)
    assert Blocking.blocked == [(0, "invoke")]
    hung = [o for o in ops if o["type"] == "info" and o["process"] == 0]
    assert len(hung) == 1 and hung[0]["f"] == "x" and hung[0]["error"][0] == "hung"
    # thread 0 went on as process 0 + N, in the main phase and in the final one
    later = [o for o in ops if o["process"] == N]
    assert any(o["f"] == "x" and o["type"] == "ok" for o in later)
    assert any(o["f"] == "final" and o["type"] == "ok" for o in later)
    assert not any(o["process"] == 0 and o["index"] > hung[0]["index"] for o in ops)
    completions_per_invoke(ops)
    stats = it.stats()
    assert len(stats["abandoned"]) == 1 and "process 3" in stats["abandoned"][0]
    assert stats["info"] == 1 and not stats["timed_out"]
    # the abandoned thread's late completion is dropped, never written
    lines = path.read_bytes()
    (left,) = [t for t in threading.enumerate() if t.name == "isrlab-worker-0-p0"]
    Blocking.release.set()
    left.join(10)
    assert not left.is_alive()
    assert path.read_bytes() == lines


def test_late_completion_of_an_abandoned_worker_is_dropped(tmp_path: Path) -> None:
    # process 0's first op blocks until thread 0 runs as its fresh process N; the run then
    # goes on until the abandoned worker has returned, tried to record and closed its client
    late_closed = threading.Event()

    class Late(Blocking):
        def close(self) -> None:
            if self.process == 0:
                late_closed.set()

    def step(ctx: g.Context) -> Op | None:
        if ctx.process == N:
            Blocking.release.set()
        return None if late_closed.is_set() else {"f": "x"}

    path = tmp_path / "h.jsonl"
    h = HistoryWriter(path)
    it = Interpreter(
        g.clients(g.fn(step)),
        h,
        lambda p, t: Late(p, first_hang_only("x")),
        N,
        hang_timeout=0.5,
    )
    it.run()
    h.close()
    assert late_closed.is_set() and Blocking.blocked == [(0, "invoke")]
    ops = load_history(path)  # raises if process 0 reappeared after its info
    assert [(o["type"], o.get("error", [None])[0]) for o in ops if o["process"] == 0] == [
        ("invoke", None),
        ("info", "hung"),
    ]
    completions_per_invoke(ops)


def test_hung_invoke_in_final_phase_is_completed_as_info(tmp_path: Path) -> None:
    # the final drain: per thread, drain until an ok (as FinalPolls reads until done)
    gen = g.phases(
        g.time_limit(0.3, g.clients(g.repeat({"f": "x", "value": 1}))),
        g.time_limit(
            30, g.clients(g.each_thread(lambda: g.until_ok(g.repeat({"f": "drain", "value": 0}))))
        ),
    )
    ops, it, _ = run(tmp_path, gen, first_hang_only("drain", process=1), hang_timeout=0.5)
    hung = [o for o in ops if o["type"] == "info" and o["f"] == "drain"]
    assert [(o["process"], o["error"][0]) for o in hung] == [(1, "hung")]
    # the fresh process 1 + N drained after it, and every thread finished its drain
    assert any(
        o["process"] == 1 + N and o["f"] == "drain" and o["type"] == "ok"
        for o in ops
        if o["index"] > hung[0]["index"]
    )
    assert sum(o["f"] == "drain" and o["type"] == "ok" for o in ops) == N
    completions_per_invoke(ops)
    assert len(it.stats()["abandoned"]) == 1


def test_hung_close_after_a_crash_moves_the_thread_to_a_new_process(tmp_path: Path) -> None:
    # as in the final drain: a crash (info) whose close never returns for process 2
    gen = g.time_limit(
        1.0,
        g.clients(
            g.each_thread(
                lambda: g.seq(
                    g.once({"f": "poll"}), g.once({"f": "crash"}), g.repeat({"f": "poll"})
                )
            )
        ),
    )
    ops, it, _ = run(
        tmp_path, gen, first_hang_only("close", stage="close", process=2), hang_timeout=0.5
    )
    assert Blocking.blocked == [(2, "close")]
    crash = [o for o in ops if o["process"] == 2 and o["type"] == "info"]
    assert len(crash) == 1 and crash[0]["f"] == "crash" and "error" not in crash[0]
    assert any(o["process"] == 2 + N and o["f"] == "poll" and o["type"] == "ok" for o in ops)
    completions_per_invoke(ops)
    assert "hung in close" in it.stats()["abandoned"][0]


def test_hung_final_close_does_not_hold_the_end_of_the_run(tmp_path: Path) -> None:
    # the generator is done; closing process 0's client at the end never returns
    gen = g.clients(g.each_thread(lambda: g.limit(2, g.repeat({"f": "x"}))))
    ops, it, _ = run(tmp_path, gen, first_hang_only("close", stage="close"), hang_timeout=0.5)
    assert Blocking.blocked == [(0, "close")]
    assert sum(o["type"] == "ok" for o in ops) == 6
    assert {o["process"] for o in ops} <= set(range(N))  # nobody was replaced
    assert "its thread is done" in it.stats()["abandoned"][0]


def test_stop_does_not_wait_for_a_hung_op(tmp_path: Path) -> None:
    # stop() (Ctrl-C) lets the threads finish their op, but a hung one is still abandoned
    path = tmp_path / "h.jsonl"
    h = HistoryWriter(path)
    it = Interpreter(
        g.clients(g.repeat({"f": "x"})),
        h,
        lambda p, t: Blocking(p, first_hang_only("x", process=1)),
        N,
        hang_timeout=0.5,
    )
    threading.Timer(0.1, it.stop).start()
    it.run()
    h.close()
    ops = load_history(path)
    assert [o["error"][0] for o in ops if o["type"] == "info"] == ["hung"]
    assert not any(o["process"] == 1 + N for o in ops)  # stopping: nobody replaces it
    completions_per_invoke(ops)


def test_whole_run_bound_completes_open_ops_as_info(tmp_path: Path) -> None:
    class StuckNemesis:
        def invoke(self, op: Op) -> Op:
            Blocking.release.wait()
            return op

    gen = g.phases(
        g.any_of(
            g.clients(g.repeat({"f": "x", "value": 1})),
            g.nemesis(g.once({"f": "start-partition", "value": None})),
        ),
        g.clients(g.repeat({"f": "final"})),
    )

    def hang(op: Op, p: int, st: str) -> bool:
        return st == "invoke"  # no client op ever comes back

    # no per-op bound: only the run's bound can end this run
    ops, it, _ = run(tmp_path, gen, hang, nemesis=StuckNemesis(), run_timeout=1.0)
    stats = it.stats()
    assert stats["timed_out"] and stats["finished"]
    timeouts = [o for o in ops if o.get("error", [None])[0] == "run-timeout"]
    assert sorted((str(o["process"]), o["type"], o["f"]) for o in timeouts) == [
        ("0", "info", "x"),
        ("1", "info", "x"),
        ("2", "info", "x"),
        ("nemesis", "info", "start-partition"),
    ]
    nem = [o for o in ops if o["process"] == "nemesis"]
    assert [o["f"] for o in nem] == ["start-partition"] * 2
    completions_per_invoke(ops)
    assert "run timeout" in stats["abandoned"][-1]


def test_bounds_leave_room_for_a_transaction_body_and_its_abort() -> None:
    hang, whole = bounds(10.0, 60.0, 8.0, 30.0)
    assert hang > 2 * 10.0  # the body until its deadline, then abort_transaction
    assert whole > 60.0 + 8.0 + 30.0 + 2 * hang
    assert bounds(0.5, 1, 0, 1)[0] >= 10.0  # a grace of at least 10 s


def test_bad_bounds_are_refused(tmp_path: Path) -> None:
    h = HistoryWriter(tmp_path / "h.jsonl")
    for kw in ({"hang_timeout": 0}, {"run_timeout": -1.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Interpreter(
                g.repeat({"f": "x"}), h, lambda p, t: Blocking(p, first_hang_only("x")), 1, **kw
            )
    h.close()
