"""harness.inventory, .ssh and .remote without any SSH server: inventories, command wrapping, errors, retries."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from isrlab.harness.inventory import Node, SshOptions, load_inventory, load_nodes
from isrlab.harness.remote import (
    NodesError,
    Remote,
    RemoteCommandError,
    Result,
    on_nodes,
    try_on_nodes,
    wrap_command,
)
from isrlab.harness.ssh import SshConnectError


def test_nodes_list_with_defaults_and_overrides() -> None:
    nodes = load_nodes("n1, admin@n2:2222,10.0.0.3", user="debian", key_file="/k", sudo=True)
    assert [n.name for n in nodes] == ["n1", "n2", "10.0.0.3"]
    assert nodes[0] == Node("n1", "n1", 22, "debian", "/k", None, True)
    assert (nodes[1].user, nodes[1].port) == ("admin", 2222)


def test_nodes_list_errors() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        load_nodes("n1,n1")
    with pytest.raises(ValueError, match="bad port"):
        load_nodes("n1:ssh")
    with pytest.raises(ValueError, match="either"):
        load_inventory()
    with pytest.raises(ValueError, match="empty"):
        load_nodes(" , ")


def test_nodes_file(tmp_path: Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text(
        "defaults: {user: vagrant, key: keys/id, sudo: true}\n"
        "host_key_policy: strict\nknown_hosts: kh\n"
        "nodes:\n"
        "  - {name: n1, host: 192.168.56.11}\n"
        "  - {name: n2, host: 192.168.56.12, port: 2200, user: root, key: /abs/key, sudo: false}\n"
        "  - 192.168.56.13\n"
    )
    inv = load_inventory(nodes_file=f)
    n1, n2, n3 = inv.nodes
    assert n1 == Node("n1", "192.168.56.11", 22, "vagrant", str(tmp_path / "keys/id"), None, True)
    assert (n2.port, n2.user, n2.key_file, n2.sudo) == (2200, "root", "/abs/key", False)
    assert n3.name == n3.host == "192.168.56.13"
    assert inv.ssh.host_key_policy == "strict"
    assert inv.ssh.known_hosts == str(tmp_path / "kh")


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("nodes: 3\n", "'nodes:' list"),
        ("nodes: [{name: x}]\n", "needs at least a 'host'"),
        ("nodes: [a]\nhost_key_policy: yolo\n", "host_key_policy"),
        ("nodes: [\n", "not valid YAML"),
    ],
)
def test_nodes_file_errors(tmp_path: Path, text: str, msg: str) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        load_inventory(nodes_file=f)
    with pytest.raises(ValueError, match="does not exist"):
        load_inventory(nodes_file=tmp_path / "missing.yaml")


def test_wrap_command_quotes_env_cwd_and_sudo() -> None:
    w = wrap_command("echo $X", env={"X": "a b'c"}, cwd="/tmp/my dir", sudo=True)
    assert w == "sudo -n -- env X='a b'\"'\"'c' sh -c 'cd '\"'\"'/tmp/my dir'\"'\"' && echo $X'"
    with pytest.raises(ValueError, match="environment variable"):
        wrap_command("true", env={"A B": "x"})


def test_remote_command_error_names_node_command_status_and_stderr_tail() -> None:
    stderr = "\n".join(f"line {i}" for i in range(100))
    res = Result("n3", "kafka-start", 2, "", stderr, 0.1)
    with pytest.raises(RemoteCommandError) as ei:
        res.check()
    msg = str(ei.value)
    assert msg.startswith("n3: command exited with status 2: kafka-start")
    assert "line 99" in msg and "line 10\n" not in msg
    assert ei.value.exit_status == 2 and ei.value.node == "n3"
    assert Result("n3", "true", 0, "", "", 0.0).check().ok


def test_connect_refused_is_retried_then_reported() -> None:
    with socket.socket() as s:  # a port that is certainly closed: bind, never listen
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        node = Node("lo", "127.0.0.1", port=port)
        opts = SshOptions(host_key_policy="warn", connect_retries=2, backoff_initial=0.01)
        with pytest.raises(SshConnectError) as ei:
            Remote(node, opts).exec("true")
    assert "after 3 attempts" in str(ei.value)
    assert f"root@127.0.0.1:{port}" in str(ei.value)


def test_strict_policy_needs_known_hosts() -> None:
    with pytest.raises(SshConnectError, match="known_hosts"):
        Remote(Node("x", "127.0.0.1", port=1), SshOptions()).exec("true")
    with pytest.raises(ValueError):
        SshOptions(host_key_policy="trust-me")  # type: ignore[arg-type]


def test_on_nodes_collects_errors_per_node_and_runs_in_parallel() -> None:
    nodes = [Node(f"n{i}", f"h{i}") for i in range(1, 5)]

    def fn(r: Remote) -> str:
        if r.node.name in ("n2", "n4"):
            raise RuntimeError(f"boom on {r.node.host}")
        return r.node.host

    out = try_on_nodes(nodes, fn)
    assert out["n1"] == "h1" and isinstance(out["n2"], RuntimeError)
    with pytest.raises(NodesError) as ei:
        on_nodes(nodes, fn, parallel=False)
    assert set(ei.value.errors) == {"n2", "n4"}
    assert ei.value.results == {"n1": "h1", "n3": "h3"}
    assert "boom on h2" in str(ei.value) and "2 node(s) failed" in str(ei.value)
    assert on_nodes(nodes[:1], fn) == {"n1": "h1"}

    # every call waits for all the others: only passes if they really run at the same time
    barrier = threading.Barrier(len(nodes), timeout=10)
    assert on_nodes(nodes, lambda r: barrier.wait() >= 0) == {n.name: True for n in nodes}


def test_the_vagrant_example_nodes_file_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "vagrant" / "nodes.yaml"
    inv = load_inventory(nodes_file=path)
    assert [n.name for n in inv.nodes] == ["n1", "n2", "n3", "n4", "n5"]
    assert inv.nodes[4].host == "192.168.56.15"
    assert all(n.user == "vagrant" and n.sudo for n in inv.nodes)
    assert inv.nodes[0].key_file == str(path.parent / ".vagrant/machines/n1/virtualbox/private_key")
    assert inv.ssh.host_key_policy == "accept-new"
