"""The harness uses the nemeses, never the reverse: a nemesis reaches nodes through the narrow
protocols of nemeses.base (ClusterDB, Shell), which the harness's DB and Remote satisfy."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def forbidden(package: str, prefixes: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.startswith(prefixes):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_nemeses_do_not_import_the_harness() -> None:
    assert forbidden("nemeses", ("isrlab.harness", "harness")) == []


def test_the_scan_sees_lazy_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from isrlab import harness\n    import isrlab.harness.remote\n")
    assert [m for _, m in imported_modules(f)] == [
        "isrlab",
        "isrlab.harness",
        "isrlab.harness.remote",
    ]
