"""What a source file imports, as the layering tests read it: one scan for all of them."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in `path`, a file of one of the folders under `root`
    (installed as ``isrlab.<folder>``): at any depth (lazy imports inside functions too),
    relative ones resolved, and ``from m import n`` seen as both ``m`` and ``m.n``."""
    package = ".".join(["isrlab", *path.relative_to(root).parent.parts])
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out
