"""The top line: serving/paused/stopped, step, replay position, errors, the decode
path, then the model and device."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


# the attention backend serving (EngineSnapshot.backend), as the decode path it runs:
# kernels/__init__.py picks cpu_native (the C layer) on a CPU with AVX-512, else torch_sdpa
DECODE_PATHS = {"cpu_native": "C layer (cpu_native)", "torch_sdpa": "torch_sdpa (no C layer)",
                "triton": "triton", "torch": "torch reference"}


class StatusBar(Widget):
    DEFAULT_CSS = "StatusBar { height: 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text(" roseplay ", "bold reverse")

    def loading(self, message: str) -> None:
        t = Text(" roseplay ", "bold #111111 on #f2d34f")
        t.append(f"  {message}", "bold")
        self._set(t)

    def show(self, snap, kind: str, paused: bool, position: str = "",
             workload: dict | None = None, unavailable: str = "",
             stopped: bool = False) -> None:
        """Most important first (a narrow terminal cuts the end): mode, position, step,
        finished, the engine's error, requests the engine refused, then the model and
        device. `unavailable`: why a live engine cannot serve now (the client's word: a
        dead engine's last snapshot carries no error); `stopped`: for good."""
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" roseplay ", "bold #111111 on #f2d34f")
        t.append(" ")
        if kind == "replay":
            t.append(" REPLAY ", "bold #111111 on #c792ea")
            t.append(" ❚❚ paused " if paused else " ▶ playing ", "bold")
            t.append(position + "  ", "#c792ea")
            t.append("(recorded engine paused)  " if snap.paused else "", "dim")
        elif unavailable:       # in place of SERVING / PAUSED: the engine serves nothing now
            badge = " ■ STOPPED " if stopped else " ◌ UNAVAILABLE "
            t.append(badge, "bold #ffffff on #d63c3c" if stopped
                     else "bold #111111 on #ff9f43")
            t.append(f" {unavailable}  ", "bold #ff5555" if stopped else "bold #ff9f43")
        elif paused:
            t.append(" ❚❚ PAUSED ", "bold #111111 on #ff9f43")
            t.append("  n: one step · space: resume  ", "dim")
        else:
            t.append(" ▶ SERVING ", "bold #111111 on #4cc97a")
            t.append("  ")
        if kind != "replay" and position:
            t.append(position, "bold #ff6b6b")
        t.append(f"step {snap.step}", "bold")
        t.append(f"  finished {snap.counters.finished}")
        n = (workload or {}).get("replicas")
        if n:           # data parallelism: the router's policy (u), before what a width cuts
            t.append(f"  DP={n} ", "bold")
            t.append(f"routing {workload.get('routing_policy')}", "bold #5fb3f0")
        if snap.error and snap.error != unavailable:
            t.append(f"  ⚠ {snap.error}", "bold #ff5555")
        refused = refusal(workload or {})
        if refused:
            t.append(f"  ⚠ {refused}", "bold #ff5555")
        if snap.backend:
            t.append("  decode ", "dim")
            t.append(DECODE_PATHS.get(snap.backend, snap.backend), "bold")
        t.append(f"  {snap.model} ", "bold")
        t.append(f"· {snap.device} {snap.dtype}", "dim")
        tp, kv = snap.tensor_parallel_size, snap.kv_bytes_per_rank
        if kv:
            where = f" x {tp} ranks (TP={tp})" if tp > 1 else ""
            t.append(f" · KV {kv / 2 ** 30:.2f} GiB{where}", "dim")
        self._set(t)

    def _set(self, t: Text) -> None:
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        return self._text


def refusal(workload: dict) -> str:
    """The workload's requests the engine refused, and why (the latest reason)."""
    n = workload.get("refused") or 0
    if not n:
        return ""
    return f"{n} request{'s' if n > 1 else ''} refused: {workload.get('last_error') or '?'}"
