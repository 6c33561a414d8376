"""The import statements of a source file, read with `ast` (both import-rule tests,
tests/test_import_rules.py and tests/engine/test_import_rules.py, build their graphs on it)."""
from __future__ import annotations

import ast
import pathlib


def import_statements(path: pathlib.Path, package: str) -> list[tuple[str, tuple[str, ...], int]]:
    """(module, names imported from it, line) of every import in the file, wherever it sits:
    `import a.b` gives ("a.b", (), line), `from .b import c` ("<package>.b", ("c",), line)
    with the relative module resolved against `package`, and `import_module("x")` ("x", (),
    line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, tuple(a.name for a in node.names), node.lineno))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.args[0].value, (), node.lineno))
    return found
