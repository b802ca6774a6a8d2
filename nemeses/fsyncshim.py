"""Failing fsyncs for a Python daemon, driven by a flag file: the ``fsync-fail`` nemesis.

A disk that returns EIO to fsync (a dying device, a thin pool out of space, a network block
device gone) is what dm-flakey or dm-error give on a machine with device-mapper, and what
CharybdeFS gives through FUSE. Neither runs on every host the harness deploys to (the embedded
cluster's network namespaces share the machine's disks), so the fault is injected where the
broker calls the kernel: when the environment has ``ISRLAB_FSYNC_FAIL_FILE``, importing this
module (done at interpreter start by ``isrlab_fsyncshim.pth``, which ``harness.db`` installs
with this file as ``isrlab_fsyncshim.py`` into the broker's venv) replaces ``os.fsync`` and
``os.fdatasync`` with versions that raise ``OSError(EIO)`` while that file exists, without
calling the kernel. The data stays in the page cache, as after a real failed fsync whose pages
the kernel kept; what the broker may still rely on is up to it (it takes its log dir offline
and halts: docs/durability.md, "A failed fsync takes the log dir offline").

The module must import nothing outside the standard library: it runs before site-packages.
"""

from __future__ import annotations

import errno
import os

ENV = "ISRLAB_FSYNC_FAIL_FILE"

_real_fsync = os.fsync
_real_fdatasync = os.fdatasync


def install(flag_file: str) -> None:
    """Make ``os.fsync`` and ``os.fdatasync`` fail with EIO while ``flag_file`` exists."""

    def check() -> None:
        if os.path.exists(flag_file):
            raise OSError(errno.EIO, "Input/output error (isrlab fsync-fail nemesis)")

    def fsync(fd: int) -> None:  # (a file object's fileno() is what callers pass)
        check()
        _real_fsync(fd)

    def fdatasync(fd: int) -> None:
        check()
        _real_fdatasync(fd)

    os.fsync = fsync  # type: ignore[assignment]
    os.fdatasync = fdatasync  # type: ignore[assignment]


if os.environ.get(ENV):
    install(os.environ[ENV])
