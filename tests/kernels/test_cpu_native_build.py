"""The native CPU kernels' build (kernels/cpu_native_build.py): the vector width each
target gets (16 floats with AVX-512, 8 with AVX2 + FMA + F16C, else 4), the AVX-512
sources compiling where they cannot run, the backend `attention_backend=auto` picks
from the width (cpu_native from 8 up, else torch_sdpa), and the fallbacks when no
compiler builds them. The kernels' results at each width: tests/kernels/test_cpu_native.py."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess

import pytest

import kernels.cpu_native_build as build
from kernels import cpu_native, default_cpu_backend
from kernels.cpu_native_build import FLAGS, HEADERS, SOURCES, _load

COMPILER = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler")
X86 = platform.machine().lower() in ("x86_64", "amd64")
needs_x86 = pytest.mark.skipif(not X86, reason="the x86-64 levels are x86 targets")


def _cpu_width() -> int:
    """The width this CPU's flags call for."""
    flags = set(build._cpu_flags().split())
    if "avx512f" in flags:
        return 16
    return 8 if {"avx2", "fma", "f16c"} <= flags else 4


def _macros(*target: str) -> dict[str, str]:
    """The macros kernels/cpu_native_simd.h defines for `target` (preprocessed only)."""
    simd = next(h for h in HEADERS if h.name == "cpu_native_simd.h")
    out = subprocess.run([COMPILER, *target, "-dM", "-E", str(simd)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return {p[1]: p[2] if len(p) > 2 else "" for p in (line.split(maxsplit=2)
                                                        for line in out.splitlines())}


@needs_compiler
@needs_x86
@pytest.mark.parametrize("target,width,helpers", [
    ("-march=x86-64-v4", "16", "RP_AVX512"),               # AVX-512 F/BW/CD/DQ/VL
    ("-march=x86-64-v3", "8", "RP_AVX2"),                  # AVX2, FMA, F16C
    ("-march=haswell", "8", "RP_AVX2"),
    ("-march=x86-64-v2", "4", None),                       # SSE4.2: the generic vectors
    ("-march=sandybridge", "4", None),                     # AVX without AVX2 / FMA
])
def test_the_target_sets_the_vector_width(target, width, helpers):
    macros = _macros(target)
    assert macros["RP_WIDTH"] == width
    assert [m for m in ("RP_AVX512", "RP_AVX2") if m in macros] == ([helpers] if helpers else [])


@needs_compiler
@needs_x86
def test_a_forced_width_keeps_the_loops_and_drops_intrinsics_the_target_lacks():
    """-DRP_WIDTH=16 on an AVX2 target: 16-float vectors with the generic helpers (how
    an AVX2 CPU runs the AVX-512 build's loops)."""
    macros = _macros("-march=x86-64-v3", "-DRP_WIDTH=16")
    assert macros["RP_WIDTH"] == "16" and "RP_AVX512" not in macros and "RP_AVX2" not in macros


@needs_compiler
@needs_x86
def test_the_avx512_sources_compile_here(tmp_path):
    """The AVX-512 helpers compile even on a CPU that cannot run them (-O0: a quick
    compile; always_inline still inlines, so a helper's target mismatch still fails)."""
    for source in SOURCES:
        subprocess.run([COMPILER, *FLAGS, "-march=x86-64-v4", "-O0", "-Werror", "-c", str(source),
                        "-o", str(tmp_path / f"{source.stem}.o")],
                       check=True, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not cpu_native.available(), reason="no C compiler")
def test_this_cpus_build_has_the_width_its_flags_call_for():
    assert cpu_native._LIB.rp_vector_width() == (_cpu_width() if X86 else 4)


class _Built:
    def __init__(self, width: int):
        self.rp_vector_width = lambda: width


@pytest.mark.parametrize("lib,backend", [(_Built(16), "cpu_native"), (_Built(8), "cpu_native"),
                                         (_Built(4), "torch_sdpa"), (None, "torch_sdpa")])
def test_the_cpu_default_is_cpu_native_with_avx2_or_avx512(lib, backend, monkeypatch):
    """The 4-float build (no AVX2) is not measured against oneDNN: torch_sdpa there, and
    where there is no library at all (docs/KERNELS.md "CPU native")."""
    monkeypatch.setattr(build, "load", lambda: lib)
    assert default_cpu_backend() == backend


def test_this_cpu_gets_the_default_its_build_allows():
    lib = build.load()
    wide = lib is not None and lib.rp_vector_width() >= 8
    assert default_cpu_backend() == ("cpu_native" if wide else "torch_sdpa")


@needs_compiler
def test_no_compiler_or_a_failed_build_means_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSEPLAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")                   # a compiler that fails
    assert _load() is None
    monkeypatch.setenv("CC", COMPILER)
    lib = _load(FLAGS + ("-O0",))                            # builds into tmp_path (quickly)
    assert lib is not None and lib.rp_abi_version() == 4
    assert lib.rp_vector_width() == cpu_native._LIB.rp_vector_width()
    assert [p.suffix for p in (tmp_path / "native").iterdir()] == [".so"]   # no objects left


def test_the_library_is_keyed_by_every_source_and_header():
    assert {p.name for p in SOURCES + HEADERS} == {
        p.name for p in SOURCES[0].parent.glob("cpu_native*.[ch]")}
