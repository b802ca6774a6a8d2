"""harness.cluster planning and preflight errors; none of these need root."""

from __future__ import annotations

import ipaddress
import os

import pytest
from typer.testing import CliRunner

from isrlab.harness.cluster import embedded, sshd
from isrlab.harness.cluster.cli import app
from isrlab.harness.cluster.embedded import ClusterError, plan


def test_default_plan_matches_the_documented_layout() -> None:
    p = plan()
    assert (p.bridge, p.subnet, p.host_address) == ("isrlab0", "10.77.0.0/24", "10.77.0.1")
    assert [n.name for n in p.nodes] == ["n1", "n2", "n3", "n4", "n5"]
    assert [n.address for n in p.nodes] == [f"10.77.0.{i}" for i in range(11, 16)]
    assert p.nodes[0].netns == "isrlab-default-n1"
    assert p.nodes[0].workdir == "/var/lib/isrlab/default/n1"
    assert p.iptables[0][:5] == ["FORWARD", "-i", "isrlab0", "-o", "isrlab0"]


def test_named_clusters_get_their_own_bridge_subnet_and_short_link_names() -> None:
    a, b = plan("alpha", embedded.MAX_NODES), plan("beta", 3)
    assert a.bridge != b.bridge and a.bridge != "isrlab0"
    assert a.subnet != b.subnet
    assert ipaddress.ip_network(a.subnet).is_private
    # hashed subnets stay clear of 10.77.200.0/24 and up, which tests use explicitly
    for name in ("alpha", "beta", "itest", "x" * 32):
        assert 1 <= int(embedded.default_subnet(name).split(".")[2]) < 200
    # Linux interface names are at most 15 bytes
    for name in [a.bridge] + [n.veth_host for n in a.nodes]:
        assert len(name) <= 15, name
    assert len({n.veth_host for n in a.nodes}) == embedded.MAX_NODES
    assert plan("alpha", 2, "192.168.99.0/24").nodes[1].address == "192.168.99.12"


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("bad name", 3, None), "bad cluster name"),
        (("x", 0, None), "between 1"),
        (("x", 3, "8.8.8.0/24"), "not a private range"),
        (("x", 3, "10.1.0.0/29"), "must be IPv4 and hold"),
        (("x", 3, "nonsense"), "bad subnet"),
    ],
)
def test_plan_rejects_bad_input(args: tuple[str, int, str | None], msg: str) -> None:
    with pytest.raises(ClusterError, match=msg):
        plan(*args)


def test_non_root_gets_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(embedded, "_effective_caps", lambda: 0)
    with pytest.raises(ClusterError) as ei:
        embedded.up("unit", 3)
    assert "needs root" in str(ei.value) and "--nodes-file" in str(ei.value)
    # CAP_NET_ADMIN alone is not enough (namespaces and mounts need CAP_SYS_ADMIN)
    monkeypatch.setattr(embedded, "_effective_caps", lambda: 1 << embedded.CAP_NET_ADMIN)
    assert not embedded.has_admin_privileges()
    caps = 1 << embedded.CAP_NET_ADMIN | 1 << embedded.CAP_SYS_ADMIN
    monkeypatch.setattr(embedded, "_effective_caps", lambda: caps)
    assert embedded.has_admin_privileges()


def test_cli_reports_errors_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(embedded, "_effective_caps", lambda: 0)
    for cmd in (["up", "--node-count", "3", "--name", "unit"], ["down", "--name", "unit"]):
        res = CliRunner().invoke(app, cmd)
        assert res.exit_code == 2, res.output
        assert "needs root" in res.output
        assert "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)


def test_missing_tools_name_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "has_admin_privileges", lambda: True)
    monkeypatch.setattr(embedded, "find_tool", lambda t: None if t == "ip" else "/bin/" + t)
    monkeypatch.setattr(sshd, "SSHD", "/nonexistent/sshd")
    with pytest.raises(ClusterError) as ei:
        embedded.preflight()
    msg = str(ei.value)
    assert "apt-get install -y iproute2 openssh-server" in msg
    assert "ip" in msg and "/nonexistent/sshd" in msg
