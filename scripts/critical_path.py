"""A verify step's critical path on the host (scripts/host_step_profile.py
--critical-path): from the moment its tokens are on the host to the next step's model
forward, the time a device waits on the host after a speculative verify (a decode step
hides all of its host work behind the device; docs/SPECULATIVE.md "Host cost").

Marks are taken by wrapping the engine's methods on that path (the token read, the
verify's commit, the plan and its proposals, the batch, the runner up to the forward);
each segment between two consecutive marks is reported by its median over the steps
that verified, so the parts of the path read off without a profiler's overhead."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import engine.core.core as core_module
from engine.worker.device_io import HostCopy


class CriticalPath:
    def __init__(self, engine):
        self.marks: list[tuple[str, float]] = []
        self.paths: list[float] = []
        self.segments: dict[str, list[float]] = defaultdict(list)
        self._undo: list = []
        self._wrap(HostCopy, "wait_seconds", "tokens read", after=True)
        self._wrap(engine.spec, "commit", "commit")
        self._wrap(engine, "_schedule", "plan")
        self._wrap(engine.spec.proposer, "propose", "propose")
        self._wrap(core_module, "build_step_batch", "batch")
        self._wrap(engine.executor, "execute_model", "runner")
        self._wrap(engine.executor.runner.model, "forward", "forward", before_only=True)

    def _wrap(self, owner, attr: str, name: str, after: bool = False,
              before_only: bool = False) -> None:
        real = getattr(owner, attr)
        marks, now = self.marks, time.perf_counter

        def timed(*args, **kwargs):
            if not after:
                marks.append((name, now()))
            out = real(*args, **kwargs)
            if not before_only:
                marks.append((name if after else name + " done", now()))
            return out
        self._undo.append((owner, attr, owner.__dict__.get(attr)))
        setattr(owner, attr, timed)

    def close(self) -> None:
        """Unwrap every method (a class attribute is restored, an instance one dropped)."""
        for owner, attr, old in reversed(self._undo):
            if old is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)

    def step(self, step) -> None:
        """One engine step; if it read a verify's tokens and launched a forward after
        them, its path and segments are recorded."""
        self.marks.clear()
        step()
        names = [n for n, _ in self.marks]
        if "commit" not in names or "forward" not in names:
            return
        t_read = next(t for n, t in self.marks if n == "tokens read")
        t_fwd = next(t for n, t in self.marks if n == "forward")
        if t_fwd < t_read:
            return
        self.paths.append(t_fwd - t_read)
        on_path = [(n, t) for n, t in self.marks if t_read <= t <= t_fwd]
        for (a, ta), (b, tb) in zip(on_path, on_path[1:]):
            self.segments[f"{a} -> {b}"].append(tb - ta)

    def report(self) -> str:
        if not self.paths:
            return "no verify step read its tokens before a forward (--speculative?)"
        n = len(self.paths)
        lines = [f"verify steps {n}: tokens on the host -> next forward, median "
                 f"{1e6 * statistics.median(self.paths):.1f} us"]
        rows = sorted(self.segments.items(),
                      key=lambda kv: -statistics.median(kv[1]) * len(kv[1]))
        for seg, took in rows:
            lines.append(f"  {1e6 * statistics.median(took):7.1f} us  in {len(took) / n:4.0%} "
                         f"of them  {seg}")
        return "\n".join(lines)


def measure(args) -> None:
    """--critical-path: the closed loop of host_step_profile's options, warmed up, then
    --steps steps with the marks on; prints the report."""
    from host_loop import warm_loop
    if not (args.speculative and args.runner):
        raise SystemExit("--critical-path needs --speculative K and --runner (the marks "
                         "end at the model's forward)")
    engine, loop, _ = warm_loop(args)
    path = CriticalPath(engine)
    try:
        for _ in range(args.steps):
            path.step(loop.step)
    finally:
        path.close()
    print(path.report())
