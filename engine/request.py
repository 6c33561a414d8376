"""Requests: sampling parameters, the per-request state machine and its token bookkeeping
(what LLM.generate hands back: engine/request_output.py)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

import msgspec
from msgspec.structs import force_setattr

from engine.codes import REASON_LENGTH, REASON_STOP
from engine import validation as V
from engine.errors import InvalidRequestError
from engine.structured_outputs import StructuredOutputsParams


_SAMPLING_EPS = 1e-5
PENDING_TOKEN = -1         # an output token sampled on the device, not yet read (async)
MAX_TEMPERATURE = V.MAX_TEMPERATURE
TRACE_TOKENS = 256         # output tokens a request's trace keeps (logprobs, speculation)


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                     kw_only=True):
    """vLLM-style sampling parameters. temperature 0 means greedy.

    A msgspec Struct (as vLLM's): the engine-process wire carries it as it is, and
    decoding checks each field's type, then runs __post_init__'s bounds (a failure there
    is a msgspec.ValidationError naming the field); a field this engine does not know is
    refused, not ignored. __post_init__ checks every field's type as strictly as the wire
    does, so a value built in Python is never refused later by the engine process
    (tests/engine/front/test_validation.py compares the two). The field list is here only.
    Keywords only: vLLM's first field is n, so SamplingParams(2) meant another field."""

    max_tokens: int | None = 16        # None (vLLM's): up to the context's end, resolved
    #                                    by the front for the prompt (InputProcessor)
    temperature: float = 1.0
    top_k: int = -1          # -1 (or 0): no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop: str | tuple[str, ...] | None = None     # a list is accepted; stored as a tuple
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    # -- vLLM's sampling surface beyond the basics (docs/SAMPLING.md), vLLM's names and
    # defaults: penalties over token counts held on the device, a per-token bias, min-p,
    # EOS/stop tokens masked until min_tokens, top logprobs of each sampled token
    presence_penalty: float = 0.0      # OpenAI: -= penalty if the token was generated
    frequency_penalty: float = 0.0     # OpenAI: -= penalty x times it was generated
    repetition_penalty: float = 1.0    # vLLM/HF: prompt + output tokens, / or x penalty
    logit_bias: dict[int, float] | None = None    # token id -> added to its logit
    min_p: float = 0.0                 # drop tokens with p < min_p x max p
    min_tokens: int = 0                # stop tokens (EOS, stop_token_ids) masked before
    logprobs: int | None = None        # top-n logprobs per output token (+ the sampled one)
    prompt_logprobs: int | None = None # top-n logprobs per prompt token (skips prefix hits)
    # roseplay extra (the TUI's model-vs-processed view): each logprobs entry also
    # carries the model's own top-n (TokenLogprobs.raw); needs logprobs
    raw_logprobs: bool = False
    # roseplay extra (a viewer's own prompt): the final output carries the request's
    # token trace (RequestOutput.trace); a snapshot keeps only the latest few
    token_trace: bool = False
    # vLLM's structured outputs: json / regex / choice / grammar / json_object, each token
    # masked to what the grammar allows (docs/STRUCTURED_OUTPUTS.md)
    structured_outputs: StructuredOutputsParams | None = None
    # -- vLLM's output text fields, applied by the front (engine/front/processor.py):
    # detokenize False leaves the text empty (token ids only; no stop strings then),
    # skip_special_tokens False shows special tokens in it (spaces_between_special_tokens
    # False: two in a row without the space a decoder puts between tokens),
    # include_stop_str_in_output keeps the stop string that ended it
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's n: sequences per prompt. The engine runs one per request: LLM.generate fans
    # n out into n requests (seed + i when seeded) and gathers them into one
    # RequestOutput; a stream (EngineClient.submit) takes n = 1 only
    n: int = 1

    def __post_init__(self):
        # one validation layer (engine/validation.py): named field, accepted range
        if self.max_tokens is not None:
            V.check_int("max_tokens", self.max_tokens, 1, V.MAX_TOKENS)
        V.check_int("top_k", self.top_k, -1, V.MAX_TOP_K)     # -1 or 0: no top-k cut
        V.check_number("temperature", self.temperature, 0, V.MAX_TEMPERATURE)
        V.check_top_p(self.top_p)
        V.check_int("n", self.n, 1, V.MAX_N)
        V.check_seed(self.seed, self.n)
        force_setattr(self, "stop", V.check_stop(self.stop))
        force_setattr(self, "stop_token_ids", V.check_stop_token_ids(self.stop_token_ids))
        V.check_bool("ignore_eos", self.ignore_eos)
        for name in ("skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            V.check_bool(name, getattr(self, name))
        if not V.check_bool("detokenize", self.detokenize) and self.stop:
            raise InvalidRequestError("stop strings need detokenize=True (they match the "
                                      "text), as in vLLM")
        self._check_extras()

    def _check_extras(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            V.check_number(name, getattr(self, name), -V.MAX_PENALTY, V.MAX_PENALTY)
        V.check_number("repetition_penalty", self.repetition_penalty,
                       V.MIN_REPETITION_PENALTY, V.MAX_REPETITION_PENALTY)
        V.check_number("min_p", self.min_p, 0, 1)
        V.check_int("min_tokens", self.min_tokens, 0,
                    V.MAX_TOKENS if self.max_tokens is None else self.max_tokens)
        force_setattr(self, "logit_bias", V.check_logit_bias(self.logit_bias))
        V.check_logprobs("logprobs", self.logprobs)
        V.check_logprobs("prompt_logprobs", self.prompt_logprobs)
        if V.check_bool("raw_logprobs", self.raw_logprobs) and self.logprobs is None:
            raise InvalidRequestError("raw_logprobs needs logprobs (the top-n to show)")
        V.check_bool("token_trace", self.token_trace)
        so = self.structured_outputs
        if isinstance(so, dict):      # as the wire decodes a map into the Struct
            try:
                so = msgspec.convert(so, StructuredOutputsParams)
            except msgspec.ValidationError as exc:
                text = str(exc)
                raise InvalidRequestError(text if text.startswith("structured_outputs")
                                          else f"structured_outputs: {text}") from None
            force_setattr(self, "structured_outputs", so)
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise InvalidRequestError("structured_outputs must be a StructuredOutputsParams")

    @property
    def uses_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def alters_logits(self) -> bool:
        """A field that changes the logits before sampling (penalties, logit bias, min_p,
        min_tokens): the sampler's processed path."""
        return (self.uses_penalties or self.logit_bias is not None or self.min_p > 0
                or self.min_tokens > 0)

    @property
    def needs_processing(self) -> bool:
        """Anything beyond temperature/top-k/top-p/seed (logprobs too): not speculated,
        and SamplingExtras built for its step."""
        return self.alters_logits or self.logprobs is not None

    @property
    def greedy(self) -> bool:
        # like vLLM: a temperature this small is greedy (dividing by it overflows to
        # inf/NaN logits, and a NaN row's argmax is token 0)
        return self.temperature < _SAMPLING_EPS

    def replace(self, **changes) -> "SamplingParams":
        """A validated copy with `changes` (as dataclasses.replace)."""
        return SamplingParams(**{**msgspec.structs.asdict(self), **changes})


def sample_seed(seed: int | None, i: int) -> int | None:
    """The seed of sample i of a seeded prompt (LLM.generate's n, the server's n and
    best_of): seed + i, as vLLM's parallel sampling, so the samples differ and each is
    reproducible alone; V.check_seed(seed, samples) keeps every one in range."""
    return None if seed is None else seed + i


class RequestStatus(enum.Enum):
    WAITING = "waiting"          # queued, nothing computed (or preempted: see .preempted)
    RUNNING = "running"          # admitted: prefilling or decoding
    FINISHED = "finished"
    CANCELLED = "cancelled"
    ERROR = "error"

    @property
    def done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.CANCELLED, RequestStatus.ERROR)


@dataclass(eq=False)
class Request:
    """One request's mutable state, owned by the engine thread."""

    request_id: str
    prompt_token_ids: tuple[int, ...] | list[int]   # read only: LLMEngine.add keeps the
    #                                  CoreRequest's tuple, which the garbage collector
    #                                  untracks at its first pass (a list's 512 ids were
    #                                  walked again in every generation it reached)
    params: SamplingParams
    prompt: str | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)   # hash chain of full blocks
    prompt_key: tuple | None = None  # dedup key of its tokens at its last admission try
    table_row: int = -1              # its row in KVManager.tables (engine/core/kv/block_tables.py)
    num_computed_tokens: int = 0     # tokens whose KV is in block_table
    num_cached_tokens: int = 0       # prompt tokens served by the prefix cache (last admission)
    num_host_cached_tokens: int = 0  # those of them reloaded from the host tier
    swap: object = None              # preempted by swap: its SwapRecord in the host tier
    num_prefill_target: int = 0      # tokens to compute before the next sample (set at admission)
    num_preemptions: int = 0
    admit_seq: int = -1              # admission order; newest is preempted first
    dedup_leader: "Request | None" = None
    finish_reason: str | None = None  # "length" | "stop" | "cancelled" | "error"
    error: str | None = None
    chunks_done: int = 0             # prefill chunks computed since the last admission
    priority: int = 0                # scheduling_policy=priority: lower is served first
    stop_ids: frozenset = frozenset()  # token ids that end it: stop_token_ids + EOS (engine.add)
    length_cap: int = 0              # min(prompt + max_tokens, max_model_len): the
    #                                  token count that ends it (the one length rule: the
    #                                  step's update and the scheduler's look at pending
    #                                  tokens both compare num_tokens with it; the
    #                                  scheduler applies max_model_len when it is added)
    pending_row: int = -1            # async scheduling: its sample row in the step in flight
    #                                  while its last output token (PENDING_TOKEN) is unread
    greedy: bool = field(init=False, default=True)   # params.greedy, read once per step
    processed: bool = field(init=False, default=False)   # params.needs_processing, read
    #                                  once per step (the sampler's slower path)
    plain_greedy: bool = field(init=False, default=True)  # greedy and not processed
    alters_logits: bool = field(init=False, default=False)   # params.alters_logits, read
    #                                  once per step
    argmax_row: bool = field(init=False, default=True)   # greedy, no field alters its
    #                                  logits: its token is the logits' argmax (logprobs or not)
    logprobs_trace: list | None = None   # params.logprobs: the TokenLogprobs of its first
    #                                  TRACE_TOKENS output tokens (the TUI's token scrub),
    #                                  kept by setting last_logprobs
    prompt_logprobs: list | None = None   # params.prompt_logprobs: TokenLogprobs by prompt
    #                                  position (0: None), filled chunk by chunk; None once sent
    num_draft_tokens: int = 0        # speculative decoding: drafts verified for it,
    num_accepted_tokens: int = 0     # and accepted (engine/core/spec_decode.py)
    spec_quiet: int = 0              # steps its proposer is not waited for: set when the
    #                                  proposer found no draft for it (spec_decode.py)
    spec_trace: list = field(default_factory=list)   # its verifies with drafts: (first
    #                                  output index of the verify's tokens, tokens it emitted,
    #                                  drafted, accepted), those starting in its first
    #                                  TRACE_TOKENS tokens (spec_decode.py commit)
    # -- the TTFT split (vLLM's RequestStateStats names where they fit; the scheduler
    # sets them, on the serving clock): TTFT = queued + prefill before its last chunk +
    # the last chunk's step until the first token is emitted
    scheduled_ts: float | None = None    # first scheduled (its first admission, or a dedup
    #                                  join; vLLM: a preemption does not move it)
    last_chunk_ts: float | None = None   # its last prompt chunk (the one whose logits give
    #                                  the first token) was scheduled
    prefill_chunks: int = 0          # chunks scheduled before its first token, every admission
    prefill_preemptions: int = 0     # preemptions before its first token (their requeue
    #                                  and recompute count in the prefill part, as in vLLM)
    grammar: object = None           # structured outputs: its RequestGrammar (compile,
    #                                  matcher; engine/core/structured/manager.py)
    _last_logprobs: object = field(default=None, repr=False)

    @property
    def last_logprobs(self):
        """Its latest TokenLogprobs (params.logprobs set): the TUI's next-token view."""
        return self._last_logprobs

    @last_logprobs.setter
    def last_logprobs(self, lp) -> None:
        """One emitted token's logprobs (append_sampled sets it once per token of a request
        that asked): the latest, and the trace of its first TRACE_TOKENS tokens."""
        self._last_logprobs = lp
        trace = self.logprobs_trace
        if trace is None:
            trace = self.logprobs_trace = []
        if len(trace) < TRACE_TOKENS:
            trace.append(lp)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def __post_init__(self):
        self.length_cap = len(self.prompt_token_ids) + self.params.max_tokens
        self.greedy = self.params.greedy
        self.processed = self.params.needs_processing
        self.plain_greedy = self.greedy and not self.processed
        self.alters_logits = self.params.alters_logits
        self.argmax_row = self.greedy and not self.alters_logits
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)

    def token_slice(self, start: int, end: int) -> tuple[int, ...] | list[int]:
        """Tokens [start, end) of prompt + output, without joining the two sequences."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return [*self.prompt_token_ids[start:], *self.output_token_ids[:end - n]]

    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]

    @property
    def num_pending(self) -> int:
        """Output tokens sampled on the device but not read yet (0 or 1)."""
        return int(self.pending_row >= 0)

    def drop_pending(self) -> None:
        """The request ends before its pending token is read: it is never emitted."""
        if self.pending_row >= 0:
            self.output_token_ids.pop()
            self.pending_row = -1

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """Admitted and still computing more than the one pending decode token."""
        return self.status is RequestStatus.RUNNING and self.num_uncomputed > 1


_request_id = attrgetter("request_id")


def add_pending_tokens(requests: list[Request], first: int = 0) -> int:
    """Async scheduling: each running request of a step's sample rows (row i: requests[i],
    from row `first` on) with no token pending yet counts the token that step samples for
    it before its value is known (PENDING_TOKEN, vLLM V1's output placeholders), so the
    next step can be planned now: lengths, positions and slots include it. pending_row:
    its sample row (the runner feeds the next step's input from there). Returns how many
    it marked. One loop over a wide step."""
    running, pending, marked = RequestStatus.RUNNING, PENDING_TOKEN, 0
    for row in range(first, len(requests)):
        req = requests[row]
        if req.status is running and req.pending_row < 0:
            req.output_token_ids.append(pending)
            req.pending_row = row
            marked += 1
    return marked


def append_sampled(requests: list[Request], tokens: list[int], now: float, itls,
                   request_ids: list[str], token_ids: list[int], row_logprobs: list | None = None,
                   logprobs: list | None = None,
                   admits: list[int] | None = None) -> list[tuple[Request, str]]:
    """A step's tokens into their requests (a pending one resolves its placeholder; one
    that ended meanwhile takes none, nor one re-admitted since the step was launched:
    `admits`, each row's Request.admit_seq at launch, tells; a dedup follower sent back
    to the queue by its leader's cancel and admitted again recomputes its prompt and
    samples its own first token), with their times, the
    inter-token gaps (into `itls`), and the ids and tokens emitted (and, given
    row_logprobs, one per row, their logprobs into `logprobs`). Returns the requests
    a token ends, with the reason (stop token, or the length cap). One loop over a wide
    step, so inlined."""
    running, ended, skipped = RequestStatus.RUNNING, [], []
    for req, token, admit in zip(requests, tokens, repeat(None) if admits is None else admits):
        out = req.output_token_ids
        if req.pending_row >= 0:   # planned with it (even if preempted since)
            out[-1] = token
            req.pending_row = -1
        elif req.status is running and (admit is None or admit == req.admit_seq):
            out.append(token)
        else:
            skipped.append(id(req))    # cancelled (or re-admitted) meanwhile
            continue
        times = req.token_times
        if times:
            itls.append((now, now - times[-1]))
        times.append(now)
        if token in req.stop_ids:
            ended.append((req, REASON_STOP))
        elif len(req.prompt_token_ids) + len(out) >= req.length_cap:
            ended.append((req, REASON_LENGTH))
    if skipped:                    # rare: emit the others only
        skip = set(skipped)
        kept = [id(r) not in skip for r in requests]
        requests = [r for r, k in zip(requests, kept) if k]
        tokens = [t for t, k in zip(tokens, kept) if k]
        if row_logprobs is not None:
            row_logprobs = [lp for lp, k in zip(row_logprobs, kept) if k]
    request_ids.extend(map(_request_id, requests))
    token_ids.extend(tokens)
    if row_logprobs is not None:
        attach_logprobs(requests, row_logprobs, logprobs)
    return ended


def attach_logprobs(requests: list[Request], row_logprobs: list, logprobs: list) -> None:
    """The logprobs of a step's emitted rows (one entry each, None where not asked) into
    the step's `logprobs`, and each asked one as its request's latest distribution."""
    logprobs.extend(row_logprobs)
    for req, lp in zip(requests, row_logprobs):
        if lp is not None:
            req.last_logprobs = lp
