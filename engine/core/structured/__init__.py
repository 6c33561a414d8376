"""Structured outputs in the engine core (docs/STRUCTURED_OUTPUTS.md): the grammar
library behind one interface (guidance.py: llguidance, the default; xgrammar_backend.py,
the alternative; common.py what they share), the compile pool and cache (compiler.py),
each request's matcher and the one packed bitmask per step (manager.py; its host
buffers: engine/worker/host_masks.py), the vocabulary the grammars mask over (vocab.py)
and the TUI's view of a step (view.py)."""
from __future__ import annotations

from engine.core.structured.common import GrammarError
from engine.core.structured.manager import StructuredOutputManager
from engine.core.structured.vocab import synthetic_tokenizer_json, tokenizer_json


def make_manager(config, tokenizer, vocab_size: int, eos_ids: tuple[int, ...],
                 pinned: bool, counters) -> StructuredOutputManager:
    """The engine's structured-outputs manager; its backend is built by the first
    compile (on the compile pool), from the model's tokenizer, or a synthetic
    vocabulary for a model without one (dummy presets)."""
    so = config.structured_outputs_config
    eos_ids = tuple(eos_ids) or (vocab_size - 1,)   # a grammar needs an end: a model
    #                                                without an EOS ends on its last id

    def build():
        text = tokenizer_json(tokenizer)
        if text is None:
            if tokenizer is not None:
                raise GrammarError("structured outputs need a fast tokenizer "
                                   "(tokenizer.json); this model's has none")
            text = synthetic_tokenizer_json(vocab_size, eos_ids)
        args = (text, vocab_size, eos_ids, so)
        if so.backend == "xgrammar":
            return _xgrammar(*args)
        from engine.core.structured.guidance import GuidanceBackend
        try:
            return GuidanceBackend(*args)
        except (ValueError, RuntimeError):   # a tokenizer llguidance cannot read: auto tries
            if so.backend != "auto":    # xgrammar's reading of it
                raise
            return _xgrammar(*args)

    return StructuredOutputManager(so, build, pinned, counters)


def _xgrammar(*args):
    from engine.core.structured.xgrammar_backend import XGrammarBackend   # (its import
    return XGrammarBackend(*args)           # takes seconds: only when it is the backend)


__all__ = ["GrammarError", "StructuredOutputManager", "make_manager"]
