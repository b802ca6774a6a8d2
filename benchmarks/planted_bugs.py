"""Planted bugs (issue 18): does `isrlab sim` find a one-line bug in the broker's cores and
shells within 10 CPU-minutes?

Each bug of `BUGS` is a one-line change to one function of the broker, applied while the
simulation runs by recompiling that function from its source with the line changed
(`planted(bug)`, a context manager that puts the original back): no product file is edited,
and the diff of every bug is printed. For each bug the script runs simulated queue tests
(`harness/sim/shrink.py`'s `run_isolated`: the whole run in a forked child, which inherits the
patch) on seeds 1, 2, ... until the checker says INVALID or the invariants checker reports a
violation, with a safe configuration (acks=all, idempotent producers, RF 3) and a nemesis mix
of partitions, kills and pauses; then the unpatched broker on the same seeds, which must be
VALID. It prints seeds to detection and CPU seconds as a markdown table.

    python benchmarks/planted_bugs.py                 # every bug
    python benchmarks/planted_bugs.py --bug hw-max --seeds 20 --json out.json
"""

from __future__ import annotations
import __future__

import argparse
import contextlib
import difflib
import importlib
import inspect
import json
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT.parent) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT.parent))

from isrlab.harness.sim.shrink import Outcome, run_isolated  # noqa: E402


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    module: str  # where the function lives
    qualname: str  # Class.method or function
    old: str  # the line as it is (stripped), exactly once in the function
    new: str  # the line as planted
    overrides: dict[str, Any] = field(default_factory=dict)  # on top of BASE


#: a safe configuration: the unpatched broker must be valid on every seed tried
BASE: dict[str, Any] = {
    "name": "planted",
    "concurrency": 4,
    "rate": 20,
    "key_count": 1,
    "recovery_time": 3,
    "final_time_limit": 20,
    "acks": "all",
    "idempotence": True,
    "nemesis": "partition+kill+pause",
    "nemesis_interval": 3,
    "time_limit": 15,
    "op_timeout_ms": 5000,
}

BUGS: list[Bug] = [
    Bug(
        "acks-all-as-1",
        "acks=all answered at once, as acks=1 (the leader's produce completion does not wait "
        "for the ISR)",
        "isrlab.broker.replication.partition",
        "Partition._produce_appended",
        "if acks == 1:",
        "if acks in (1, ACKS_ALL):",
    ),
    Bug(
        "hw-max",
        "the high watermark advanced to the leader's LEO (max over the ISR instead of min)",
        "isrlab.broker.replication.partition",
        "Partition._maybe_increment_hw",
        "new_hw = min(new_hw, replica.log_end_offset if replica else UNKNOWN_OFFSET)",
        "new_hw = max(new_hw, replica.log_end_offset if replica else UNKNOWN_OFFSET)",
    ),
    Bug(
        "no-epoch-truncation",
        "a follower does not truncate on a leader change (OffsetsForLeaderEpoch's answer "
        "ignored: cut to its own end only)",
        "isrlab.broker.replication.partition",
        "Partition.on_offsets_for_leader_epoch_response",
        "self._truncate(min(end_offset, local_end))",
        "self._truncate(local_end)",
    ),
    Bug(
        "elect-outside-isr",
        "the controller elects any live replica, not only an ISR member",
        "isrlab.broker.controller.controller",
        "Controller._decide_with_elr",
        "if r in isr:",
        "if r in live:",
        # the ISR must have shrunk (replica lag 10 s) before the leader goes: longer faults
        {"nemesis": "partition+kill", "nemesis_interval": 8, "time_limit": 40},
    ),
    Bug(
        "consumer-reads-to-leo",
        "a consumer's fetch bounded by the LEO instead of the HW",
        "isrlab.broker.replication.partition",
        "Partition._readable_end",
        "return self.last_stable_offset if read_committed else self._hw",
        "return self.last_stable_offset if read_committed else self.log.log_end_offset",
    ),
    Bug(
        "dup-check-wrong-field",
        "the idempotence duplicate check compares the batch's first offset, not its first "
        "sequence (a retry is never recognised as a duplicate)",
        "isrlab.broker.log.producer_state",
        "ProducerStateManager.check",
        "if b.first_seq == first and b.last_seq == last:",
        "if b.first_offset == first and b.last_seq == last:",
        # retries of appended batches: requests cut by partitions, timing out, sent again
        {"nemesis": "partition", "nemesis_interval": 2, "rate": 40, "time_limit": 20},
    ),
    Bug(
        "follower-no-producer-state",
        "a follower appends without updating its producer state (a new leader has no sequence "
        "history: a retried batch is appended again)",
        "isrlab.broker.partition",
        "LogAdapter.append_as_follower",
        "self.owner.producer_state.apply(records, info.batches, self._index_aborted)",
        "pass",
        # a retry must reach the new leader: the send's timeout (librdkafka's
        # message.timeout.ms) outlives the failover (the killed leader's ZooKeeper session
        # expiring, the election); with the default 5 s the retries gave up first
        {
            "nemesis": "kill",
            "nemesis_interval": 3,
            "rate": 40,
            "time_limit": 20,
            "op_timeout_ms": 20000,
        },
    ),
]

BY_NAME = {b.name: b for b in BUGS}


def _target(bug: Bug) -> tuple[Any, str, Any]:
    module = importlib.import_module(bug.module)
    owner: Any = module
    *path, name = bug.qualname.split(".")
    for p in path:
        owner = getattr(owner, p)
    return owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def patched_source(bug: Bug) -> tuple[str, str]:
    """(the function's source, the source with the bug's line changed)."""
    _owner, _name, fn = _target(bug)
    src = textwrap.dedent(inspect.getsource(fn))
    lines = src.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == bug.old]
    if len(hits) != 1:
        raise ValueError(f"{bug.name}: {bug.old!r} is {len(hits)} times in {bug.qualname}")
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = f"{indent}{bug.new}  # planted: {bug.name}\n"
    return src, "".join(lines)


def diff(bug: Bug) -> str:
    src, new = patched_source(bug)
    mod = bug.module.removeprefix("isrlab.").replace(".", "/")
    return "".join(
        difflib.unified_diff(
            src.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{mod}.py:{bug.qualname}",
            f"b/{mod}.py:{bug.qualname}",
            n=1,
        )
    )


@contextlib.contextmanager
def planted(bug: Bug) -> Iterator[None]:
    """The broker with `bug` in it, while the block runs (this process and its children)."""
    owner, name, fn = _target(bug)
    _, new = patched_source(bug)
    module = importlib.import_module(bug.module)
    namespace: dict[str, Any] = {}
    code = compile(
        new,
        f"<planted {bug.name}>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, module.__dict__, namespace)
    replacement = namespace[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, fn)


@dataclass
class Hunt:
    bug: str
    detected_at: int | None  # the seed
    seeds_tried: int
    cpu_s: float
    how: str | None  # anomalies or violation kind
    baseline_valid: int = 0  # unpatched seeds valid
    baseline_tried: int = 0
    baseline_bad: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _run(overrides: dict[str, Any], seed: int, timeout_s: float) -> Outcome:
    d = Path(tempfile.mkdtemp(prefix="planted-"))
    try:
        return run_isolated({**overrides, "seed": seed}, d, timeout_s=timeout_s)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _how(o: Outcome) -> str:
    return ", ".join(sorted(o.kinds()))


def hunt(
    bug: Bug,
    max_seeds: int = 30,
    max_cpu_s: float = 600.0,
    timeout_s: float = 120.0,
    first_seed: int = 1,
    baseline: bool = True,
    log: Any = print,
) -> Hunt:
    """Seeds from `first_seed` until the patched broker fails; then the same seeds unpatched."""
    overrides = {**BASE, **bug.overrides}
    h = Hunt(bug.name, None, 0, 0.0, None)
    seeds: list[int] = []
    with planted(bug):
        for seed in range(first_seed, first_seed + max_seeds):
            if h.cpu_s >= max_cpu_s:
                break
            o = _run(overrides, seed, timeout_s)
            seeds.append(seed)
            h.seeds_tried += 1
            h.cpu_s += o.cpu_s
            if o.error:
                h.errors.append(f"seed {seed}: {o.error}")
            log(f"  {bug.name} seed {seed}: {_how(o) if o.failed else o.error or 'valid'}")
            if o.failed:
                h.detected_at, h.how = seed, _how(o)
                break
    if baseline:
        for seed in seeds:
            o = _run(overrides, seed, timeout_s)
            h.baseline_tried += 1
            if o.valid is True and not o.violation:
                h.baseline_valid += 1
            else:
                h.baseline_bad.append(f"seed {seed}: {_how(o) or o.error}")
            log(f"  unpatched seed {seed}: {'valid' if o.valid is True else _how(o) or o.error}")
    h.cpu_s = round(h.cpu_s, 1)
    return h


def table(hunts: list[Hunt]) -> str:
    rows = [
        "| bug | found at seed | seeds run | CPU s to detection | found as | unpatched, same "
        "seeds |",
        "|---|---|---|---|---|---|",
    ]
    for h in hunts:
        base = (
            f"{h.baseline_valid}/{h.baseline_tried} valid"
            + (f" ({'; '.join(h.baseline_bad)})" if h.baseline_bad else "")
            if h.baseline_tried
            else "-"
        )
        rows.append(
            f"| {h.bug} | {h.detected_at if h.detected_at is not None else 'not found'} | "
            f"{h.seeds_tried} | {h.cpu_s} | {h.how or '-'} | {base} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bug", action="append", choices=sorted(BY_NAME), help="(repeatable)")
    p.add_argument("--seeds", type=int, default=30, help="at most this many seeds per bug")
    p.add_argument("--max-cpu-s", type=float, default=600.0, help="per bug (10 CPU-minutes)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="wall s for one run")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    bugs = [BY_NAME[n] for n in args.bug] if args.bug else BUGS
    hunts: list[Hunt] = []
    for bug in bugs:
        print(f"## {bug.name}: {bug.what}\n{diff(bug)}", flush=True)
        started = time.monotonic()
        hunts.append(
            hunt(
                bug,
                args.seeds,
                args.max_cpu_s,
                args.timeout_s,
                baseline=not args.no_baseline,
                log=lambda s: print(s, flush=True),
            )
        )
        print(f"  ({time.monotonic() - started:.0f} s wall)\n", flush=True)
    print(table(hunts))
    if args.json:
        args.json.write_text(json.dumps([h.__dict__ for h in hunts], indent=2))
    return 0 if all(h.detected_at is not None for h in hunts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
