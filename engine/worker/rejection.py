"""Rejection sampling of speculative drafts (Leviathan et al. 2023; vLLM's
RejectionSampler): batched on the device, exact, the target's distribution preserved.

Each verified position j of a request has a target distribution p_j (the processed one
the sampler would draw from) and a draft token x_j drawn from q_j. The draft is accepted
with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection the token is drawn
from norm(max(0, p_j - q_j)) instead and the later positions are void; when every draft
is accepted, the bonus position (no draft) draws from its p. For an n-gram (or oracle)
draft q_j is one-hot at x_j: accept with probability p_j(x_j), else draw from p_j with
x_j removed. A rejected row's token never equals its draft (p_j(x_j) < q_j(x_j) there,
so the residual is 0 at x_j): the host reads "accepted" as "token == draft".
"""
from __future__ import annotations

import numpy as np
import torch

from engine.worker.device_io import to_device
from engine.worker.sampling import Sampler


def target_probs(logits: torch.Tensor, temperature: np.ndarray, top_k: np.ndarray,
                 top_p: np.ndarray) -> torch.Tensor:
    """The distribution the sampler draws random rows from (temperature, top-k, top-p)."""
    scaled = logits.float() / to_device(temperature, torch.float32, logits.device)[:, None]
    scaled = Sampler._top_p(Sampler._top_k(scaled, top_k), top_p)
    return torch.softmax(scaled, dim=-1)


def seeded_generators(generators: dict, cols, rows: np.ndarray,
                      device: torch.device) -> dict[int, torch.Generator]:
    """{i: generator} for the i-th of `rows` (sample rows) whose request is seeded: its
    own generator (Sampler.generators, by request id; made from its seed if new), so a
    seeded request's draws come from its stream as without speculation."""
    out = {}
    for i in np.flatnonzero(cols.seeded[rows]).tolist():
        row = int(rows[i])
        rid = cols.request_ids[row]
        gen = generators.get(rid)
        if gen is None:
            gen = generators[rid] = torch.Generator(device=device).manual_seed(
                int(cols.seed[row]))
        out[i] = gen
    return out


def rejection_sample(probs: torch.Tensor, draft_ids: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None,
                     row_generators: dict[int, torch.Generator] | None = None) -> torch.Tensor:
    """probs [N, V] target distributions; draft_ids [N] (-1: a bonus row, drawn from p);
    draft_probs [N, V] q, or None for one-hot drafts; row_generators: rows that draw from
    their own generator (seeded requests) instead of `generator`. Returns each row's
    token [N]: the draft where accepted, else the residual's draw (a bonus row: p's)."""
    n = probs.shape[0]
    is_draft = draft_ids >= 0
    x = draft_ids.clamp_min(0)[:, None]
    p_x = probs.gather(1, x)[:, 0]
    if draft_probs is None:       # one-hot q: the residual is p without x
        q_x = torch.ones_like(p_x)
        residual = probs.scatter(1, x, torch.where(is_draft, 0.0, p_x)[:, None])
    else:
        q_x = draft_probs.gather(1, x)[:, 0]
        residual = (probs - draft_probs).clamp_min_(0.0)
        residual = torch.where(is_draft[:, None], residual, probs)   # a bonus row: p
    u = torch.rand(n, device=probs.device, generator=generator)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for i, gen in (row_generators or {}).items():     # seeded rows: their own stream
        u[i] = torch.rand((), device=probs.device, generator=gen)
        noise[i].exponential_(generator=gen)
    accept = is_draft & (u * q_x <= p_x)
    empty = residual.sum(dim=-1, keepdim=True) <= 0               # p == q: never rejected
    residual = torch.where(empty, probs, residual)
    # one draw per row from the residual: argmax of w / E, E ~ Exp(1)
    race = (residual / noise.clamp_min_(1e-10)).argmax(dim=-1)
    return torch.where(accept, draft_ids, race)
