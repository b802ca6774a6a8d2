"""Root-only tests of this directory are skipped (not failed) without root and sshd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from isrlab.harness.cluster import sshd


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0 and os.access(sshd.SSHD, os.X_OK):
        return
    why = "needs root and openssh-server (network namespaces, sshd, iptables)"
    here = Path(__file__).parent
    for item in items:
        if "root" in item.keywords and item.path.is_relative_to(here):
            item.add_marker(pytest.mark.skip(reason=why))
