"""Test fixtures (`isrlab.pipeline.fixtures`: simulated histories, synthetic run stores) are
imported by tests and benchmarks only: no product module depends on them, so what `isrlab`
does never rests on a simulation."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("broker", "harness", "nemeses", "checkers", "pipeline")
FIXTURES = "isrlab.pipeline.fixtures"


def _imports(path: Path, root: Path) -> list[str]:
    """Every module `path` imports, absolute or relative, at any depth (lazy imports too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(["isrlab", *path.relative_to(root).parent.parts])
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def _offenders(root: Path) -> list[str]:
    bad = []
    for top in PRODUCT:
        for p in (root / top).rglob("*.py"):
            if (root / "pipeline" / "fixtures") in p.parents:
                continue
            bad += [
                f"{p.relative_to(root)}: {m}"
                for m in _imports(p, root)
                if m == FIXTURES or m.startswith(FIXTURES + ".")
            ]
    return bad


def test_no_product_module_imports_the_fixtures() -> None:
    assert _offenders(ROOT) == []


def test_the_check_sees_an_import_of_the_fixtures(tmp_path: Path) -> None:
    # The scan itself can fail: a product module that imports them, lazily and relatively.
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "report.py").write_text(
        "def f():\n    from .fixtures import simulate\n    return simulate\n"
    )
    assert _offenders(tmp_path) == [
        "pipeline/report.py: isrlab.pipeline.fixtures",
        "pipeline/report.py: isrlab.pipeline.fixtures.simulate",
    ]


def test_benchmarks_find_the_fixtures_outside_the_repository(tmp_path: Path) -> None:
    # `python benchmarks/x.py` runs with the installed package, from anywhere.
    code = "import isrlab.pipeline.fixtures.simulate, isrlab.pipeline.fixtures.synthetic"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
