"""Fixtures that run the broker as a real process, the way users run it."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(
        self,
        log_dir: Path,
        port: int,
        overrides: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        broker_id: int = 0,
        nofile: int | None = None,
    ):
        self.log_dir = log_dir
        self.nofile = nofile  # the child's open-file limit (ulimit -n), if lowered
        self.port = port
        self.host = host
        self.broker_id = broker_id
        self.overrides = {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{host}:{port}",
            "log.dirs": str(log_dir),
            **(overrides or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.stderr_path = log_dir.parent / f"broker-{broker_id}-{port}.stderr"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20) -> None:
        args = [sys.executable, "-m", "isrlab.broker", "start"]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        self.stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - lives as long as the process
        nofile = self.nofile

        def limit_files() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            args, stdout=self.stderr, stderr=self.stderr, preexec_fn=limit_files
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.stderr_path.read_text()[-3000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("broker did not start listening")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    @property
    def serving(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self.paused

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            if sig == signal.SIGSTOP:
                self.paused = True
            elif sig == signal.SIGCONT:
                self.paused = False

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self.paused = False

    def log_text(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type]:
    started: list[BrokerProcess] = []

    def make(overrides: dict[str, str] | None = None, log_dir: Path | None = None) -> BrokerProcess:
        b = BrokerProcess(log_dir or tmp_path / f"logs-{len(started)}", free_port(), overrides)
        b.start()
        started.append(b)
        return b

    yield make  # type: ignore[misc]
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:  # type: ignore[no-untyped-def]
    return broker_factory()


@pytest.fixture
def journaled_dir(tmp_path: Path) -> Iterator[Path]:
    """A log directory with the fsync journal attached (`durable.attach`, as the broker does
    at start-up), detached afterwards: what the power-loss tests cut back."""
    from isrlab.broker.log import durable

    d = tmp_path / "data"
    d.mkdir()
    durable.attach(d)
    yield d
    durable.detach(d)
