"""The range rules every knob and request field is checked with: an int (not a bool) in
[lo, hi], a finite number in [lo, hi]. A module of their own so that engine/config.py
(the knobs) and engine/validation.py (the requests, which reads the config's bounds)
share one rule and one message without importing each other both ways."""
from __future__ import annotations

import math

from engine.errors import InvalidRequestError

MAX_SEED = 2 ** 64 - 1   # torch generators take 64 bits (the engine's seed, a request's)
# a request's seed may be any signed 64-bit value too, as vLLM's server takes it; torch
# seeds a generator with a negative one's two's complement (-1 as 2**64 - 1): seed_bits
MIN_SEED = -2 ** 63
MAX_PRIORITY = 2 ** 31 - 1   # a request's priority lies in [-MAX_PRIORITY - 1, MAX_PRIORITY]


def seed_bits(seed: int) -> int:
    """The 64 bits torch's manual_seed makes of a seed (the same generator): a negative
    one's two's complement, a sum past MAX_SEED wrapped."""
    return seed & MAX_SEED


def show(value) -> str:
    """A refused value as a message quotes it (bounded: a client's value may be huge)."""
    return repr(value)[:60]


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    """An int (not a bool) in [lo, hi] (>= lo without hi)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo \
            or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidRequestError(f"{name} must be an integer {bound}, got {show(value)}")
    return value


def check_number(name: str, value, lo: float, hi: float, lo_open: bool = False) -> float:
    """A finite int or float (not a bool) in [lo, hi] ((lo, hi] with lo_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and math.isnan(value)):
        raise InvalidRequestError(f"{name} must be a number, got {show(value)}")
    inside = (lo < value if lo_open else lo <= value) and value <= hi
    if not inside:
        raise InvalidRequestError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], "
                                  f"got {show(value)}")
    return value


def check_priority(priority) -> int:
    """A request's priority (vLLM: lower is served first): an int32."""
    return check_int("priority", priority, -MAX_PRIORITY - 1, MAX_PRIORITY)
