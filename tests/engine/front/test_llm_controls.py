"""LLM's controls (vLLM's offline API): reset_prefix_cache forgets the cached prefixes,
so the same prompt run again is computed again (no cache hit), and the tokens stay."""
from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."


def test_reset_prefix_cache_makes_the_next_run_cold():
    with LLM(model="default", device="cpu", num_blocks=64, block_size=4) as llm:
        first = llm.generate([PROMPT], GREEDY)[0]
        warm = llm.generate([PROMPT], GREEDY)[0]
        assert warm.metrics.num_cached_tokens > 0          # the prefix was cached
        assert llm.engine.pool.num_cached > 0
        llm.reset_prefix_cache()
        assert llm.engine.pool.num_cached == 0
        cold = llm.generate([PROMPT], GREEDY)[0]
        assert cold.metrics.num_cached_tokens == cold.num_cached_tokens == 0
        # vLLM's names for the same (its scripts read them)
        assert warm.num_cached_tokens == warm.metrics.num_cached_tokens > 0
        assert warm.outputs[0].finished() and warm.finished
        assert first.outputs[0].token_ids == warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_text_prompt_dict_is_the_text():
    """vLLM's TextPrompt, {"prompt": text}, is tokenized as the text itself (it was
    refused for lacking 'prompt_token_ids')."""
    with LLM(model="default", device="cpu") as llm:
        plain, as_dict = llm.generate([PROMPT, {"prompt": PROMPT}], GREEDY)
        assert as_dict.prompt == PROMPT and as_dict.prompt_token_ids == plain.prompt_token_ids
        assert as_dict.outputs[0].token_ids == plain.outputs[0].token_ids


def test_n_samples_per_prompt_gathered_in_one_output(capsys):
    """vLLM's SamplingParams.n: one RequestOutput per prompt with n completions, index i
    the i-th; a seeded prompt's sample i is the seed + i request (reproducible); only
    the request whose n is 1 reaches a stream (EngineClient.submit refuses n > 1)."""
    from engine import InvalidRequestError
    import pytest
    with LLM(model="default", device="cpu") as llm:
        sp = SamplingParams(n=3, max_tokens=6, seed=5, ignore_eos=True, prompt_logprobs=1)
        outs = llm.generate([PROMPT, "ROMEO:"], sp, use_tqdm=True)
        assert "Processed prompts" in capsys.readouterr().err
        assert len(outs) == 2
        for out in outs:
            assert [c.index for c in out.outputs] == [0, 1, 2]
            assert out.prompt_logprobs is not None and out.error is None
        for i, c in enumerate(outs[0].outputs):
            alone = llm.generate(PROMPT, sp.replace(n=1, seed=5 + i, prompt_logprobs=None))[0]
            assert c.token_ids == alone.outputs[0].token_ids
        greedy = llm.generate(PROMPT, GREEDY.replace(n=2))[0].outputs
        assert greedy[0].token_ids == greedy[1].token_ids
        with pytest.raises(InvalidRequestError, match=r"n=2: a request runs one sequence"):
            llm.inputs.process(PROMPT, SamplingParams(n=2))
        with pytest.raises(InvalidRequestError, match=r"use_tqdm must be a boolean"):
            llm.generate(PROMPT, GREEDY, use_tqdm="yes")
        assert llm.get_tokenizer() is llm.tokenizer is not None
    with pytest.raises(InvalidRequestError, match=r"n must be an integer in \[1, 1024\]"):
        SamplingParams(n=0)


def test_chat_renders_the_template_and_generates():
    """vLLM's LLM.chat: the bundled model's play template (the server's), one output per
    conversation, equal to generate() on the rendered prompt; bad messages refused."""
    from engine import InvalidRequestError
    import pytest
    sp = SamplingParams(max_tokens=8, temperature=0.0, stop="\n\n")
    user = [{"role": "user", "content": "Speak."}]
    with LLM(model="default", device="cpu") as llm:
        one, = llm.chat(user, sp)
        assert one.prompt == "ROMEO.\nSpeak.\n\nJULIET.\n"
        again, = llm.generate({"prompt_token_ids": list(one.prompt_token_ids)}, sp)
        assert one.outputs[0].token_ids == again.outputs[0].token_ids
        both = llm.chat([user, [{"role": "system", "content": "A room."}, *user]], sp)
        assert len(both) == 2 and both[1].prompt.startswith("A room.\n\nROMEO.")
        for bad in ("hi", [], [[]], [1], [{"content": "no role"}], user[0]):
            with pytest.raises(InvalidRequestError, match="messages must be a list"):
                llm.chat(bad, sp)


def test_chat_reads_content_parts_and_refuses_what_it_cannot_render():
    """OpenAI's content parts are joined into the text one per line, as the server's chat
    completions and vLLM join them (the template wrote the list's Python repr into the
    prompt; then the parts ran together, 'Speak' + 'Go.' read 'SpeakGo.'); an unknown role, a
    non-text part or content, and tools that are not a list are refused (an unknown
    role rendered as the assistant, tools='x' was ignored)."""
    from engine import InvalidRequestError
    import pytest
    sp = SamplingParams(max_tokens=2, temperature=0.0)
    parts = [{"type": "text", "text": "Speak"}, {"type": "text", "text": "Go."}]
    with LLM(model="default", device="cpu") as llm:
        joined, = llm.chat([{"role": "user", "content": parts}], sp)
        plain, = llm.chat([{"role": "user", "content": "Speak\nGo."}], sp)
        assert joined.prompt == plain.prompt == "ROMEO.\nSpeak\nGo.\n\nJULIET.\n"
        assert joined.outputs[0].token_ids == plain.outputs[0].token_ids
        for message, match in (
                ({"role": "wizard", "content": "hi"}, "message role must be one of system, "),
                ({"role": "user", "content": 5}, "message content must be a string, a list"),
                ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                 "content parts must be .*got 'image_url'"),
                ({"role": "user", "content": [{"type": "text"}]}, "a text part without text")):
            with pytest.raises(InvalidRequestError, match=match):
                llm.chat([message], sp)
        with pytest.raises(InvalidRequestError, match="tools must be a list of tool dicts"):
            llm.chat([{"role": "user", "content": "hi"}], sp, tools="x")


def test_an_interrupted_generate_leaves_nothing_running():
    """An exception out of generate() (Ctrl-C, or on_step raising) ends that call's
    requests: the next call ran them all to their end first (200 steps for 2 tokens)."""
    import pytest

    class Stop(Exception):
        pass

    def stop(engine):
        raise Stop

    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    with LLM(model="default", device="cpu") as llm:
        with pytest.raises(Stop):
            llm.generate([PROMPT] * 4, long, on_step=stop)
        assert not llm.engine.has_unfinished() and not llm.outputs.states
        steps = []
        out, = llm.generate(PROMPT, GREEDY, on_step=steps.append)
        assert len(out.outputs[0].token_ids) == 4 and len(steps) <= 8
        add, added = llm.engine.add, []

        def add_twice(creq):             # the engine refuses the second request
            if added:
                raise Stop
            added.append(creq)
            return add(creq)

        llm.engine.add = add_twice
        with pytest.raises(Stop):
            llm.generate([PROMPT] * 3, long)
        llm.engine.add = add
        assert not llm.engine.has_unfinished() and not llm.outputs.states


def test_config_with_keywords_is_refused():
    """LLM(config=..., max_num_seqs=3) ignored the keywords (an unknown one too)."""
    import pytest
    from engine import InvalidRequestError
    from engine.config import make_config
    config = make_config(model="dummy:tiny", device="cpu")
    for kwargs in (dict(max_num_seqs=3), dict(bogus=1), dict(model="default")):
        with pytest.raises(InvalidRequestError, match="pass config or engine keywords"):
            LLM(config=config, **kwargs)
    with LLM(config=config) as llm:
        assert llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0].token_ids


def test_stop_reason_names_the_stop_string_or_token():
    """vLLM's CompletionOutput.stop_reason: the stop string that matched (the earliest in
    the text, whatever its place in the list), the stop_token_ids id that ended it, and
    None for a length cap."""
    sp = SamplingParams(max_tokens=40, temperature=0.0)
    with LLM(model="default", device="cpu") as llm:
        free = llm.generate([PROMPT], sp)[0].outputs[0]
        assert free.finish_reason == "length" and free.stop_reason is None
        first, later = free.text.split()[3], free.text.split()[6]
        out = llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0.0,
                                                    stop=[later, "zzz", first]))[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == first
        assert free.text.startswith(out.text) and first not in out.text
        token = free.token_ids[5]
        out = llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0.0,
                                                    stop_token_ids=[token]))[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == token
        assert out.token_ids == free.token_ids[:free.token_ids.index(token) + 1]


def test_max_tokens_none_runs_to_the_end_of_the_context():
    """vLLM's max_tokens=None: the output may take the rest of the context (it was
    refused); the front resolves it for each prompt, so the engine gets an integer."""
    with LLM(model="dummy:tiny", device="cpu", max_model_len=32) as llm:
        long, short = llm.generate([list(range(1, 21)), [1, 2, 3]], SamplingParams(
            max_tokens=None, ignore_eos=True, temperature=0.0))
    assert [len(o.outputs[0].token_ids) for o in (long, short)] == [12, 29]
    assert long.outputs[0].finish_reason == short.outputs[0].finish_reason == "length"


def test_max_tokens_none_runs_to_the_end_of_a_pool_smaller_than_the_context():
    """A KV pool that holds less than max_model_len (16 blocks of 4: 64 tokens of 2,048)
    is the context's end for max_tokens=None: the request runs until the pool is full
    (it was refused: 'prompt + max_tokens = 2048 tokens can never fit the KV pool')."""
    import pytest
    from engine import InvalidRequestError
    with LLM(model="dummy:tiny", device="cpu", num_blocks=16, block_size=4) as llm:
        out, = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=None, ignore_eos=True,
                                                        temperature=0.0))
        assert len(out.outputs[0].token_ids) == 61 and out.outputs[0].finish_reason == "length"
        with pytest.raises(InvalidRequestError, match="can never fit the KV pool"):
            llm.generate([list(range(1, 65))], SamplingParams(max_tokens=None))


def test_chat_takes_chat_template_kwargs():
    """vLLM's LLM.chat(chat_template_kwargs=...): extra variables the template reads
    (the keyword was a TypeError); a reserved one is refused as the server refuses it."""
    from engine import InvalidRequestError
    import pytest
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    sp = SamplingParams(max_tokens=2, temperature=0.0)
    user = [{"role": "user", "content": "Speak."}]
    with LLM(model="default", device="cpu") as llm:
        out, = llm.chat(user, sp, chat_template=template,
                        chat_template_kwargs={"greeting": "Hark! ", "unread": 1})
        assert out.prompt == "Hark! Speak."
        plain, = llm.chat(user, sp, chat_template=template)
        assert plain.prompt == "Speak."
        with pytest.raises(InvalidRequestError, match="chat_template_kwargs cannot set tokenize"):
            llm.chat(user, sp, chat_template_kwargs={"tokenize": True})


def test_chat_continues_the_final_message():
    """vLLM's LLM.chat(continue_final_message=True, add_generation_prompt=False): the
    prompt ends with the last message's text, which the model continues (the keyword was
    a TypeError); with add_generation_prompt too it is refused, as vLLM refuses it."""
    from engine import InvalidRequestError
    import pytest
    sp = SamplingParams(max_tokens=4, temperature=0.0)
    start = [{"role": "user", "content": "Speak."}, {"role": "assistant", "content": "I will "}]
    with LLM(model="default", device="cpu") as llm:
        out, = llm.chat(start, sp, add_generation_prompt=False, continue_final_message=True)
        assert out.prompt == "ROMEO.\nSpeak.\n\nJULIET.\nI will "   # (its space: kept)
        same, = llm.generate(out.prompt, sp)
        assert same.outputs[0].token_ids == out.outputs[0].token_ids
        with pytest.raises(InvalidRequestError, match="cannot both be true"):
            llm.chat(start, sp, continue_final_message=True)
        with pytest.raises(InvalidRequestError, match="last message has no text"):
            llm.chat([*start[:1], {"role": "assistant", "content": None}], sp,
                     add_generation_prompt=False, continue_final_message=True)
