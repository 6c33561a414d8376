"""The decode attention kernel compiled for an H100 (sm_90) on any machine, no GPU needed
(Triton's bundled ptxas and cuobjdump): its registers, spill stack and the count of
each SASS opcode, at qwen3-0.6b's shape (8 KV heads x 2 query heads each x 128, pages
of 16, the engine's strides, a wide launch's register cap). What a kernel change does
to loads, conversions and register pressure shows here before a device run
(docs/KERNELS.md "FP8 tiles").

    python scripts/kernel_sass.py --kv fp8 [--rope] [--rows-shared] [--block-n 64] [--stages 2]
        [--warps 4]
    python scripts/kernel_sass.py --kv fp8 --json     # one JSON line (the tests read it)
    python scripts/kernel_sass.py --kv bf16 --rope --ptx > a.ptx   # its instructions, to
        # diff against another tree's (debug sections, source lines and labels left out)

Run without TRITON_INTERPRET (the interpreter compiles nothing).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels.decode_attention as da  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTRS = dict(q_ptr="bf16", bt_ptr="i32", ctx_ptr="i32", out_ptr="bf16", pm_ptr="fp32",
            pl_ptr="fp32", pacc_ptr="fp32", cnt_ptr="i32", pos_ptr="i64", nk_ptr="bf16",
            nv_ptr="bf16", cs_ptr="bf16", slot_ptr="i64", ks_ptr="fp32", vs_ptr="fp32",
            order_ptr="i32")
INTS = dict(min_split_tokens=64, num_heads=16, num_splits=3, stride_nkb=3072,
            stride_nkh=128, stride_nvb=3072, stride_nvh=128, stride_cs=128, stride_qb=4096,
            stride_qh=128, stride_qd=1, stride_kb=16384, stride_ks=1024, stride_kh=128,
            stride_kd=1, stride_vb=16384, stride_vs=1024, stride_vh=128, stride_vd=1,
            stride_btb=512, stride_btm=1, stride_ob=2048, stride_oh=128, stride_od=1)
# --shape qwen2.5: qwen2.5-0.5b's 14 query heads on 2 KV heads x 64 (INTS' head strides)
QWEN25 = dict(consts=dict(GROUP=7, HEAD_DIM=64, BLOCK_D=64, HALF=32, NUM_KV=2, MERGE_G=8),
              ints=dict(num_heads=14, stride_nkb=1152, stride_nkh=64, stride_nvb=1152,
                        stride_nvh=64, stride_cs=64, stride_qb=896, stride_qh=64,
                        stride_kb=2048, stride_ks=128, stride_kh=64, stride_vb=2048,
                        stride_vs=128, stride_vh=64, stride_ob=896, stride_oh=64))


def compile_decode(fp8: bool, rope: bool, block_n: int, stages: int, warps: int = da.NUM_WARPS,
                   shared: bool = False, shape: str = "qwen3", cap: bool = True):
    """The kernel as a launch at those shapes specializes it (pointers and ints divisible
    by 16 marked so, ints equal to 1 constant); shared: a verify step's launch (rows of one
    sequence, rotary_decode_attention's rows_shared; implies rope). shape: qwen3-0.6b's
    heads or qwen2.5-0.5b's; cap: the register cap of a launch that fills the SMs."""
    fn = da._decode_split_kernel
    kv = "*fp8e4nv" if fp8 else "*bf16"
    consts = dict(GROUP=2, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=block_n, PAGE=16,
                  SINGLE=False, PREC="tf32", MERGE_G=2, MERGE_S=32, MERGE_ALL=16, PDL=True,
                  ROPE=rope or shared, HALF=64, FP8=fp8, ORDERED=True, NUM_KV=8,
                  SHARED=shared)
    ints = dict(INTS)
    if shape == "qwen2.5":
        consts.update(QWEN25["consts"])
        ints.update(QWEN25["ints"])
    sig, attrs, cx = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name], cx[(i,)] = "constexpr", consts[name]
        elif name in ("k_ptr", "v_ptr") or name in PTRS:
            sig[name] = kv if name in ("k_ptr", "v_ptr") else "*" + PTRS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale_log2":
            sig[name] = "fp32"
        elif ints[name] == 1 and name not in fn.do_not_specialize:
            sig[name], cx[(i,)] = "constexpr", 1
        else:
            sig[name] = "i32"
            if ints[name] % 16 == 0 and name not in fn.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = dict(num_warps=warps, num_stages=stages)
    if cap and getattr(da, "MAX_REGISTERS", None):
        options["maxnreg"] = da.MAX_REGISTERS
    return triton.compile(ASTSource(fn, sig, constexprs=cx, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def sass_report(kernel) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", path], check=True,
                              capture_output=True, text=True).stdout
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", path],
                             check=True, capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(1) for m in re.finditer(
        r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    return dict(registers=regs, stack=stack, ops=dict(ops))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv", choices=("bf16", "fp8"), default="fp8")
    p.add_argument("--rope", action="store_true", help="the fused rotary launch")
    p.add_argument("--rows-shared", action="store_true",
                   help="a verify step's fused launch (rows of one sequence; implies --rope)")
    p.add_argument("--shape", choices=("qwen3", "qwen2.5"), default="qwen3",
                   help="qwen3-0.6b's heads (16 on 8 KV x 128) or qwen2.5-0.5b's (14 on 2 x 64)")
    p.add_argument("--no-cap", action="store_true",
                   help="without the register cap (a launch that does not fill the SMs)")
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--stages", type=int, default=da.NUM_STAGES)
    p.add_argument("--warps", type=int, default=da.NUM_WARPS,
                   help=f"warps a program (a crowded fp8 launch: "
                        f"{da.CROWDED_FP8['num_warps']}, block-n {da.CROWDED_FP8['block_n']})")
    p.add_argument("--json", action="store_true")
    p.add_argument("--ptx", action="store_true",
                   help="print the PTX instructions instead (no debug sections, source "
                        "lines or labels)")
    a = p.parse_args()
    kernel = compile_decode(a.kv == "fp8", a.rope, a.block_n, a.stages, a.warps,
                            a.rows_shared, a.shape, not a.no_cap)
    if a.ptx:
        code = re.sub(r"\$L__tmp\d+", "$T", kernel.asm["ptx"].split(".section")[0])
        print("\n".join(line for line in code.splitlines() if line.strip() != "$T:"
                        and not line.lstrip().startswith((".loc", ".file"))))
        return 0
    rep = sass_report(kernel)
    if a.json:
        print(json.dumps(rep))
        return 0
    print(f"registers {rep['registers']}  stack {rep['stack']} bytes  "
          f"instructions {sum(rep['ops'].values())}")
    for op, n in sorted(rep["ops"].items(), key=lambda kv: -kv[1])[:30]:
        print(f"{n:6d} {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
