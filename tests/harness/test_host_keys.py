"""Real hosts' SSH host keys (issue 15): trusted on first use and kept in a known_hosts file
(~/.isrlab/known_hosts unless a nodes file names one), then strict: a changed key is refused.
Against a live SSH server (paramiko's server side, in this process) whose key we control."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from isrlab.harness import runner
from isrlab.harness.inventory import Node, SshOptions
from isrlab.harness.ssh import SshConnectError, _connect
from isrlab.harness.testconfig import TestConfig


class _Server(paramiko.ServerInterface):
    def check_auth_password(self, username: str, password: str) -> int:
        ok = username == "u" and password == "pw"
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username: str) -> str:
        return "password"


@contextlib.contextmanager
def ssh_server(host_key: paramiko.PKey) -> Iterator[int]:
    """A listening SSH server presenting ``host_key``; yields its port."""
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            transports.append(t)
            with contextlib.suppress(Exception):
                t.start_server(server=_Server())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for t in transports:
            t.close()
        sock.close()


def test_first_use_is_remembered_then_a_changed_key_is_refused(tmp_path: Path) -> None:
    known = tmp_path / "dir" / "known_hosts"  # (its folder does not exist yet)
    opts = SshOptions(host_key_policy="accept-new", known_hosts=str(known), connect_retries=0)
    first, second = paramiko.RSAKey.generate(2048), paramiko.RSAKey.generate(2048)
    with ssh_server(first) as port:
        node = Node("n1", "127.0.0.1", port=port, user="u", password="pw")
        _connect(node, opts).close()
        lines = known.read_text().splitlines()
        assert lines == [f"[127.0.0.1]:{port} ssh-rsa {first.get_base64()}"]
        _connect(node, opts).close()  # the same key again: fine, not added twice
        assert known.read_text().splitlines() == lines
    with ssh_server(second) as port2:  # the "same host" rebuilt (or an impostor)
        known.write_text(f"[127.0.0.1]:{port2} ssh-rsa {first.get_base64()}\n")
        node = Node("n1", "127.0.0.1", port=port2, user="u", password="pw")
        with pytest.raises(SshConnectError, match="host key mismatch") as e:
            _connect(node, opts)
        assert str(known) in str(e.value)
        assert second.get_base64() not in known.read_text()


def test_real_hosts_keep_their_keys_in_a_known_hosts_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = TestConfig.from_mapping({"nodes": "n1,n2,n3"})
    with runner.node_inventory(config) as (inv, _):
        assert inv.ssh.host_key_policy == "accept-new"
        assert inv.ssh.known_hosts == str(tmp_path / ".isrlab" / "known_hosts")
    nodes_file = tmp_path / "nodes.yaml"
    nodes_file.write_text("nodes: [a, b]\n")
    config = TestConfig.from_mapping({"nodes_file": str(nodes_file)})
    with runner.node_inventory(config) as (inv, _):
        assert inv.ssh.known_hosts == str(tmp_path / ".isrlab" / "known_hosts")
    # a nodes file that pins keys keeps its own file and policy
    nodes_file.write_text("nodes: [a]\nhost_key_policy: strict\nknown_hosts: pinned\n")
    with runner.node_inventory(config) as (inv, _):
        assert inv.ssh.host_key_policy == "strict"
        assert inv.ssh.known_hosts == str(tmp_path / "pinned")


def test_help_says_how_to_pin_keys() -> None:
    from typer.testing import CliRunner

    from tests.typer_app import subcommand_app

    res = CliRunner().invoke(
        subcommand_app("test", runner.test_command), ["test", "--help"], env={"COLUMNS": "200"}
    )
    text = " ".join(res.output.split())
    assert "known_hosts" in text and "host_key_policy: strict" in text
