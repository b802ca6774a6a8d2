"""SSH connections to nodes (paramiko): the pool, host-key checks and connect retries.

Connections and retries
    One paramiko transport per (node, options) is pooled and shared by threads (SSH multiplexes
    channels); ``close_all()`` closes the default pool. Connecting retries with exponential backoff
    on transient errors (refused, reset, timeouts, banner errors); opening a session on a dead
    pooled transport reconnects once. A command that has started is never retried, since it may
    not be idempotent. Authentication and host-key failures are not retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

import paramiko

from isrlab.harness.inventory import Node, SshOptions

log = logging.getLogger(__name__)


class ControlError(Exception):
    """Base class of everything the SSH and remote layers raise on purpose."""


class SshConnectError(ControlError):
    """Could not open an SSH connection (after retries, or a non-retryable failure)."""

    def __init__(self, node: Node, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(
            f"{node.name}: cannot connect to {node.user}@{node.host}:{node.port}: {reason}"
        )


class _WarnAndAccept(paramiko.MissingHostKeyPolicy):
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        log.warning(
            "accepting unknown SSH host key %s %s for %s (host_key_policy=warn)",
            key.get_name(),
            key.fingerprint,
            hostname,
        )


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, paramiko.AuthenticationException | paramiko.BadHostKeyException):
        return False
    if isinstance(
        exc,
        paramiko.ssh_exception.NoValidConnectionsError
        | ConnectionError
        | socket.timeout
        | TimeoutError
        | EOFError,
    ):
        return True
    if isinstance(exc, paramiko.SSHException):
        # banner timeouts, "Error reading SSH protocol banner", resets mid-handshake
        return True
    return isinstance(exc, OSError)


class ConnectionPool:
    """One live ``paramiko.SSHClient`` per (node, options), shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._node_locks: dict[tuple[Node, SshOptions], threading.Lock] = {}
        self._clients: dict[tuple[Node, SshOptions], paramiko.SSHClient] = {}

    def client(
        self, node: Node, ssh: SshOptions, *, stale: paramiko.SSHClient | None = None
    ) -> paramiko.SSHClient:
        """The pooled client, connecting if there is none or it is dead or is ``stale``.

        Threads that saw the same connection fail all pass it as ``stale``: the first one
        reconnects, the others get its new client instead of closing it again.
        """
        key = (node, ssh)
        with self._lock:
            node_lock = self._node_locks.setdefault(key, threading.Lock())
        with node_lock:
            c = self._clients.get(key)
            if c is not None and c is not stale:
                t = c.get_transport()
                if t is not None and t.is_active():
                    return c
            if c is not None:
                c.close()
                self._clients.pop(key, None)
            c = _connect(node, ssh)
            self._clients[key] = c
            return c

    def close(self, node: Node | None = None) -> None:
        """Close the connections of ``node`` (all options), or of every node."""
        with self._lock:
            keys = [k for k in self._clients if node is None or k[0] == node]
            clients = [self._clients.pop(k) for k in keys]
        for c in clients:
            c.close()


_KNOWN_HOSTS_LOCK = threading.Lock()


def _remember_host_key(path: str, node: Node, key: paramiko.PKey) -> None:
    """Append ``node``'s key to known_hosts unless already there.

    Appending under a lock (not ``SSHClient.save_host_keys``, which rewrites the file from one
    client's view) keeps the keys of nodes that connected at the same time in other threads.
    """
    host = node.host if node.port == 22 else f"[{node.host}]:{node.port}"
    with _KNOWN_HOSTS_LOCK:
        known = paramiko.HostKeys()
        if os.path.exists(path):
            known.load(path)
        if known.lookup(host) is not None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{host} {key.get_name()} {key.get_base64()}\n")
    log.warning(
        "%s: trusting SSH host key %s %s on first use; kept in %s (a changed key is refused)",
        node.name,
        key.get_name(),
        key.fingerprint,
        path,
    )


def _connect(node: Node, ssh: SshOptions) -> paramiko.SSHClient:
    delay = ssh.backoff_initial
    last: BaseException | None = None
    for attempt in range(ssh.connect_retries + 1):
        client = paramiko.SSHClient()
        if ssh.known_hosts and os.path.exists(ssh.known_hosts):
            client.load_host_keys(ssh.known_hosts)
        if ssh.host_key_policy == "strict":
            if not ssh.known_hosts:
                raise SshConnectError(node, "host_key_policy=strict needs a known_hosts file")
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        elif ssh.host_key_policy == "accept-new":
            # AutoAddPolicy accepts; _remember_host_key below appends the key to known_hosts
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            client.set_missing_host_key_policy(_WarnAndAccept())
        try:
            client.connect(
                node.host,
                port=node.port,
                username=node.user,
                key_filename=node.key_file,
                password=node.password,
                timeout=ssh.connect_timeout,
                banner_timeout=ssh.connect_timeout,
                auth_timeout=ssh.connect_timeout,
                allow_agent=node.key_file is None and node.password is None,
                look_for_keys=node.key_file is None and node.password is None,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            raise SshConnectError(
                node,
                f"host key mismatch ({e.key.get_name()} {e.key.fingerprint}, expected "
                f"{e.expected_key.fingerprint}); if the host was rebuilt, remove its line from "
                f"{ssh.known_hosts}",
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = f"key {node.key_file}" if node.key_file else "agent/default keys/password"
            raise SshConnectError(node, f"authentication failed with {how}: {e}") from None
        except paramiko.SSHException as e:
            client.close()
            if "not found in known_hosts" in str(e):
                raise SshConnectError(
                    node,
                    f"unknown host key and host_key_policy=strict; add the host to "
                    f"{ssh.known_hosts} (ssh-keyscan) or use host_key_policy=accept-new",
                ) from None
            last = e
        except Exception as e:
            client.close()
            if not _is_transient(e):
                raise SshConnectError(node, f"{type(e).__name__}: {e}") from e
            last = e
        else:
            transport = client.get_transport()
            if transport is not None:
                if ssh.keepalive:
                    transport.set_keepalive(ssh.keepalive)
                # without it Nagle holds each channel-open behind the ACK of the previous
                # channel-close: a 40 ms delayed-ACK stall on every command
                with contextlib.suppress(OSError, AttributeError):
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
            if ssh.host_key_policy == "accept-new" and ssh.known_hosts and transport is not None:
                try:
                    _remember_host_key(ssh.known_hosts, node, transport.get_remote_server_key())
                except OSError as e:
                    client.close()
                    raise SshConnectError(
                        node,
                        f"cannot keep its host key in {ssh.known_hosts}: {e.strerror or e} "
                        "(a key not kept could not be checked next time)",
                    ) from None
            return client
        if attempt < ssh.connect_retries:
            log.debug("%s: transient SSH error (%s), retrying in %.2fs", node.name, last, delay)
            time.sleep(delay)
            delay = min(delay * 2, ssh.backoff_max)
    raise SshConnectError(
        node, f"{type(last).__name__}: {last} (after {ssh.connect_retries + 1} attempts)"
    )


DEFAULT_POOL = ConnectionPool()


def close_all() -> None:
    """Close every pooled connection of the default pool."""
    DEFAULT_POOL.close()
