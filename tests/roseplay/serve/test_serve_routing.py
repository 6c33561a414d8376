"""POST /routing's 400s (roseplay/serve/routing.py) name the body field, over a front
whose router is real and whose replicas are not needed (the policy is refused first)."""
from __future__ import annotations

from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.front.router import Router
from roseplay.serve.errors import install_handlers
from roseplay.serve.routing import routing_router


class OneRouterFront:
    """What /routing reads of a data-parallel front, as far as a refused change goes."""

    def __init__(self):
        self.router = Router(2, 16)

    def set_routing_policy(self, policy: str) -> str:
        self.router.policy = policy
        return policy


def test_an_unknown_policy_is_a_400_naming_policy():
    app = FastAPI()
    install_handlers(app, frozenset())
    app.include_router(routing_router)
    front = OneRouterFront()
    app.state.serve = SimpleNamespace(loop=front)
    with TestClient(app) as client:
        r = client.post("/routing", json={"policy": "fastest"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "policy" and "'fastest'" in err["message"], err
    assert front.router.policy == "least_load"
