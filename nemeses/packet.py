"""Packet faults with tc netem: delay, loss, duplication, reordering on the nodes' interfaces.

``start-packet`` with ``{"target": T, "behaviour": {"delay": "50ms", "jitter": "10ms",
"loss": "20%", "duplicate": "5%", "reorder": "25%", "corrupt": "1%", "rate": "1mbit"}}``
(any subset; default a 50 ms +- 10 ms delay) runs ``tc qdisc replace dev <if> root netem ...`` on
every target node, where ``<if>`` is the interface the node uses to reach its peers (``ip route
get``); reordering needs a delay, so one is added when missing. ``stop-packet`` and ``heal()``
run ``tc qdisc del dev <if> root`` on every node (an absent qdisc is not an error).

netem is a kernel module (``sch_netem``). Where it is missing tc says "Specified qdisc kind is
unknown"; ``check_available(db)`` probes for that once and raises ``PacketFaultsUnavailable``
with what to do, so a test asking for packet faults fails before it starts, not midway. (The
embedded cluster's kernel here has no sch_netem; packet faults work on real hosts and VMs.)
"""

from __future__ import annotations

import random
import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isrlab.nemeses.base import ClusterDB, NemesisError, Shell, resolve_targets

DEFAULT_BEHAVIOUR: dict[str, str] = {"delay": "50ms", "jitter": "10ms"}
KNOWN = ("delay", "jitter", "loss", "duplicate", "reorder", "corrupt", "rate")


class PacketFaultsUnavailable(NemesisError):
    pass


def netem_args(behaviour: dict[str, Any]) -> list[str]:
    """``{"delay": "50ms", "loss": "20%"}`` -> ``["delay", "50ms", "loss", "20%"]``."""
    unknown = sorted(set(behaviour) - set(KNOWN))
    if unknown:
        raise NemesisError(f"unknown netem behaviour {', '.join(unknown)}; use {', '.join(KNOWN)}")
    b = {k: str(v) for k, v in behaviour.items()}
    if "reorder" in b and "delay" not in b:
        b["delay"] = "10ms"  # netem only reorders delayed packets
    args: list[str] = []
    if "delay" in b:
        args += ["delay", b["delay"]]
        if "jitter" in b:
            args += [b["jitter"], "distribution", "normal"]
    for k in ("loss", "duplicate", "reorder", "corrupt", "rate"):
        if k in b:
            args += [k, b[k]]
    if not args:
        raise NemesisError("an empty netem behaviour does nothing; give delay, loss, ...")
    return args


def _unavailable(node: str, stderr: str) -> PacketFaultsUnavailable:
    return PacketFaultsUnavailable(
        f"packet faults need tc netem, which is not available on {node} "
        f"({stderr.strip() or 'tc failed'}): the kernel lacks the sch_netem module. Load it "
        "with `modprobe sch_netem` (package linux-modules-extra-$(uname -r) on Ubuntu) or drop "
        "'packet' from --nemesis; the embedded cluster's kernel cannot do it, real hosts and "
        "VMs can."
    )


def interface(r: Shell, peer_host: str) -> str:
    """The interface ``r``'s node uses to reach ``peer_host``."""
    res = r.exec(
        f"ip -o route get $(getent ahostsv4 {shlex.quote(peer_host)} | head -n1 | "
        f"cut -d' ' -f1) 2>/dev/null || ip -o route get {shlex.quote(peer_host)}",
        check=False,
    )
    words = res.stdout.split()
    if "dev" in words:
        return words[words.index("dev") + 1]
    raise NemesisError(f"{r.node.name}: cannot tell which interface reaches {peer_host}")


def check_available(db: ClusterDB) -> None:
    """Raise PacketFaultsUnavailable unless netem works on the first node (probed on lo)."""
    node = db.names[0]
    r = db.remote(node)
    res = r.exec(
        "tc qdisc add dev lo root netem delay 0ms 2>&1 && tc qdisc del dev lo root", check=False
    )
    if not res.ok:
        if "command not found" in res.stdout + res.stderr:
            raise PacketFaultsUnavailable(
                f"tc is not installed on {node}: apt-get install iproute2"
            )
        raise _unavailable(node, res.stdout + res.stderr)


class PacketFault:
    kind = "packet"

    def __init__(self, db: ClusterDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self._ifaces: dict[str, str] = {}
        self.active: set[str] = set()

    def _iface(self, node: str) -> str:
        if node not in self._ifaces:
            peers = [n for n in self.db.names if n != node] or [node]
            peer_host = self.db.remote(peers[0]).node.host
            self._ifaces[node] = interface(self.db.remote(node), peer_host)
        return self._ifaces[node]

    def _apply(self, node: str, args: list[str]) -> None:
        r = self.db.remote(node)
        cmd = f"tc qdisc replace dev {shlex.quote(self._iface(node))} root netem " + shlex.join(
            args
        )
        res = r.exec(cmd, check=False)
        if not res.ok:
            if "qdisc kind is unknown" in res.stderr:
                raise _unavailable(node, res.stderr)
            res.check()

    def start(self, value: Any) -> dict[str, Any]:
        value = dict(value or {})
        behaviour = dict(value.get("behaviour") or DEFAULT_BEHAVIOUR)
        args = netem_args(behaviour)
        target = str(value.get("target", "all"))
        nodes = resolve_targets(target, self.db, self.rng, value.get("key"))
        with ThreadPoolExecutor(max_workers=len(nodes)) as ex:
            list(ex.map(lambda n: self._apply(n, args), nodes))
        self.active.update(nodes)
        return {"target": target, "nodes": nodes, "behaviour": behaviour}

    def stop(self, value: Any = None) -> dict[str, Any]:
        return {"nodes": self.heal()}

    def heal(self) -> list[str]:
        def clear(node: str) -> bool:
            try:
                dev = self._iface(node)
            except NemesisError:
                return False
            res = self.db.remote(node).exec(
                f"tc qdisc show dev {dev} | grep -q netem && tc qdisc del dev {dev} root",
                check=False,
            )
            return res.ok

        names = self.db.names
        with ThreadPoolExecutor(max_workers=len(names)) as ex:
            cleared = list(ex.map(clear, names))
        self.active.clear()
        return [n for n, c in zip(names, cleared, strict=True) if c]
