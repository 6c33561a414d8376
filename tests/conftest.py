import os

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (long soak)")


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    run_slow = config.getoption("--run-slow") or os.environ.get("ROSEPLAY_SLOW") == "1"
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not run_slow:
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
