"""The corrupt fault against the shared fake cluster, whose shell runs here: the files of a
fake data directory really get their bits flipped, cut, copied aside and put back, and the
completion says exactly what was done. The fault on real brokers: tests/nemeses/
test_corrupt_cluster.py and docs/durability.md."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from isrlab.nemeses.base import NemesisError
from isrlab.nemeses.compose import KINDS, build, schedule
from isrlab.nemeses.corrupt import FILES, CorruptFault
from tests.nemeses.conftest import RecordingDB

SEGMENTS = (0, 300, 600)


def cluster(tmp_path: Path, n: int = 5) -> RecordingDB:
    """Every node's data dir holds partition t0-0 (three segments with their indexes, a
    .txnindex of the last, a snapshot, the leader-epoch file) and the log-dir checkpoints; python is this one."""
    followers = tuple(f"n{i}" for i in range(2, min(n, 3) + 1))
    db = RecordingDB(n, leader="n1", followers=followers, root=tmp_path)  # replicas n1..n3
    for node in db.names:
        data = tmp_path / node / "broker" / "data"
        part = data / "t0-0"
        part.mkdir(parents=True)
        for base in SEGMENTS:
            stem = f"{base:020d}"
            (part / f"{stem}.log").write_bytes(bytes(range(256)) * 20)
            (part / f"{stem}.index").write_bytes(b"\x00\x00\x00\x10" * 64)
            (part / f"{stem}.timeindex").write_bytes(b"\x01" * 120)
        (part / f"{600:020d}.snapshot").write_bytes(b"snap" * 10)
        (part / f"{600:020d}.txnindex").write_bytes(b"\x00" * 68)
        (part / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
        for name in (
            "recovery-point-offset-checkpoint",
            "replication-offset-checkpoint",
            "log-start-offset-checkpoint",
        ):
            (data / name).write_text("0\n1\nt0 0 300\n")
        venv = tmp_path / node / "venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").symlink_to(Path(__import__("sys").executable))
    return db


def snapshot_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def fault(db: RecordingDB, seed: int = 0) -> CorruptFault:
    return CorruptFault(db, random.Random(seed))  # type: ignore[arg-type]


def test_bit_flips_change_exactly_the_reported_bits_in_the_range(tmp_path: Path) -> None:
    db = cluster(tmp_path)
    before = snapshot_of(tmp_path)
    done = fault(db).start(
        {"target": "one", "key": "t0/0", "file": "segment", "range": [0.5, 0.6], "bits": 8}
    )
    [damage] = done["damage"]
    node = damage["node"]
    path = Path(damage["file"])
    assert path == tmp_path / node / "broker" / "data" / "t0-0" / f"{0:020d}.log"
    assert done["nodes"] == [node] and damage["size"] == 5120
    flips = damage["flips"]
    assert len(flips) == 8 and all(2560 <= o < 3072 and 0 <= b < 8 for o, b in flips)
    expected = bytearray(before[str(path.relative_to(tmp_path))])
    for o, b in flips:
        expected[o] ^= 1 << b
    assert path.read_bytes() == bytes(expected)
    after = snapshot_of(tmp_path)
    changed = [k for k in before if before[k] != after[k]]
    assert changed == [str(path.relative_to(tmp_path))] or not changed  # two flips may cancel
    # the broker was killed before its file changed and started after
    mine = [c for c in db.calls if c[1] == node]
    assert mine[0] == ("kill", node) and mine[-1] == ("start", node)
    assert ("exec", node) in mine[1:-1]


@pytest.mark.parametrize("file", sorted(FILES))
def test_every_file_kind_is_found_and_truncated(tmp_path: Path, file: str) -> None:
    db = cluster(tmp_path, 3)
    done = fault(db).start(
        {"target": "all", "file": file, "mode": "truncate", "at": 0.25, "segment": "last"}
    )
    assert done["nodes"] == db.names
    for d in done["damage"]:
        path = Path(d["file"])
        assert path.stat().st_size == d["truncated_to"] == int(d["size"] * 0.25)
        if file in ("segment", "index", "timeindex"):
            assert path.name.startswith(f"{600:020d}")  # the last segment's
    assert not db.down


def test_minority_damages_one_of_the_three_replicas_and_nothing_else(tmp_path: Path) -> None:
    db = cluster(tmp_path)
    before = snapshot_of(tmp_path)
    done = fault(db, seed=4).start({"target": "minority", "file": "index", "bits": 3})
    hit = done["nodes"]
    assert done["replicas"] == ["n1", "n2", "n3"] and len(hit) == 1 and hit[0] in done["replicas"]
    after = snapshot_of(tmp_path)
    touched = {k.split("/")[0] for k in before if before[k] != after[k]}
    assert touched <= set(hit) and touched
    assert {n for op, n in db.calls if op == "kill"} == set(hit)


def test_a_missing_file_is_reported_and_the_broker_still_starts(tmp_path: Path) -> None:
    db = cluster(tmp_path, 1)
    done = fault(db).start({"target": "one", "file": "txnindex"})
    assert done["nodes"] == [] and "no 00000000000000000000.txnindex" in done["damage"][0]["error"]
    assert db.calls[-1] == ("start", "n1") and not db.down


def test_snapshot_and_restore_bring_an_old_disk_back(tmp_path: Path) -> None:
    db = cluster(tmp_path, 3)
    f = fault(db)
    done = f.start({"target": "one", "mode": "snapshot"})
    [node] = done["nodes"]
    data = tmp_path / node / "broker" / "data"
    old = snapshot_of(data)
    (data / "t0-0" / f"{900:020d}.log").write_bytes(b"newer")  # the node moves on
    (data / "recovery-point-offset-checkpoint").write_text("0\n1\nt0 0 900\n")
    stopped = f.stop()
    assert stopped == {"nodes": [node], "restored": [node]}
    assert snapshot_of(data) == old
    assert not Path(str(data) + ".isrlab-old-disk").exists()
    assert [c for c in db.calls if c[1] == node][-1] == ("start", node)
    assert f.stop() == {"nodes": [], "restored": []}


def test_heal_drops_copies_and_starts_dead_brokers(tmp_path: Path) -> None:
    db = cluster(tmp_path, 3)
    f = fault(db)
    f.start({"target": "all", "mode": "snapshot"})
    db.down.add("n2")
    assert f.heal() == ["n2"]
    assert not list(tmp_path.glob("*/broker/data.isrlab-old-disk"))
    assert f.stop() == {"nodes": [], "restored": []}  # nothing left to restore


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"mode": "melt"}, "unknown mode"),
        ({"file": "wal"}, "unknown file"),
        ({"range": [0.6, 0.5]}, "empty"),
        ({"range": [0, 2]}, r"in \[0, 1\]"),
        ({"bits": 0}, "at least 1"),
        ({"segment": "second"}, "segment must be"),
        ({"mode": "truncate", "at": "half"}, "number"),
    ],
)
def test_bad_values_are_refused_before_anything_happens(
    tmp_path: Path, value: dict[str, object], why: str
) -> None:
    db = cluster(tmp_path, 1)
    with pytest.raises(NemesisError, match=why):
        fault(db).start(value)
    assert db.calls == []


def test_the_schedule_draws_corrupt_values_and_build_gives_the_fault(tmp_path: Path) -> None:
    assert "corrupt" in KINDS
    ops = schedule("corrupt", 5.0, seed=2, targets=["minority"], keys=["t0/0", "t1/0"])
    starts = [op["value"] for op in itertools.islice(ops, 400) if op.get("f") == "start-corrupt"]
    assert {s["target"] for s in starts} == {"minority"}
    assert {s["mode"] for s in starts} == {"bitflip", "truncate", "snapshot"}
    assert {s["file"] for s in starts if "file" in s} == set(FILES)
    assert {s["key"] for s in starts} == {"t0/0", "t1/0"}
    db = cluster(tmp_path, 3)
    nem = build("corrupt", db, db.test)  # type: ignore[arg-type]
    assert isinstance(nem.faults["corrupt"], CorruptFault)
    for value in starts[:6]:  # every drawn value works on the fake cluster
        done = nem.invoke(
            {"process": "nemesis", "type": "info", "f": "start-corrupt", "value": value}
        )
        assert "error" not in done, done
        nem.invoke({"process": "nemesis", "type": "info", "f": "stop-corrupt", "value": None})
