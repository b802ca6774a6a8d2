"""One entry point for every checker: load a history in any supported format, check it.

- `load(path, fmt)`: ``jsonl`` (checkers.history), ``edn`` and ``jepsen-log``
  (checkers.formats, imported lazily, then validated like jsonl); every failure is a
  `HistoryError`;
- `load_for_check(path, fmt, workload)`: what `check` needs, loaded as fast as it can
  be: for a ``queue`` check of a ``jsonl`` file, a `checkers.queue.load.QueueFile`
  (screened natively, loaded as compact records only if the checker must explain;
  `isrlab check` uses this), otherwise `load`;
- `check(ops, workload, **opts)`: ``queue`` -> `checkers.queue.check_queue`;
  ``register``, ``cas-register``, ``kv`` -> `checkers.linear.api.check_workload`
  (imported lazily);
- `policy_from_test(test)`: the checker options a run's test.json asks for.

All return the spec's results dict (docs/history-format.md, "Checker output").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from isrlab.checkers.history import HistoryError, load_history, validate

if TYPE_CHECKING:
    from isrlab.checkers.queue.load import QueueFile, QueueHistory

__all__ = ["FORMATS", "WORKLOADS", "check", "load", "load_for_check", "policy_from_test"]

WORKLOADS = ("queue", "register", "cas-register", "kv")
FORMATS = ("jsonl", "edn", "jepsen-log")
QUEUE_OPTS = ("allow", "disallow", "subscribe", "eos", "ww_deps", "max_examples")
#: What a transactional test read with ``isolation_level: read_uncommitted`` allows on top of the
#: defaults: Kafka's read_uncommitted consumers read records of open and aborted transactions,
#: so aborted reads (G1a), circular information flow through such reads (G1c and variants:
#: Adya's PL-1, read uncommitted, proscribes only G0) and a transaction reading its own
#: uncommitted sends are what the level promises, not anomalies of the system.
READ_UNCOMMITTED_ALLOWED = frozenset(
    {"G1a", "G1c", "G1c-process", "G1c-realtime", "precommitted-read"}
)


def load(path: Path, fmt: str = "jsonl") -> list[dict[str, Any]]:
    """Load a history file; raises HistoryError for unreadable or malformed input."""
    if fmt == "jsonl":
        return load_history(Path(path))
    if fmt in ("edn", "jepsen-log"):
        from isrlab.checkers import formats

        reader = formats.load_edn if fmt == "edn" else formats.load_jepsen_log
        try:
            ops = list(reader(Path(path)))
        except OSError as e:
            raise HistoryError(f"cannot read history {path}: {e.strerror or e}") from None
        except ValueError as e:  # formats.FormatError names file and line already
            raise HistoryError(str(e)) from None
        validate(ops)
        return ops
    raise HistoryError(f"unknown history format {fmt!r}; use one of {', '.join(FORMATS)}")


def load_for_check(
    path: Path, fmt: str = "jsonl", workload: str | None = None
) -> Sequence[dict[str, Any]] | QueueFile:
    """The history at `path` in the form `check(..., workload)` checks fastest.

    A ``queue`` check of a ``jsonl`` file gets a `QueueFile`: `check` screens the file
    natively and loads it (`checkers.queue.load.load_queue`) only if the explaining
    checker must run. Anything else gets `load`. Errors are `load`'s.
    """
    if workload == "queue" and fmt == "jsonl" and Path(path).is_file():
        from isrlab.checkers.queue.load import QueueFile

        return QueueFile(Path(path))
    return load(path, fmt)


def check(
    ops: Sequence[dict[str, Any]] | QueueHistory | QueueFile, workload: str, **opts: Any
) -> dict[str, Any]:
    """Check `ops` as `workload`; queue options: allow, disallow, subscribe, eos, ww_deps.

    Linearizability workloads take timeout_s and out_dir. A `QueueFile` or
    `QueueHistory` (from `load_for_check`) is loaded as op dicts for them.
    """
    if workload == "queue":
        from isrlab.checkers.queue import check_queue

        return check_queue(ops, **{k: v for k, v in opts.items() if k in QUEUE_OPTS})
    if workload in ("register", "cas-register", "kv"):
        from isrlab.checkers.linear.api import check_workload
        from isrlab.checkers.queue.load import QueueFile, QueueHistory

        if isinstance(ops, QueueFile):
            ops = ops.load()
        if isinstance(ops, QueueHistory):
            ops = ops.op_dicts()

        return dict(
            check_workload(
                ops, workload, timeout_s=opts.get("timeout_s"), out_dir=opts.get("out_dir")
            )
        )
    raise ValueError(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")


def _as_list(x: Any) -> list[str] | None:
    if x is None:
        return None
    if isinstance(x, str):
        return [s.strip() for s in x.split(",") if s.strip()]
    return [str(s) for s in x]


def policy_from_test(test: Mapping[str, Any]) -> dict[str, Any]:
    """Checker options from a test configuration (test.json).

    Reads `workload` (a name, or {"name": ..., options}), `eos` {"input", "output"},
    `subscribe` (bool) or `sub_via`
    (Jepsen's name: a list or string containing "subscribe"), `ww_deps`, and the
    anomaly lists `allow` / `disallow` (top level or under `checker`). A transactional test
    (`txn: true`) read with `isolation_level: read_uncommitted` also allows
    `READ_UNCOMMITTED_ALLOWED` (a `disallow` still wins).
    """
    conf: dict[str, Any] = dict(test)
    conf.update(test.get("checker") or {})
    policy: dict[str, Any] = {}
    workload = conf.get("workload")
    if isinstance(workload, Mapping):  # {"name": "queue", ...options}
        conf.update({k: v for k, v in workload.items() if k != "name"})
        workload = workload.get("name")
    if workload == "eos":
        # the harness's consume-transform-produce workload records queue histories
        workload = "queue"
    if isinstance(workload, str) and workload:
        policy["workload"] = workload
    eos = conf.get("eos")
    if isinstance(eos, Mapping) and (eos.get("input") or eos.get("output")):
        policy["eos"] = {"input": list(eos.get("input", ())), "output": list(eos.get("output", ()))}
    if "subscribe" in conf and isinstance(conf["subscribe"], bool):
        policy["subscribe"] = conf["subscribe"]
    elif "sub_via" in conf:
        sub = conf["sub_via"]
        policy["subscribe"] = "subscribe" in (sub if isinstance(sub, list | tuple) else [sub])
    if isinstance(conf.get("ww_deps"), bool):
        policy["ww_deps"] = conf["ww_deps"]
    for name in ("allow", "disallow"):
        items = _as_list(conf.get(name))
        if items:
            policy[name] = set(items)
    if conf.get("txn") is True and conf.get("isolation_level") == "read_uncommitted":
        policy["allow"] = policy.get("allow", set()) | READ_UNCOMMITTED_ALLOWED
    return policy
