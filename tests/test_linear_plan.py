"""kernels/linear.py's launch plan for the decode projections (shapes only, no kernel)."""
import pytest

pytest.importorskip("triton")

from kernels import linear as lin  # noqa: E402

H100_SMS = 132


def plan(n, k, pro=0, m=1, **overrides):
    p = lin.launch_plan(m, n, k, H100_SMS, 2, pro, overrides)
    return p["block_k"], p["split"], p["num_warps"]


def test_one_row_reads_each_k_range_in_one_step():
    """Qwen2.5-0.5B at one row: the fused qkv and gate_up read all 896 columns in one
    1024-wide step (16 warps, no split), down_proj one 512-wide step per split, o_proj
    keeps its four 256-column splits; lm_head's 9496 tiles keep 256-column steps."""
    assert plan(1152, 896, pro=1) == (1024, 1, 16)
    assert plan(9728, 896, pro=1) == (1024, 1, 16)
    assert plan(896, 4864, pro=2) == (512, 10, 8)
    assert plan(896, 896) == (256, 4, 4)
    assert plan(151936, 896) == (256, 1, 4)


def test_whole_k_off_and_overrides(monkeypatch):
    monkeypatch.setattr(lin, "WHOLE_K_MAX", 0)
    assert plan(9728, 896, pro=1) == (256, 1, 4)
    assert plan(896, 4864, pro=2)[0] == 256
    monkeypatch.setattr(lin, "WHOLE_K_MAX", 1024)
    assert plan(9728, 896, pro=1, block_k=128) == (128, 1, 4)     # the caller's tile wins
    assert plan(9728, 896, pro=1, m=16)[0] == 128                  # tensor-core path: as before
