"""Whether the live engine can serve, as the top line shows it.

An engine process that dies publishes no last snapshot saying so: the one on screen
carries no error and the app would keep reading SERVING. The client knows (its
`unavailable` and `fatal_error`), so the app asks it here and hands the status bar
plain values.
"""
from __future__ import annotations

SERVING = ("", False)


def engine_down(src) -> tuple[str, bool]:
    """(why the engine cannot serve now, whether it stopped for good); ("", False) while
    it serves, and always for a replay (its engine is a recording)."""
    if src is None or src.kind != "live":
        return SERVING
    sides = getattr(src, "sides", None)
    if sides is None:
        return client_down(getattr(src, "loop", None))
    from roseplay.tui.compare import SIDES     # two engines: the first one down, named
    downs = [(f"{name}: {why}", stopped) for name, side in zip(SIDES, sides)
             for why, stopped in [client_down(side.loop)] if why]
    return max(downs, key=lambda d: d[1], default=SERVING)   # a stopped one first


def side_downs(src) -> list[tuple[str, bool]]:
    """Each compared engine's own state, for its own column (a replay's: serving)."""
    sides = getattr(src, "sides", None) or ()
    if src is None or src.kind != "live":
        return [SERVING] * max(2, len(sides))
    return [client_down(getattr(side, "loop", None)) for side in sides]


def client_down(loop) -> tuple[str, bool]:
    """One client's state: stopped for good once it has a fatal error (its process died,
    or every replica's did); unavailable without one while it attaches again."""
    why = getattr(loop, "unavailable", None) if loop is not None else None
    if not why:
        return SERVING
    return str(why), getattr(loop, "fatal_error", None) is not None


def kv_events_endpoints(src) -> list[str]:
    """Where the live engine publishes its KV events (kv_events_config; every replica's
    with data parallelism), as its clients' Welcome said: [] with none, in-process (only
    an engine process publishes) or in a replay."""
    if src is None or src.kind != "live" or getattr(src, "sides", None) is not None:
        return []
    loop = getattr(src, "loop", None)
    clients = getattr(loop, "replicas", None) or [loop]
    found = (getattr(getattr(c, "transport", None), "kv_events", None) for c in clients)
    return [ev.endpoint for ev in found if ev is not None]
