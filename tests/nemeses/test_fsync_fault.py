"""The fsync-fail fault's order of operations (a fake cluster), the shim it drives on real
nodes (`nemeses.fsyncshim`, loaded in a real interpreter), and its place in the composer."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from isrlab.nemeses.compose import KINDS, build, schedule
from isrlab.nemeses.fsync import FsyncFailFault

SHIM = Path(__file__).resolve().parents[2] / "nemeses" / "fsyncshim.py"


class FakeDB:
    def __init__(self) -> None:
        self.test: dict[str, Any] = {}
        self.events: list[tuple[str, str]] = []
        self.failing: set[str] = set()
        self.down: set[str] = set()

    @property
    def names(self) -> list[str]:
        return ["n1", "n2", "n3"]

    def set_fsync_failing(self, node: str, failing: bool) -> bool:
        self.events.append(("fail" if failing else "repair", node))
        had = node in self.failing
        (self.failing.add if failing else self.failing.discard)(node)
        return failing or had

    def broker_state(self, node: str) -> str:
        return "down" if node in self.down else "running"

    def start(self, node: str) -> int:
        self.events.append(("start", node))
        self.down.discard(node)
        return 1


def test_start_sets_the_flag_and_stop_repairs_then_starts_the_halted_brokers() -> None:
    db = FakeDB()
    fault = FsyncFailFault(db, random.Random(1))  # type: ignore[arg-type]
    done = fault.start({"target": "all"})
    assert done == {"target": "all", "nodes": ["n1", "n2", "n3"]}
    assert db.failing == {"n1", "n2", "n3"}
    db.down.add("n2")  # it halted at its first failed fsync
    assert fault.stop() == {"nodes": ["n1", "n2", "n3"], "started": ["n2"]}
    assert db.failing == set() and db.down == set()
    assert db.events.index(("repair", "n2")) < db.events.index(("start", "n2"))


def test_heal_repairs_every_node_whatever_this_fault_did() -> None:
    db = FakeDB()
    db.failing.add("n3")  # left by a run that ended mid-fault
    db.down.add("n3")
    fresh = FsyncFailFault(db, random.Random(0))  # type: ignore[arg-type]
    assert fresh.heal() == ["n3"]  # what compose.heal_all builds when the run did not
    assert db.failing == set()
    assert db.down == {"n3"}, "left to the kill fault's heal, which starts the dead brokers"


def test_fsync_fail_is_a_nemesis_kind_with_targets() -> None:
    assert "fsync-fail" in KINDS
    ops = list(
        itertools.islice(
            (op for op in schedule("fsync-fail", 1.0, 3, targets=["one"]) if op.get("f")), 2
        )
    )
    assert [op["f"] for op in ops] == ["start-fsync-fail", "stop-fsync-fail"]
    db = FakeDB()
    done = build("fsync-fail", db, {"seed": 3}).invoke(ops[0])  # type: ignore[arg-type]
    assert len(done["value"]["nodes"]) == 1 and db.failing == set(done["value"]["nodes"])


def test_the_shim_fails_fsync_with_eio_while_the_flag_file_exists(tmp_path: Path) -> None:
    flag = tmp_path / "fsync-fail"
    script = f"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("isrlab_fsyncshim", {str(SHIM)!r})
shim = importlib.util.module_from_spec(spec); spec.loader.exec_module(shim)
fd = os.open({str(tmp_path / "data")!r}, os.O_WRONLY | os.O_CREAT)
os.fsync(fd); os.fdatasync(fd)
open({str(flag)!r}, "w").close()
for call in (os.fsync, os.fdatasync):
    try:
        call(fd)
        sys.exit("fsync succeeded while the flag file existed")
    except OSError as e:
        assert e.errno == 5, e
os.unlink({str(flag)!r})
os.fsync(fd)
print("ok")
"""
    env = {**os.environ, "ISRLAB_FSYNC_FAIL_FILE": str(flag)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    env.pop("ISRLAB_FSYNC_FAIL_FILE")
    flag.touch()  # without the variable the shim changes nothing
    script_off = script.replace("open(" + repr(str(flag)) + ', "w").close()', "")
    off = subprocess.run([sys.executable, "-c", script_off], env=env, capture_output=True)
    assert off.returncode != 0 and b"fsync succeeded" in off.stderr
