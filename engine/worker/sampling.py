"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds,
and vLLM's processing (min_tokens, logit bias, penalties, min_p) and logprobs.

Reads only the step batch's sampling columns. One host sync per step (the final token
list, taken by the caller), never one per request. Random rows draw from an exponential
race (argmax of p / E, E ~ Exp(1)), which samples exactly from p; a seeded request draws
its noise from its own generator (kept here by request id until `release`), so its
output does not depend on what else is in the batch.

The order is vLLM V1's: min_tokens masks and logit bias, then penalties (all three also
change greedy rows), argmax; for random rows temperature, min_p, top-k, top-p. A step
with none of these (SamplingColumns.extras is None, or only logprobs asked) runs the
plain sampling path, and a logprobs-only step then reads only the rows that asked. Logprobs
(docs/SAMPLING.md) are taken per `logprobs_mode`: raw_* from the model's logits,
processed_* from the distribution sampled from (after all of the above).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.config import LOGPROBS_MODES
from engine.worker.device_io import to_device
from engine.worker.logprobs import TopLogprobs, take
from engine.worker.penalties import TokenCounts
from engine.worker.step_batch import SamplingColumns, SamplingExtras
from kernels import reference


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0,
                 logprobs_mode: str = LOGPROBS_MODES[0],
                 top_logprobs: TopLogprobs = reference.top_logprobs):
        """top_logprobs: the kernel backend's (kernels/logprobs.py on the GPU)."""
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}   # seeded requests, by id
        self.counts = TokenCounts(device)                  # penalty rows' token counts
        self.logprobs_mode = logprobs_mode
        self.top = top_logprobs
        # the last sample's packed logprobs (engine/worker/logprobs.py): the sampled
        # distribution's, then the model's own for the rows that asked raw_logprobs
        self.last_logprobs: tuple[torch.Tensor, ...] | None = None
        # the launch's draws from seeded generators (each with its state before) and its
        # penalty rows' counted tokens: what rewind() undoes when the launch fails
        self.drawn: list[tuple[torch.Generator, torch.Tensor]] = []
        self.counted: list[tuple[torch.Tensor, torch.Tensor]] = []

    def release(self, request_id: str) -> None:
        """The request ended: drop its generator and its token counts."""
        self.generators.pop(request_id, None)
        self.counts.release(request_id)

    def begin(self) -> None:
        """A launch begins (ModelRunner.execute_model): rewind() undoes what it draws."""
        if self.drawn or self.counted:
            self.drawn, self.counted = [], []

    def will_draw(self, gen: torch.Generator) -> None:
        """`gen` (a seeded request's) is about to draw for this launch."""
        self.drawn.append((gen, gen.get_state()))

    def rewind(self) -> None:
        """The launch failed after it drew: each seeded generator goes back to its state
        before the launch, and the penalty rows' counts lose its tokens, so that its
        rerun (engine/core/step_faults.py) draws and counts as if it never had."""
        for gen, state in reversed(self.drawn):
            gen.set_state(state)
        for slots, tokens in self.counted:
            self.counts.add(slots, tokens, -1)
        self.drawn, self.counted = [], []

    def sample(self, logits: torch.Tensor, cols: SamplingColumns,
               model_logits: torch.Tensor | None = None,
               argmax: torch.Tensor | None = None) -> torch.Tensor:
        """logits [R, V] (model dtype), one row per sample -> token ids, on the device.
        model_logits: the model's own, when `logits` is their grammar-masked copy
        (engine/worker/grammar_mask.py): the raw logprobs view reads them. argmax: the
        rows' argmax if already taken (a decode graph's own), used when every row is
        greedy and none is altered."""
        self.last_logprobs = None
        ex = cols.extras
        model = logits if model_logits is None else model_logits
        if ex is not None and not ex.only_logprobs:
            return self._sample_processed(logits, cols, ex, model)
        if cols.all_greedy:      # exact on bf16: no upcast needed
            tokens, scaled = (logits.argmax(dim=-1) if argmax is None else argmax), None
        else:
            greedy_tokens = logits.argmax(dim=-1)    # in the model dtype, as all-greedy
            random_tokens, scaled = self._sample_random(logits.float(), cols, None)
            tokens = torch.where(to_device(cols.greedy, torch.bool, logits.device),
                                 greedy_tokens, random_tokens)
        if ex is not None:
            self.last_logprobs = self._row_logprobs(logits, model, scaled, tokens, cols, ex)
        return tokens

    def _row_logprobs(self, logits: torch.Tensor, model: torch.Tensor,
                      scaled: torch.Tensor | None, tokens: torch.Tensor,
                      cols: SamplingColumns, ex: SamplingExtras) -> tuple:
        """The logprobs of a step whose rows no field alters: only the rows that asked
        are read (what `_sample_processed` gives them: the distribution sampled from,
        i.e. the logits of a greedy row and the scaled ones of a random row)."""
        idx = to_device(ex.logprob_rows, torch.int64, logits.device)
        raw = self.logprobs_mode.startswith("raw")
        if raw or scaled is None:
            src, gathered = (model if raw else logits), False
        else:       # those rows only: greedy ones from the logits, random ones scaled
            greedy = to_device(cols.greedy[ex.logprob_rows], torch.bool, logits.device)
            src = torch.where(greedy[:, None], logits.index_select(0, idx).float(),
                              scaled.index_select(0, idx))
            gathered = True
        return self._take(src, tokens, idx, ex, gathered) + self._raw_view(model, tokens, ex)

    def _take(self, src: torch.Tensor, tokens: torch.Tensor, idx: torch.Tensor,
              ex: SamplingExtras, gathered: bool = False) -> tuple[torch.Tensor]:
        """The sampled distribution's packed logprobs of the rows `idx` asking
        (engine/worker/logprobs.py)."""
        return (take(self.top, src, tokens, idx, ex.num_logprobs,
                     self.logprobs_mode.endswith("logprobs"), gathered),)

    def _sample_random(self, logits: torch.Tensor, cols: SamplingColumns,
                       min_p: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, the logits they were drawn from) for every row as a random one."""
        scaled = logits / to_device(cols.temperature, torch.float32, logits.device)[:, None]
        scaled = self._min_p(scaled, min_p)
        scaled = self._top_k(scaled, cols.top_k)
        scaled = self._top_p(scaled, cols.top_p)
        probs = torch.softmax(scaled, dim=-1)
        noise = self._noise(probs, cols)
        return (probs / noise).argmax(dim=-1), scaled

    def _sample_processed(self, logits: torch.Tensor, cols: SamplingColumns,
                          ex: SamplingExtras, model: torch.Tensor) -> torch.Tensor:
        dev = logits.device
        want_lp = ex.logprob_rows.shape[0] > 0
        x = logits.to(torch.float32, copy=True)   # never the graphs' output buffer
        if ex.mask_rows.shape[0]:                 # min_tokens: no stop token yet
            x.index_put_((to_device(ex.mask_rows, torch.int64, dev),
                          to_device(ex.mask_tokens, torch.int64, dev)),
                         torch.tensor(float("-inf"), device=dev))
        if ex.bias_rows.shape[0]:
            x.index_put_((to_device(ex.bias_rows, torch.int64, dev),
                          to_device(ex.bias_tokens, torch.int64, dev)),
                         to_device(ex.bias_values, torch.float32, dev), accumulate=True)
        penalized = self._penalize(x, cols, ex) if ex.penalty_rows.shape[0] else None
        tokens = x.argmax(dim=-1)
        sampled_from = x
        if not cols.all_greedy:
            random_tokens, scaled = self._sample_random(x, cols, ex.min_p)
            greedy = to_device(cols.greedy, torch.bool, dev)
            tokens = torch.where(greedy, tokens, random_tokens)
            sampled_from = torch.where(greedy[:, None], x, scaled) if want_lp else None
        if want_lp:
            src = model if self.logprobs_mode.startswith("raw") else sampled_from
            idx = to_device(ex.logprob_rows, torch.int64, dev)
            self.last_logprobs = self._take(src, tokens, idx, ex) \
                + self._raw_view(model, tokens, ex)
        if penalized is not None:     # last: a failed sample counts nothing
            rows, slots = penalized
            counted = tokens.index_select(0, rows)
            self.counts.add(slots, counted)
            self.counted.append((slots, counted))
        return tokens

    def _penalize(self, x: torch.Tensor, cols: SamplingColumns,
                  ex: SamplingExtras) -> tuple[torch.Tensor, torch.Tensor]:
        dev = x.device
        rows = to_device(ex.penalty_rows, torch.int64, dev)
        slots = self.counts.slots_of([cols.request_ids[i] for i in ex.penalty_rows.tolist()],
                                     x.shape[1])
        if ex.first_sample.any():
            first = to_device(np.nonzero(ex.first_sample)[0], torch.int64, dev)
            self.counts.reset(slots.index_select(0, first), ex.prompt_ids, ex.prompt_lens)
        self.counts.apply(x, rows, slots, ex.presence, ex.frequency, ex.repetition)
        return rows, slots

    def _raw_view(self, model: torch.Tensor, tokens: torch.Tensor,
                  ex: SamplingExtras) -> tuple:
        """The model's own log-softmax top-n of the rows that asked raw_logprobs (the TUI
        shows it beside the processed distribution), packed; () if none did."""
        if ex.raw_rows is None:
            return ()
        idx = to_device(ex.logprob_rows[ex.raw_rows], torch.int64, model.device)
        return (take(self.top, model, tokens, idx, ex.num_logprobs, True),)

    @staticmethod
    def _min_p(logits: torch.Tensor, min_p: np.ndarray | None) -> torch.Tensor:
        """Drop tokens whose probability is below min_p x the row's top probability."""
        if min_p is None:
            return logits
        probs = torch.softmax(logits, dim=-1)
        floor = probs.amax(dim=-1, keepdim=True) * to_device(min_p, torch.float32,
                                                             logits.device)[:, None]
        return logits.masked_fill(probs < floor, float("-inf"))

    @staticmethod
    def _top_k(logits: torch.Tensor, top_k: np.ndarray) -> torch.Tensor:
        vocab = logits.shape[-1]
        ks = np.where(top_k > 0, np.minimum(top_k, vocab), vocab)
        if ks.min() >= vocab:
            return logits
        k_max = int(ks.max())
        top = torch.topk(logits, k_max, dim=-1).values
        threshold = top.gather(1, to_device(ks - 1, torch.int64, logits.device)[:, None])
        return logits.masked_fill(logits < threshold, float("-inf"))

    @staticmethod
    def _top_p(logits: torch.Tensor, top_p: np.ndarray) -> torch.Tensor:
        if top_p.min() >= 1.0:
            return logits
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs          # mass strictly above each token
        p = to_device(top_p, torch.float32, logits.device)[:, None]
        # keeps the top; a row of top_p 1 keeps everything, as alone (its tail's mass
        # above it can round to 1.0 in float32)
        drop = (before >= p) & (p < 1.0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)

    def _noise(self, probs: torch.Tensor, cols: SamplingColumns) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i in np.nonzero(cols.seeded & ~cols.greedy)[0].tolist():
            rid = cols.request_ids[i]
            gen = self.generators.get(rid)
            if gen is None:
                gen = torch.Generator(device=probs.device).manual_seed(int(cols.seed[i]))
                self.generators[rid] = gen
            self.will_draw(gen)
            noise[i].exponential_(generator=gen)
        return noise.clamp_min_(1e-10)
