"""Builds the native CPU kernels (kernels/cpu_native*.c) into a shared library once per
machine and loads it.

Why a C file and ctypes, not a torch C++ extension: a torch extension compiles against
torch's headers for a minute on this 2-core target, which the first launch would wait
for; these files compile with the system's `cc` in a few seconds, need no Python or
torch headers, and are called with raw pointers. They are compiled with `-march=native`,
which sets the vector width of every loop (kernels/cpu_native_simd.h: 16 floats with
AVX-512, 8 with AVX2 + FMA + F16C, else 4), so the cached library is keyed by the
sources, the compiler and this CPU's flags: a home directory shared between different
machines never loads a library built for another CPU. No compiler, or a failed build:
`load()` returns None and the engine keeps the torch CPU backend (torch_sdpa).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = tuple(_HERE / f"cpu_native{part}.c" for part in ("", "_gemm", "_attention", "_rows"))
HEADERS = (_HERE / "cpu_native.h", _HERE / "cpu_native_simd.h")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fvisibility=hidden")
ABI_VERSION = 4                 # rp_abi_version() of the source this module binds
_lock = threading.Lock()
_loaded: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built libraries live: $ROSEPLAY_CACHE_DIR, else $XDG_CACHE_HOME/roseplay."""
    root = os.environ.get("ROSEPLAY_CACHE_DIR")
    if root:
        return Path(root) / "native"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "roseplay" / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def library_path(compiler: str, flags: tuple[str, ...] = FLAGS) -> Path:
    key = hashlib.sha256()
    for path in SOURCES + HEADERS:
        key.update(path.read_bytes())
    for part in (compiler, " ".join(flags), platform.machine(), _cpu_flags()):
        key.update(part.encode())
    return cache_dir() / f"cpu_native-{key.hexdigest()[:16]}.so"


def _build(compiler: str, target: Path, flags: tuple[str, ...] = FLAGS) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)      # atomic: concurrent builders each install a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    lib.rp_abi_version.restype = i32
    lib.rp_vector_width.restype = i32
    lib.rp_linear.restype = i32
    lib.rp_linear.argtypes = [ptr, i64, i64, i64, ptr, i32, i64, ptr, ptr, i64, i32, ptr,
                              f32, ptr, i64, ptr, i64]
    lib.rp_decode_attention.restype = i32
    lib.rp_decode_attention.argtypes = [i64, i64, i64, i64, ptr, i64, ptr, i64, ptr, i64,
                                        ptr, ptr, i64, ptr, ptr, ptr, i64, i64, ptr, i64,
                                        i64, ptr, f32, ptr]
    lib.rp_llama_decode_layer.restype = i32
    lib.rp_llama_decode_layer.argtypes = (
        [i64, i64, ptr, ptr, ptr, ptr, f32, ptr, ptr] + [ptr, i32, ptr] * 3 + [i64, ptr, i32, ptr]
        + [i64, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, ptr, i64, i64, ptr, f32])
    return lib


def load() -> ctypes.CDLL | None:
    """The library, built on first use (about a second), or None where it cannot be
    (no C compiler, a failed build: logged once). Not wanted: --attention-backend
    torch_sdpa never builds it."""
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        _loaded["lib"] = lib = _load()
        return lib


def build_in_background() -> None:
    """Starts load() on a thread (a first launch's compile overlaps the model's load on
    the other core); the next load() waits for it."""
    if "lib" not in _loaded:
        threading.Thread(target=load, name="cpu-native-build", daemon=True).start()


def _load(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The library built with `flags` (tests build the other widths' variants with
    -mno-avx2 or -DRP_WIDTH=16), or None."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: the CPU engine uses torch ops (torch_sdpa)")
        return None
    try:
        target = library_path(compiler, flags)
        if not target.exists():
            _build(compiler, target, flags)
        lib = _bind(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning("cannot build the native CPU kernels (%s): using torch ops", detail)
        return None
    if lib.rp_abi_version() != ABI_VERSION:
        log.warning("native CPU kernels: ABI %s, expected %s: using torch ops",
                    lib.rp_abi_version(), ABI_VERSION)
        return None
    return lib
