"""`roseplay serve --data-parallel-size 2` (two engine processes behind one router) as
clients see it when one replica is SIGKILLed while streams run on both: the dead
replica's streams end with an error event naming the death and [DONE], the live one's
run on to their solo tokens, /health stays 200, new requests (pinned to the dead one or
not) are served by the live replica, /metrics reads nothing running and no KV in use on
either, and SIGTERM then stops the server with exit code 0 and nothing left behind.
(engine/front/test_dp_attach.py kills a replica under the DP client itself.)"""
from __future__ import annotations

import os
import re
import signal

import httpx
import pytest

from tests.roseplay.serve.open_streams import Reader, solo_tokens
from tests.roseplay.serve.serve_proc import ServeProc, stream_body

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
MAX_TOKENS = 400
GAUGES = re.compile(r'^vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc)'
                    r'\{engine="(\d)"[^}]*\} (\S+)$', re.M)


def gauges(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(name, engine): float(v) for name, engine, v in GAUGES.findall(text)}


def test_a_killed_replica_ends_its_streams_only():
    with ServeProc("--data-parallel-size", "2", engines=2) as srv:
        ref = solo_tokens(srv.url, MAX_TOKENS)
        readers = [Reader(srv.url, stream_body(MAX_TOKENS, data_parallel_rank=i % 2))
                   for i in range(4)]
        for r in readers:
            r.start()
        for r in readers:
            assert r.first.wait(60)
        os.kill(srv.engine_pids[1], signal.SIGKILL)
        for i, r in enumerate(readers):
            ids, errors, reasons, done = r.result()
            assert done, i
            if i % 2 == 0:
                assert errors == [] and reasons == ["length"] and ids == ref, i
            else:
                assert len(errors) == 1 and "engine process died" in errors[0]["message"], i
                assert reasons == [] and len(ids) < MAX_TOKENS, i
        assert httpx.get(srv.url + "/health").status_code == 200
        for pin in (None, 1):
            body = {**stream_body(MAX_TOKENS), "stream": False, "data_parallel_rank": pin}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == ref, r.text
        replicas = httpx.get(srv.url + "/routing").json()["replicas"]
        assert [x["alive"] for x in replicas] == [True, False]
        assert all(v == 0 for v in gauges(srv.url).values())
        assert {engine for _, engine in gauges(srv.url)} == {"0", "1"}
        srv.signal(signal.SIGTERM)
        assert srv.wait() == 0, srv.output
