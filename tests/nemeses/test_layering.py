"""The harness uses the nemeses, never the reverse: a nemesis reaches nodes through the narrow
protocols of nemeses.base (ClusterDB, Shell), which the harness's DB and Remote satisfy."""

from __future__ import annotations

from pathlib import Path

from tests.packaging.imports import imported_modules

ROOT = Path(__file__).resolve().parents[2]


def forbidden(package: str, prefixes: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path, ROOT):
            if module.startswith(prefixes):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_nemeses_do_not_import_the_harness() -> None:
    assert forbidden("nemeses", ("isrlab.harness", "harness")) == []


def test_the_scan_sees_lazy_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from isrlab import harness\n    import isrlab.harness.remote\n")
    assert [m for _, m in imported_modules(f, tmp_path)] == [
        "isrlab",
        "isrlab.harness",
        "isrlab.harness.remote",
    ]


# The `isrlab` command line (harness/cli.py, the program's entry point) mounts
# `isrlab analyze`: the one place where the harness side names the pipeline, and only its CLI.
ENTRY_POINT_MOUNTS = {"harness/cli.py": ("isrlab.pipeline.cli",)}


def pipeline_importers(root: Path) -> list[str]:
    """Imports of the pipeline from the packages it builds on (harness, nemeses, checkers,
    broker): the pipeline reads test configurations and runs; it is not read by them."""
    bad = []
    for package in ("harness", "nemeses", "checkers", "broker"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            allowed = ENTRY_POINT_MOUNTS.get(rel, ())
            for line, module in imported_modules(path, root):
                parts = module.split(".")
                if not (parts[:2] == ["isrlab", "pipeline"] or parts[0] == "pipeline"):
                    continue
                if allowed and (module == "isrlab.pipeline" or module.startswith(allowed)):
                    continue  # `from isrlab.pipeline import cli` is also seen as .cli
                bad.append(f"{rel}:{line} imports {module}")
    return bad


def test_the_harness_side_does_not_import_the_pipeline() -> None:
    assert pipeline_importers(ROOT) == []


def test_the_pipeline_scan_sees_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "matrix.py").write_text(
        "def f():\n    from isrlab.pipeline.store import config_name\n"
    )
    (tmp_path / "harness" / "cli.py").write_text(
        "from isrlab.pipeline import cli, store\n"  # the entry point may mount the CLI only
    )
    assert pipeline_importers(tmp_path) == [
        "harness/cli.py:1 imports isrlab.pipeline.store",
        "harness/matrix.py:2 imports isrlab.pipeline.store",
        "harness/matrix.py:2 imports isrlab.pipeline.store.config_name",
    ]
