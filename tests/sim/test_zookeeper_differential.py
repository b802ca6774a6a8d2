"""The simulated ZooKeeper against the real one: the same scripts through kazoo's API on both.

Each script is a list of steps by one of two clients: create (ephemeral, sequence, makepath),
get / exists / get_children (with or without a watch), set and delete (any version,
delete recursive too), ensure_path, sync, DataWatch / ChildrenWatch recipes, and closing and
reopening a client's session. After every step each client's watch callbacks are collected
(the real client's are waited for: a sync, then a marker through kazoo's callback queue). What
is compared: each result or exception class, data, versions, cversions, children, numChildren,
dataLength, ephemeral owners (as the sessions' order of appearance), every watch and recipe
callback, and the zxids (czxid, mzxid, pzxid) as distances from an anchor write, so their
order, their equalities and how many txns lie between them (failed writes and session txns
included) all have to agree.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import Callback

from isrlab.harness.sim.clock import VirtualTimeLoop
from isrlab.harness.sim.kazoo_client import SimEnsemble, SimKazooClient

pytestmark = pytest.mark.integration

Step = tuple[Any, ...]
CLIENTS = 2


class Backend:
    """Two clients under one fresh chroot, an anchor zxid, and per-client event logs."""

    def __init__(self) -> None:
        self.events: list[list[Any]] = [[] for _ in range(CLIENTS)]
        self.sessions: list[int] = []
        self.clients: list[Any] = []
        self.anchor = 0

    def setup(self) -> None:
        for _ in range(CLIENTS):
            c = self.new_client()
            c.start()
            self.clients.append(c)
            self.saw_session(c)
        self.anchor = self.clients[0].create("/anchor", b"", include_data=True)[1].czxid
        self.settle()

    def saw_session(self, c: Any) -> None:
        self.sessions.append(c.client_id[0])

    def new_client(self) -> Any:
        raise NotImplementedError

    def settle(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for c in self.clients:
            c.stop()
            c.close()


class RealBackend(Backend):
    def __init__(self, connect: str):
        super().__init__()
        self.hosts = connect + "/d" + uuid.uuid4().hex[:12]
        root = KazooClient(hosts=connect)
        root.start(timeout=30)
        root.ensure_path("/" + self.hosts.partition("/")[2])
        root.stop()
        root.close()

    def new_client(self) -> Any:
        return KazooClient(hosts=self.hosts, timeout=10)

    def settle(self) -> None:
        for c in self.clients:
            if not c.connected:
                continue
            c.sync("/")
            done = threading.Event()
            c.handler.dispatch_callback(Callback("watch", done.set, ()))
            assert done.wait(10), "kazoo's callback queue did not drain"


class SimBackend(Backend):
    def __init__(self, seed: int = 0):
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.ensemble = SimEnsemble(self.loop, seed=seed)
        root = SimKazooClient(self.ensemble)
        root.start()
        self.hosts = "sim/d0"
        root.ensure_path("/d0")
        root.stop()

    def new_client(self) -> Any:
        return SimKazooClient(self.ensemble, self.hosts, timeout=10)

    def settle(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0.05))

    def close(self) -> None:
        super().close()
        self.loop.close()


def _norm_stat(b: Backend, stat: Any) -> Any:
    if stat is None:
        return None

    def z(x: int) -> Any:
        return x - b.anchor if x >= b.anchor else "before"

    owner = stat.ephemeralOwner
    return {
        "version": stat.version,
        "cversion": stat.cversion,
        "aversion": stat.aversion,
        "owner": b.sessions.index(owner) if owner else None,
        "dataLength": stat.dataLength,
        "numChildren": stat.numChildren,
        "czxid": z(stat.czxid),
        "mzxid": z(stat.mzxid),
        "pzxid": z(stat.pzxid),
    }


def _recipe_stat(b: Backend, stat: Any) -> Any:
    """What a recipe's callback may be compared on: the real one reads the node on kazoo's
    callback thread while the test's thread goes on (an ensure_path's next create may or may
    not have happened), so what a step's later writes change is left out."""
    full = _norm_stat(b, stat)
    return full and {k: full[k] for k in ("version", "owner", "dataLength", "czxid", "mzxid")}


def _recorder(b: Backend, i: int, tag: str) -> Any:
    def record(event: Any) -> None:
        b.events[i].append((tag, event.type, event.path))

    return record


def apply(b: Backend, step: Step) -> Any:
    i, op, *args = step
    c = b.clients[i]
    try:
        if op == "create":
            path, data, ephemeral, sequence, makepath = args
            return c.create(path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath)
        if op == "get":
            path, watch = args
            data, stat = c.get(path, watch=_recorder(b, i, "get") if watch else None)
            return data, _norm_stat(b, stat)
        if op == "exists":
            path, watch = args
            return _norm_stat(b, c.exists(path, watch=_recorder(b, i, "exists") if watch else None))
        if op == "children":
            path, watch = args
            kids = c.get_children(path, watch=_recorder(b, i, "children") if watch else None)
            return sorted(kids)
        if op == "set":
            path, data, version = args
            return _norm_stat(b, c.set(path, data, version=version))
        if op == "delete":
            path, version, recursive = args
            return c.delete(path, version=version, recursive=recursive)
        if op == "ensure":
            return c.ensure_path(args[0])
        if op == "sync":
            return c.sync(args[0])
        if op == "datawatch":
            path = args[0]

            def on_data(data: bytes | None, stat: Any) -> None:
                b.events[i].append(("datawatch", path, data, _recipe_stat(b, stat)))

            c.DataWatch(path, on_data)
            return None
        if op == "childwatch":
            path = args[0]

            def on_children(children: list[str]) -> None:
                b.events[i].append(("childwatch", path, sorted(children)))

            c.ChildrenWatch(path, on_children)
            return None
        if op == "restart":  # close the session (ephemerals go), open a new one
            c.stop()
            c.start()
            b.saw_session(c)
            return None
        raise AssertionError(op)
    except KazooException as e:
        return type(e).__name__


def run(b: Backend, script: list[Step]) -> list[Any]:
    b.setup()
    out: list[Any] = []
    try:
        for step in script:
            out.append((step, apply(b, step)))
            b.settle()
            if step[1] == "restart":
                # kazoo's stop() stops its callback thread before the connection thread
                # closes the session and hands the watches their NONE event: the real
                # client delivers it or drops it depending on which thread wins.
                b.events[step[0]][:] = [e for e in b.events[step[0]] if e[1:] != ("NONE", None)]
            out.append([sorted(map(repr, ev)) for ev in b.events])
            for ev in b.events:
                ev.clear()
    finally:
        b.close()
    return out


def compare(connect: str, script: list[Step]) -> None:
    real = run(RealBackend(connect), script)
    sim = run(SimBackend(), script)
    for k, (r, s) in enumerate(zip(real, sim, strict=True)):
        assert s == r, f"step {k // 2}: {script[k // 2]}\n real: {r}\n  sim: {s}"


SCRIPTS: dict[str, list[Step]] = {
    "create-get-set-delete": [
        (0, "create", "/a", b"x", False, False, False),
        (0, "create", "/a", b"y", False, False, False),  # NodeExists, takes a zxid
        (0, "get", "/a", False),
        (0, "set", "/a", b"yy", 0),
        (0, "set", "/a", b"zz", 0),  # BadVersion
        (0, "set", "/a", b"zz", -1),
        (0, "create", "/a/b", b"", False, False, False),
        (0, "delete", "/a", -1, False),  # NotEmpty
        (0, "delete", "/a", 7, False),  # BadVersion before NotEmpty
        (0, "delete", "/a/b", 0, False),
        (0, "exists", "/a", False),
        (0, "delete", "/a", -1, False),
        (0, "get", "/a", False),
        (0, "delete", "/a", -1, False),
        (0, "create", "/q/r/s", b"1", False, False, False),  # NoNode
        (0, "create", "/q/r/s", b"1", False, False, True),  # makepath
        (0, "children", "/q", False),
        (0, "delete", "/q", -1, True),
        (0, "exists", "/q", False),
    ],
    "sequential-and-ephemeral": [
        (0, "create", "/s", b"", False, False, False),
        (0, "create", "/s/n-", b"a", False, True, False),
        (1, "create", "/s/n-", b"b", True, True, False),
        (0, "delete", "/s/n-0000000000", -1, False),
        (0, "create", "/s/n-", b"c", False, True, False),
        (0, "children", "/s", False),
        (1, "create", "/s/e", b"", True, False, False),
        (0, "create", "/s/e/child", b"", False, False, False),  # NoChildrenForEphemerals
        (1, "create", "/s/e", b"", True, False, False),
        (0, "get", "/s/e", False),
        (0, "exists", "/s", False),
    ],
    "watches-fire-once": [
        (0, "exists", "/w", True),
        (1, "create", "/w", b"1", False, False, False),
        (1, "set", "/w", b"2", -1),  # the exists watch fired already: nothing
        (0, "get", "/w", True),
        (0, "get", "/w", True),
        (0, "children", "/w", True),
        (1, "set", "/w", b"3", -1),
        (0, "get", "/w", True),
        (0, "children", "/w", True),
        (1, "create", "/w/c", b"", False, False, False),
        (1, "delete", "/w/c", -1, False),
        (0, "children", "/w", True),
        (1, "delete", "/w", -1, False),  # one NodeDeleted for data + child watches
        (0, "get", "/w", True),  # NoNode: no watch set
        (1, "create", "/w", b"", False, False, False),
    ],
    "ephemerals-go-with-the-session": [
        (0, "create", "/brokers/ids", b"", False, False, True),
        (1, "create", "/brokers/ids/1", b"reg", True, False, False),
        (0, "childwatch", "/brokers/ids"),
        (0, "datawatch", "/brokers/ids/1"),
        (0, "exists", "/brokers/ids/1", True),
        (1, "restart"),
        (0, "exists", "/brokers/ids/1", False),
        (1, "create", "/brokers/ids/1", b"reg2", True, False, False),
        (0, "get", "/brokers/ids/1", False),
        (1, "set", "/brokers/ids/1", b"reg3", 0),
        (1, "delete", "/brokers/ids/1", -1, False),
        (0, "datawatch", "/nothing"),
        (1, "ensure", "/nothing/deeper"),
        (0, "sync", "/brokers"),
    ],
    "controller-cas": [
        (0, "create", "/controller", b"0", True, False, False),
        (1, "create", "/controller", b"1", True, False, False),
        (0, "create", "/controller_epoch", b"1", False, False, False),
        (1, "get", "/controller_epoch", False),
        (0, "set", "/controller_epoch", b"2", 0),
        (1, "set", "/controller_epoch", b"2", 0),  # the loser's CAS
        (1, "datawatch", "/controller"),
        (0, "restart"),
        (1, "create", "/controller", b"1", True, False, False),
        (1, "set", "/controller_epoch", b"3", 1),
        (0, "get", "/controller", True),
    ],
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripted_sequences_agree(real_zookeeper: Any, name: str) -> None:
    compare(real_zookeeper.connect, SCRIPTS[name])


PATHS = ["/a", "/b", "/a/x", "/a/y", "/b/x"]
DATA = [b"", b"1", b"22"]


def _steps() -> st.SearchStrategy[Step]:
    """Single steps over a small alphabet. No recursive delete here (the scripts have one):
    with a ChildrenWatch on the node, what the real recipe reads between the deletions is a
    race between kazoo's threads."""
    i = st.integers(0, CLIENTS - 1)
    p = st.sampled_from(PATHS)
    d = st.sampled_from(DATA)
    v = st.sampled_from([-1, 0, 1, 2])
    b = st.booleans()
    return st.one_of(
        st.tuples(i, st.just("create"), p, d, b, st.just(False), b),
        st.tuples(
            i, st.just("create"), st.sampled_from(["/a/s-", "/b/s-"]), d, b, st.just(True), b
        ),
        st.tuples(i, st.just("get"), p, b),
        st.tuples(i, st.just("exists"), p, b),
        st.tuples(i, st.just("children"), st.sampled_from(["/", *PATHS]), b),
        st.tuples(i, st.just("set"), p, d, v),
        st.tuples(i, st.just("delete"), p, v, st.just(False)),
        st.tuples(i, st.just("ensure"), p),
        st.tuples(i, st.just("datawatch"), p),
        st.tuples(i, st.just("childwatch"), st.sampled_from(["/", "/a", "/b"])),
        st.tuples(i, st.just("restart")),
    )


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=st.lists(_steps(), min_size=1, max_size=14))
def test_generated_sequences_agree(real_zookeeper: Any, script: list[Step]) -> None:
    compare(real_zookeeper.connect, script)
