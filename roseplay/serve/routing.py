"""GET /routing and POST /routing: a data-parallel server's router (docs/ROUTING.md) — each
replica's load, the blocks its KV events say it caches, what was routed to it, the last
decisions with their costs — and its policy, switched live. Keyed like /v1/* when the
server has --api-key. A server of one engine answers 404."""
from __future__ import annotations

import dataclasses

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.config import ROUTING_POLICIES, InvalidRequestError
from roseplay.serve.body import parse_body
from roseplay.serve.errors import OpenAIError, invalid

routing_router = APIRouter()
RECENT_SHOWN = 16


class RoutingChange(msgspec.Struct, forbid_unknown_fields=True):
    policy: str


def _front(request: Request):
    loop = request.app.state.serve.loop
    if not hasattr(loop, "router"):
        raise OpenAIError(404, "this server has one engine: routing needs "
                               "--data-parallel-size N", code="not_data_parallel")
    return loop


def routing_state(dp) -> dict:
    """The router's state as JSON-ready data (the routing card's too)."""
    loads, router = dp.loads(), dp.router
    return {
        "policy": router.policy, "policies": list(ROUTING_POLICIES),
        "kv_overlap_score_weight": router.weight,
        "replicas": [{"engine": r, "alive": load.alive, "waiting": load.waiting,
                      "running": load.running, "active_blocks": load.active_blocks,
                      "cached_blocks": len(dp.kv_index.caches[r].hashes),
                      "host_cached_blocks": len(dp.kv_index.caches[r].host),
                      "routed": router.routed[r]} for r, load in enumerate(loads)],
        "recent": [{**{k: v for k, v in dataclasses.asdict(d).items() if k != "loads"},
                    "costs": [c if c != float("inf") else None for c in d.costs]}
                   for d in list(router.recent)[-RECENT_SHOWN:]]}


@routing_router.get("/routing")
async def routing(request: Request):
    return JSONResponse(routing_state(_front(request)))


@routing_router.post("/routing")
async def set_routing(request: Request):
    dp = _front(request)
    change = parse_body(RoutingChange, await request.body())
    try:
        dp.set_routing_policy(change.policy)
    except InvalidRequestError as exc:     # an unknown policy: the 400 names the field
        raise invalid(str(exc), "policy") from None
    return JSONResponse(routing_state(dp))
