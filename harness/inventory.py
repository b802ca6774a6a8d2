"""Nodes and inventories: which hosts a test runs on and how to reach them (no SSH here).

Nodes and inventories
    ``Node(name, host, port=22, user="root", key_file=None, password=None, sudo=False)`` is one
    host. ``load_nodes(nodes="n1,n2", user=..., key_file=...)`` parses a ``--nodes`` list
    (entries ``host``, ``host:port`` or ``user@host:port``); ``load_nodes(nodes_file="nodes.yaml")``
    reads ``nodes: [{name, host, port, user, key, password, sudo}]`` with optional top-level
    ``defaults: {user, key, port, sudo}``, ``known_hosts:`` and ``host_key_policy:``.
    ``load_inventory`` returns both the nodes and the ``SshOptions`` a file asks for.

Host-key policy (``SshOptions.host_key_policy``)
    ``"strict"``: the host key must be in ``known_hosts`` (a file) and match; anything else is an
    error. The embedded cluster uses this with a per-run known_hosts file it writes itself from
    the host keys it generated, so there is never a trust-on-first-use step.
    ``"accept-new"``: unknown hosts are accepted and, if ``known_hosts`` is given, appended to
    it; a *changed* key is still an error. ``"warn"``: unknown hosts are accepted with a warning
    logged and nothing is saved. Use strict for real hosts whenever you can.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

HostKeyPolicy = Literal["strict", "accept-new", "warn"]
HOST_KEY_POLICIES: tuple[str, ...] = ("strict", "accept-new", "warn")


@dataclass(frozen=True)
class Node:
    """One SSH-reachable host. ``name`` is how the harness refers to it (n1..n5)."""

    name: str
    host: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    password: str | None = field(default=None, repr=False)
    sudo: bool = False


@dataclass(frozen=True)
class SshOptions:
    """How to connect: host-key policy, timeouts and the retry schedule for transient errors."""

    host_key_policy: HostKeyPolicy = "strict"
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    connect_retries: int = 5
    backoff_initial: float = 0.2
    backoff_max: float = 2.0
    keepalive: int = 15

    def __post_init__(self) -> None:
        if self.host_key_policy not in HOST_KEY_POLICIES:
            raise ValueError(
                f"host_key_policy must be one of {', '.join(HOST_KEY_POLICIES)}, "
                f"not {self.host_key_policy!r}"
            )


@dataclass(frozen=True)
class Inventory:
    """Nodes plus the SSH options that go with them (from a nodes file or the command line)."""

    nodes: list[Node]
    ssh: SshOptions


def _parse_node_spec(spec: str, user: str, port: int) -> tuple[str, str, int]:
    """``host``, ``host:port``, ``user@host`` or ``user@host:port`` -> (user, host, port)."""
    if "@" in spec:
        user, spec = spec.split("@", 1)
    if spec.count(":") == 1:  # an IPv6 literal has several colons and no port here
        host, port_s = spec.split(":")
        try:
            port = int(port_s)
        except ValueError:
            raise ValueError(f"bad port in node spec {spec!r}") from None
    else:
        host = spec
    if not host:
        raise ValueError(f"empty host in node spec {spec!r}")
    return user, host, port


def load_inventory(
    nodes: str | Sequence[str] | None = None,
    nodes_file: str | os.PathLike[str] | None = None,
    *,
    user: str = "root",
    key_file: str | None = None,
    port: int = 22,
    sudo: bool = False,
    ssh: SshOptions | None = None,
) -> Inventory:
    """Nodes from a comma-separated list (or sequence) or from a YAML nodes file.

    Exactly one of ``nodes`` / ``nodes_file`` must be given. The keyword arguments are defaults
    that entries (and a file's ``defaults:``) override. Relative key paths in a file are taken
    relative to the file.
    """
    if (nodes is None) == (nodes_file is None):
        raise ValueError("give either nodes (e.g. 'n1,n2,n3') or nodes_file (a nodes.yaml)")
    base_ssh = ssh or SshOptions(host_key_policy="accept-new")
    if nodes is not None:
        specs = [s.strip() for s in (nodes.split(",") if isinstance(nodes, str) else nodes)]
        out = []
        for spec in filter(None, specs):
            u, host, p = _parse_node_spec(spec, user, port)
            out.append(Node(name=host, host=host, port=p, user=u, key_file=key_file, sudo=sudo))
        if not out:
            raise ValueError("the nodes list is empty")
        _check_unique(out)
        return Inventory(out, base_ssh)

    path = Path(nodes_file)  # type: ignore[arg-type]
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"nodes file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ValueError(f"nodes file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"nodes file {path} must be a mapping with a 'nodes:' list")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"nodes file {path}: 'defaults' must be a mapping")

    def key_path(k: str | None) -> str | None:
        if k is None:
            return None
        kp = Path(os.path.expanduser(k))
        return str(kp if kp.is_absolute() else (path.parent / kp))

    d_user = str(defaults.get("user", user))
    d_key = key_path(defaults.get("key", key_file))
    d_port = int(defaults.get("port", port))
    d_sudo = bool(defaults.get("sudo", sudo))
    out = []
    for i, entry in enumerate(data["nodes"]):
        if isinstance(entry, str):
            entry = {"host": entry}
        if not isinstance(entry, dict) or "host" not in entry:
            raise ValueError(f"nodes file {path}: entry {i} needs at least a 'host'")
        host = str(entry["host"])
        out.append(
            Node(
                name=str(entry.get("name", host)),
                host=host,
                port=int(entry.get("port", d_port)),
                user=str(entry.get("user", d_user)),
                key_file=key_path(entry["key"]) if "key" in entry else d_key,
                password=entry.get("password"),
                sudo=bool(entry.get("sudo", d_sudo)),
            )
        )
    if not out:
        raise ValueError(f"nodes file {path} lists no nodes")
    _check_unique(out)
    policy = data.get("host_key_policy", base_ssh.host_key_policy)
    known = data.get("known_hosts", base_ssh.known_hosts)
    try:
        ssh_opts = replace(
            base_ssh,
            host_key_policy=policy,
            known_hosts=key_path(known) if known else None,
        )
    except ValueError as e:
        raise ValueError(f"nodes file {path}: {e}") from None
    return Inventory(out, ssh_opts)


def load_nodes(
    nodes: str | Sequence[str] | None = None,
    nodes_file: str | os.PathLike[str] | None = None,
    **defaults: Any,
) -> list[Node]:
    """Just the nodes of ``load_inventory``."""
    return load_inventory(nodes, nodes_file, **defaults).nodes


def _check_unique(nodes: Sequence[Node]) -> None:
    names = [n.name for n in nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate node names: {', '.join(dupes)}")
