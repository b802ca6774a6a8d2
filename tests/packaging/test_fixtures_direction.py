"""Test fixtures (`isrlab.pipeline.fixtures`: simulated histories, synthetic run stores) are
imported by tests and benchmarks only: no product module depends on them, so what `isrlab`
does never rests on a simulation."""

import subprocess
import sys
from pathlib import Path

from tests.packaging.imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("broker", "harness", "nemeses", "checkers", "pipeline")
FIXTURES = "isrlab.pipeline.fixtures"


def _offenders(root: Path) -> list[str]:
    bad = []
    for top in PRODUCT:
        for p in (root / top).rglob("*.py"):
            if (root / "pipeline" / "fixtures") in p.parents:
                continue
            bad += [
                f"{p.relative_to(root)}: {m}"
                for _, m in imported_modules(p, root)
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
