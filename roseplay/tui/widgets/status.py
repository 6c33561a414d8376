"""The top line: serving/paused/stopped, step, replay position, errors, the decode
path, then the model and device, the KV pool's size and where KV events go."""
from __future__ import annotations

import re

from rich.text import Text
from textual.widget import Widget


# the attention backend serving (EngineSnapshot.backend), as the decode path it runs:
# kernels/__init__.py picks cpu_native (the C layer) on a CPU with AVX-512, else torch_sdpa
DECODE_PATHS = {"cpu_native": "C layer (cpu_native)", "torch_sdpa": "torch_sdpa (no C layer)",
                "triton": "triton", "torch": "torch reference"}
SHORT_PATHS = {"cpu_native": "C layer", "torch_sdpa": "torch_sdpa", "triton": "triton",
               "torch": "torch ref"}
# what a narrow line gives up, least important first, each in addition to those before
# (the first: nothing); the step, the counts and the errors are never dropped
FORMS = ("", "kv events", "kv", "short hint", "device", "short decode", "decode", "hint", "model",
         "frame", "replay words")     # a replay's frame count, then its "playing"/"paused"


class StatusBar(Widget):
    DEFAULT_CSS = "StatusBar { height: 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text(" roseplay ", "bold reverse")
        self._args: tuple | None = None     # show's, for the shorter forms render builds
        self.kv_events: list[str] = []      # where the engine publishes KV events (each replica)

    def loading(self, message: str) -> None:
        t = Text(" roseplay ", "bold #111111 on #f2d34f")
        t.append(f"  {message}", "bold")
        self._args = None
        self._set(t)

    def show(self, snap, kind: str, paused: bool, position: str = "",
             workload: dict | None = None, unavailable: str = "",
             stopped: bool = False) -> None:
        """Most important first: mode, position, step, finished, the engine's error,
        requests the engine refused, then the decode path, the model and device. The
        line drawn is the fullest of FORMS that fits the width (render): 120 columns cut
        the end while paused or recording. `unavailable`: why a live engine cannot serve
        now (the client's word: a dead engine's last snapshot carries no error);
        `stopped`: for good."""
        self._args = (snap, kind, paused, position, workload or {}, unavailable, stopped)
        self._set(self._line(*self._args, 0))

    def _line(self, snap, kind, paused, position, workload, unavailable, stopped,
              level: int) -> Text:
        """The line at `level`: FORMS[1..level] shortened or dropped."""
        cut = set(FORMS[1:level + 1])
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" roseplay ", "bold #111111 on #f2d34f")
        t.append(" ")
        if kind == "replay":        # (80x24 cut a long one's "finished 488" to "finished…")
            t.append(" REPLAY ", "bold #111111 on #c792ea")
            t.append((" ❚❚ " if paused else " ▶ ") if "replay words" in cut else
                     " ❚❚ paused " if paused else " ▶ playing ", "bold")
            if "frame" in cut:
                position = re.sub(r"  frame \d+/\d+", "", position)
            t.append(position + "  ", "#c792ea")
            t.append("(recorded engine paused)  " if snap.paused else "", "dim")
        elif unavailable:       # in place of SERVING / PAUSED: the engine serves nothing now
            badge = " ■ STOPPED " if stopped else " ◌ UNAVAILABLE "
            t.append(badge, "bold #ffffff on #d63c3c" if stopped
                     else "bold #111111 on #ff9f43")
            t.append(f" {unavailable}  ", "bold #ff5555" if stopped else "bold #ff9f43")
        elif paused:
            t.append(" ❚❚ PAUSED ", "bold #111111 on #ff9f43")
            t.append("  " if "hint" in cut else "  n: step · space: resume  "
                     if "short hint" in cut else "  n: one step · space: resume  ", "dim")
        else:
            t.append(" ▶ SERVING ", "bold #111111 on #4cc97a")
            t.append("  ")
        if kind != "replay" and position:
            t.append(position, "bold #ff6b6b")
        t.append(f"step {snap.step}", "bold")
        t.append(f"  finished {snap.counters.finished}")
        n = workload.get("replicas")
        if n:           # data parallelism: the router's policy (u), before what a width cuts
            t.append(f"  DP={n} ", "bold")
            t.append(f"routing {workload.get('routing_policy')}", "bold #5fb3f0")
        if snap.error and snap.error != unavailable:
            t.append(f"  ⚠ {snap.error}", "bold #ff5555")
        refused = refusal(workload)
        if refused:
            t.append(f"  ⚠ {refused}", "bold #ff5555")
        if snap.backend and "decode" not in cut:
            t.append("  decode ", "dim")
            names = SHORT_PATHS if "short decode" in cut else DECODE_PATHS
            t.append(names.get(snap.backend, snap.backend), "bold")
        if "model" not in cut:
            t.append(f"  {snap.model} ", "bold")
            if "device" not in cut:
                t.append(f"· {snap.device} {snap.dtype}", "dim")
        tp, kv = snap.tensor_parallel_size, snap.kv_bytes_per_rank
        if kv and "kv" not in cut:
            where = f" x {tp} ranks (TP={tp})" if tp > 1 else ""
            t.append(f" · KV {kv / 2 ** 30:.2f} GiB{where}", "dim")
        if self.kv_events and "kv events" not in cut and kind != "replay":
            more = f" +{len(self.kv_events) - 1}" if len(self.kv_events) > 1 else ""
            t.append(f" · KV events {self.kv_events[0]}{more}", "dim")
        return t

    def _set(self, t: Text) -> None:
        if t != self._text:
            self._text = t
            self.refresh()

    def render(self) -> Text:
        """The fullest form that fits: the shorter ones are built here, on a redraw (a
        change or a resize), not on every frame's show."""
        width, t = self.size.width, self._text
        for level in range(1, len(FORMS) if self._args is not None else 1):
            if t.cell_len <= width:
                break
            t = self._line(*self._args, level)
        return t


def refusal(workload: dict) -> str:
    """The workload's requests the engine refused, and why (the latest reason)."""
    n = workload.get("refused") or 0
    if not n:
        return ""
    return f"{n} request{'s' if n > 1 else ''} refused: {workload.get('last_error') or '?'}"
