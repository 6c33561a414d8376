"""GET /server_info (SGLang's, and vLLM's dev endpoint of that name): what a router in
front of several servers reads to learn which model a worker serves. SGLang's router
(`sglang-router`) lists a worker's model in its own /v1/models from `served_model_name`
(else `model_path`); without this route it listed "unknown", and a client that takes
the model from /v1/models (`roseplay bench --base-url`) asked for a model named unknown.
Keyed like /v1/* under --api-key (gate.py): it tells what /v1/models tells."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from roseplay import __version__

server_info_router = APIRouter()


@server_info_router.get("/server_info")
async def server_info(request: Request):
    st = request.app.state.serve
    return JSONResponse({"model_path": st.loop.info.model_name,
                         "served_model_name": st.model_names[0],
                         "served_model_names": list(st.model_names),
                         "max_model_len": st.max_model_len,
                         "version": __version__})
