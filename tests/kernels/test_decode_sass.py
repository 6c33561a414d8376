"""The decode attention kernel as the H100 runs it, checked on any machine: compiled for
sm_90 with Triton's bundled tools (scripts/kernel_sass.py), an fp8 cache's tiles reach
the tensor cores without byte-wide shared-memory reads (main before 2026-11-27 read the
V tile with 64 LDS.U8 a thread a tile and ran at half its bytes' floor), and the fused
rotary launch stays within the register cap that lets 4 programs share a multiprocessor
(docs/KERNELS.md "FP8 tiles"). The verify rows' launch (rows_shared) compiles too: the
interpreter runs only the branches a call takes, so a name missing from an untaken
constexpr branch (the plain decode's, once) shows only here or on the device."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# one child compiles every launch asked for (torch and Triton imported once): the
# script's own flags and --json output, one line each
MANY = """
import json, sys
import kernel_sass
for argv in json.loads(sys.argv[1]):
    sys.argv = ["kernel_sass.py", "--json", *argv]
    kernel_sass.main()
"""


def _reports(*argvs: list[str]) -> list[dict]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists() or not (tools / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas/cuobjdump are missing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "scripts"), str(REPO),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", MANY, json.dumps(argvs)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(argvs):]]


def _report(*args: str) -> dict:
    return _reports(list(args))[0]


@pytest.fixture(scope="module")
def fast_reports() -> dict:
    """The fast tests' launches, compiled in one child: fp8, a crowded fp8 step's, and a
    verify step's (bf16 and fp8)."""
    import kernels.decode_attention as da
    crowded = da.CROWDED_FP8
    fp8, crowd, shared, shared_fp8 = _reports(
        ["--kv", "fp8"], ["--kv", "fp8", "--rope", "--block-n", str(crowded["block_n"]),
                          "--warps", str(crowded["num_warps"])],
        ["--kv", "bf16", "--rows-shared"], ["--kv", "fp8", "--rows-shared"])
    return {"fp8": fp8, "crowded": crowd, "shared": shared, "shared_fp8": shared_fp8}


def test_fp8_decode_reads_no_bytes_from_shared_memory(fast_reports):
    rep = fast_reports["fp8"]
    assert rep["ops"].get("LDS.U8", 0) == 0, rep["ops"]
    assert rep["registers"] <= 128 and rep["stack"] == 0, rep


def test_a_crowded_fp8_launch_reads_no_bytes_and_keeps_the_cap(fast_reports):
    """The fused launch of a crowded fp8 step (2 warps, 32-token tiles: what qwen3-0.6b
    runs at batch 256) keeps the 16-bit transpose path and the register cap."""
    import kernels.decode_attention as da
    rep = fast_reports["crowded"]
    assert rep["ops"].get("LDS.U8", 0) == 0, rep["ops"]
    assert rep["registers"] <= da.MAX_REGISTERS, rep


def test_the_verify_rows_launch_compiles_without_byte_reads(fast_reports):
    """rows_shared's launch (rows_before, launch_rows_kv, attend_launch_tile) compiles
    for sm_90 within the register cap, and its fp8 tiles, the substituted rows included,
    reach the tensor cores without byte-wide shared-memory reads."""
    import kernels.decode_attention as da
    for name in ("shared", "shared_fp8"):
        rep = fast_reports[name]
        assert rep["ops"].get("HMMA.16816.F32.BF16", 0) + rep["ops"].get(
            "HMMA.16816.F32", 0) > 0 and rep["registers"] <= da.MAX_REGISTERS, rep
    assert fast_reports["shared_fp8"]["ops"].get("LDS.U8", 0) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_fused_rotary_decode_within_the_register_cap(kv):
    rep = _report("--kv", kv, "--rope")
    assert rep["registers"] <= 128, rep
