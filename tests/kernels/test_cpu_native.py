"""The native CPU backend (kernels/cpu_native.py, kernels/cpu_native.c) against the torch
CPU backend and the references: skinny linears with their fused prologues at every row
count and panel remainder, weights packed in the narrowest exact dtype, decode attention
with rotary and the KV store, bad indices refused, the build's fallbacks, the backend
`attention_backend=auto` picks (cpu_native with AVX-512, else torch_sdpa), and the
bundled model's greedy tokens on it equal to HF transformers' in float32.

The library is built with -march=native: on a CPU with AVX-512 it holds the vector
paths, elsewhere the portable loops (what every kernel test here then checks)."""
from __future__ import annotations

import pytest
import torch

import kernels.cpu_native_build as build
from kernels import cpu_native, cpu_ops, default_cpu_backend, get_ops
from kernels import reference as ref
from kernels.cpu_native_build import FLAGS, _load

pytestmark = pytest.mark.skipif(not cpu_native.available(),
                                reason="no C compiler: the native CPU kernels cannot build")
AVX512 = "avx512f" in build._cpu_flags().split()
WIDTH = 16 if AVX512 else 1         # rp_vector_width() of a -march=native build here
needs_avx512 = pytest.mark.skipif(
    not AVX512, reason="this CPU has no AVX-512: the native library is the portable build, "
                       "which test_the_portable_build_computes_the_same covers")


def _weight(n: int, k: int, exact_in: torch.dtype | None, seed: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    if exact_in is torch.bfloat16:
        w[0, 0] = 3e5             # past float16's range: only bfloat16 holds it exactly
    return w.to(exact_in).float() if exact_in is not None else w


ROW_COUNTS = [1, 3, 4, 5, 8, 9, 16, 17, 32]
EXACT = [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
         (None, torch.float32)]


@pytest.mark.parametrize("exact_in,packed_as", EXACT)
@pytest.mark.parametrize("n", [16, 40, 100])
def test_linear_matches_torch_at_every_row_count(exact_in, packed_as, n):
    w = _weight(n, 48, exact_in, n)
    bias = torch.randn(n)
    for m in ROW_COUNTS:
        x = torch.randn(m, 48)
        for b in (None, bias):
            torch.testing.assert_close(cpu_native.linear(x, w, b), x @ w.T + (0 if b is None else b),
                                       atol=1e-5, rtol=3e-5)
    assert cpu_native.packed_panels(w).dtype == packed_as
    assert cpu_native.packed_panels(w).shape == (-(-n // 16), 48, 16)


def test_fused_prologues_match_their_compositions():
    gen = torch.Generator().manual_seed(3)
    w = _weight(72, 64, torch.float16, 1)
    norm = torch.rand(64, generator=gen) + 0.5
    for m in (1, 7, 16, 30):
        x, res = torch.randn(m, 64, generator=gen), torch.randn(m, 64, generator=gen)
        got = cpu_native.rms_norm_linear(x, norm, 1e-5, w)
        torch.testing.assert_close(got, ref.rms_norm(x, norm, 1e-5) @ w.T, atol=1e-5, rtol=1e-5)
        y, new_res = cpu_native.rms_norm_linear(x, norm, 1e-5, w, None, res)
        want_h, want_res = ref.rms_norm(x, norm, 1e-5, res)
        torch.testing.assert_close(new_res, want_res, atol=0, rtol=0)
        torch.testing.assert_close(y, want_h @ w.T, atol=1e-5, rtol=1e-5)
        gate_up = torch.randn(m, 128, generator=gen) * 4       # SiLU's tails too
        torch.testing.assert_close(cpu_native.silu_mul_linear(gate_up, w),
                                   ref.silu_and_mul(gate_up) @ w.T, atol=1e-5, rtol=1e-5)


def test_wide_inputs_and_other_dtypes_use_the_torch_backend():
    w = _weight(32, 16, torch.float16, 2)
    wide = torch.randn(cpu_native.NATIVE_MAX_ROWS + 1, 16)
    torch.testing.assert_close(cpu_native.linear(wide, w), cpu_ops.linear(wide, w))
    assert not hasattr(w, "_native_panels")                 # never packed for it
    half = w.half()
    assert cpu_native.linear(torch.randn(4, 16).half(), half).dtype == torch.float16


def test_a_weight_changed_in_place_is_repacked():
    w = _weight(16, 16, torch.float16, 4)
    x = torch.randn(2, 16)
    cpu_native.linear(x, w)
    with torch.no_grad():
        w.mul_(1.0 / 3.0)                                   # no longer float16-exact
    torch.testing.assert_close(cpu_native.linear(x, w), x @ w.T, atol=1e-6, rtol=1e-6)
    assert cpu_native.packed_panels(w).dtype == torch.float32


def _paged(lens, block_size, n_kv, d, gen, num_blocks=64):
    kc = torch.randn(num_blocks, block_size, n_kv, d, generator=gen)
    vc = torch.randn(num_blocks, block_size, n_kv, d, generator=gen)
    width = max(-(-n // block_size) for n in lens) + 1
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=gen)
    used = 0
    for b, n in enumerate(lens):
        need = -(-n // block_size)
        table[b, :need] = free[used:used + need].int()
        used += need
    return kc, vc, table


@pytest.mark.parametrize("n_heads,n_kv,d", [(8, 4, 32), (4, 4, 16), (6, 1, 64), (4, 2, 24)])
def test_decode_attention_matches_the_reference(n_heads, n_kv, d):
    gen = torch.Generator().manual_seed(d)
    lens = [1, 7, 0, 33, 16]                                # 0: no context -> zeros
    kc, vc, table = _paged(lens, 4, n_kv, d, gen)
    q = torch.randn(len(lens), n_heads, d, generator=gen)
    ctx = torch.tensor(lens, dtype=torch.int32)
    got = cpu_native.paged_decode_attention(q, kc, vc, table, ctx, d ** -0.5)
    want = ref.paged_decode_attention(q, kc, vc, table, ctx, d ** -0.5)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    assert got[2].abs().max() == 0


@pytest.mark.parametrize("n_heads,n_kv,d", [(8, 4, 32), (6, 2, 24)])
def test_rotary_decode_attention_stores_and_attends_as_the_reference(n_heads, n_kv, d):
    gen = torch.Generator().manual_seed(5)
    lens = [3, 9, 17, 1]
    kc, vc, table = _paged(lens, 4, n_kv, d, gen)
    qkv = torch.randn(len(lens), (n_heads + 2 * n_kv) * d, generator=gen)
    q, k, v = qkv.split([n_heads * d, n_kv * d, n_kv * d], dim=-1)
    q, k, v = (t.reshape(len(lens), -1, d) for t in (q, k, v))    # strided views of one row
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.stack([table[b, (n - 1) // 4] * 4 + (n - 1) % 4 for b, n in enumerate(lens)])
    slots[3] = -1                                   # a padding row: nothing stored
    cos_sin = torch.randn(64, d, generator=gen)
    ctx = torch.tensor(lens, dtype=torch.int32)
    caches = [(kc.clone(), vc.clone()) for _ in range(2)]
    args = (positions, q, k, v, cos_sin, True)
    got = cpu_native.rotary_decode_attention(*args, *caches[0], slots, table, ctx, d ** -0.5)
    want = ref.rotary_decode_attention(*args, *caches[1], slots, table, ctx, d ** -0.5)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(caches[0][0], caches[1][0], atol=1e-6, rtol=0)
    assert torch.equal(caches[0][1], caches[1][1])
    assert torch.equal(caches[0][0].view(-1, n_kv, d)[table[3, 0] * 4], kc.view(-1, n_kv, d)[table[3, 0] * 4])


def test_an_index_out_of_range_raises_and_writes_nothing():
    gen = torch.Generator().manual_seed(6)
    kc, vc, table = _paged([5, 5], 4, 2, 16, gen, num_blocks=8)
    q = torch.randn(2, 4, 16, generator=gen)
    k = v = torch.randn(2, 2, 16, generator=gen)
    ctx = torch.tensor([5, 5], dtype=torch.int32)
    before = kc.clone()
    bad_table = table.clone()
    bad_table[1, 1] = 8                                        # past the pool
    with pytest.raises(IndexError):
        cpu_native.paged_decode_attention(q, kc, vc, bad_table, ctx, 0.25)
    cos_sin = torch.randn(16, 16)
    for positions, slots in ((torch.tensor([4, 16]), torch.tensor([4, 5])),
                             (torch.tensor([4, 4]), torch.tensor([4, 32]))):
        with pytest.raises(IndexError):
            cpu_native.rotary_decode_attention(positions, q, k, v, cos_sin, True, kc, vc,
                                               slots, table, ctx, 0.25)
    assert torch.equal(kc, before)


def test_backend_exports_every_op():
    names = [n for n in dir(ref) if not n.startswith("_") and callable(getattr(ref, n))
             and getattr(getattr(ref, n), "__module__", "") == "kernels.reference"]
    assert get_ops("cpu_native") is cpu_native
    assert all(callable(getattr(cpu_native, n, None)) for n in names), names


class _Built:
    def __init__(self, width: int):
        self.rp_vector_width = lambda: width


@pytest.mark.parametrize("lib,backend", [(_Built(16), "cpu_native"), (_Built(1), "torch_sdpa"),
                                         (None, "torch_sdpa")])
def test_the_cpu_default_is_cpu_native_only_with_its_avx512_paths(lib, backend, monkeypatch):
    """The portable loops are slower than oneDNN (docs/KERNELS.md "CPU native"): a CPU
    without AVX-512, or no library at all, runs torch_sdpa."""
    monkeypatch.setattr(build, "load", lambda: lib)
    assert default_cpu_backend() == backend


def test_this_cpu_gets_the_default_its_build_allows():
    assert default_cpu_backend() == ("cpu_native" if AVX512 else "torch_sdpa")


def test_no_compiler_or_a_failed_build_means_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSEPLAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")                   # a compiler that fails
    assert _load() is None
    monkeypatch.delenv("CC")
    lib = _load()                                            # builds into tmp_path
    assert lib is not None and lib.rp_abi_version() == 3 and lib.rp_vector_width() == WIDTH
    assert [p.suffix for p in (tmp_path / "native").iterdir()] == [".so"]


def test_bundled_model_greedy_tokens_equal_hf_float32():
    """The bundled float16 checkpoint on the backend `auto` picks on this CPU (cpu_native
    on its float16-packed weights, or torch_sdpa): HF transformers' greedy tokens
    (float32, eager) for prompts decoded together."""
    from transformers import AutoModelForCausalLM

    from engine.front.llm import LLM
    from engine.request import SamplingParams
    from engine.tokenizer import DEFAULT_MODEL_DIR
    path = str(DEFAULT_MODEL_DIR)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [[0, 5, 9, 100, 7], [0, 44], [0, 3, 3, 3, 17, 250, 1000, 12, 9], [0]]
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                          min_new_tokens=48, do_sample=False, pad_token_id=0, eos_token_id=None)
        expected.append(out[0, len(p):].tolist())
    llm = LLM(device="cpu", num_blocks=64, max_num_batched_tokens=16)
    assert llm.engine.backend == default_cpu_backend()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    llm.engine.close()
    assert [list(o.outputs[0].token_ids) for o in outs] == expected


@needs_avx512
def test_decode_steps_run_each_layer_in_one_call_with_the_same_tokens(monkeypatch):
    _assert_one_call_layers_give_the_torch_tokens(monkeypatch)


def _assert_one_call_layers_give_the_torch_tokens(monkeypatch):
    """Greedy tokens of the bundled model under cpu_native equal the torch backend's, and
    every decode-only step took the one-call layer."""
    from engine.front.llm import LLM
    from engine.request import SamplingParams
    prompts = ["ROMEO:", "To be, or not to be", "KING HENRY:\nWhat", "O"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    fused = []
    real = cpu_native.llama_decode_layer

    def spy(*args):
        out = real(*args)
        fused.append(out is not None)
        return out
    monkeypatch.setattr(cpu_native, "llama_decode_layer", spy)
    outs = {}
    for backend in ("torch", "cpu_native"):
        llm = LLM(device="cpu", attention_backend=backend, num_blocks=64,
                  max_num_batched_tokens=16)               # chunked prefill + decode mixed
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        llm.engine.close()
    assert outs["torch"] == outs["cpu_native"]
    assert len(fused) >= 6 * 20 and all(fused)             # 6 layers x the decode-only steps


def test_the_portable_build_computes_the_same(tmp_path, monkeypatch):
    """The loops a CPU without AVX-512 runs (built here with -mno-avx512f): the same
    results and greedy tokens; and the engine would not pick them by default."""
    monkeypatch.setenv("ROSEPLAY_CACHE_DIR", str(tmp_path))
    portable = _load(FLAGS + ("-mno-avx512f",))
    assert portable is not None and portable.rp_vector_width() == 1
    monkeypatch.setattr(cpu_native, "_LIB", portable)
    gen = torch.Generator().manual_seed(9)
    w, norm = _weight(40, 48, torch.float16, 7), torch.rand(48, generator=gen) + 0.5
    for m in (1, 5, 16, 20):
        x, res = torch.randn(m, 48, generator=gen), torch.randn(m, 48, generator=gen)
        torch.testing.assert_close(cpu_native.linear(x, w), x @ w.T, atol=1e-5, rtol=1e-5)
        y, new_res = cpu_native.rms_norm_linear(x, norm, 1e-5, w, None, res)
        h, want_res = ref.rms_norm(x, norm, 1e-5, res)
        torch.testing.assert_close(y, h @ w.T, atol=1e-5, rtol=1e-5)
        gate_up = torch.randn(m, 96, generator=gen)
        torch.testing.assert_close(cpu_native.silu_mul_linear(gate_up, w),
                                   ref.silu_and_mul(gate_up) @ w.T, atol=1e-5, rtol=1e-5)
    lens = [1, 7, 0, 33]
    kc, vc, table = _paged(lens, 4, 2, 32, gen)
    q, ctx = torch.randn(4, 8, 32, generator=gen), torch.tensor(lens, dtype=torch.int32)
    torch.testing.assert_close(cpu_native.paged_decode_attention(q, kc, vc, table, ctx, 0.2),
                               ref.paged_decode_attention(q, kc, vc, table, ctx, 0.2),
                               atol=2e-6, rtol=2e-5)
    _assert_one_call_layers_give_the_torch_tokens(monkeypatch)
