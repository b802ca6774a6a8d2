"""The wheelhouse: the wheels that carry this checkout's code to the nodes.

The control host builds a *wheelhouse* once (``build_wheelhouse()`` -> ``Wheelhouse``): the isrlab
wheel (built from a scratch copy of the checkout, so the checkout gets no build/ or egg-info) plus
wheels of what the broker imports at run time (``NODE_REQUIREMENTS``, version pins taken from
pyproject.toml) and pip itself. It is cached under ``$ISRLAB_CACHE`` (default
``~/.cache/isrlab``; the newest ``KEEP_WHEELHOUSES`` are kept) in a directory named by the Python
tag and the *build hash*: a SHA-256 over pyproject.toml and every source file of the packages; the
dependency wheels are cached apart, keyed by the requirement pins. ``harness.db.KafkaDB.install``
puts it on the nodes. Nothing here touches a node.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "harness", "nemeses", "checkers", "pipeline")
# what `python -m isrlab.broker start` imports on a node; pins come from pyproject.toml
NODE_REQUIREMENTS = ("kafka-python", "crc32c", "kazoo", "typer", "rich", "orjson")
SOURCE_SUFFIXES = (".py", ".html", ".j2", ".css", ".js")
KEEP_WHEELHOUSES = 3

Progress = Callable[[str], None]


class WheelhouseError(Exception):
    """The wheels could not be built or are incomplete; the message says what to do."""


def _print_progress(msg: str) -> None:
    print(f"[wheelhouse] {msg}", flush=True)


@dataclass(frozen=True)
class Wheelhouse:
    """Wheels to install on nodes: ``path`` holds them, ``build_hash`` names their content."""

    path: Path
    build_hash: str
    python: str  # "3.11": the nodes' interpreter must match (binary wheels)
    deps_key: str = ""  # names the dependency wheels: nodes with them only swap the isrlab wheel

    @property
    def files(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.suffix == ".whl")

    @property
    def project_wheel(self) -> Path:
        for p in self.files:
            if p.name.startswith("isrlab-"):
                return p
        raise WheelhouseError(f"wheelhouse {self.path} has no isrlab wheel; delete it and retry")

    @property
    def pip_wheel(self) -> Path:
        for p in self.files:
            if p.name.startswith("pip-"):
                return p
        raise WheelhouseError(f"wheelhouse {self.path} has no pip wheel; delete it and retry")


def cache_dir() -> Path:
    return Path(os.environ.get("ISRLAB_CACHE") or Path.home() / ".cache" / "isrlab")


def _source_files(root: Path) -> list[Path]:
    out = [root / "pyproject.toml", *[p for p in [root / "setup.py"] if p.exists()]]
    for pkg in PACKAGES:
        base = root / pkg
        if base.is_dir():
            out += [
                p
                for p in base.rglob("*")
                if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts
            ]
    return sorted(out)


def build_hash(root: Path = PROJECT_ROOT) -> str:
    """SHA-256 over pyproject.toml and the packages' source files (names and contents)."""
    h = hashlib.sha256()
    for p in _source_files(root):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def node_requirements(root: Path = PROJECT_ROOT) -> list[str]:
    """The pyproject.toml dependency specs of ``NODE_REQUIREMENTS`` (e.g. ``kazoo>=2.9``)."""
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {n.lower() for n in NODE_REQUIREMENTS}
    out = [d for d in deps if re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() in wanted]
    missing = wanted - {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in out}
    if missing:
        raise WheelhouseError(f"pyproject.toml does not list {', '.join(sorted(missing))}")
    return out


def _run(cmd: Sequence[str], what: str, cwd: Path | None = None) -> None:
    res = subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd)
    if res.returncode != 0:
        tail = "\n    ".join((res.stderr or res.stdout).strip().splitlines()[-15:])
        raise WheelhouseError(
            f"{what} failed (exit {res.returncode}): {shlex.join(cmd)}\n    {tail}"
        )


def build_wheelhouse(
    root: Path = PROJECT_ROOT, cache: Path | None = None, progress: Progress = _print_progress
) -> Wheelhouse:
    """The cached wheelhouse for the current sources, built now if missing (see module doc)."""
    digest = build_hash(root)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = cache or cache_dir()
    target = base / f"wheelhouse-py{py}-{digest[:16]}"
    reqs = node_requirements(root)
    dep_key = hashlib.sha256("\n".join([py, *reqs]).encode()).hexdigest()[:16]
    if (target / ".complete").exists():
        progress(f"wheelhouse cached ({target.name})")
        return Wheelhouse(target, digest, py, dep_key)
    started = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # dependency wheels change only with pyproject.toml: share them between builds
    deps = base / f"deps-py{py}-{dep_key}"
    if not (deps / ".complete").exists():
        tmp_deps = Path(tempfile.mkdtemp(prefix="deps-", dir=base))
        _run(
            [*pip, "download", "--only-binary=:all:", "-d", str(tmp_deps), "pip", *reqs],
            "downloading the broker's dependency wheels",
        )
        (tmp_deps / ".complete").touch()
        shutil.rmtree(deps, ignore_errors=True)
        tmp_deps.rename(deps)
    tmp = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=base))
    try:
        # build from a scratch copy: setuptools writes build/ and *.egg-info next to the sources
        src = tmp / "src"
        src.mkdir()
        for p in _source_files(root):
            dest = src / p.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
        if (root / "README.md").exists():
            shutil.copy2(root / "README.md", src / "README.md")
        _run([*pip, "wheel", "--no-deps", "-w", str(tmp), str(src)], "building the isrlab wheel")
        shutil.rmtree(src)
        for whl in deps.glob("*.whl"):
            shutil.copy2(whl, tmp / whl.name)
        (tmp / ".complete").write_text(digest + "\n")
        if (target / ".complete").exists():  # another process built the same one meanwhile
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(base, "wheelhouse-", keep=KEEP_WHEELHOUSES)
    progress(f"wheelhouse built in {time.monotonic() - started:.1f}s ({target.name})")
    return Wheelhouse(target, digest, py, dep_key)


def _prune(base: Path, prefix: str, keep: int) -> None:
    """Delete all but the ``keep`` newest complete ``prefix*`` directories of the cache."""
    done = sorted(
        (p for p in base.glob(prefix + "*") if (p / ".complete").exists()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in done[keep:]:
        shutil.rmtree(old, ignore_errors=True)
