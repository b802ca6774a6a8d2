"""The embedded cluster: N nodes as Linux network namespaces on a bridge, each with its own sshd.

Public API (see ``harness.cluster.embedded`` for the full spec):
``up(name, n, subnet) -> EmbeddedCluster``, ``down(name) -> list[str]``,
``status(name) -> ClusterStatus``, ``get(name) -> EmbeddedCluster``,
``embedded_cluster(n, name)`` (context manager), ``plan(name, n, subnet)`` (names and addresses
without creating anything), ``sshd_stop`` / ``sshd_start`` (a node's listener, for faults),
``libfaketime_path()``, ``ClusterError``; the CLI is ``cli.app``.
"""

from isrlab.harness.cluster.embedded import (
    ClusterError,
    ClusterStatus,
    EmbeddedCluster,
    NodeHealth,
    down,
    embedded_cluster,
    get,
    libfaketime_path,
    plan,
    sshd_start,
    sshd_stop,
    status,
    up,
)

__all__ = [
    "ClusterError",
    "ClusterStatus",
    "EmbeddedCluster",
    "NodeHealth",
    "down",
    "embedded_cluster",
    "get",
    "libfaketime_path",
    "plan",
    "sshd_start",
    "sshd_stop",
    "status",
    "up",
]
