"""The Selected panel's model-vs-processed distribution (issue 33): a prompt typed with
a logit bias and a penalty in the prompt box's sampling field shows the model's
probabilities beside the ones sampled from, and the numbers on screen are the engine's
(the request's TokenLogprobs and its raw twin), the biased token pushed up."""
from __future__ import annotations

import math

import pytest

from engine.config import InvalidRequestError
from roseplay.tui.app import RoseplayApp
from roseplay.workload.own_prompts import own_request_id
from roseplay.tui.widgets.prompt_input import parse_sampling
from roseplay.tui.widgets.token_choice import pct
from tests.roseplay.tui.helpers import live_source, sync, wait_for, widget_text

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("fast_pilot")]
BIASED = 7          # a token of dummy:tiny's vocabulary, pushed up by +8


def test_parse_sampling_fields_and_errors():
    assert parse_sampling("temperature=0 logit_bias=7:8,9:-2 frequency_penalty=1.5") == \
        {"temperature": 0.0, "logit_bias": {7: 8.0, 9: -2.0}, "frequency_penalty": 1.5}
    for bad in ("tempo=1", "top_k=x", "logit_bias=7"):
        with pytest.raises(InvalidRequestError):
            parse_sampling(bad)


def expected_rows(lp) -> dict[int, tuple[str, str]]:
    """token -> (model p, processed p) as shown, from the engine's entries."""
    raw = {t: pct(math.exp(v)) for t, v in zip(lp.raw.token_ids[1:], lp.raw.logprobs[1:])}
    proc = {t: pct(math.exp(v)) for t, v in zip(lp.token_ids[1:], lp.logprobs[1:])}
    return {t: (raw.get(t, "–"), proc.get(t, "–")) for t in [*proc, *raw]}


def shown_rows(text: str) -> dict[int, tuple[str, str]]:
    rows = {}
    for line in text.splitlines():
        parts = line.replace("▶", " ").replace("│", " ").split()
        if len(parts) >= 3 and parts[0].startswith("#") and parts[0][1:].isdigit():
            rows[int(parts[0][1:])] = (parts[1], parts[2])
    return rows


@sync
async def test_typed_bias_and_penalty_show_model_and_processed_p():
    src = live_source(concurrency=1)    # (in this process: the rows are the point; the
    #   logprobs crossing the engine's process: test_tui_tokens.py's typed prompt)
    try:
        app = RoseplayApp(source=src)
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.snapshot is not None, 60)
            await pilot.press("i", *"to be or not")
            app.query_one("#prompt-sampling").value = \
                f"temperature=0 logit_bias={BIASED}:8 frequency_penalty=0.5 max_tokens=4"
            await pilot.press("enter", "escape")
            app.set_zoom("detail")           # room for a row per token (z to it)
            detail = app.query_one("#detail")
            view = lambda: app.snapshot.request(own_request_id(1))           # noqa: E731
            seen = {}

            def agrees() -> bool:
                r = view()
                if r is None or r.logprobs is None or r.logprobs.raw is None:
                    return False
                want, got = expected_rows(r.logprobs), shown_rows(widget_text(detail))
                shown = {t: want[t] for t in got}
                seen.update(lp=r.logprobs, want=want, got=got)
                return len(got) >= 4 and got == shown
            assert await wait_for(pilot, agrees, 30), (seen, widget_text(detail))
            lp, got = seen["lp"], seen["got"]
            # greedy over the processed logits: the sampled token is the processed top-1
            assert lp.token_ids[0] == lp.token_ids[1] and lp.rank == 1
            text = widget_text(detail)
            assert "model p" in text and "after p" in text and "model → after" in text
            assert f"(processed_logprobs; sampled rank 1, model {lp.raw.rank})" in text
            assert f"▶ {'#' + str(lp.token_ids[0]):>12}" in widget_text(detail)
            # the bias pushed BIASED up: above its model probability (or into the top-n)
            raw = dict(zip(lp.raw.token_ids[1:], lp.raw.logprobs[1:]))
            proc = dict(zip(lp.token_ids[1:], lp.logprobs[1:]))
            assert BIASED in proc and proc[BIASED] > raw.get(BIASED, -math.inf)
            assert BIASED in got
    finally:
        src.close()
