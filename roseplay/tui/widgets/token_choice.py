"""The selected request's token choice: its speculative drafts and accepted totals, and
the next-token distribution of its latest token (top-n with probabilities, the sampled
token marked), from the logprobs the request asked for (RequestView.logprobs: vLLM's
TokenLogprobs, what `logprobs_mode` says it holds).

A request that asked for raw_logprobs too (a typed prompt does) shows the model's own
distribution beside the processed one (after min_tokens, logit_bias, penalties,
temperature, min_p, top-k/top-p): a bias pushing a token up, a penalty pushing a
repeated token down, each token's rank change marked (↑ ↓)."""
from __future__ import annotations

import math

from rich.text import Text

from roseplay.tui.widgets import theme

BARS = " ▁▂▃▄▅▆▇█"
NO_LOGPROBS = ("next token: no logprobs asked for (a prompt typed with i asks for the top 5, "
               "and so does 1 in 8 generated)")
# before its first token a request shows no distribution whether it asked or not
NO_TOKEN_YET = "next token: none sampled yet (its distribution shows from its first token)"
NO_LOGPROBS_SHORT = "next token: no logprobs asked for"
NO_TOKEN_YET_SHORT = "next token: none sampled yet"


def token_label(token_id: int, tokenizer) -> str:
    """A token as text (quoted, whitespace visible), or #id without a tokenizer."""
    if tokenizer is None:
        return f"#{token_id}"
    text = tokenizer.decode([token_id])
    return repr(text.replace("\n", "⏎"))


def shares(values: list[float], mode: str) -> list[float]:
    """Each entry's probability: exp(logprob) for the *_logprobs modes; for the *_logits
    modes a softmax over the entries shown (their share among the top-n, not of the whole
    vocabulary)."""
    if mode.endswith("logprobs"):
        return [math.exp(v) for v in values]
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


def top_entries(lp) -> list[tuple[int, float]]:
    """(token id, value) of the top-n, best first (entry 0 is the sampled token)."""
    return list(zip(lp.token_ids[1:], lp.logprobs[1:])) or [(lp.token_ids[0], lp.logprobs[0])]


def pct(p: float) -> str:
    return f"{100 * p:.1f}%" if p < 0.1 else f"{100 * p:.0f}%"


def spec_words(r) -> Text:
    t = Text()
    if r.spec_draft_tokens:
        share = 100 * r.spec_accepted_tokens / r.spec_draft_tokens
        t.append("spec ", "bold")
        t.append(f"{r.spec_draft_tokens} drafted → {r.spec_accepted_tokens} accepted "
                 f"({share:.0f}%)  ")
    return t


def compare_rows(lp, mode: str) -> list[tuple[int, float | None, float | None, str]]:
    """(token, model p, processed p, rank mark) for the union of both top-n lists, in the
    processed order then the model's; None: outside that list's top-n. Mark: ↑ the
    processing moved the token up, ↓ down, ✚ into the top-n, ✖ out of it, "" unchanged."""
    proc, raw = top_entries(lp), top_entries(lp.raw)
    proc_p = dict(zip([t for t, _ in proc], shares([v for _, v in proc], mode)))
    raw_p = {t: math.exp(v) for t, v in raw}
    proc_rank = {t: i for i, (t, _) in enumerate(proc)}
    raw_rank = {t: i for i, (t, _) in enumerate(raw)}
    out = []
    for tid in [t for t, _ in proc] + [t for t, _ in raw if t not in proc_rank]:
        a, b = raw_rank.get(tid), proc_rank.get(tid)
        mark = "✚" if a is None else "✖" if b is None else "↑" if b < a else "↓" if b > a else ""
        out.append((tid, raw_p.get(tid), proc_p.get(tid), mark))
    return out


def _p(p: float | None) -> str:
    return "–" if p is None else pct(p)


def _fitting(t: Text, pieces: list[tuple[str, str]], width: int) -> Text:
    """Append whole pieces while the line stays within `width` (the rest: "…"): a
    one-line distribution is never cut inside a token."""
    for i, (text, style) in enumerate(pieces):
        if t.cell_len + len(text) > width - (1 if i + 1 < len(pieces) else 0):
            return t.append("…", "dim")
        t.append(text, style)
    return t


def compare_text(t: Text, lp, tokenizer, mode: str, rows: int, width: int = 200) -> Text:
    """The model's distribution beside the processed one (SamplingParams.raw_logprobs)."""
    sampled = lp.token_ids[0]
    entries = compare_rows(lp, mode)
    meta = f"({mode}; sampled rank {lp.rank}, model {lp.raw.rank})"
    if rows <= 1:          # the tokens first, as many as fit the line
        t.append("next token model→after: ", "bold")
        return _fitting(t, [(f"{token_label(tid, tokenizer)} {_p(a)}→{_p(b)}{mark}  ",
                             "bold" if tid == sampled else "")
                            for tid, a, b, mark in entries], width)
    t.append("next token model → after ", "bold")
    t.append(f"{meta}: ", "dim")
    t.append(f"sampled {token_label(sampled, tokenizer)}", "bold")
    t.append(f"\n  {'token':>12} {'model p':>8} {'after p':>8}", "bold")
    for tid, a, b, mark in entries[:rows - 3]:
        t.append("\n")
        t.append(f"{'▶' if tid == sampled else ' '} {token_label(tid, tokenizer):>12} "
                 f"{_p(a):>8} {_p(b):>8} {mark}", "bold" if tid == sampled else "")
    # what the columns mean, under the table (it was cut at the end of the header)
    t.append("\nafter: bias, penalties, temperature, min_p, top-k/p · ↑↓ rank moved, "
             "✚ into / ✖ out of the top-n", "dim")
    return t


def choice_text(r, tokenizer, mode: str, rows: int, width: int = 200) -> Text:
    """`rows` == 1: one line of `width` (each token with a one-glyph bar, as many as fit);
    more: a bar per token."""
    t = spec_words(r)
    lp = r.logprobs
    if lp is None:      # one line: the words that fit it whole, not a cut sentence
        forms = (NO_LOGPROBS, NO_LOGPROBS_SHORT) if r.output_tokens else \
            (NO_TOKEN_YET, NO_TOKEN_YET_SHORT)
        fits = rows > 1 or t.cell_len + len(forms[0]) <= width
        return t.append(forms[0] if fits else forms[1], "dim")
    if getattr(lp, "raw", None) is not None:
        return compare_text(t, lp, tokenizer, mode, rows, width)
    entries = top_entries(lp)
    probs = shares([v for _, v in entries], mode)
    sampled_id = lp.token_ids[0]
    color = theme.color("decode")
    if rows <= 1:           # the sampled token and the top-n first, the mode last
        t.append("next token ", "bold")
        t.append(f"{token_label(sampled_id, tokenizer)}", "bold")
        if mode.endswith("logprobs"):
            t.append(f" {pct(math.exp(lp.logprobs[0]))}")
        t.append(f" (rank {lp.rank}) · top {len(entries)}: ", "dim")
        pieces = [(f"{BARS[min(8, max(1, round(p * 8)))]}{token_label(tid, tokenizer)} "
                   f"{pct(p)}{'✓' if tid == sampled_id else ''}  ",
                   "bold" if tid == sampled_id else "") for (tid, _), p in zip(entries, probs)]
        return _fitting(t, pieces + [(f"({mode})", "dim")], width)
    t.append("next token ", "bold")
    t.append(f"({mode}, sampled rank {lp.rank}): ", "dim")
    t.append(f"sampled {token_label(sampled_id, tokenizer)}", "bold")
    if mode.endswith("logprobs"):
        t.append(f" {pct(math.exp(lp.logprobs[0]))}")
    for (tid, _), p in list(zip(entries, probs))[:rows - 1]:
        mark = tid == sampled_id
        t.append("\n")
        t.append(f"{'▶' if mark else ' '} {token_label(tid, tokenizer):>12} ",
                 "bold" if mark else "")
        t.append("█" * max(1, round(p * 30)), color)
        t.append(f" {pct(p):>6}" + ("  sampled" if mark else ""))
    return t
