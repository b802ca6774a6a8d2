"""What reached disk: the one home of the broker's fsyncs, and the journal of synced lengths.

Every fsync of a broker file or directory goes through this module (segments, indexes,
checkpoints, the leader-epoch file, producer snapshots, the transaction index, meta.properties,
the topic store, the log and partition directories). When the log dir holding the file is
*attached* (the broker does it at start-up while ``isrlab.power.journal.enable`` is true, isrlab's
own key), each SUCCESSFUL fsync is recorded, durably (one JSON line appended to
``<log dir>/.isrlab-synced`` and fsynced), before the call returns:

- ``["S", path, n]``: the file at ``path`` (relative to the log dir) has its first ``n`` bytes on
  disk (its length at the fsync);
- ``["D", dir, [names]]``: the directory was fsynced holding these entries;
- ``["R", old, new]``: a rename (the synced length follows the file to its new name);
- ``["X", path]``: a deletion (of a file, or of a directory and everything under it);
- ``["T", path, n]``: a truncation to ``n`` bytes (the synced length cannot exceed it).

A record that would change nothing (the deletion of a file never synced, say) is not written.
The journal is compacted at start-up (``attach``): replayed, stripped of files that no longer
exist, and rewritten atomically (tmp, fsync, rename, directory fsync). A log dir without a journal
(a first start, or bookkeeping turned on again) starts from a baseline: every file there counts as
synced at its current length.

``apply_power_loss`` (``isrlab-broker power-loss --log-dirs ...``, after a kill -9) turns a log
dir into what a power loss would leave: the model is described in docs/durability.md ("Power
loss"). In short, file granularity: a file is cut back to its synced length; a file whose directory
entry never reached disk is deleted (an entry is durable once its directory was fsynced holding it,
or once the file itself, or a file below it, was fsynced under that name, as ext4 and XFS commit
a new file's entry with its first fsync); a file with a durable entry but no synced byte is left
empty.

``apply_power_loss(log_dir, torn_seed=S)`` (``isrlab-broker power-loss --torn-seed S``, the
``power-torn`` nemesis) is the same loss on a disk that wrote back part of the page cache before
the power went: LazyFS's torn writes. Each file keeps its synced bytes and, drawn from the seed
and its path, none, all or a prefix of its unsynced tail; when it keeps some, the last page of
what it keeps may read as zeros (the file's size reached disk, that page's data did not). The
segments of one partition keep a prefix in time: once one is cut short, the later ones keep only
their synced bytes (a file system writes back a log's pages in order; Kafka flushes segments in
order). An entry that never reached disk survives one time in two (the file system committed
it on its own), its data torn as any unsynced tail; a segment after one cut short or deleted
does not.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import logging
import os
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOURNAL_NAME = ".isrlab-synced"
JOURNAL_TMP = JOURNAL_NAME + ".tmp"
#: isrlab's truncation journal (broker.log.inventory.TRUNCATION_JOURNAL): the observer's notes,
#: which a power loss leaves alone, as it does this module's journal
TRUNCATION_JOURNAL = "isrlab-truncations.jsonl"
_OWN_FILES = (JOURNAL_NAME, JOURNAL_TMP, TRUNCATION_JOURNAL)

PathLike = str | os.PathLike[str]

#: the simulator's seam (harness/sim/cluster.py sets it in each simulated broker's context):
#: True skips the ``os.fsync`` system calls of this module (they cost real milliseconds and a
#: simulation never loses the real machine's page cache) while every journal record is
#: written exactly as before, so ``apply_power_loss`` models the power loss the same way.
#: False (the default) is the real broker's behaviour.
skip_fsync: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "isrlab_durable_skip_fsync", default=False
)


#: the simulator's ``fsync-fail`` seam (harness/sim/cluster.py sets it in each simulated
#: broker's context): while the callable returns True, every fsync of that broker fails with
#: EIO, as ``nemeses.fsyncshim`` makes ``os.fsync`` fail in a real broker. None: never.
fsync_fails: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "isrlab_durable_fsync_fails", default=None
)


def _fsync(fd: int) -> None:
    """``os.fsync(fd)``, unless a simulation skips the system call (``skip_fsync``) or makes
    it fail (``fsync_fails``)."""
    fails = fsync_fails.get()
    if fails is not None and fails():
        raise OSError(errno.EIO, "Input/output error (isrlab fsync-fail nemesis)")
    if not skip_fsync.get():
        os.fsync(fd)


class JournalError(Exception):
    """A log dir has no usable journal (bookkeeping off, or not an isrlab log dir)."""


def _ancestors(rel: str) -> Iterator[str]:
    """``a/b/c`` -> ``a/b``, ``a`` (the entries a path's own entry hangs from)."""
    while True:
        rel = os.path.dirname(rel)
        if not rel:
            return
        yield rel


def _under(rel: str, prefix: str) -> bool:
    return rel == prefix or rel.startswith(prefix + "/")


@dataclass
class SyncedState:
    """The replayed journal: what a power loss would keep."""

    synced: dict[str, int] = field(default_factory=dict)  # path -> bytes on disk
    durable: set[str] = field(default_factory=set)  # paths whose directory entry is on disk

    def apply(self, record: list[Any]) -> None:
        kind = record[0]
        if kind == "S":
            rel, n = record[1], int(record[2])
            self.synced[rel] = n
            self.durable.add(rel)
            self.durable.update(_ancestors(rel))
        elif kind == "D":
            directory, names = record[1], record[2]
            for name in names:
                self.durable.add(os.path.join(directory, name) if directory else name)
            if directory:
                self.durable.add(directory)
                self.durable.update(_ancestors(directory))
        elif kind == "R":
            old, new = record[1], record[2]
            self._drop(new, keep_entry=True)
            for rel in [r for r in self.synced if _under(r, old)]:
                self.synced[new + rel[len(old) :]] = self.synced.pop(rel)
            # The old name is gone (the model never brings it back); the new name is durable
            # only if it already was (a rename over a durable entry) or once synced again.
            for rel in [r for r in self.durable if _under(r, old)]:
                self.durable.discard(rel)
                if rel != old:
                    self.durable.add(new + rel[len(old) :])
        elif kind == "X":
            self._drop(record[1], keep_entry=False)
        elif kind == "T":
            rel, n = record[1], int(record[2])
            if rel in self.synced:
                self.synced[rel] = min(self.synced[rel], n)
        elif kind == "N":  # compacted form: a durable entry without synced data
            self.durable.add(record[1])
        else:
            raise ValueError(f"unknown journal record {record!r}")

    def _drop(self, rel: str, keep_entry: bool) -> None:
        for r in [r for r in self.synced if _under(r, rel)]:
            del self.synced[r]
        for r in [r for r in self.durable if _under(r, rel)]:
            if not (keep_entry and r == rel):
                self.durable.discard(r)

    def would_change(self, record: list[Any]) -> bool:
        """False for a record that cannot change the state (it is then not written)."""
        kind = record[0]
        if kind == "S":
            return self.synced.get(record[1]) != record[2] or any(
                a not in self.durable for a in _ancestors(record[1])
            )
        if kind in ("X", "R"):
            rel = record[1]
            return (
                any(_under(r, rel) for r in self.synced)
                or any(_under(r, rel) for r in self.durable)
                or (kind == "R" and record[2] in self.synced)
            )
        if kind == "T":
            return self.synced.get(record[1], -1) > record[2]
        return True

    def records(self) -> list[list[Any]]:
        """The compacted journal."""
        out: list[list[Any]] = [["S", rel, n] for rel, n in sorted(self.synced.items())]
        out += [["N", rel] for rel in sorted(self.durable - self.synced.keys())]
        return out


def read_journal(log_dir: PathLike) -> SyncedState:
    """Replay ``<log_dir>/.isrlab-synced``; a torn last line (a crash while appending) is skipped."""
    path = Path(log_dir) / JOURNAL_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JournalError(
            f"{log_dir} has no {JOURNAL_NAME}: the broker did not record what reached disk "
            "(isrlab.power.journal.enable=false, or not an isrlab log dir)"
        ) from None
    state = SyncedState()
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            record = json.loads(line)
            state.apply(record)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            if number >= len(lines) - 1:  # the last line, torn by a crash mid-append
                log.warning("%s: ignoring a torn last record", path)
                break
            raise JournalError(f"{path}:{number}: unreadable journal record ({exc})") from None
    return state


def _walk(root: str) -> Iterator[tuple[str, bool]]:
    """(relative path, is a directory) of everything under ``root`` but the journal, parents first."""
    for current, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in sorted(dirnames):
            yield (os.path.join(rel_dir, name) if rel_dir else name), True
        for name in sorted(filenames):
            if not rel_dir and name in _OWN_FILES:
                continue
            yield (os.path.join(rel_dir, name) if rel_dir else name), False


def _write_atomically(log_dir: str, records: list[list[Any]]) -> None:
    tmp = os.path.join(log_dir, JOURNAL_TMP)
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(data)
        out.flush()
        _fsync(out.fileno())
    os.replace(tmp, os.path.join(log_dir, JOURNAL_NAME))
    _fsync_dir_only(log_dir)


def _fsync_dir_only(directory: PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _baseline(log_dir: str) -> SyncedState:
    state = SyncedState()
    for rel, is_dir in _walk(log_dir):
        state.durable.add(rel)
        if not is_dir:
            with contextlib.suppress(FileNotFoundError):
                state.synced[rel] = os.stat(os.path.join(log_dir, rel)).st_size
    return state


def _compact(log_dir: str, state: SyncedState) -> SyncedState:
    """Keep what still exists; a synced length never exceeds the file's length."""
    out = SyncedState()
    for rel, is_dir in _walk(log_dir):
        if rel in state.durable:
            out.durable.add(rel)
        if not is_dir and rel in state.synced:
            with contextlib.suppress(FileNotFoundError):
                size = os.stat(os.path.join(log_dir, rel)).st_size
                out.synced[rel] = min(state.synced[rel], size)
    return out


class Journal:
    """The open journal of one log dir: appends and fsyncs records, keeps the replayed state."""

    def __init__(self, log_dir: str, state: SyncedState):
        self.log_dir = log_dir
        self.state = state
        self._lock = threading.Lock()
        self._fd = os.open(
            os.path.join(log_dir, JOURNAL_NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )

    def record(self, record: list[Any]) -> None:
        """Append ``record``; it is on disk when this returns, or, inside ``batched()``, when
        the batch ends (one fsync of the journal for all the batch's records)."""
        pending = getattr(_batch, "journals", None)
        with self._lock:
            if self._fd < 0 or not self.state.would_change(record):
                return
            line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
            os.write(self._fd, line)
            if pending is None:
                _fsync(self._fd)
            else:
                pending.add(self)
            self.state.apply(record)

    def sync(self) -> None:
        with self._lock:
            if self._fd >= 0:
                _fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_journals: dict[str, Journal] = {}
_registry_lock = threading.Lock()
#: per thread: the journals written inside ``batched()`` and not yet fsynced
_batch = threading.local()


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Group the journal records of several fsyncs that belong together (a segment and its
    indexes; a checkpoint's tmp file, rename and directory) under one fsync of the journal,
    done before the block is left: each record still follows its own successful fsync, and
    all are on disk before the caller goes on (acknowledges, say). Nested blocks join the
    outermost one. If the block raises, the records written so far are synced all the same."""
    if getattr(_batch, "journals", None) is not None:
        yield
        return
    pending: set[Journal] = set()
    _batch.journals = pending
    try:
        yield
    finally:
        _batch.journals = None
        for journal in pending:
            journal.sync()


def attach(log_dir: PathLike, enabled: bool = True) -> Journal | None:
    """Start recording fsyncs under ``log_dir`` (broker start-up): compact the journal, or
    write the baseline when there is none. ``enabled=False`` removes a journal left by an earlier
    run (it would be stale) and records nothing."""
    root = os.path.abspath(log_dir)
    detach(root)
    for stale in [d for d in _journals if not os.path.isdir(d)]:  # removed log dirs (tests)
        detach(stale)
    if not enabled:
        for name in (JOURNAL_NAME, JOURNAL_TMP):  # not the truncation journal: still true
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
        return None
    os.makedirs(root, exist_ok=True)
    try:
        state = _compact(root, read_journal(root))
    except JournalError as exc:
        if os.path.exists(os.path.join(root, JOURNAL_NAME)):
            log.warning("%s; starting a new journal from what is on disk now", exc)
        state = _baseline(root)
    try:
        _write_atomically(root, state.records())
    except OSError as exc:
        # e.g. a full disk: the broker still starts (it serves reads, refuses writes), but
        # without a journal it can trust, so none is kept and a power loss is refused
        for name in (JOURNAL_NAME, JOURNAL_TMP):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        log.warning(
            "%s: cannot write the fsync journal (%s): power-loss bookkeeping is off until the "
            "next start",
            root,
            exc,
        )
        return None
    journal = Journal(root, state)
    with _registry_lock:
        _journals[root] = journal
    return journal


def detach(log_dir: PathLike) -> None:
    with _registry_lock:
        journal = _journals.pop(os.path.abspath(log_dir), None)
    if journal is not None:
        journal.close()


def _journal_for(path: PathLike) -> tuple[Journal, str] | None:
    if not _journals:
        return None
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    while True:
        journal = _journals.get(directory)
        if journal is not None:
            rel = os.path.relpath(absolute, directory)
            return journal, "" if rel == "." else rel
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _record(path: PathLike, make: Any) -> None:
    found = _journal_for(path)
    if found is not None:
        journal, rel = found
        if rel and rel not in _OWN_FILES:
            journal.record(make(rel))


# -- the fsync sites -------------------------------------------------------------------------


def fsync_fd(fd: int, path: PathLike) -> None:
    """fsync an open file, then record its length as synced."""
    _fsync(fd)
    if _journals:
        size = os.fstat(fd).st_size
        _record(path, lambda rel: ["S", rel, size])


def fsync_file(path: PathLike) -> None:
    """Open, fsync and close ``path`` (an mmapped index: its dirty pages are written too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def fsync_dir(directory: PathLike) -> None:
    """fsync a directory, then record the entries it holds."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        _fsync(fd)
        if _journals:
            found = _journal_for(os.path.join(directory, "x"))
            if found is not None:
                journal, rel = found
                parent = os.path.dirname(rel)
                names = sorted(n for n in os.listdir(fd) if parent or n not in _OWN_FILES)
                journal.record(["D", parent, names])
    finally:
        os.close(fd)


def replace(src: PathLike, dst: PathLike) -> None:
    """``os.replace``, followed by the journal."""
    os.replace(src, dst)
    if _journals:
        found = _journal_for(dst)
        if found is not None:
            journal, rel_dst = found
            rel_src = os.path.relpath(os.path.abspath(src), journal.log_dir)
            journal.record(["R", rel_src, rel_dst])


def unlink(path: PathLike, missing_ok: bool = False) -> None:
    """``os.unlink``, followed by the journal."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
    if _journals:
        _record(path, lambda rel: ["X", rel])


def rmtree(path: PathLike) -> None:
    """Remove a directory tree (errors ignored, as the callers did), followed by the journal."""
    shutil.rmtree(path, ignore_errors=True)
    if _journals and not os.path.exists(path):
        _record(path, lambda rel: ["X", rel])


def truncated(path: PathLike, size: int) -> None:
    """Tell the journal that ``path`` was cut to ``size`` bytes (call after the ftruncate)."""
    if _journals:
        _record(path, lambda rel: ["T", rel, size])


def write_atomically(path: PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: tmp file, fsync, rename, directory fsync."""
    tmp = f"{os.fspath(path)}.tmp"
    with batched():
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                fsync_fd(out.fileno(), tmp)
            replace(tmp, path)
        except OSError:
            unlink(tmp, missing_ok=True)
            raise
        fsync_dir(os.path.dirname(os.path.abspath(path)))


# -- power loss ------------------------------------------------------------------------------


#: the page size of the torn-tail model: zeros end on a page boundary
PAGE_BYTES = 4096


@dataclass
class PowerLossReport:
    log_dir: str
    truncated: list[tuple[str, int, int]] = field(default_factory=list)  # path, from, to
    emptied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: with a torn seed: path, unsynced bytes kept, zeroed bytes among them
    torn: list[tuple[str, int, int]] = field(default_factory=list)
    torn_seed: int | None = None

    def summary(self) -> str:
        lost = sum(old - new for _, old, new in self.truncated)
        text = (
            f"{self.log_dir}: {len(self.truncated)} file(s) cut back ({lost} bytes), "
            f"{len(self.emptied)} emptied, {len(self.deleted)} deleted"
        )
        if self.torn_seed is not None:
            kept = sum(k for _, k, _ in self.torn)
            zeroed = sum(z for _, _, z in self.torn)
            text += (
                f"; torn (seed {self.torn_seed}): {len(self.torn)} file(s) kept part of their "
                f"unsynced bytes ({kept} bytes, {zeroed} of them zeros)"
            )
        return text


@dataclass(frozen=True)
class _Tear:
    """What a torn power loss leaves of one file: its first ``cut`` bytes, the bytes from
    ``zeros_from`` to ``cut`` reading as zeros (``zeros_from == cut``: none)."""

    cut: int
    zeros_from: int


def _entry_survives(seed: int, rel: str) -> bool:
    """Whether the seed's torn power loss keeps an entry that was never made durable (the file
    system committed it on its own, as ext4's journal does every few seconds): one in two."""
    return random.Random(f"{seed}:entry:{rel}").random() < 0.5


def _draw_tear(seed: int, rel: str, synced: int, size: int) -> _Tear:
    """The seed's tear of file ``rel``: its synced bytes and none, all or a prefix of the rest;
    a third of the tears that keep something end with a page of zeros. Drawn from the seed and
    the path alone, so one seed tears the same files the same way whatever the walk order."""
    rng = random.Random(f"{seed}:{rel}")
    unsynced = size - synced
    shape = rng.random()
    if shape < 0.25:
        cut = synced
    elif shape < 0.5 or unsynced < 2:
        cut = size
    else:
        cut = synced + rng.randint(1, unsynced - 1)
    zeros_from = cut
    if cut > synced and rng.random() < 1 / 3:
        zeros_from = max(synced, (cut - 1) // PAGE_BYTES * PAGE_BYTES)
    return _Tear(cut, zeros_from)


def apply_power_loss(log_dir: PathLike, torn_seed: int | None = None) -> PowerLossReport:
    """Leave ``log_dir`` as a power loss would (run it while the broker is dead, after kill -9).

    Every file whose directory entry never reached disk is deleted (a directory with everything
    under it); every other file is cut back to its synced length (to 0 if no byte of it was
    synced). With ``torn_seed``, a file may keep part of its unsynced tail instead, the last
    page of it possibly zeros (the module's docstring; ``_draw_tear``). Before a partition's
    segment is cut, zeroed or deleted, the records it loses (every batch not whole and intact
    before the first byte lost) are appended to the log dir's truncation journal
    (``inventory.record_power_loss``, kind ``power-loss``): the reconciliation of unseen
    writes names them. isrlab's own files (this journal, the truncation journal) are left
    alone. Afterwards what is left is on disk: the journal is rewritten as its baseline.
    """
    root = os.path.abspath(log_dir)
    if not os.path.isdir(root):
        raise JournalError(f"{log_dir} is not a directory")
    from isrlab.broker.log.inventory import is_segment, record_power_loss

    state = read_journal(root)
    report = PowerLossReport(root, torn_seed=torn_seed)
    # per partition directory: a segment was cut short, so the later ones keep no more than
    # their synced bytes (segments are walked in base-offset order: their names sort so)
    cut_short: set[str] = set()
    gone: list[str] = []
    for rel, is_dir in list(_walk(root)):
        if any(_under(rel, g) for g in gone):
            continue
        full = os.path.join(root, rel)
        segment = not is_dir and is_segment(Path(full))
        parent = os.path.dirname(rel)
        # this file's tear seed: None, the worst case (no seed, or a segment after a cut)
        seed = None if segment and parent in cut_short else torn_seed
        if rel not in state.durable and not (seed is not None and _entry_survives(seed, rel)):
            if segment:
                cut_short.add(parent)
            # the records of every segment about to vanish, in the truncation journal first
            doomed = [Path(full)]
            if is_dir:
                doomed = sorted(p for p in Path(full).rglob("*") if p.is_file())
            for path in doomed:
                if is_segment(path):
                    record_power_loss(path, 0)
            if is_dir:
                shutil.rmtree(full)
            else:
                os.unlink(full)
            gone.append(rel)
            report.deleted.append(rel)
            continue
        if is_dir:
            continue
        size = os.stat(full).st_size
        keep = state.synced.get(rel)
        synced = min(keep or 0, size)
        tear = _Tear(synced, synced)
        if seed is not None and size > synced:
            tear = _draw_tear(seed, rel, synced, size)
        if segment and (tear.cut < size or tear.zeros_from < tear.cut):
            cut_short.add(parent)
        if size > tear.zeros_from and segment:
            record_power_loss(Path(full), tear.zeros_from)
        if tear.cut < size:
            os.truncate(full, tear.cut)
        if tear.zeros_from < tear.cut:
            with open(full, "r+b") as f:
                f.seek(tear.zeros_from)
                f.write(bytes(tear.cut - tear.zeros_from))
        if tear.cut > synced:
            report.torn.append((rel, tear.cut - synced, tear.cut - tear.zeros_from))
        if keep is None and tear.cut == 0:
            report.emptied.append(rel)
        elif size > tear.cut:
            report.truncated.append((rel, size, tear.cut))
    # what is left is the disk now
    for rel, is_dir in _walk(root):
        full = os.path.join(root, rel)
        if is_dir:
            _fsync_dir_only(full)
        else:
            fd = os.open(full, os.O_RDONLY)
            try:
                _fsync(fd)
            finally:
                os.close(fd)
    _write_atomically(root, _baseline(root).records())
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m isrlab.broker.log.durable LOG_DIR...``: apply a power loss to each."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m isrlab.broker.log.durable LOG_DIR... (after kill -9)")
        return 0 if args else 2
    status = 0
    for arg in args:
        try:
            print(apply_power_loss(arg).summary())
        except (JournalError, OSError) as exc:
            print(f"power-loss: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    raise SystemExit(main())
