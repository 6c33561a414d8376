"""`roseplay serve --api-server-count 2` as a real subprocess (GroupProc: it also knows
the API-server processes and the metrics folder, and checks that they are gone at the
end), and /metrics read back as samples: shared by tests/roseplay/serve/test_serve_multiproc.py
and test_serve_liveness.py."""
from __future__ import annotations

import os
import shutil
import signal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import children
from tests.roseplay.serve.serve_proc import ServeProc, alive


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(kv.split("=", 1) for kv in f.read().decode().split("\0") if "=" in kv)


class GroupProc(ServeProc):
    """ServeProc with --api-server-count 2: also knows the API-server processes and the
    metrics directory, and checks that they are gone at the end."""

    def __init__(self, *args: str, env: dict | None = None):
        super().__init__("--api-server-count", "2", *args, env=env)
        self.api_pids: list[int] = []
        self.metrics_dir: str | None = None

    def _engine_pid(self) -> int:
        kids = children(self.proc.pid)
        self.api_pids = [k for k in kids if "roseplay.serve.multiproc" in cmdline(k)]
        engine = [k for k in kids if "engine.ipc.core_proc" in cmdline(k)]
        assert len(self.api_pids) == 1 and len(engine) == 1, kids
        self.engine_pids = engine
        env = environ_of(self.api_pids[0])
        assert "ROSEPLAY_ENGINE_KEY" not in cmdline(self.api_pids[0])
        self.metrics_dir = env["PROMETHEUS_MULTIPROC_DIR"]
        assert os.stat(self.metrics_dir).st_mode & 0o077 == 0      # private
        return engine[0]

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:     # the module's server (a test failed): stop it
            self.signal(signal.SIGINT)
            self.signal(signal.SIGINT)   # a second Ctrl-C: no drain
            try:
                self.wait(60)
            except Exception:            # noqa: BLE001 - killed below
                for pid in self.api_pids:
                    if alive(pid):
                        os.kill(pid, signal.SIGKILL)
        super().__exit__(*exc)
        if self.metrics_dir:             # what a killed serve process cannot remove
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def assert_clean(self) -> None:
        super().assert_clean()
        assert not any(alive(pid) for pid in self.api_pids), "an API server outlived serve"
        assert not os.path.exists(self.metrics_dir), self.metrics_dir


def scrape(url: str) -> dict[tuple, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, lab), v in samples.items()
               if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def per_server(samples: dict) -> dict[str, float]:
    return {dict(lab)["api_server"]: v for (n, lab), v in samples.items()
            if n == "roseplay:api_server_requests_total"}
