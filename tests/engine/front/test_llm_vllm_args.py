"""LLM(...) keywords as a vLLM user writes them: vLLM's other names of a knob are taken
(num_gpu_blocks_override, dtype half / float), and a value that would be dropped without
a word (a kv_offloading_size smaller than one KV block) is refused by name."""
import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig, InvalidRequestError, make_config
from roseplay.cli import build_parser
from roseplay.cli_flags import engine_kwargs


def test_num_gpu_blocks_override_is_vllms_name_of_num_blocks():
    """It was refused as an unknown engine argument (only num_gpu_blocks was taken)."""
    assert make_config(num_gpu_blocks_override=48).num_blocks == 48
    assert make_config(num_gpu_blocks=40).num_blocks == 40
    with pytest.raises(InvalidRequestError, match="num_gpu_blocks_override and num_blocks "
                                                  "are one argument"):
        make_config(num_gpu_blocks_override=48, num_blocks=64)


@pytest.mark.parametrize("alias,dtype", [("half", "float16"), ("float", "float32")])
def test_vllms_dtype_names(alias, dtype):
    """dtype="half" (vLLM's ModelDType) was refused: only float16 was a choice."""
    assert EngineConfig(dtype=alias).dtype == dtype
    args = build_parser().parse_args(["--dtype", alias])
    assert make_config(**engine_kwargs(args)).dtype == dtype


def test_half_runs():
    with LLM(model="dummy:tiny", device="cpu", num_gpu_blocks_override=48,
             dtype="half") as llm:
        assert llm.engine.executor.dtype_name == "float16"
        assert llm.engine.pool.num_blocks == 48
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
        assert len(out[0].outputs[0].token_ids) == 2


def test_a_host_tier_smaller_than_one_block_is_refused():
    """kv_offloading_size=1e-9 (one byte) started with no host tier and said nothing."""
    with pytest.raises(InvalidRequestError, match=r"^kv_offloading_size 1e-09 GiB holds no "
                                                  r"KV block \(one is \d+ bytes"):
        LLM(model="dummy:tiny", device="cpu", num_blocks=48, kv_offloading_size=1e-9)
    with LLM(model="dummy:tiny", device="cpu", num_blocks=48,
             kv_offloading_size=0.001) as llm:
        assert llm.engine.host is not None and llm.engine.host.num_blocks > 0


def test_a_list_of_ints_is_one_token_prompt():
    """generate([1, 2, 3]) is one prompt of three tokens in vLLM (prompt_to_seq); it was
    taken as three prompts and refused ('prompt must be a string or token ids, got int')."""
    with LLM(model="dummy:tiny", device="cpu", num_blocks=48) as llm:
        sp = SamplingParams(max_tokens=3, temperature=0)
        one = llm.generate([1, 2, 3], sp)
        assert len(one) == 1 and one[0].prompt_token_ids == (1, 2, 3)
        assert one[0].outputs[0].token_ids == llm.generate([[1, 2, 3]], sp)[0].outputs[0].token_ids
        assert [o.prompt_token_ids for o in llm.generate([[4], [5, 6]], sp)] == [(4,), (5, 6)]
        assert llm.generate([], sp) == []
        with pytest.raises(InvalidRequestError, match="prompt_token_ids must be integers"):
            llm.generate([1, True], sp)


def test_use_tqdm_may_be_the_function_that_makes_the_bar():
    """vLLM's use_tqdm=functools.partial(tqdm, leave=False) was refused ('must be a
    boolean'); it makes the bar over the batch's requests."""
    made = []

    class Bar:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.n = 0

        def update(self, k):
            self.n += k

        def close(self):
            made.append(self.n)

    with LLM(model="dummy:tiny", device="cpu", num_blocks=48) as llm:
        llm.generate([[1], [2]], SamplingParams(max_tokens=2), use_tqdm=Bar)
        assert made[0]["total"] == 2 and made[-1] == 2
        with pytest.raises(InvalidRequestError, match="use_tqdm must be a boolean"):
            llm.generate([[1]], use_tqdm="yes")
