"""The draft model's decode chains (engine/worker/draft_graphs.py, docs/SPECULATIVE.md
"Draft model"): n positions back to back, each argmax fed to the next on the device,
give the same drafts as one decode per position with the argmax fed from the host; on
CUDA (float32) the captured graphs give the eager runner's drafts on the same inputs.
The CPU case runs the same comparison through the static buffers unpadded, without
capture, padded as on CUDA (rows to a bucket, forwards to a captured length), and a
chain larger than the buffers (eager fallback)."""
import numpy as np
import pytest
import torch

from engine.config import DEFAULT_DRAFT_MODEL
from engine.worker.draft_graphs import DraftGraphs
from engine.worker.draft_batch import DraftChain, DraftExtend
from engine.worker.draft_runner import DraftRunner, load_draft
from tests.engine.core.test_draft_spec import BUNDLED, write_random_llama

BLOCK, LENS, COUNTS = 16, (20, 33, 7), (4, 2, 3)   # prompt lengths, chain length per row


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    return DEFAULT_DRAFT_MODEL if BUNDLED else \
        write_random_llama(tmp_path_factory.mktemp("draft"), 4096)


def _runner(path, device: str, use_graphs: bool, max_rows: int = 4) -> DraftRunner:
    from kernels import default_cpu_backend, get_ops
    dev = torch.device(device)
    loaded = load_draft(path, 4096, dev, torch.float32, seed=0)
    ops = get_ops("triton" if device == "cuda" else default_cpu_backend())
    return DraftRunner(loaded, ops, dev, torch.float32, num_blocks=16, block_size=BLOCK,
                       max_rows=max_rows, max_chain=4, use_graphs=use_graphs)


def _prompts() -> list[np.ndarray]:
    g = np.random.default_rng(7)
    return [g.integers(0, 4096, n) for n in LENS]


def _tables() -> np.ndarray:
    return np.arange(3 * len(LENS), dtype=np.int32).reshape(len(LENS), 3)   # 48 slots each


def _slot(row: int, pos: int) -> int:
    return int(_tables()[row, pos // BLOCK]) * BLOCK + pos % BLOCK


def _extend(runner: DraftRunner) -> None:
    """Every prompt but its last token into the draft's KV."""
    prompts = _prompts()
    ids = np.concatenate([p[:-1] for p in prompts])
    pos = np.concatenate([np.arange(len(p) - 1) for p in prompts])
    slots = np.concatenate([[_slot(r, i) for i in range(len(p) - 1)]
                            for r, p in enumerate(prompts)])
    cu = np.concatenate(([0], np.cumsum([len(p) - 1 for p in prompts]))).astype(np.int32)
    runner.extend(DraftExtend(ids, pos, slots.astype(np.int64), cu,
                              np.asarray([len(p) - 1 for p in prompts], np.int32), _tables()))


def _chain(first: list[int], counts, offset: int = 0) -> DraftChain:
    """Row r: counts[r] - offset forwards from its last prompt token + offset, given
    first[r], then fed its own argmaxes."""
    n, rows = max(counts) - offset, len(counts)
    ids, feed = np.zeros((n, rows), np.int64), np.ones((n, rows), bool)
    pos, slots = np.zeros((n, rows), np.int64), np.full((n, rows), -1, np.int64)
    for r, count in enumerate(counts):
        ids[0, r], feed[0, r] = first[r], False
        for f in range(count - offset):
            pos[f, r] = LENS[r] - 1 + offset + f
            slots[f, r] = _slot(r, int(pos[f, r]))
        feed[max(count - offset, 0):, r] = False
    lens = np.where(slots >= 0, pos + 1, 1).astype(np.int32)
    return DraftChain(ids, feed, pos, slots, lens, _tables())


def _chained(runner: DraftRunner) -> list[list[int]]:
    out = runner.decode_chain(_chain([int(p[-1]) for p in _prompts()], COUNTS))
    return [out[r, :c].tolist() for r, c in enumerate(COUNTS)]


def _stepwise(runner: DraftRunner) -> list[list[int]]:
    """One decode per position, each argmax back on the host and given to the next."""
    got, prev = [[] for _ in COUNTS], [int(p[-1]) for p in _prompts()]
    for f in range(max(COUNTS)):
        live = [c if c > f else 0 for c in COUNTS]
        out = runner.decode_chain(_chain(prev, [f + 1 if c else 0 for c in live], f))
        for r, c in enumerate(live):
            if c:
                got[r].append(int(out[r, 0]))
                prev[r] = int(out[r, 0])
    return got


def test_draft_chain_matches_stepwise_decodes_cpu(draft_path):
    runner = _runner(draft_path, "cpu", use_graphs=False)
    _extend(runner)
    chained = _chained(runner)
    assert [len(d) for d in chained] == list(COUNTS)
    assert runner.chains.replays == 1 and runner.chains.eager_chains == 0
    assert _stepwise(runner) == chained
    small = _runner(draft_path, "cpu", use_graphs=False, max_rows=2)   # 3 rows: eager
    _extend(small)
    assert _chained(small) == chained and small.chains.eager_chains == 1
    padded = _runner(draft_path, "cpu", use_graphs=False)   # as on CUDA: rows to 4,
    padded.chains = DraftGraphs(padded, 4, 4, use_graphs=False, pad=True)  # lengths to 2-4
    _extend(padded)
    assert _chained(padded) == chained and _stepwise(padded) == chained
    assert padded.chains.replays == 1 + max(COUNTS) and padded.chains.eager_chains == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_draft_chain_graphs_match_eager_cuda(draft_path):
    """Float32 (no bf16 near-tie flips): the captured chain (3 rows padded to 4) gives
    the eager padded chain's drafts, which are the stepwise decodes' drafts."""
    graphs = _runner(draft_path, "cuda", use_graphs=True)
    assert set(graphs.chains.graphs) == {(b, n) for b in (1, 2, 4) for n in (2, 3, 4)}
    eager = _runner(draft_path, "cuda", use_graphs=False)
    assert not eager.chains.graphs
    _extend(graphs)
    _extend(eager)
    got = _chained(graphs)
    assert graphs.chains.replays == 1 and graphs.chains.eager_chains == 0
    assert got == _chained(eager)
    assert got == _stepwise(eager)
