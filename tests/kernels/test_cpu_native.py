"""The native CPU backend (kernels/cpu_native.py, kernels/cpu_native*.c) against the torch
CPU backend and the references, at every vector width the C files build with (16 floats:
AVX-512, 8: AVX2, 4: the generic vectors): skinny linears with their fused prologues at
every row count and column remainder, weights packed in the narrowest exact dtype,
decode attention with rotary and the KV store at every head size's grouping, bad
indices refused; and the bundled model on it: greedy tokens equal to HF transformers'
in float32, each decode step's layers in one C call.

This CPU's -march=native build is the width its instruction set gives; the other widths
are built with -DRP_WIDTH (kernels/cpu_native_simd.h), the same loops and tile shapes
with the helpers' generic versions where the CPU lacks the instructions. So an AVX2 CPU
runs the 16-wide build's loops too, and an AVX-512 one the AVX2 build's intrinsics.
The build itself (flags, width choice, fallbacks): tests/kernels/test_cpu_native_build.py."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kernels import cpu_native, cpu_ops, get_ops
from kernels import reference as ref
from kernels.cpu_native_build import FLAGS, _load

pytestmark = pytest.mark.skipif(not cpu_native.available(),
                                reason="no C compiler: the native CPU kernels cannot build")
WIDTHS = (16, 8, 4)


def width_library(width: int):
    """The kernels built with `width` floats per vector: this CPU's own build where it
    has that width, else one with -DRP_WIDTH (cached like the engine's)."""
    native = cpu_native._LIB
    if native.rp_vector_width() == width:
        return native
    lib = _load(FLAGS + (f"-DRP_WIDTH={width}",))
    assert lib is not None and lib.rp_vector_width() == width
    return lib


@pytest.fixture(params=WIDTHS, ids=[f"width{w}" for w in WIDTHS])
def width(request, monkeypatch) -> int:
    """cpu_native's library for the test: the build of each width in turn."""
    monkeypatch.setattr(cpu_native, "_LIB", width_library(request.param))
    return request.param


def _weight(n: int, k: int, exact_in: torch.dtype | None, seed: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    if exact_in is torch.bfloat16:
        w[0, 0] = 3e5             # past float16's range: only bfloat16 holds it exactly
    return w.to(exact_in).float() if exact_in is not None else w


ROW_COUNTS = [*range(1, 18), 20, 32]      # every tile shape and partial row group
EXACT = [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
         (None, torch.float32)]


@pytest.mark.parametrize("exact_in,packed_as", EXACT)
@pytest.mark.parametrize("n", [16, 19, 40, 100])          # full and partial last vectors
def test_linear_matches_torch_at_every_row_count(exact_in, packed_as, n, width):
    w = _weight(n, 48, exact_in, n)
    bias = torch.randn(n)
    for m in ROW_COUNTS:
        x = torch.randn(m, 48)
        for b in (None, bias):
            torch.testing.assert_close(cpu_native.linear(x, w, b), x @ w.T + (0 if b is None else b),
                                       atol=1e-5, rtol=3e-5)
    assert cpu_native.packed_panels(w).dtype == packed_as
    assert cpu_native.packed_panels(w).shape == (-(-n // 16), 48, 16)


@pytest.mark.parametrize("k", [64, 44])                  # 44: the rows' vector tails
def test_fused_prologues_match_their_compositions(k, width):
    gen = torch.Generator().manual_seed(3)
    w = _weight(72, k, torch.float16, 1)
    norm = torch.rand(k, generator=gen) + 0.5
    for m in (1, 7, 16, 30):
        x, res = torch.randn(m, k, generator=gen), torch.randn(m, k, generator=gen)
        got = cpu_native.rms_norm_linear(x, norm, 1e-5, w)
        torch.testing.assert_close(got, ref.rms_norm(x, norm, 1e-5) @ w.T, atol=1e-5, rtol=1e-5)
        y, new_res = cpu_native.rms_norm_linear(x, norm, 1e-5, w, None, res)
        want_h, want_res = ref.rms_norm(x, norm, 1e-5, res)
        torch.testing.assert_close(new_res, want_res, atol=0, rtol=0)
        torch.testing.assert_close(y, want_h @ w.T, atol=1e-5, rtol=1e-5)
        gate_up = torch.randn(m, 2 * k, generator=gen) * 4     # SiLU's tails too
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


@pytest.mark.parametrize("n_heads,n_kv,d", [(8, 4, 32), (4, 4, 16), (6, 1, 64), (4, 2, 24),
                                             (5, 1, 128)])
def test_decode_attention_matches_the_reference(n_heads, n_kv, d, width):
    """Heads in register-sized groups (8 at D = 32 with 16 floats a vector, 3 with 8),
    D = 128 in slices where one head's values exceed the registers (8 and 4 floats a
    vector), D = 24 one head at a time; contexts with vector tails, and an empty one."""
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
def test_rotary_decode_attention_stores_and_attends_as_the_reference(n_heads, n_kv, d, width):
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


def test_an_index_out_of_range_raises_and_writes_nothing(width):
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


def test_bundled_model_greedy_tokens_equal_hf_float32():
    """The bundled float16 checkpoint on the backend `auto` picks on this CPU (cpu_native
    on its float16-packed weights with AVX2 or AVX-512, else torch_sdpa): HF
    transformers' greedy tokens (float32, eager) for prompts decoded together."""
    from transformers import AutoModelForCausalLM

    from engine.front.llm import LLM
    from engine.request import SamplingParams
    from engine.tokenizer import DEFAULT_MODEL_DIR
    from kernels import default_cpu_backend
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


PROMPTS = ["ROMEO:", "To be, or not to be", "KING HENRY:\nWhat", "O"]


def _greedy_tokens(backend: str) -> list:
    from engine.front.llm import LLM
    from engine.request import SamplingParams
    llm = LLM(device="cpu", attention_backend=backend, num_blocks=64,
              max_num_batched_tokens=16)                   # chunked prefill + decode mixed
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    llm.engine.close()
    return outs


@pytest.fixture(scope="module")
def torch_tokens() -> list:
    return _greedy_tokens("torch")


def test_decode_steps_run_each_layer_in_one_call_with_the_same_tokens(width, torch_tokens,
                                                                       monkeypatch):
    """Greedy tokens of the bundled model under cpu_native equal the torch backend's, and
    every decode-only step took the one-call layer."""
    fused = []
    real = cpu_native.llama_decode_layer

    def spy(*args):
        out = real(*args)
        fused.append(out is not None)
        return out
    monkeypatch.setattr(cpu_native, "llama_decode_layer", spy)
    assert _greedy_tokens("cpu_native") == torch_tokens
    assert len(fused) >= 6 * 20 and all(fused)             # 6 layers x the decode-only steps


def test_out_of_memory_leaves_the_callers_float_mode():
    """A scratch allocation that fails returns -1 (MemoryError in Python) and leaves the
    thread's floating-point mode as it was: the attention flushes subnormals only inside
    a call that runs. In a child process whose address space is capped (no torch there:
    ctypes buffers, the library as built here)."""
    code = """if True:
        import ctypes, importlib.util, resource, sys
        spec = importlib.util.spec_from_file_location("build", sys.argv[1])
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        lib = build._bind(ctypes.CDLL(sys.argv[2]))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), hard))
        q, cache, out = (ctypes.c_float * 16)(), (ctypes.c_float * 16)(), (ctypes.c_float * 16)()
        table = (ctypes.c_int32 * 2)()
        lens = (ctypes.c_int32 * 1)(2 ** 31 - 1)      # its scores would need 96 GB
        status = lib.rp_decode_attention(
            1, 1, 1, 16, ctypes.addressof(q), 16, None, 0, None, 0, None, None, 0, None,
            ctypes.addressof(cache), ctypes.addressof(cache), 1, 2 ** 30,
            ctypes.addressof(table), 2, 2, ctypes.addressof(lens), 1.0, ctypes.addressof(out))
        tiny, one = 5e-324, float("1")
        print(status, tiny * one > 0)
    """
    import kernels.cpu_native_build as build
    done = subprocess.run([sys.executable, "-c", code, build.__file__, cpu_native._LIB._name],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-1", "True"]
