"""The engine never imports textual or rich: neither at run time nor in its sources."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
UI = ("textual", "rich")


def test_importing_every_engine_module_loads_no_ui_package():
    code = f"""
import importlib, pkgutil, sys
import engine
names = ["engine"] + [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")]
for name in names:
    importlib.import_module(name)
from engine import LLM, LLMEngine, EngineLoop   # the lazy attributes too
bad = sorted(m for m in sys.modules if m.split(".")[0] in {UI!r})
print(len(names), "modules;", "ui:", bad)
assert not bad, bad
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "ui: []" in out.stdout


def test_engine_sources_do_not_mention_ui_imports():
    pattern = re.compile(rf"^\s*(import|from)\s+({'|'.join(UI)})\b", re.MULTILINE)
    lazy = re.compile(rf"import_module\(\s*['\"]({'|'.join(UI)})\b")
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if pattern.search(text) or lazy.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"engine modules importing textual/rich: {offenders}"
    assert len(list(ENGINE.rglob("*.py"))) > 10
