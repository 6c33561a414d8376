import importlib.util
import os

import pytest
import torch

# Without CUDA, the Triton kernel tests (tests/kernels/) run under the interpreter in this
# very run, spread over the xdist workers like any other test. TRITON_INTERPRET=1 holds for
# the whole process once a @triton.jit runs, so it is set here, before any test module
# imports a kernel; with CUDA it stays unset and those tests re-run themselves in a child.
if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    os.environ["TRITON_INTERPRET"] = "1"

# Modules that take longest go to the workers first (xdist hands whole modules out in
# collection order), so none of them starts last and leaves the other workers idle: the
# slow tier's longest, then the fast tier's by wall seconds (per module, the fast tier on
# 2 workers, 2026-11-28: routing 62 s ... spec_decode 21 s), then the rest of the slow tier's.
SLOW_FIRST = ("roseplay/tui/test_guides_verified.py", "roseplay/tui/test_tui_guides_tmux.py",
              "engine/ipc/test_soak_process.py",
              "roseplay/tui/test_tui_routing.py", "roseplay/serve/test_serve_liveness.py",
              "engine/core/test_property.py", "roseplay/tui/test_tui_layout.py",
              "roseplay/tui/test_tui_marks.py", "roseplay/serve/test_serve_adversarial.py",
              "roseplay/tui/test_compare_snapshot.py", "roseplay/tui/test_tui_lesson_guides.py",
              "engine/ipc/test_engine_process.py", "roseplay/tui/test_tui_tmux.py",
              "engine/core/test_draft_spec.py", "roseplay/tui/test_tui.py",
              "kernels/test_kernels.py", "kernels/test_decode_sass.py",
              "roseplay/tui/test_guides.py", "roseplay/workload/test_record.py",
              "engine/ipc/test_exact_under_cancel.py", "engine/core/test_spec_decode.py",
              "roseplay/serve/test_serve_shutdown.py", "roseplay/serve/test_serve_multiproc.py",
              "engine/worker/distributed/test_tp_model.py")


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto` (pyproject addopts). Without CUDA 3, on 2 cores: many tests
    wait on subprocesses, servers and tmux, and a third worker fills those waits. With
    CUDA none: the GPU tests size their engines to the whole device."""
    return 0 if torch.cuda.is_available() else 3


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (long soak)")


def run_slow(config) -> bool:
    """Whether this run includes the slow tier (--run-slow or ROSEPLAY_SLOW=1)."""
    return config.getoption("--run-slow") or os.environ.get("ROSEPLAY_SLOW") == "1"


def _slow_rank(item) -> int:
    path = item.path.as_posix()
    return next((i for i, tail in enumerate(SLOW_FIRST) if path.endswith(tail)), len(SLOW_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_slow_rank)          # stable: each module's tests stay together, in order
    has_cuda = torch.cuda.is_available()
    slow = run_slow(config)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not slow:
            item.add_marker(skip_slow)


class Checkpoint(str):
    """A tiny HF Llama checkpoint directory (the path, as a str) and the HF model saved
    there (`.hf`, the correctness oracle)."""
    hf = None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """One tiny Llama checkpoint per test module (the one definition; tests that damage
    it copy it first)."""
    from tests.hf_models import make_checkpoint
    path = tmp_path_factory.mktemp("llama")
    out = Checkpoint(path)
    out.hf = make_checkpoint("llama", path)
    return out


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box OpenMP
    spinning makes them 10-30x slower; engine threads inherit this setting."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
