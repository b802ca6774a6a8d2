"""A simulated ZooKeeper ensemble: sans-IO, deterministic, on a virtual clock.

`SimZooKeeper` is the ensemble's state machine as clients see it (one linearizable server: the
lag of a follower that has not yet applied a committed write is not modelled). It holds the
znode tree, sessions and the watch tables, and answers requests; it never sleeps, starts no
thread and reads no clock but the one it is given (anything with `time()` in seconds, such as
`clock.VirtualTimeLoop`). `kazoo_client.SimKazooClient` is the client side on top of it.

What it follows of ZooKeeper 3.8 (the server's `PrepRequestProcessor`, `DataTree`,
`SessionTrackerImpl`, `WatchManager`), because the broker reads or depends on it:

- zxids: every write that reaches the leader takes the next zxid, the failed ones too (a
  create of an existing node, a set with a bad version: ZooKeeper logs them as error txns);
  so do creating and closing a session. The closing of a session (close or expiry) deletes
  its ephemeral nodes in that one txn, all with its zxid.
- stats: czxid, mzxid, pzxid, ctime, mtime (virtual ms), version, cversion (child creations
  and deletions), aversion 0, ephemeralOwner, dataLength, numChildren; kazoo's `ZnodeStat`.
- create: NoNode (no parent), NodeExists, NoChildrenForEphemerals, in that order;
  sequential names are numbered `%010d`. set: NoNode, BadVersion. delete:
  NoNode, BadVersion, NotEmpty, in that order. Version -1 matches any. A sequential name counts
  the parent's child creations only, not its cversion (which deletions move too): what the
  real server answers in the differential test (two creations and a deletion, then `-0000000002`).
- watches: one-shot, per session and path, data watches (set by get on an existing node and
  by exists, on a missing node too) and child watches (get_children on an existing node).
  create fires NodeCreated then the parent's NodeChildrenChanged; set fires NodeDataChanged;
  delete fires one NodeDeleted per session watching the node (data or child watch) then the
  parent's NodeChildrenChanged. A connection that drops loses its watches (kazoo sets none
  again: its recipes read again on reconnection).
- sessions: the timeout is negotiated into [2, 20] ticks; a session expires when the ensemble
  has heard nothing from it for its timeout, at the next tick boundary after that
  (ZooKeeper's `ExpiryQueue`). A reachable client is heard continuously (kazoo pings every
  third of the timeout); one cut off is last heard at the cut.

Faults: `partition`/`heal` cut a session's client from the ensemble and back, `expire` ends a
session now, `lose_connection_on_next` makes the session's next request end in ConnectionLoss
with the write applied or not (drawn from the seeded `random.Random` when not given).

Each request goes through `request`; watch events and session notices go out through the
`notify` callable a session was opened with, synchronously, as the request or tick that
caused them runs; the client side decides when to deliver them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.protocol.states import EventType, ZnodeStat


class Clock(Protocol):
    def time(self) -> float: ...


class Notice(Enum):
    """What the ensemble tells a session's client besides watch events."""

    EXPIRED = "expired"  # the session ended while its client was reachable
    CUT = "cut"  # the client cannot reach the ensemble any more (it notices by timeout)
    REACHABLE = "reachable"  # the client can reach the ensemble again


@dataclass(frozen=True)
class WatchEvent:
    """A fired watch: `type` is kazoo's EventType (CREATED, DELETED, CHANGED, CHILD)."""

    type: str
    path: str


Notify = Callable[["WatchEvent | Notice"], None]


@dataclass
class Znode:
    data: bytes
    czxid: int
    mzxid: int
    pzxid: int
    ctime: int
    mtime: int
    ephemeral_owner: int = 0
    version: int = 0
    cversion: int = 0
    created_children: int = 0  # the next sequential child's number
    children: set[str] = field(default_factory=set)

    def stat(self) -> ZnodeStat:
        return ZnodeStat(
            czxid=self.czxid,
            mzxid=self.mzxid,
            ctime=self.ctime,
            mtime=self.mtime,
            version=self.version,
            cversion=self.cversion,
            aversion=0,
            ephemeralOwner=self.ephemeral_owner,
            dataLength=len(self.data),
            numChildren=len(self.children),
            pzxid=self.pzxid,
        )


@dataclass
class Session:
    id: int
    timeout_ms: int
    notify: Notify
    heard_ms: int
    reachable: bool = True
    ephemerals: set[str] = field(default_factory=set)
    # the next request ends in ConnectionLoss: None no, True applied first, False not applied
    lose_next: bool | None = None
    # watch events fired while the client could not be reached: on its TCP connection, which
    # lives on, they arrive when it can be reached again (dropped with the connection)
    held: list[WatchEvent] = field(default_factory=list)


WRITES = frozenset({"create", "set", "delete"})


def parent_of(path: str) -> str:
    head = path.rpartition("/")[0]
    return head or "/"


def _validate(path: str) -> None:
    if (
        not path.startswith("/")
        or (path != "/" and path.endswith("/"))
        or "//" in path
        or any(part in (".", "..") for part in path.split("/"))
    ):
        raise BadArgumentsError(path)


class SimZooKeeper:
    """The ensemble: znodes, sessions, watches, zxids, faults."""

    def __init__(self, clock: Clock, rng: random.Random, tick_ms: int = 500, epoch: int = 1):
        self.clock = clock
        self.rng = rng
        self.tick_ms = tick_ms
        self.zxid = epoch << 32
        self.nodes: dict[str, Znode] = {"/": Znode(b"", 0, 0, 0, 0, 0)}
        self.sessions: dict[int, Session] = {}
        # ZooKeeper's session ids: the server id in the top byte, then a counter
        self._next_session = (1 << 56) | (rng.getrandbits(32) << 16)
        self._data_watches: dict[str, set[int]] = {}
        self._child_watches: dict[str, set[int]] = {}

    # ----- time and sessions ----------------------------------------------------------------

    def now_ms(self) -> int:
        return round(self.clock.time() * 1000)

    def _expires_at(self, s: Session) -> int:
        # ExpiryQueue.roundToNextInterval: the tick boundary after heard + timeout
        t = s.heard_ms + s.timeout_ms
        return (t // self.tick_ms + 1) * self.tick_ms

    def next_deadline(self) -> float | None:
        """Virtual time (seconds) of the next session expiry, None if no session can expire
        (every client reachable)."""
        due = [self._expires_at(s) for s in self.sessions.values() if not s.reachable]
        return min(due) / 1000 if due else None

    def advance(self) -> list[int]:
        """Expire every session whose time has come, oldest deadline first; their ids."""
        now = self.now_ms()
        due = sorted(
            (self._expires_at(s), sid)
            for sid, s in self.sessions.items()
            if not s.reachable and self._expires_at(s) <= now
        )
        for _, sid in due:
            self._close_session(sid, expired=True)
        return [sid for _, sid in due]

    def negotiate(self, timeout_ms: int) -> int:
        return max(2 * self.tick_ms, min(20 * self.tick_ms, timeout_ms))

    def open_session(self, timeout_ms: int, notify: Notify) -> tuple[int, int]:
        """A new session (a createSession txn): its id and negotiated timeout."""
        self.advance()
        sid = self._next_session
        self._next_session += 1
        self._txn()
        s = Session(sid, self.negotiate(timeout_ms), notify, self.now_ms())
        self.sessions[sid] = s
        return sid, s.timeout_ms

    def reconnect(self, sid: int) -> bool:
        """A client connecting again with its session: True if the session is alive (and
        reachable), False if it expired (the client is told so on connecting)."""
        self.advance()
        s = self.sessions.get(sid)
        if s is None:
            return False
        if not s.reachable:
            raise ConnectionLoss()
        s.heard_ms = self.now_ms()
        return True

    def close_session(self, sid: int) -> None:
        """The client closes its session: ephemerals deleted now (a closeSession txn)."""
        self.advance()
        s = self.sessions.get(sid)
        if s is None:
            return
        if not s.reachable:
            raise ConnectionLoss()
        self._close_session(sid, expired=False)

    def _close_session(self, sid: int, expired: bool) -> None:
        s = self.sessions.pop(sid)
        self._drop_watches(sid)
        zxid = self._txn()
        for path in sorted(s.ephemerals, reverse=True):
            self._delete_node(path, zxid)
        if expired and s.reachable:
            s.notify(Notice.EXPIRED)

    def drop_connection(self, sid: int) -> None:
        """The session's connection closed (the session lives on): its watches go with it,
        and the events held for it."""
        self._drop_watches(sid)
        s = self.sessions.get(sid)
        if s is not None:
            s.held.clear()

    def _drop_watches(self, sid: int) -> None:
        for table in (self._data_watches, self._child_watches):
            for path in [p for p, w in table.items() if sid in w]:
                table[path].discard(sid)
                if not table[path]:
                    del table[path]

    # ----- faults ---------------------------------------------------------------------------

    def partition(self, sid: int) -> None:
        """Cut the session's client from the ensemble: last heard now, expires unless healed
        within its timeout."""
        self.advance()
        s = self.sessions.get(sid)
        if s is None or not s.reachable:
            return
        s.heard_ms = self.now_ms()
        s.reachable = False
        s.notify(Notice.CUT)

    def heal(self, sid: int) -> None:
        self.advance()
        s = self.sessions.get(sid)
        if s is None or s.reachable:
            return
        s.reachable = True
        s.notify(Notice.REACHABLE)
        held, s.held = s.held, []
        for event in held:
            s.notify(event)

    def expire(self, sid: int) -> None:
        """End the session now, as if its timeout had passed."""
        self.advance()
        if sid in self.sessions:
            self._close_session(sid, expired=True)

    def lose_connection_on_next(self, sid: int, applied: bool | None = None) -> None:
        """The session's next request ends in ConnectionLoss; a write is applied first if
        `applied` (drawn from the seeded rng when None). A read is never applied."""
        if applied is None:
            applied = self.rng.random() < 0.5
        self.sessions[sid].lose_next = applied

    # ----- requests -------------------------------------------------------------------------

    def request(self, sid: int, op: str, *args: Any) -> Any:
        """Run one request of session `sid`: create, get, exists, get_children, set, delete,
        sync (see the methods of the same names with a leading underscore)."""
        self.advance()
        s = self.sessions.get(sid)
        if s is None:
            raise SessionExpiredError()
        if not s.reachable:
            raise ConnectionLoss()
        s.heard_ms = self.now_ms()
        handler = getattr(self, "_" + op)
        lose = s.lose_next
        if lose is None:
            return handler(sid, *args)
        s.lose_next = None
        if lose and op in WRITES:
            try:
                handler(sid, *args)
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError):
                pass  # the outcome is lost with the connection
            except NoChildrenForEphemeralsError:
                pass
        self.drop_connection(sid)
        raise ConnectionLoss()

    def _txn(self) -> int:
        self.zxid += 1
        return self.zxid

    def _node(self, path: str) -> Znode:
        _validate(path)
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError()
        return node

    def _create(self, sid: int, path: str, data: bytes, ephemeral: bool, sequence: bool) -> str:
        _validate(path if not sequence else path + "0")
        zxid = self._txn()
        parent_path = parent_of(path)
        parent = self.nodes.get(parent_path)
        if parent is None:
            raise NoNodeError()
        if sequence:
            path = f"{path}{parent.created_children:010d}"
        if path in self.nodes:
            raise NodeExistsError()
        if parent.ephemeral_owner:
            raise NoChildrenForEphemeralsError()
        now = self.now_ms()
        self.nodes[path] = Znode(
            bytes(data), zxid, zxid, zxid, now, now, ephemeral_owner=sid if ephemeral else 0
        )
        if ephemeral:
            self.sessions[sid].ephemerals.add(path)
        parent.children.add(path.rpartition("/")[2])
        parent.cversion += 1
        parent.created_children += 1
        parent.pzxid = zxid
        self._fire(self._data_watches, path, EventType.CREATED)
        self._fire(self._child_watches, parent_path, EventType.CHILD)
        return path

    def _get(self, sid: int, path: str, watch: bool) -> tuple[bytes, ZnodeStat]:
        node = self._node(path)
        if watch:
            self._data_watches.setdefault(path, set()).add(sid)
        return node.data, node.stat()

    def _exists(self, sid: int, path: str, watch: bool) -> ZnodeStat | None:
        _validate(path)
        if watch:
            self._data_watches.setdefault(path, set()).add(sid)
        node = self.nodes.get(path)
        return None if node is None else node.stat()

    def _get_children(self, sid: int, path: str, watch: bool) -> tuple[list[str], ZnodeStat]:
        node = self._node(path)
        if watch:
            self._child_watches.setdefault(path, set()).add(sid)
        return sorted(node.children), node.stat()

    def _set(self, sid: int, path: str, data: bytes, version: int) -> ZnodeStat:
        _validate(path)
        zxid = self._txn()
        node = self._node(path)
        if version != -1 and version != node.version:
            raise BadVersionError()
        node.data = bytes(data)
        node.version += 1
        node.mzxid = zxid
        node.mtime = self.now_ms()
        self._fire(self._data_watches, path, EventType.CHANGED)
        return node.stat()

    def _delete(self, sid: int, path: str, version: int) -> None:
        _validate(path)
        if path == "/":
            raise BadArgumentsError(path)
        zxid = self._txn()
        node = self._node(path)
        if version != -1 and version != node.version:
            raise BadVersionError()
        if node.children:
            raise NotEmptyError()
        self._delete_node(path, zxid)

    def _sync(self, sid: int, path: str) -> str:
        _validate(path)
        return path

    def _delete_node(self, path: str, zxid: int) -> None:
        node = self.nodes.pop(path)
        if node.ephemeral_owner and node.ephemeral_owner in self.sessions:
            self.sessions[node.ephemeral_owner].ephemerals.discard(path)
        parent_path = parent_of(path)
        parent = self.nodes[parent_path]
        parent.children.discard(path.rpartition("/")[2])
        parent.cversion += 1
        parent.pzxid = zxid
        # one NodeDeleted per session, whether it watched the data or the children
        told = self._fire(self._data_watches, path, EventType.DELETED)
        self._fire(self._child_watches, path, EventType.DELETED, skip=told)
        self._fire(self._child_watches, parent_path, EventType.CHILD)

    def _fire(
        self, table: dict[str, set[int]], path: str, kind: str, skip: frozenset[int] = frozenset()
    ) -> frozenset[int]:
        sids = table.pop(path, set())
        for sid in sorted(sids - skip):
            s = self.sessions.get(sid)
            if s is None:
                continue
            if s.reachable:
                s.notify(WatchEvent(kind, path))
            else:
                s.held.append(WatchEvent(kind, path))
        return frozenset(sids)


__all__ = ["Clock", "Notice", "SimZooKeeper", "WatchEvent", "Znode"]
