"""Import rules outside engine/ (tests/engine/test_import_rules.py holds the engine's):

* no import circle among roseplay/'s modules, nor among scripts/';
* tests/ never imports scripts/, scripts/ never imports tests/ (what both need lives in
  devtools/), and neither roseplay/ nor devtools/ imports tests/ or scripts/.

Read from the sources (AST, imports inside functions and import_module strings
included), so an import on a path no test runs still counts.
"""
from __future__ import annotations

import pathlib

from tests.import_graph import import_statements

ROOT = pathlib.Path(__file__).resolve().parents[1]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(folder: str) -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted((ROOT / folder).rglob("*.py"))}


def imports_of(name: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """(imported dotted name, line) of every import in a file, wherever it sits: for
    `from a.b import c` both `a.b` and `a.b.c` (whichever is a module counts)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for base, names, line in import_statements(path, package):
        found.append((base, line))
        found += [(f"{base}.{n}", line) for n in names]
    return found


def graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports (package __init__ files are
    not implied: each import names the module it loads)."""
    mods = modules_of(folder)
    return {name: {imp for imp, _ in imports_of(name, path) if imp in mods and imp != name}
            for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.append(top)
                        if top == node:
                            break
                    if len(part) > 1:
                        out.append(sorted(part))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def crossings(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in modules_of(folder).items():
        for imp, line in imports_of(name, path):
            if imp.split(".")[0] in forbidden:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imp}")
    return sorted(set(bad))


def test_the_circle_finder_finds_circles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(circles(edges)) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_roseplay_has_no_import_circle():
    assert circles(graph("roseplay")) == []


def test_scripts_have_no_import_circle():
    assert circles(graph("scripts")) == []


def test_tests_never_import_scripts():
    assert crossings("tests", ("scripts",)) == []


def test_scripts_never_import_tests():
    assert crossings("scripts", ("tests",)) == []


def test_the_package_and_devtools_import_no_tests_or_scripts():
    assert crossings("roseplay", ("tests", "scripts", "devtools")) == []
    assert crossings("devtools", ("tests", "scripts")) == []
