"""The five folders install and import as one ``isrlab`` namespace (setup.py's package-dir map).

Importing the bare folder names would work from the repository root (it is on sys.path there) and
load a second copy of every module under another name; no code, command string or test may rely on
it.
"""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import isrlab.broker
import isrlab.checkers.queue.analysis

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("broker", "harness", "nemeses", "checkers", "pipeline")
# statements, also inside strings (`python -c '...'`, probes run in subprocesses)
BARE = re.compile(
    rf"(?:^|(?<!isrlab)[\s'\"])(from|import)\s+({'|'.join(FOLDERS)})(\.\w+)*"
    r"(\s+import\b|\s+as\b|\s*[,;'\"]|\s*\\n|\s*$)",
    re.M,
)


def _sources() -> list[Path]:
    out: list[Path] = []
    for top in [*FOLDERS, "tests", "benchmarks"]:
        out += [p for p in (ROOT / top).rglob("*.py*") if p.suffix in (".py", ".pyx")]
    return out


def test_no_module_imports_a_bare_top_level_name() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
        for p in _sources()
        for m in BARE.finditer(p.read_text())
    ]
    assert bad == []


def test_the_namespace_maps_onto_the_fixed_folders() -> None:
    assert Path(isrlab.broker.__file__).resolve() == ROOT / "broker" / "__init__.py"
    assert isrlab.checkers.queue.analysis.__name__ == "isrlab.checkers.queue.analysis"


def test_installed_interpreter_finds_isrlab_outside_the_repository(tmp_path: Path) -> None:
    # From another directory only the installed mapping can answer; the bare names must not.
    code = (
        "import importlib.util as u, isrlab.harness.cli, isrlab.broker.cli;"
        "print(u.find_spec('broker') is None, u.find_spec('harness') is None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True"]


@pytest.mark.integration
def test_the_node_wheel_holds_every_package_under_isrlab(tmp_path: Path) -> None:
    from isrlab.harness.wheelhouse import PACKAGES, _source_files

    src = tmp_path / "src"
    for p in _source_files(ROOT):
        dest = src / p.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(p.read_bytes())
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("-w", str(tmp_path), str(src)),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = tmp_path.glob("isrlab-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    # every module, also those of a folder without __init__.py (broker/network)
    wanted = {
        "isrlab/" + p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sorted(wanted - set(names)) == []
    assert not any(n.split("/")[0] in PACKAGES for n in names)
