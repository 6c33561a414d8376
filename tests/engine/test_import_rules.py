"""The engine's folders are its processes, and imports only point down the seam:

    front -> ipc -> core -> worker        (and every side -> the top-level contract)

Read from the sources (AST, lazy imports inside functions and import_module strings
included), so a rule broken on a path no test runs still fails here. The run-time check
(importing every module loads no UI package) is the second half.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

from tests.import_graph import import_statements

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"
TOP = "top"     # engine/*.py: the shared contract (config, codes, outputs, request, ...)
ALLOWED = {     # side -> the sides it may import (itself always)
    TOP: set(),
    "front": {TOP, "ipc"},
    "ipc": {TOP, "core"},
    "core": {TOP, "worker"},
    "worker": {TOP},
}
# UI and server packages, and the test and benchmark hooks (benchmarks/: handed to the
# engine through its Python API, never imported by it)
FOREIGN = ("textual", "rich", "fastapi", "uvicorn", "starlette", "roseplay", "benchmarks",
           "tests")
FACADE = "engine"   # engine/__init__.py: the public API, which loads LLM etc. lazily
# the core runs the model through the Executor (engine/worker/executor/) and hands it
# plain data; it never touches a tensor or a kernel itself
DEVICE_PACKAGES = ("torch", "triton", "kernels")
# what the core may import from the worker: the Executor, and the types of what crosses
# it (batches, the draft's columns, host copies, tier transfers, host mask buffers)
CORE_TO_WORKER = {"engine.worker.executor", "engine.worker.step_batch",
                  "engine.worker.draft_batch", "engine.worker.device_io",
                  "engine.worker.kv_transfer", "engine.worker.logprobs",
                  "engine.worker.host_masks"}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


def package_of(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def side_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or package_of(module) != "engine" else TOP


def resolve(name: str) -> str | None:
    """The engine module a dotted import names (longest existing prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported dotted name, line) for every import in the module, wherever it sits."""
    found = []
    for base, names, line in import_statements(MODULES[module], package_of(module)):
        found += [(f"{base}.{n}" if f"{base}.{n}" in MODULES else base, line) for n in names]
        if not names:
            found.append((base, line))
    return found


def engine_edges() -> list[tuple[str, str, int]]:
    edges = []
    for module in MODULES:
        for name, line in imports_of(module):
            target = resolve(name) if name.split(".")[0] == "engine" else None
            if target is not None and target != module:
                edges.append((module, target, line))
    return edges


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_folders_exist_and_hold_the_processes():
    sides = {side_of(m) for m in MODULES}
    assert sides == set(ALLOWED), sides
    assert {"engine.front.client", "engine.core.scheduler", "engine.worker.runner",
            "engine.ipc.core_proc"} <= set(MODULES)


def test_imports_only_point_down_the_seam():
    offenders = []
    for src, dst, line in engine_edges():
        if src == FACADE:
            continue
        a, b = side_of(src), side_of(dst)
        if a != b and b not in ALLOWED[a]:
            offenders.append(f"{where(src, line)}: {a} imports {b} ({dst})")
    assert not offenders, "imports against the seam:\n" + "\n".join(offenders)


def test_core_imports_no_torch_and_no_kernels():
    """Lazy imports inside functions count: the core drives the model through the
    Executor only."""
    offenders = [f"{where(m, line)}: {name}" for m in MODULES if side_of(m) == "core"
                 for name, line in imports_of(m) if name.split(".")[0] in DEVICE_PACKAGES]
    assert not offenders, "core modules importing torch or kernels:\n" + "\n".join(offenders)


def test_core_reaches_the_worker_through_the_executor_only():
    offenders = [f"{where(src, line)}: {dst}" for src, dst, line in engine_edges()
                 if side_of(src) == "core" and side_of(dst) == "worker"
                 and dst not in CORE_TO_WORKER]
    assert not offenders, "core modules importing the worker's insides:\n" + "\n".join(offenders)


def test_no_package_cycles():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in engine_edges():
        if src != FACADE and package_of(src) != package_of(dst):
            graph.setdefault(package_of(src), set()).add(package_of(dst))
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "package cycles:\n" + "\n".join(cycles)


def test_engine_sources_import_no_ui_or_server_package():
    offenders = [f"{where(m, line)}: {name}" for m in MODULES for name, line in imports_of(m)
                 if name.split(".")[0] in FOREIGN]
    assert not offenders, "engine modules importing UI/server packages:\n" + "\n".join(offenders)


def test_importing_every_engine_module_loads_no_ui_or_server_package():
    code = f"""
import importlib, sys
for name in {sorted(MODULES)!r}:
    importlib.import_module(name)
from engine import LLM, LLMEngine, EngineLoop   # the lazy attributes too
bad = sorted(m for m in sys.modules if m.split(".")[0] in {FOREIGN!r})
print("foreign:", bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "foreign: []" in out.stdout, out.stdout
