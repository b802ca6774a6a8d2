"""The kazoo client the broker's `KafkaZkClient` uses, on the simulated ensemble.

`SimEnsemble` is the thin IO shell of `zookeeper.SimZooKeeper` on an event loop: it keeps one
timer at the core's next session expiry. `SimKazooClient` has the `KazooClient` methods and
attributes the broker calls (create with ephemeral/sequence/makepath, get, set, delete with
recursive, exists, get_children, ensure_path, sync, start/stop/close, client_id,
_session_timeout, state, add_listener/remove_listener, DataWatch, ChildrenWatch, watch=
callables), raising kazoo's exceptions, and kazoo's client behaviour around them:

- states LOST (before start and when a session ends) -> CONNECTED -> SUSPENDED (connection
  lost) -> CONNECTED, listeners called on each change, synchronously, as kazoo does from its
  connection thread;
- watch= callables are kept per path (a set per path for data and for child watches), popped
  when the event arrives and called on the loop later, in arrival order (kazoo's callback
  thread); a lost connection clears them all and calls each with a NONE event; after a lost
  session the client opens a new one at once (kazoo reconnects with no session id);
- DataWatch / ChildrenWatch: kazoo's recipes (first call at once, DataWatch calls again when
  the node's mzxid changed, ChildrenWatch when the children differ after a reconnection, a
  function returning False stops it, ChildrenWatch stops if the node is gone).

Callbacks (watches, recipes, state listeners called from the loop) run in the `contextvars`
context the client was created in, as kazoo's own threads belong to the process that started
them: in a simulation that context names the broker's `clock.Process`, so a killed broker's
callbacks are dropped with the rest of it. `crash()` is the client's side of kill -9: nothing
more is sent or delivered, and the ensemble, no longer hearing from it, expires the session
after its timeout. The ensemble's own timer runs in a context of its own.

One difference: kazoo queues a request made while the connection is down and sends it when
the connection is back; here such a request raises ConnectionLoss at once (a request may
always end so, callers handle it), since a synchronous call cannot wait for virtual time.
The recipes' own reads handle it as kazoo's do (they retry until answered): a read that
meets a cut kazoo has not noticed yet runs again when the cut heals (the reply the live TCP
connection would have brought then, `retry_at_heal`), one that meets a known loss when the
client is CONNECTED again.
"""

from __future__ import annotations

import contextvars
import inspect
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import _prefix_root, normpath
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat

from isrlab.harness.sim.zookeeper import Notice, SimZooKeeper, WatchEvent

Watcher = Callable[[WatchedEvent], Any]


class Loop(Protocol):
    """What the client and the shell need of an event loop (`asyncio` loops have it)."""

    def time(self) -> float: ...

    def call_soon(
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> Any: ...

    def call_at(
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> Any: ...

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> Any: ...


class SimEnsemble:
    """`SimZooKeeper` on a loop: its clock is the loop's, and session expiries run on time."""

    def __init__(self, loop: Loop, seed: int = 0, tick_ms: int = 500):
        self.loop = loop
        self.core = SimZooKeeper(loop, random.Random(seed), tick_ms=tick_ms)
        self._timer: Any = None
        self._timer_at: float | None = None
        # the ensemble's timer belongs to no client's process
        self._context = contextvars.Context()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call into the core, then the expiry timer set for the core's next deadline."""
        try:
            return fn(*args)
        finally:
            self.reschedule()

    def reschedule(self) -> None:
        when = self.core.next_deadline()
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, when
        if when is not None:
            self._timer = self.loop.call_at(when, self._tick, context=self._context)

    def _tick(self) -> None:
        self._timer, self._timer_at = None, None
        self.call(self.core.advance)


class SimKazooClient:
    """A `KazooClient` connected to a `SimEnsemble`; `hosts` may end in a chroot."""

    def __init__(
        self,
        ensemble: SimEnsemble,
        hosts: str = "sim",
        timeout: float = 10.0,
        reconnect_delay: float = 0.1,
    ):
        self.ensemble = ensemble
        self.core = ensemble.core
        self.loop = ensemble.loop
        _, _, chroot = hosts.partition("/")
        self.chroot = normpath("/" + chroot) if chroot else ""
        if self.chroot == "/":
            self.chroot = ""
        self._requested_timeout_ms = round(timeout * 1000)
        self._session_timeout = self._requested_timeout_ms
        self._reconnect_delay = reconnect_delay
        self.state = KazooState.LOST
        self.state_listeners: list[Callable[[str], Any]] = []
        self._session_id: int | None = None
        self._started = False
        self._cut = False  # the network: this client cannot reach the ensemble
        self._suspend_timer: Any = None
        # path -> its watchers, an insertion-ordered set (a dict), as kazoo keeps a set: a set
        # of callables would call them in the order of their addresses, which differs from one
        # process to the next, so one seed would not give one trace
        self._data_watchers: defaultdict[str, dict[Watcher, None]] = defaultdict(dict)
        self._child_watchers: defaultdict[str, dict[Watcher, None]] = defaultdict(dict)
        self._crashed = False
        #: the recipes' reads that met a cut kazoo has not noticed (`retry_at_heal`)
        self._at_heal: list[Callable[[], object]] = []
        # the context of the code that created the client: its callbacks run there
        self._context = contextvars.copy_context()

    def soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run `callback(*args)` on the loop later, in the client's context (kazoo's callback
        thread)."""
        if not self._crashed:
            self.loop.call_soon(callback, *args, context=self._context)

    def _later(self, delay: float, callback: Callable[..., object], *args: Any) -> Any:
        return self.loop.call_later(delay, callback, *args, context=self._context)

    # ----- session and connection -----------------------------------------------------------

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        return None if self._session_id is None else (self._session_id, b"\x00" * 16)

    @property
    def connected(self) -> bool:
        return self.state == KazooState.CONNECTED

    def start(self, timeout: float = 15) -> None:
        if self._started and self._session_id is not None:
            return
        self._started = True
        if self._cut:
            self._started = False
            raise KazooTimeoutError("Connection time-out")
        self._new_session()

    def stop(self) -> None:
        """Close the session (its ephemerals go at once) and stop."""
        if not self._started:
            return
        self._started = False
        self._cancel_suspend()
        sid, self._session_id = self._session_id, None
        if sid is not None and not self._cut:
            self.ensemble.call(self.core.close_session, sid)
        elif sid is not None:
            self.ensemble.call(self.core.drop_connection, sid)
        self._reset_watchers()
        self._set_state(KazooState.LOST)

    def close(self) -> None:
        pass  # kazoo frees its sockets here; nothing is held

    def add_listener(self, listener: Callable[[str], Any]) -> None:
        if listener not in self.state_listeners:
            self.state_listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], Any]) -> None:
        if listener in self.state_listeners:
            self.state_listeners.remove(listener)

    def _set_state(self, state: str) -> None:
        if self.state == state:
            return
        self.state = state
        for listener in list(self.state_listeners):
            if listener(state) is True:
                self.remove_listener(listener)

    def _new_session(self) -> None:
        sid, negotiated = self.ensemble.call(
            self.core.open_session, self._requested_timeout_ms, self._on_notice
        )
        self._session_id = sid
        self._session_timeout = negotiated
        self._set_state(KazooState.CONNECTED)

    def _on_notice(self, notice: WatchEvent | Notice) -> None:
        if self._crashed:
            return
        if isinstance(notice, WatchEvent):
            self._watch_event(notice)
        elif notice is Notice.EXPIRED:
            # the ensemble closed the session: kazoo goes LOST and opens a new one
            self.soon(self._session_lost)
        elif notice is Notice.CUT:
            self._cut = True
            # kazoo notices after its read timeout (2/3 of the session timeout) of silence
            self._cancel_suspend()
            self._suspend_timer = self._later(
                self._session_timeout * 2 / 3 / 1000, self._connection_lost
            )
        elif notice is Notice.REACHABLE:
            self._cut = False
            # a cut shorter than the read timeout: the TCP connection lived on (the replies
            # held meanwhile arrive now), kazoo notices nothing
            self._cancel_suspend()
            if self.state == KazooState.SUSPENDED:
                self._later(self._reconnect_delay, self._reconnect)
            pending, self._at_heal = self._at_heal, []
            for read in pending:
                self.soon(read)

    def retry_at_heal(self, read: Callable[[], object]) -> bool:
        """A recipe's read that met ConnectionLoss: kazoo's recipes retry their reads until
        they are answered (KazooRetry without a limit). On a cut kazoo has not noticed
        (connected, no read timeout yet) the request waits on the live TCP connection and is
        answered once the cut heals: `read` runs again then. True if so; False when the
        connection is known lost, where the recipes' CONNECTED listeners read again."""
        if self.state != KazooState.CONNECTED or not self._cut or self._crashed:
            return False
        self._at_heal.append(read)
        return True

    def _cancel_suspend(self) -> None:
        if self._suspend_timer is not None:
            self._suspend_timer.cancel()
            self._suspend_timer = None

    def _connection_lost(self) -> None:
        """The connection dropped (the session may live on): SUSPENDED, watches cleared."""
        self._cancel_suspend()
        if not self._started or self.state != KazooState.CONNECTED:
            return
        if self._session_id is not None:
            self.ensemble.call(self.core.drop_connection, self._session_id)
        self._at_heal.clear()  # their recipes read again once CONNECTED
        self._set_state(KazooState.SUSPENDED)
        self._reset_watchers()
        if not self._cut:
            self._later(self._reconnect_delay, self._reconnect)

    def _reconnect(self) -> None:
        if not self._started or self.state == KazooState.CONNECTED or self._cut:
            return
        sid = self._session_id
        try:
            alive = sid is not None and self.ensemble.call(self.core.reconnect, sid)
        except ConnectionLoss:
            return  # cut again: the next REACHABLE retries
        if alive:
            self._set_state(KazooState.CONNECTED)
        else:
            self._session_lost()

    def _session_lost(self) -> None:
        if not self._started:
            return
        self._cancel_suspend()
        self._session_id = None
        self._at_heal.clear()
        self._set_state(KazooState.LOST)
        self._reset_watchers()
        if self._cut:
            return
        self._new_session()

    def _reset_watchers(self) -> None:
        watchers = [w for ws in self._child_watchers.values() for w in ws]
        watchers += [w for ws in self._data_watchers.values() for w in ws]
        self._child_watchers = defaultdict(dict)
        self._data_watchers = defaultdict(dict)
        event = WatchedEvent(EventType.NONE, self._keeper_state(), None)
        for w in watchers:
            self.soon(w, event)

    def _keeper_state(self) -> str:
        return {
            KazooState.CONNECTED: "CONNECTED",
            KazooState.SUSPENDED: "CONNECTING",
            KazooState.LOST: "EXPIRED_SESSION",
        }[self.state]

    def _watch_event(self, ev: WatchEvent) -> None:
        watchers: list[Watcher] = []
        if ev.type in (EventType.CREATED, EventType.CHANGED):
            watchers += self._data_watchers.pop(ev.path, {})
        elif ev.type == EventType.DELETED:
            watchers += self._data_watchers.pop(ev.path, {})
            watchers += self._child_watchers.pop(ev.path, {})
        elif ev.type == EventType.CHILD:
            watchers += self._child_watchers.pop(ev.path, {})
        event = WatchedEvent(ev.type, "CONNECTED", self._unchroot(ev.path))
        for w in watchers:
            self.soon(w, event)

    # ----- faults (the network between this client and the ensemble) ------------------------

    def crash(self) -> None:
        """The process holding this client was killed (kill -9): no request, callback or
        listener call any more, nothing closed; the ensemble stops hearing from the session,
        which expires after its timeout (its ephemerals go then)."""
        if self._crashed:
            return
        self._crashed = True
        self._started = False
        self._cancel_suspend()
        sid = self._session_id
        if sid is not None and sid in self.core.sessions:
            self.ensemble.call(self.core.partition, sid)

    def partition(self) -> None:
        """Cut this client from the ensemble: SUSPENDED after kazoo's read timeout, the
        session expires unless healed within its timeout."""
        if self._session_id is None:
            self._cut = True
        else:
            self.ensemble.call(self.core.partition, self._session_id)

    def heal(self) -> None:
        if self._session_id is None or self._session_id not in self.core.sessions:
            self._cut = False
            if self._started and self.state != KazooState.CONNECTED:
                self._later(self._reconnect_delay, self._reconnect)
        else:
            self.ensemble.call(self.core.heal, self._session_id)

    # ----- requests -------------------------------------------------------------------------

    def _path(self, path: str, trailing: bool = False) -> str:
        if not isinstance(path, str):
            raise TypeError("Invalid type for 'path' (string expected)")
        return str(_prefix_root(self.chroot, path, trailing=trailing))

    def _unchroot(self, path: str) -> str:
        if self.chroot and path.startswith(self.chroot):
            return path[len(self.chroot) :] or "/"
        return path

    def _request(self, op: str, *args: Any) -> Any:
        if not self._started:
            raise ConnectionClosedError("Connection has been closed")
        if self.state == KazooState.LOST or self._session_id is None:
            raise SessionExpiredError()
        if self.state != KazooState.CONNECTED or self._cut:
            raise ConnectionLoss()
        try:
            return self.ensemble.call(self.core.request, self._session_id, op, *args)
        except ConnectionLoss:
            self._connection_lost()
            raise
        except SessionExpiredError:
            self._session_lost()
            raise

    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Any = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        include_data: bool = False,
    ) -> Any:
        if not isinstance(value, bytes):
            raise TypeError("Invalid type for 'value' (must be a byte string)")
        full = self._path(path, trailing=sequence)
        try:
            created = self._request("create", full, value, ephemeral, sequence)
        except NoNodeError:
            if not makepath:
                raise
            parent = path.rstrip("/") if sequence and path.endswith("/") else path
            self.ensure_path(parent.rpartition("/")[0] or "/")
            created = self._request("create", full, value, ephemeral, sequence)
        if include_data:
            _, stat = self._request("get", created, False)
            return self._unchroot(created), stat
        return self._unchroot(created)

    def ensure_path(self, path: str, acl: Any = None) -> bool | str:
        """kazoo's walk: exists up to the first node there, then creates down; True if the
        node was there, else the path its create returned."""
        if self.exists(path) is not None:
            return True
        parent, _, node = path.rpartition("/")
        if not node:
            return True
        self.ensure_path(parent or "/")
        try:
            return self.create(path)  # type: ignore[no-any-return]
        except NodeExistsError:
            return True

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, ZnodeStat]:
        full = self._path(path)
        result = self._request("get", full, watch is not None)
        if watch is not None:
            self._data_watchers[full][watch] = None
        return result  # type: ignore[no-any-return]

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        full = self._path(path)
        stat = self._request("exists", full, watch is not None)
        if watch is not None:
            self._data_watchers[full][watch] = None
        return stat  # type: ignore[no-any-return]

    def get_children(
        self, path: str, watch: Watcher | None = None, include_data: bool = False
    ) -> Any:
        full = self._path(path)
        children, stat = self._request("get_children", full, watch is not None)
        if watch is not None:
            self._child_watchers[full][watch] = None
        return (children, stat) if include_data else children

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        if not isinstance(value, bytes):
            raise TypeError("Invalid type for 'value' (must be a byte string)")
        return self._request("set", self._path(path), value, version)  # type: ignore[no-any-return]

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool | None:
        if recursive:
            return self._delete_recursive(path)
        self._request("delete", self._path(path), version)
        return True

    def _delete_recursive(self, path: str) -> bool | None:
        """kazoo's: True if the node was missing, None once it is deleted."""
        try:
            children = self.get_children(path)
        except NoNodeError:
            return True
        for child in children:
            self._delete_recursive(("" if path == "/" else path) + "/" + child)
        try:
            self.delete(path)
        except NoNodeError:
            pass
        return None

    def sync(self, path: str) -> str:
        return self._unchroot(self._request("sync", self._path(path)))

    # ----- recipes --------------------------------------------------------------------------

    def DataWatch(self, path: str, func: Callable[..., Any] | None = None) -> Any:
        watch = DataWatch(self, path)
        return watch(func) if func is not None else watch

    def ChildrenWatch(
        self, path: str, func: Callable[..., Any] | None = None, send_event: bool = False
    ) -> Any:
        watch = ChildrenWatch(self, path, send_event=send_event)
        return watch(func) if func is not None else watch


_LOST = (ConnectionLoss, SessionExpiredError, ConnectionClosedError)


class DataWatch:
    """kazoo's DataWatch: `func(data, stat[, event])` now and whenever the node's mzxid
    changes (None, None while it is missing), again after each reconnection; False stops."""

    def __init__(self, client: SimKazooClient, path: str):
        self._client = client
        self._path = path
        self._func: Callable[..., Any] | None = None
        self._version: int | None = None
        self._ever_called = False
        self._stopped = False

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        self._func = func
        self._client.add_listener(self._session_watcher)
        self._get_data()
        return func

    def _get_data(self, event: WatchedEvent | None = None) -> None:
        if self._stopped:
            return
        initial = self._version
        stat: ZnodeStat | None
        try:
            try:
                data, stat = self._client.get(self._path, self._watcher)
            except NoNodeError:
                data = None
                stat = self._client.exists(self._path, self._watcher)
                if stat is not None:
                    self._client.soon(self._get_data)
                    return
        except _LOST:
            # kazoo retries until answered: at the heal of a cut it has not noticed, else
            # the CONNECTED listener reads again
            self._client.retry_at_heal(self._get_data)
            return
        self._version = None if stat is None else stat.mzxid
        if initial != self._version or not self._ever_called:
            self._ever_called = True
            assert self._func is not None
            if len(inspect.signature(self._func).parameters) >= 3:
                result = self._func(data, stat, event)
            else:
                result = self._func(data, stat)
            if result is False:
                self._stopped = True
                self._func = None
                self._client.remove_listener(self._session_watcher)

    def _watcher(self, event: WatchedEvent) -> None:
        self._get_data(event)

    def _session_watcher(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._client.soon(self._get_data)


class ChildrenWatch:
    """kazoo's ChildrenWatch: `func(children[, event])` now and on every change, after a
    reconnection only if the children differ; stops when the node is gone or on False."""

    def __init__(self, client: SimKazooClient, path: str, send_event: bool = False):
        self._client = client
        self._path = path
        self._send_event = send_event
        self._func: Callable[..., Any] | None = None
        self._prior: list[str] | None = None
        self._established = False
        self._stopped = False

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        self._func = func
        self._client.add_listener(self._session_watcher)
        self._get_children()
        return func

    def _get_children(self, event: WatchedEvent | None = None) -> None:
        if self._stopped:
            return
        try:
            children = self._client.get_children(self._path, self._watcher)
        except NoNodeError:
            self._stopped = True
            return
        except _LOST:
            self._client.retry_at_heal(self._get_children)  # as DataWatch._get_data
            return
        if not self._established:
            self._established = True
            if self._prior is not None and self._prior == children:
                return
        self._prior = children
        assert self._func is not None
        result = self._func(children, event) if self._send_event else self._func(children)
        if result is False:
            self._stopped = True
            self._func = None
            self._client.remove_listener(self._session_watcher)

    def _watcher(self, event: WatchedEvent) -> None:
        if event.type != EventType.NONE:
            self._get_children(event)

    def _session_watcher(self, state: str) -> None:
        if state in (KazooState.LOST, KazooState.SUSPENDED):
            self._established = False
        elif state == KazooState.CONNECTED and not self._established and not self._stopped:
            self._client.soon(self._get_children)


__all__ = ["ChildrenWatch", "DataWatch", "SimEnsemble", "SimKazooClient"]
