"""SSH key material for one embedded-cluster run: a client key pair and per-node host keys.

All keys are ed25519, generated with ``cryptography`` (already a paramiko dependency) and
written in OpenSSH formats: private keys as ``-----BEGIN OPENSSH PRIVATE KEY-----`` files mode
0600, public keys as ``ssh-ed25519 AAAA... comment`` lines. Because the harness generates the host
keys itself it can write an exact known_hosts file and connect with a strict host-key policy.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def generate_keypair(private_path: Path, comment: str) -> str:
    """Write a new ed25519 private key to ``private_path`` (and ``.pub``); return the public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = f"{public.decode()} {comment}"
    private_path.parent.mkdir(parents=True, exist_ok=True)
    # create with 0600 from the start: sshd refuses group/world-readable host keys
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(str(private_path) + ".pub").write_text(line + "\n")
    return line


def known_hosts_lines(entries: Iterable[tuple[Iterable[str], str]]) -> str:
    """known_hosts text from (host names/addresses, public key line) pairs."""
    out = []
    for hosts, pub in entries:
        keytype, blob = pub.split()[:2]
        out.append(f"{','.join(hosts)} {keytype} {blob}")
    return "\n".join(out) + "\n"
