"""The SamplingExtras of a step: penalties, logit bias, min_p, min_tokens and logprobs as
flat columns (engine/worker/step_batch.py), built only when some row of the step uses them.

Host work is per row that uses a field (and per bias entry / stop token of those rows),
never per vocabulary entry: the device applies each field with one scatter or gather.
"""
from __future__ import annotations

from operator import attrgetter

import numpy as np

from engine.worker.step_batch import SamplingExtras

_processed = attrgetter("processed")
_alters = attrgetter("alters_logits")

_NONE_I64 = np.zeros(0, np.int64)
_NONE_F32 = np.zeros(0, np.float32)
# a step where no row alters its logits (only logprobs asked): no per-row pass
_UNALTERED = dict(penalty_rows=_NONE_I64, presence=_NONE_F32, frequency=_NONE_F32,
                  repetition=_NONE_F32, first_sample=np.zeros(0, bool), prompt_ids=_NONE_I64,
                  prompt_lens=_NONE_I64, bias_rows=_NONE_I64, bias_tokens=_NONE_I64,
                  bias_values=_NONE_F32, mask_rows=_NONE_I64, mask_tokens=_NONE_I64)
for _a in _UNALTERED.values():
    _a.flags.writeable = False
_UNALTERED["min_p"] = None


def _penalty_columns(requests: list) -> dict:
    rows, pres, freq, rep, first, prompt_parts = [], [], [], [], [], []
    for i, r in enumerate(requests):
        p = r.params
        if not p.uses_penalties:
            continue
        rows.append(i)
        pres.append(p.presence_penalty)
        freq.append(p.frequency_penalty)
        rep.append(p.repetition_penalty)
        # no output yet (async: a pending token counts): this is its first sample, so
        # its counts on the device are (re)set from its prompt
        is_first = not r.output_token_ids
        first.append(is_first)
        if is_first:
            prompt_parts.append(r.prompt_token_ids)
    lens = np.fromiter(map(len, prompt_parts), np.int64, count=len(prompt_parts))
    ids = np.fromiter((t for part in prompt_parts for t in part), np.int64,
                      count=int(lens.sum())) if prompt_parts else _NONE_I64
    return dict(penalty_rows=np.asarray(rows, np.int64),
                presence=np.asarray(pres, np.float32), frequency=np.asarray(freq, np.float32),
                repetition=np.asarray(rep, np.float32), first_sample=np.asarray(first, bool),
                prompt_ids=ids, prompt_lens=lens)


def _bias_columns(requests: list) -> dict:
    rows, tokens, values = [], [], []
    for i, r in enumerate(requests):
        bias = r.params.logit_bias
        if bias:
            rows.extend([i] * len(bias))
            tokens.extend(bias.keys())
            values.extend(bias.values())
    return dict(bias_rows=np.asarray(rows, np.int64), bias_tokens=np.asarray(tokens, np.int64),
                bias_values=np.asarray(values, np.float32))


def _min_tokens_columns(requests: list) -> dict:
    """Stop tokens (EOS and stop_token_ids: Request.stop_ids) of rows whose output is
    still shorter than min_tokens: this sample is output token len(output_token_ids).
    A constrained row's are held in its grammar mask instead, unless the grammar allows
    nothing else (engine/core/structured/manager.py)."""
    rows, tokens = [], []
    for i, r in enumerate(requests):
        if r.params.min_tokens > len(r.output_token_ids) and r.stop_ids and r.grammar is None:
            rows.extend([i] * len(r.stop_ids))
            tokens.extend(r.stop_ids)
    return dict(mask_rows=np.asarray(rows, np.int64), mask_tokens=np.asarray(tokens, np.int64))


def sampling_extras(requests: list, params: list) -> SamplingExtras | None:
    """The extras of a step's sample rows (row i: requests[i]); None if no row uses one."""
    if not any(map(_processed, requests)):
        return None
    altered = _UNALTERED
    if any(map(_alters, requests)):
        min_p = np.fromiter((p.min_p for p in params), np.float32, count=len(params))
        altered = {**_penalty_columns(requests), **_bias_columns(requests),
                   **_min_tokens_columns(requests), "min_p": min_p if min_p.max() > 0 else None}
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    raw = [j for j, i in enumerate(lp_rows) if params[i].raw_logprobs]
    return SamplingExtras(
        **altered,
        logprob_rows=np.asarray(lp_rows, np.int64),
        raw_rows=np.asarray(raw, np.int64) if raw else None,
        num_logprobs=max((params[i].logprobs for i in lp_rows), default=0))
