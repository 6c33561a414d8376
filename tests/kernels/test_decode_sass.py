"""The decode attention kernel as the H100 runs it, checked on any machine: compiled for
sm_90 with Triton's bundled tools (scripts/kernel_sass.py), an fp8 cache's tiles reach
the tensor cores without byte-wide shared-memory reads (main before 2026-11-27 read the
V tile with 64 LDS.U8 a thread a tile and ran at half its bytes' floor), and the fused
rotary launch stays within the register cap that lets 4 programs share a multiprocessor
(docs/KERNELS.md "FP8 tiles")."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _report(*args: str) -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists() or not (tools / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas/cuobjdump are missing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_sass.py"), "--json",
                           *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fp8_decode_reads_no_bytes_from_shared_memory():
    rep = _report("--kv", "fp8")
    assert rep["ops"].get("LDS.U8", 0) == 0, rep["ops"]
    assert rep["registers"] <= 128 and rep["stack"] == 0, rep


def test_a_crowded_fp8_launch_reads_no_bytes_and_keeps_the_cap():
    """The fused launch of a crowded fp8 step (2 warps, 32-token tiles: what qwen3-0.6b
    runs at batch 256) keeps the 16-bit transpose path and the register cap."""
    import kernels.decode_attention as da
    crowded = da.CROWDED_FP8
    rep = _report("--kv", "fp8", "--rope", "--block-n", str(crowded["block_n"]),
                  "--warps", str(crowded["num_warps"]))
    assert rep["ops"].get("LDS.U8", 0) == 0, rep["ops"]
    assert rep["registers"] <= da.MAX_REGISTERS, rep


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_fused_rotary_decode_within_the_register_cap(kv):
    rep = _report("--kv", kv, "--rope")
    assert rep["registers"] <= 128, rep
