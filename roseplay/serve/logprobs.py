"""OpenAI's logprobs formats and best_of, from the engine's TokenLogprobs
(engine/outputs.py: entry 0 the sampled token, then the top n).

Completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}; chat: {"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}]}]}. Token strings are each id decoded alone, as vLLM
does (a piece of a multi-byte character shows as U+FFFD, and `bytes` is that string's
UTF-8; a model without a tokenizer shows "token_id:N"). A -inf logprob (a token top-k or min_p
removed, under processed_logprobs) is written as -9999.0, as vLLM does: JSON has no
infinity. Echoed prompt logprobs come as JSON already encoded (msgspec.Raw columns), once
per prompt.
"""
from __future__ import annotations

import math

import msgspec

MIN_LOGPROB = -9999.0
_encode = msgspec.json.Encoder().encode


def _finite(value: float) -> float:
    return value if value > MIN_LOGPROB else MIN_LOGPROB   # also turns -inf/NaN into it


class LogprobsWriter:
    """One response's logprobs: `n` top entries per token (None: not asked)."""

    def __init__(self, tokenizer, n: int | None, chat: bool, text_start: int = 0,
                 as_ids: bool = False):
        self.tokenizer, self.n, self.chat = tokenizer, n, chat
        self.text_start = text_start
        self.as_ids = as_ids            # vLLM's return_tokens_as_token_ids
        self._offsets: dict[int, int] = {}      # completions: next text_offset per choice
        self._texts: dict[int, str] = {}
        self._prompts: dict[int, tuple] = {}    # echo: id(prompt list) -> (it, columns, end)

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = (self.tokenizer.decode([token_id])
                                            if self.tokenizer is not None else f"token_id:{token_id}")
        return text

    def token_name(self, token_id: int) -> str:
        """What a logprobs entry calls the token: its text, or "token_id:N" with vLLM's
        return_tokens_as_token_ids (a token whose text is a piece of a character is then
        still told apart; offsets and `bytes` stay the text's)."""
        return f"token_id:{token_id}" if self.as_ids else self.token_text(token_id)

    def format(self, index: int, entries) -> dict | None:
        """The logprobs of choice `index`'s next tokens (entries: TokenLogprobs each)."""
        if self.n is None or entries is None:
            return None
        entries = [e for e in entries if e is not None]
        return self._chat(entries) if self.chat else self._completion(index, entries)

    def echo(self, index: int, first_token: int, prompt_logprobs, entries) -> dict | None:
        """Completions `echo` + `logprobs` (OpenAI legacy): the prompt's tokens first (the
        first with null logprob and top_logprobs: nothing predicts it), then the output's.
        The prompt's part is formatted once per prompt: its n choices share the list
        (roseplay/serve/siblings.py), and their responses share its entries."""
        if self.n is None or prompt_logprobs is None:
            return self.format(index, entries)
        head, end = self._prompt_part(first_token, prompt_logprobs)
        self._offsets[index] = end
        out = self._completion(index, [e for e in entries or () if e is not None])
        return {key: msgspec.Raw(b"".join((b"[", head[key], b"," if out[key] else b"",
                                           _encode(out[key])[1:-1], b"]")))
                for key in head}

    def prompt(self, prompt_logprobs, n: int) -> list:
        """vLLM's prompt_logprobs: per prompt token (the first None: nothing predicts it)
        its logprobs dict, the token first and then the top n by rank, each id once, as
        {id: {"logprob", "rank", "decoded_token"}}."""
        out = []
        for e in prompt_logprobs:
            if e is None:
                out.append(None)
                continue
            entry = {}
            for i, (t, lp) in enumerate(zip(e.token_ids[:1 + n], e.logprobs[:1 + n])):
                entry.setdefault(str(t), {"logprob": _finite(lp), "rank": e.rank if i == 0 else i,
                                          "decoded_token": self.token_text(t)})
            out.append(entry)
        return out

    def _prompt_part(self, first_token: int, prompt_logprobs) -> tuple[dict, int]:
        """The prompt's columns as JSON (each list's items, without the brackets) and
        the text offset after it: formatted and encoded once per prompt list, so n
        choices cost n copies of its bytes, not n times the work (with logprobs 20 on a
        1000-token prompt, 21,000 entries a choice)."""
        cached = self._prompts.get(id(prompt_logprobs))
        if cached is not None and cached[0] is prompt_logprobs:
            return cached[1], cached[2]
        self._offsets[-1] = len(self.token_text(first_token))
        head = self._completion(-1, [e for e in prompt_logprobs[1:] if e is not None])
        for key, value in (("tokens", self.token_name(first_token)), ("token_logprobs", None), ("top_logprobs", None),
                           ("text_offset", 0)):
            head[key].insert(0, value)
        encoded = {key: _encode(column)[1:-1] for key, column in head.items()}
        end = self._offsets.pop(-1)
        self._prompts[id(prompt_logprobs)] = (prompt_logprobs, encoded, end)
        return encoded, end

    def _top(self, e, count: int) -> list[tuple[int, float]]:
        """vLLM's top logprobs of a token: its logprobs dict in order (the sampled token
        first, then the top n by rank, each id once), the first `count`. So a sampled
        token outside the top n comes first and pushes the n-th out of chat's list, as
        vLLM's chat, Responses and completions answer (OpenAI ranks the true top n)."""
        out, seen = [], set()
        for t, lp in zip(e.token_ids[:1 + self.n], e.logprobs[:1 + self.n]):
            if t not in seen:
                seen.add(t)
                out.append((t, lp))
        return out[:count]

    def _chat(self, entries) -> dict:
        def item(tid, lp):
            return {"token": self.token_name(tid), "logprob": _finite(lp),
                    "bytes": list(self.token_text(tid).encode())}
        content = [{**item(e.token_ids[0], e.logprobs[0]),
                    "top_logprobs": [item(t, lp) for t, lp in self._top(e, self.n)]}
                   for e in entries]
        return {"content": content}

    def _completion(self, index: int, entries) -> dict:
        tokens, values, tops, offsets = [], [], [], []
        offset = self._offsets.get(index, self.text_start)
        for e in entries:
            tokens.append(self.token_name(e.token_ids[0]))
            values.append(_finite(e.logprobs[0]))
            # n + 1 entries: the sampled token too when outside the top n (OpenAI,
            # vLLM); keyed by text, as vLLM's (two ids of one text: one key, the later's)
            tops.append({self.token_name(t): _finite(lp) for t, lp in self._top(e, self.n + 1)})
            offsets.append(offset)
            offset += len(self.token_text(e.token_ids[0]))
        self._offsets[index] = offset
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}


def best_of(choices: list, n: int, candidates: int) -> list:
    """The n candidates of each prompt with the highest cumulative logprob (OpenAI's
    best_of), re-indexed prompt x n + rank. A candidate without output ranks last."""
    picked = []
    for start in range(0, len(choices), candidates):
        group = choices[start:start + candidates]
        group.sort(key=_cumulative, reverse=True)
        for rank, c in enumerate(group[:n]):
            c.index = start // candidates * n + rank
            picked.append(c)
    return picked


def _cumulative(choice) -> float:
    out = choice.output.outputs[0] if choice.output is not None else None
    value = out.cumulative_logprob if out is not None else None
    return -math.inf if value is None else value
