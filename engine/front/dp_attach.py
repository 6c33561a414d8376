"""Replicas attached by address: a data-parallel front (engine/front/dp_client.py) over
engine processes that run elsewhere (`roseplay serve --headless`, docs/ROUTING.md
"Replicas on other hosts").

Each address gets an EngineClient attached to it (the engine's key: the one given, else
the address's key file, engine/ipc/auth.py); closing it detaches and leaves the engine
serving. The engines must serve one model (tokenizer) in blocks of one size, answer a
request alike (the front fills and checks every request with replica 0's info, its pool
the smallest of theirs), and each
must publish its KV events (the router's index reads them): the endpoints come in each
engine's Welcome.
"""
from __future__ import annotations

from typing import Callable

from engine.config import InvalidRequestError, make_config
from engine.front.client import EngineClient

# the knobs of the front itself: the rest belong to the engines, set where they start
FRONT_KNOBS = ("routing_policy", "kv_overlap_score_weight", "data_parallel_size")
KV_EVENTS_FLAG = "--kv-events-config '{\"enable_kv_cache_events\": true}'"


def front_config(addresses: list[str], engine_kwargs: dict):
    """The front's config for `addresses` (its routing knobs); an engine knob, or a
    data_parallel_size other than the number of addresses, is refused."""
    if not addresses:
        raise InvalidRequestError("engine_addresses: give at least one engine address")
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    if twice:
        raise InvalidRequestError(f"engine address {twice[0]} given twice: one replica an "
                                  "engine")
    engine_only = sorted(k for k in engine_kwargs if k not in FRONT_KNOBS)
    if engine_only:
        raise InvalidRequestError(
            f"{', '.join(engine_only)}: engine settings of running engines cannot be set by "
            "a front that attaches to them (give them where each engine starts: "
            "`roseplay serve --headless`)")
    size = engine_kwargs.get("data_parallel_size", len(addresses))
    if size != len(addresses):
        raise InvalidRequestError(f"data_parallel_size {size} conflicts with the "
                                  f"{len(addresses)} engine addresses (one replica each)")
    return make_config(**{**engine_kwargs, "data_parallel_size": len(addresses)})


def attach_replicas(addresses: list[str], engine_key: str | None, label: str,
                    timeout: float, snapshots: bool,
                    on_progress: Callable[[str], None] | None = None) -> list[EngineClient]:
    """One EngineClient attached to each address, in order, checked to serve as one
    front's replicas (else each is detached and InvalidRequestError says why)."""
    clients: list[EngineClient] = []
    try:
        for r, address in enumerate(addresses):
            clients.append(EngineClient(connect=address, engine_key=engine_key,
                                        label=f"{label}-dp{r}", startup_timeout=timeout,
                                        snapshots=snapshots, on_progress=on_progress))
        check_replicas(clients)
    except BaseException:
        for c in clients:
            c.close()
        raise
    return clients


# what the front takes from replica 0's Welcome for every request (its checks, its
# grammar library, its defaults): a replica that differs would answer by the route
SAME_MODEL = ("model_name", "block_size", "vocab_size")
SAME_ANSWERS = ("max_model_len", "structured_outputs_backend", "logprobs_mode",
                "default_sampling_params", "override_max_tokens")


def check_replicas(clients: list[EngineClient]) -> None:
    """Every engine publishes KV events; all serve one model in blocks of one size and
    answer a request alike (one max_model_len, as vLLM's data-parallel ranks; one grammar
    library, logprobs mode and generation config). Their KV pools may differ: the front
    checks requests against the smallest (DPClient.info)."""
    for c in clients:
        if c.transport.kv_events is None:
            raise InvalidRequestError(
                f"the engine at {c.address} publishes no KV events, which the router's "
                f"index needs: start it with {KV_EVENTS_FLAG}")
    first = clients[0]
    for c in clients[1:]:
        for fields, what in ((SAME_MODEL, "serve one model in blocks of one size"),
                             (SAME_ANSWERS, "answer a request alike")):
            for field in fields:
                mine, theirs = getattr(first.info, field), getattr(c.info, field)
                if mine != theirs:
                    raise InvalidRequestError(
                        f"the engines must {what}: {field} is {mine!r} at {first.address} "
                        f"and {theirs!r} at {c.address}")
