"""One range rule (engine/ranges.py) for the knobs (engine/config.py) and the requests
(engine/validation.py): the same message shape and the same refusal of bools."""
import pytest

from engine.config import MAX_SEED, EngineConfig, SchedulerConfig, check_priority
from engine.errors import InvalidRequestError
from engine.ranges import check_int, check_number
from engine import validation


def test_validation_uses_the_one_rule():
    assert validation.check_int is check_int and validation.check_number is check_number


# block_size=True was taken as the integer 1; the other rows kept their messages
@pytest.mark.parametrize("kwargs,message", [
    (dict(block_size=True), "block_size must be an integer >= 1, got True"),
    (dict(num_blocks=True), "num_blocks must be an integer >= 2, got True"),
    (dict(max_model_len=True), "max_model_len must be an integer >= 1, got True"),
    (dict(tensor_parallel_size=True), "tensor_parallel_size must be an integer in [1, 64]"),
    (dict(seed=True), f"seed must be an integer in [0, {MAX_SEED}], got True"),
    (dict(seed=MAX_SEED + 1), f"seed must be an integer in [0, {MAX_SEED}], got {MAX_SEED + 1}"),
    (dict(gpu_memory_utilization=float("nan")), "gpu_memory_utilization must be a number"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization must be in (0, 1], got 0"),
    (dict(kv_offloading_size=-1), "kv_offloading_size must be in [0, 1048576], got -1"),
    (dict(kv_offloading_size=float("inf")), "kv_offloading_size must be in [0, 1048576]"),
    (dict(client_timeout=1), "client_timeout must be in [2.0, 86400.0], got 1"),
])
def test_engine_config_ranges(kwargs, message):
    with pytest.raises(InvalidRequestError) as exc:
        EngineConfig(**kwargs)
    assert str(exc.value).startswith(message), str(exc.value)


def test_scheduler_config_and_priority_ranges():
    with pytest.raises(InvalidRequestError, match=r"^num_speculative_tokens must be an "
                                                  r"integer in \[0, \d+\], got True$"):
        SchedulerConfig(num_speculative_tokens=True)
    with pytest.raises(InvalidRequestError, match=r"^max_num_seqs must be an integer in "
                                                  r"\[1, 65536\], got '8'$"):
        SchedulerConfig(max_num_seqs="8")
    with pytest.raises(InvalidRequestError, match=r"^priority must be an integer in \[-2147483648, "
                                                  r"2147483647\], got 1099511627776$"):
        check_priority(2 ** 40)
    assert check_priority(-5) == -5
