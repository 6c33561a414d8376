"""What a source's requests carry, as the Selected panel and the token scrub say it: the
logprobs' mode and why a request has no text."""
from __future__ import annotations


def logprobs_mode(src, snap) -> str | None:
    """What the requests' logprobs hold: the live engine's mode, or the one a recording
    kept, else the snapshot's (None: not known, so no next-token choices are shown)."""
    info = getattr(src, "info", None) if src.kind == "live" else None
    return getattr(info, "logprobs_mode", None) or getattr(snap, "logprobs_mode", None) or None


def no_text_reason(src) -> str:
    """Why a request's output has no text: the model has no tokenizer, or the recording
    kept none (made before recordings kept the text, or of such a model)."""
    header = getattr(src, "header", None)
    if src.kind == "replay" and isinstance(header, dict) and not header.get("text"):
        return "no text in this recording"     # (no tokenizer, or made before text was kept)
    return "this model has no tokenizer: no text"
