"""The engine's configs given as vLLM's JSON (`--speculative-config`,
`--kv-events-config`): their fields, checks and parsing. engine/config.py holds them in
EngineConfig and re-exports them (import them from there)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from engine.errors import InvalidRequestError

# draft_model (alias "draft"): a smaller model (docs/SPECULATIVE.md); other proposers
# are handed to the Python API (LLMEngine / LLM `proposer=`), never named here
SPECULATIVE_METHODS = ("ngram", "draft_model")
SPECULATIVE_ALIASES = {"draft": "draft_model"}
MAX_SPECULATIVE_TOKENS = 16
DEFAULT_SPECULATIVE_TOKENS = 3   # k when a speculative_config gives none
# speculative_config.disable_by_batch_size when none is given: past this many decoding
# requests a step drafts nothing. A verify row is compute like any decode row; a batch
# this large already keeps the device's arithmetic busy, so its rejected drafts cost
# throughput and accepted ones win little (docs/SPECULATIVE.md "The off-switch").
DEFAULT_DISABLE_BY_BATCH_SIZE = 32
KV_EVENT_PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config (its field names): how drafts are proposed. Fixed at
    start. k is not kept here: the JSON's `num_speculative_tokens` is the start value of
    the live knob SchedulerConfig.num_speculative_tokens, k's one home, which turns
    speculation on and off (split_speculative_config; docs/SPECULATIVE.md)."""
    method: str = "ngram"
    prompt_lookup_min: int = 1      # n-gram sizes matched, longest first
    prompt_lookup_max: int = 4
    # method draft_model: the draft's checkpoint (same vocabulary as the target); None on
    # the bundled default target: the bundled draft (engine/assets/shakespeare-draft)
    model: str | None = None
    # more requests decoding than this: the step proposes no drafts and runs as a plain
    # decode step (vLLM's disable_by_batch_size; None: never off)
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self):
        """Every field's type and range (a JSON value of any type may arrive here from
        `--speculative-config`: each is refused with InvalidRequestError, never a
        TypeError)."""
        if not isinstance(self.method, str):
            raise InvalidRequestError(f"speculative_config method must be a string, got "
                                      f"{self.method!r:.60}")
        object.__setattr__(self, "method", SPECULATIVE_ALIASES.get(self.method, self.method))
        if self.method not in SPECULATIVE_METHODS:
            raise InvalidRequestError(f"speculative_config method must be one of "
                                      f"{', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) \
                or not 1 <= lo <= hi <= 64:
            raise InvalidRequestError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max <= 64, "
                                      f"got {lo!r}, {hi!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise InvalidRequestError(f"speculative_config model must be a non-empty string, "
                                      f"got {self.model!r}")
        n = self.disable_by_batch_size
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            # vLLM's bound: 1 would switch speculation off at any batch but one request
            raise InvalidRequestError(f"speculative_config disable_by_batch_size must be null "
                                      f"(never off) or an integer >= 2, got {n!r:.60}")

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        """From a SpeculativeConfig, a dict, or vLLM's JSON text (`--speculative-config`),
        its k checked (and left to split_speculative_config's caller)."""
        return split_speculative_config(value)[0]


def split_speculative_config(value) -> tuple[SpeculativeConfig | None, int | None]:
    """vLLM's speculative_config (a SpeculativeConfig, a dict or JSON text) and the
    `num_speculative_tokens` it gives (None: none given), checked: EngineConfig makes
    that k the live knob's start value."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value, None
    fields = dict(json_object(value, "speculative_config"))
    k = fields.pop("num_speculative_tokens", None)
    config = parse_json_config(SpeculativeConfig, fields, "speculative_config")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)
                          or not 1 <= k <= MAX_SPECULATIVE_TOKENS):
        raise InvalidRequestError(f"num_speculative_tokens must be an integer in "
                                  f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
    return config, k


def json_object(value, name: str) -> dict:
    """A flag's JSON object (text or an already parsed dict), refused by name if not."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"{name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{name} must be an object, got {value!r:.60}")
    return value


def parse_json_config(cls, value, name: str):
    """A config dataclass from an instance, a dict, or JSON text (a flag's value); None
    stays None; unknown fields are refused by name."""
    if value is None or isinstance(value, cls):
        return value
    value = json_object(value, name)
    unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise InvalidRequestError(f"unknown {name} field(s): {', '.join(sorted(unknown))}")
    return cls(**value)


def check_type(name: str, value, types, low=None) -> None:
    """`value` is one of `types` (a bool only where bool is one), finite, >= low if given
    (NaN passed a low bound, and inf was taken as a weight)."""
    if isinstance(value, bool) and bool not in types or not isinstance(value, types) \
            or (isinstance(value, float) and not math.isfinite(value)) \
            or (low is not None and value < low):
        bound = f" >= {low}" if low is not None else ""
        raise InvalidRequestError(f"{name} must be {'/'.join(t.__name__ for t in types)}"
                                  f"{bound}, got {value!r:.60}")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig (its field names): the engine publishes its KV cache events
    (BlockStored, BlockRemoved, AllBlocksCleared in vLLM's wire format) on a ZMQ PUB
    socket, and keeps the last `buffer_steps` batches for a late subscriber's replay
    (docs/ROUTING.md "KV events"). The sockets are CURVE servers keyed by the engine
    key, as every engine socket (a non-loopback bind needs a given key)."""
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"            # "null": publish nothing
    # tcp://HOST:PORT or ipc:///PATH; None: next to the engine address (its PORT+3 and
    # PORT+4, or PATH.kv-events and PATH.kv-replay). A given endpoint of replica r of
    # data parallelism binds PORT+r (ipc: PATH_dp<r>), as vLLM's
    endpoint: str | None = None
    replay_endpoint: str | None = None   # None with a given endpoint: no replay socket
    buffer_steps: int = 10_000        # batches kept for replay
    hwm: int = 100_000                # the PUB socket's high-water mark (messages)
    max_queue_size: int = 100_000     # batches queued for the publisher thread; past it
    #                                   a batch is dropped (its sequence number is skipped)
    topic: str = ""

    def __post_init__(self):
        check_type("enable_kv_cache_events", self.enable_kv_cache_events, (bool,))
        if self.publisher not in KV_EVENT_PUBLISHERS:
            raise InvalidRequestError(f"kv_events_config publisher must be one of "
                                      f"{', '.join(KV_EVENT_PUBLISHERS)}, got "
                                      f"{self.publisher!r:.60}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not _zmq_endpoint(value):
                raise InvalidRequestError(f"kv_events_config {name} must be tcp://HOST:PORT "
                                          f"or ipc:///PATH, got {value!r:.60}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            check_type(name, getattr(self, name), (int,), 1)
        check_type("topic", self.topic, (str,))

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, value) -> "KVEventsConfig | None":
        """From a KVEventsConfig, a dict, or vLLM's JSON text (`--kv-events-config`)."""
        return parse_json_config(cls, value, "kv_events_config")


def _zmq_endpoint(value) -> bool:
    """tcp://HOST:PORT (a port number, or * for one the system picks) or ipc:///PATH:
    what zmq binds, refused here in one line rather than at the bind."""
    if not isinstance(value, str):
        return False
    if value.startswith("ipc://"):
        return len(value) > len("ipc://")
    host, _, port = value.removeprefix("tcp://").rpartition(":")
    return value.startswith("tcp://") and bool(host) and (
        port == "*" or port.isdigit() and 0 < int(port) < 65536)


# vLLM's names; "llguidance" (the library's) is read as "guidance"
STRUCTURED_OUTPUTS_BACKENDS = ("auto", "guidance", "llguidance", "xgrammar")


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """vLLM's structured_outputs_config (its field names where it has them): the grammar
    library, and the bounds of compiling (docs/STRUCTURED_OUTPUTS.md). Fixed at start."""
    backend: str = "auto"             # auto: guidance (llguidance), xgrammar where llguidance
    #                                   cannot read the tokenizer; or either one
    compile_timeout: float = 10.0     # seconds a request may wait for its grammar
    grammar_cache_size: int = 256     # compiled grammars kept (least recently used go)
    # JSON: no whitespace but ", " and ": " (True, roseplay's default), or any between
    # tokens (False, vLLM's: a small model can fill it with newlines)
    disable_any_whitespace: bool = True
    # JSON: an object schema that lists properties takes no others unless it says so
    # (True: what vLLM's default backend, xgrammar, does in its strict mode; False: JSON
    # Schema's reading, unlisted properties allowed; both backends)
    disable_additional_properties: bool = True
    # vLLM's "no other backend on a grammar error": what this engine always does (auto
    # picks one backend at start, never another per request), so either value is kept
    disable_fallback: bool = False

    def __post_init__(self):
        if self.backend not in STRUCTURED_OUTPUTS_BACKENDS:
            raise InvalidRequestError(f"structured_outputs_config backend must be one of "
                                      f"{', '.join(STRUCTURED_OUTPUTS_BACKENDS)}, got "
                                      f"{self.backend!r:.60}")
        if self.backend == "llguidance":
            object.__setattr__(self, "backend", "guidance")
        t = self.compile_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            raise InvalidRequestError(f"compile_timeout must be in (0, 3600] seconds, got "
                                      f"{t!r:.60}")
        n = self.grammar_cache_size
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1 << 16:
            raise InvalidRequestError(f"grammar_cache_size must be an integer in [0, 65536], "
                                      f"got {n!r:.60}")
        for name in ("disable_any_whitespace", "disable_additional_properties",
                     "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"structured_outputs_config {name} must be a boolean")

    @classmethod
    def parse(cls, value) -> "StructuredOutputsConfig":
        """From itself, a dict, or JSON text (`--structured-outputs-config`); None: the
        defaults."""
        return parse_json_config(cls, value, "structured_outputs_config") or cls()
