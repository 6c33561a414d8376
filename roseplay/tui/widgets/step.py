"""This step: what the last engine step did with its token budget."""
from __future__ import annotations

from functools import partial

from rich.text import Text
from textual.widget import Widget

from roseplay.tui.widgets import theme
from roseplay.tui.widgets.borders import WidthBorders
from roseplay.tui.widgets.reshow import ReshownOnResize
from roseplay.tui.widgets.stopped import caption_borders

EMPTY = "#3a3f4a"


def budget_bar(decode: int, prefill: int, budget: int, width: int) -> Text:
    """decode | prefill | unused, in proportion to the token budget."""
    DECODE, PREFILL = theme.color("decode"), theme.color("prefill")
    total = max(budget, decode + prefill, 1)
    d = round(decode / total * width)
    p = min(width - d, round(prefill / total * width))
    if decode and not d:
        d = 1
    if prefill and not p and d < width:
        p = 1
    t = Text("█" * d, DECODE)
    t.append("█" * p, PREFILL)
    t.append("░" * max(0, width - d - p), EMPTY)
    return t


def chunk_words(step, snap, width: int = 0) -> Text:
    """This step's prefill chunks, as many whole ones as fit `width` (0: four), then
    how many more (two chunks at 120x40 read `… [259:266/266] …`: the second was cut)."""
    budget = snap.knobs.max_num_batched_tokens
    chunks, shown = step.prefill_chunks, []
    for c in chunks[:4]:
        view = snap.request(c.request_id)
        t = Text(c.request_id, "bold")
        if view is not None and view.chunks_done:
            t.append(f" chunk {view.chunks_done}/{view.chunks_total(budget)}")
        t.append(f" {c.num_tokens} tok", theme.color("prefill"))
        shown.append((t, Text(f" [{c.start}:{c.start + c.num_tokens}/{c.total}]", "dim")))
    for n in range(len(shown), 0, -1):          # the most chunks that fit, ranges first
        for ranges in (True, False):
            t = Text(" · ").join(head + tail if ranges else head for head, tail in shown[:n])
            if len(chunks) > n:
                t.append(f" · +{len(chunks) - n} more", "dim")
            if not width or t.cell_len <= width:
                return t
    return t


def spec_words(step, k: int, method: str = "", pause: str = "", width: int = 0) -> Text:
    """Speculative decoding this step: the method and k, drafts proposed and accepted,
    the acceptance % (nothing while speculation is off); `pause`: why the step drafted
    nothing (EngineSnapshot.spec_pause: too many requests decoding). The longest form
    that fits `width` (0: any): cut, it read `(19%, 7 req, ngram k…` at 120x40."""
    forms = spec_forms(step, k, method, pause)
    return next((t for t in forms if not width or len(t.plain.rstrip()) <= width),
                forms[-1] if forms else Text())


def spec_forms(step, k: int, method: str, pause: str) -> list[Text]:
    """spec_words' forms, longest first."""
    name = f"{method} " if method else ""
    if pause:
        brief = pause.replace("speculation off", "off")
        return [Text.assemble((f"spec {name}k={k}: ", "bold"), (pause, theme.color("prefill"))),
                Text.assemble((f"spec {name}k={k} ", "bold"), (brief, theme.color("prefill"))),
                Text.assemble(("spec ", "bold"), (brief, theme.color("prefill"))),
                Text.assemble(("spec ", "bold"), (brief.replace("disable_by_batch_size ", ""),
                                                  theme.color("prefill")))]
    if step.spec_verified:
        d, a, n = step.spec_draft_tokens, step.spec_accepted_tokens, step.spec_verified
        share = f"{100 * a / max(1, d):.0f}%"
        tails = [f" ({share}, {n} req{f', {method}' if method else ''} k={k})",
                 f" ({share}) {n} req {name}k={k}", f" ({share}) k={k}"]
        return [Text.assemble(("spec ", "bold"), f"{d} drafted → ",
                              (f"{a} accepted", theme.color("decode")), tail)
                for tail in tails]
    if k:
        return [Text(f"spec {name}k={k}: no drafts this step", "dim"),
                Text(f"spec k={k}: no drafts", "dim")]
    return []


class StepPanel(ReshownOnResize, WidthBorders, Widget):
    """Decode vs prefill tokens against the budget, chunks, prefix hits, COW, evictions."""

    DEFAULT_CSS = "StepPanel { height: 7; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()
        self._key = None

    def show(self, snap, stopped: bool = False, replica: int | None = None) -> None:
        """`stopped`: the engine stopped for good after this step: it is the last one,
        and its counts are of then (ran, waited), not of now. `replica`: data
        parallelism's replica that ran it (its own step number, running and waiting)."""
        self.redraw_on_resize(partial(self.show, snap, stopped, replica))
        key = (snap.last_step, snap.knobs.max_num_batched_tokens, snap.paused, self.size.width,
               theme.generation(), snap.knobs.num_speculative_tokens, stopped, replica)
        if key == self._key:
            return
        self._key = key
        self._text = self._build(snap, stopped, replica)
        self.set_borders(partial(caption_borders, snap.step if stopped else None, ""))
        self.refresh()

    def _build(self, snap, stopped: bool = False, replica: int | None = None) -> Text:
        s, budget = snap.last_step, snap.knobs.max_num_batched_tokens
        t = Text(no_wrap=True, overflow="ellipsis")
        if s is None:
            return t.append("no step: the engine stopped before its first" if stopped else
                            "no step yet: the engine is waiting for requests", "dim")
        # the top line's number: last_step is that step (StepStats.step is 1-based in a
        # live engine; recordings made before 2026-11 stored it 0-based)
        word = "last step" if stopped else "step"
        step = f"{word} {snap.step}"
        ms, counts = f"  {s.duration * 1000:7.1f} ms   ", (
            f"ran {s.num_running}  waited {s.num_waiting}" if stopped else
            f"running {s.num_running}  waiting {s.num_waiting}")
        if replica is not None:     # the replicas' steps are counted apart (snap.step sums)
            step = f"replica {replica} {word} {s.step}"
            if len(step + ms + counts) > (self.size.width or 80):
                step, ms = f"r{replica} {word} {s.step}", f"  {s.duration * 1000:.1f} ms  "
        t.append(step, "bold")
        t.append(ms)
        t.append(counts + "\n")
        used = s.decode_tokens + s.prefill_tokens
        t.append("budget ")
        t.append_text(budget_bar(s.decode_tokens, s.prefill_tokens, budget,
                                 max(10, self.size.width - 22)))
        t.append(f" {used:>5}/{budget} tok\n")
        t.append("■", theme.color("decode"))
        t.append(f" decode {s.decode_tokens} tok   ")
        t.append("■", theme.color("prefill"))
        n = len(s.prefill_chunks)
        t.append(f" prefill {s.prefill_tokens} tok in {n} chunk{'' if n == 1 else 's'}\n")
        spec = spec_words(s, snap.knobs.num_speculative_tokens,    # before the chunks: a
                          snap.spec_method, snap.spec_pause,      # long list is cut, not it
                          self.size.width or 80)
        t.append_text(spec)
        room = (self.size.width or 80) - len(spec.plain) - len("   prefill ") - 8
        # the chunks after the spec words only where they have room: the line's "…"
        # fell on the spec words (`ngram k=…`), and "prefill -" says nothing there
        if (s.prefill_chunks and room >= 0) or not spec:
            t.append("   " if spec else "")
            t.append("prefill ", "dim")
            left = (self.size.width or 80) - len(spec.plain) - (3 if spec else 0) - 8
            t.append_text(chunk_words(s, snap, max(1, left)) if s.prefill_chunks
                          else Text("-", "dim"))
        t.append("\n")
        counts = (("hit blocks", "hit", s.prefix_hit_blocks), ("COW", "COW", s.cow_copies),
                  ("evict", "ev", s.evictions), ("preempt", "pre", s.preemptions),
                  ("dedup", "dedup", s.dedup_joined))
        if snap.host_num_blocks:    # the host tier: blocks copied out and back this step
            counts += (("→host", "→h", s.blocks_to_host), ("←host", "←h", s.blocks_from_host))
        words = sum(len(f"{name} {v}  ") for name, _, v in counts) - 2
        short = words > (self.size.width or 80)     # a narrow panel: "hit 0  COW 0  ev 0 …"
        for i, (name, brief, value) in enumerate(counts):
            t.append(("  " if i else "") + f"{brief if short else name} ", "" if value else "dim")
            t.append(f"{value}", "bold #e08a1e" if value else "dim")
        return t

    def render(self) -> Text:
        return self._text
