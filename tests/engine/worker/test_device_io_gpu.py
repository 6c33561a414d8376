"""engine/worker/device_io.py on the GPU: copies between pinned host memory and the device made
by kernels through a device view of the pinned buffer give the same values as memcpys."""
import pytest
import torch

from engine.worker.device_io import HostCopyRing, copy_, device_alias

pytestmark = pytest.mark.gpu


def test_device_alias_reads_and_writes_host_memory():
    host = torch.arange(64, dtype=torch.int64).pin_memory()
    alias = device_alias(host, torch.device("cuda"))
    assert alias is not None and alias.is_cuda and alias.data_ptr() == host.data_ptr()
    dev = torch.zeros(64, dtype=torch.int64, device="cuda")
    copy_(dev, host, src_alias=alias)                        # host -> device, a kernel
    torch.cuda.synchronize()
    assert dev.tolist() == list(range(64))
    copy_(host, dev * 3, dst_alias=alias)                    # device -> host, a kernel
    torch.cuda.synchronize()
    assert host.tolist() == [3 * i for i in range(64)]
    assert device_alias(torch.zeros(4), torch.device("cuda")) is None     # not pinned


def test_host_copy_ring_on_the_gpu():
    ring = HostCopyRing(slots=3)
    inflight = ring.start(torch.tensor([0, 0], device="cuda"))
    for step in range(1, 20):
        nxt = ring.start(torch.tensor([step, -step], device="cuda") * 1)
        assert inflight.tolist() == [step - 1, 1 - step]
        inflight = nxt
    assert ring.allocations == 3
    assert inflight.tolist() == [19, -19]     # (an unread copy would keep its slot's buffer)
    for n in (1, 3, 1, 5, 2):                                # each slot's views by size
        assert ring.start(torch.arange(n, device="cuda") + n).tolist() == [n + i for i in range(n)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):         # the event goes on the stream that is current
        torch.cuda._sleep(20_000_000)     # (~10 ms: a copy waited on the wrong stream
        late = torch.full((4,), 9, device="cuda")   # would read before the fill)
        assert ring.start(late).tolist() == [9, 9, 9, 9]
    assert ring.allocations == 3
    big = torch.arange(40000, device="cuda")                 # over the kernel-copy limit
    assert ring.start(big).tolist() == list(range(40000))


@pytest.mark.parametrize("rows,width", [(1, 512), (5, 128), (200, 512)])   # 200x512: table by memcpy
def test_decode_inputs_one_launch_equals_copies(rows, width, monkeypatch):
    """StepBuffers' decode fill in one kernel (kernels/step_inputs.py) leaves the device
    buffers exactly as the separate copies (its fallback, forced here) do, device-fed ids
    included."""
    from types import SimpleNamespace

    import numpy as np

    from engine.worker import step_buffers
    g = np.random.default_rng(rows)
    batch = SimpleNamespace(
        num_decodes=rows, input_ids=g.integers(0, 999, rows),
        positions=g.integers(0, 4000, rows), slot_mapping=g.integers(0, 9999, rows),
        decode_context_lens=g.integers(1, 4000, rows).astype(np.int32),
        decode_block_tables=g.integers(0, 600, (rows, width // 2)).astype(np.int32))
    prev = torch.arange(rows, device="cuda") + 70000
    dev = torch.device("cuda")
    got = []
    for one in (True, False):
        buf = step_buffers.StepBuffers(dev, 256, 256, width, 256)
        if not one:
            monkeypatch.setattr(buf, "_one_launch", lambda copies, token_source: False)
        for source in (None, (prev, None)):
            buf._fill_decode(batch, rows + 3, source)
            torch.cuda.synchronize()
            got.append((buf.tokens.clone(), buf.seq_lens.clone(), buf.block_tables.clone()))
    for a, b in zip(got[:2], got[2:]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert got[1][0][:rows].tolist() == prev.tolist()
    assert got[0][0][:rows].tolist() == batch.input_ids.tolist()


def test_decode_inputs_direct_launch(monkeypatch):
    """After its first (Triton-dispatched) call, copy_decode_inputs launches the compiled
    kernel directly, per variant and pointer alignment, with the same results; a
    profiler's launch hook turns the direct path off."""
    import triton

    from kernels import step_inputs
    from kernels.step_inputs import copy_decode_inputs
    monkeypatch.setattr(step_inputs, "_COMPILED", {})
    dispatched = []
    run = step_inputs._decode_inputs_kernel.run
    monkeypatch.setattr(step_inputs._decode_inputs_kernel, "run",
                        lambda *a, **k: dispatched.append(1) or run(*a, **k))
    rows, width = 4, 40
    dst_tok = torch.zeros(3 * rows + 1, dtype=torch.int64, device="cuda")
    dst_lens = torch.zeros(rows, dtype=torch.int32, device="cuda")
    dst_table = torch.zeros(rows, width, dtype=torch.int32, device="cuda")
    for i in range(6):
        fed = torch.arange(2, device="cuda") + 100 * i if i % 2 else None
        tok = torch.randint(0, 999, (3 * rows,), device="cuda")
        lens = torch.randint(1, 99, (rows,), dtype=torch.int32, device="cuda")
        table = torch.randint(0, 50, (rows, width), dtype=torch.int32, device="cuda")
        off = 1 if i == 4 else 0                             # i = 4: a misaligned pointer
        out = dst_tok[off:off + 3 * rows]
        copy_decode_inputs(tok, lens, table, out, dst_lens, dst_table, fed)
        want = tok.clone()
        if fed is not None:
            want[:2] = fed
        assert torch.equal(out, want) and torch.equal(dst_lens, lens)
        assert torch.equal(dst_table, table)
    assert len(dispatched) == 3            # i = 0, 1 (fed) and 4 (alignment) compiled
    assert len(step_inputs._COMPILED) == 3
    fed32 = torch.tensor([7, 8], dtype=torch.int32, device="cuda")    # another dtype: its
    copy_decode_inputs(tok, lens, table, dst_tok[:3 * rows], dst_lens, dst_table, fed32)
    assert dst_tok[:2].tolist() == [7, 8] and len(dispatched) == 4    # own compile
    hook = lambda metadata: None            # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        copy_decode_inputs(tok, lens, table, dst_tok[:3 * rows], dst_lens, dst_table)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(dispatched) == 5             # the hooked call went through Triton
