"""What does watching the engine cost it? Output tok/s of a closed-loop workload with the
engine alone, and with the real RoseplayApp rendering headless at 200x60 beside it.

Both architectures: the engine in its own process (the default) and on a thread of the
app's process (--in-process, the old way: one GIL for everything). Each run is a fresh
process (a dropped in-process engine would keep its KV pool on the GPU); tokens are the
engine's own generated-token counter over a window that starts after a warm-up.

    python scripts/observer_cost.py --model dummy:qwen2.5-0.5b --seconds 20
    python scripts/observer_cost.py --model dummy:tiny --seconds 5 --concurrency 16 \
        --input-len 32 --output-len 16          # a CPU smoke run

--alternate K: ONE engine process and driver, measured in 2K+1 alternating windows (alone,
TUI, alone, ... alone); each TUI window is compared with the mean of the alone windows on
either side, so slow drift of the host or the GPU cancels and no run pays a start-up. Each
window also reports steps/s, tokens per step, the engine thread's host share (1 - time
blocked on the GPU's sync / wall) and its snapshot-building share.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from devtools.borrowed import Borrowed  # noqa: E402  (after the repo is on the path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dummy:qwen2.5-0.5b")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds before the window")
    p.add_argument("--concurrency", type=int, default=256, help="requests kept in flight")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--modes", default="process,in-process")
    p.add_argument("--cudagraph-mode", default=None, help="the engine's cudagraph_mode (default: the config's)")
    p.add_argument("--repeat", type=int, default=1, help="alone/TUI pairs per mode "
                   "(interleaved); the ratio reported is the median of the pairs'")
    p.add_argument("--alternate", type=int, default=0, metavar="K",
                   help="K TUI windows between K+1 alone windows in one engine run")
    p.add_argument("--view", choices=("tui", "burn", "alone"), default="tui",
                   help="--alternate: what runs in the odd windows: the app, a process "
                        "spinning one core (a control: the cost of any busy neighbour), or "
                        "nothing (every window alone: the closed loop's own figure)")
    p.add_argument("--burn-cores", type=int, default=1, help="--view burn: spinning processes")
    p.add_argument("--alone-watches", action="store_true",
                   help="--alternate: keep the snapshot subscription in the alone windows "
                        "(default: alone = nobody subscribes, the engine builds no snapshot)")
    p.add_argument("--one", nargs=2, metavar=("MODE", "VIEW"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def start(args, in_process: bool):
    from roseplay.workload.source import start_live
    engine = dict(model=args.model, max_num_seqs=max(args.concurrency, 1),
                  max_num_batched_tokens=args.max_num_batched_tokens)
    if args.cudagraph_mode:
        engine["cudagraph_mode"] = args.cudagraph_mode
    return start_live(engine, scenario="random", concurrency=args.concurrency,
                      input_len=args.input_len, output_len=args.output_len, temperature=0.0,
                      in_process=in_process)


def fresh_snapshot(source, timeout: float = 5.0):
    """Subscribe (if the client had dropped snapshots), then the next new snapshot."""
    old = source.snapshot()
    source.loop.watch(True)
    deadline = time.monotonic() + timeout
    while source.snapshot() is old and time.monotonic() < deadline:
        time.sleep(0.005)
    return source.snapshot()


def window_stats(source, seconds: float, unwatched: bool = False) -> dict:
    """Engine-side rates over one window, from two snapshots' counters. `unwatched`: no
    client subscribes during the window (the engine builds no snapshot): the real
    'alone' (only the two boundary snapshots are taken)."""
    s0 = fresh_snapshot(source) if unwatched else source.snapshot()
    if unwatched:
        source.loop.watch(False)
    time.sleep(seconds)
    s1 = fresh_snapshot(source) if unwatched else source.snapshot()
    c, dt = s1.counters.minus(s0.counters), s1.time - s0.time
    return dict(tok_s=c.generated_tokens / dt, steps_s=c.steps / dt,
                tok_per_step=(c.prefill_tokens + c.decode_tokens) / max(c.steps, 1),
                decodes_per_step=c.decode_tokens / max(c.steps, 1),
                host_share=1 - c.device_wait_us / 1e6 / dt,
                snapshot_share=c.snapshot_build_us / 1e6 / dt, gc_share=c.gc_pause_us / 1e6 / dt)


def app_window(source, seconds: float, settle: float = 1.0) -> dict:
    from roseplay.tui.app import RoseplayApp

    async def run() -> dict:
        app = RoseplayApp(source=Borrowed(source))
        async with app.run_test(size=(200, 60)) as pilot:
            await asyncio.sleep(settle)        # mounted and drawing before the window opens
            loop = asyncio.get_running_loop()
            stats = await loop.run_in_executor(None, window_stats, source, seconds)
            await pilot.pause(0)
            return stats
    return asyncio.run(run())


def burn_window(source, seconds: float, cores: int = 1) -> dict:
    """The window with processes that spin `cores` cores instead of the app: what any
    busy neighbour on the host costs the engine (turbo and shared caches), not the UI."""
    import subprocess
    spins = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(1.0)
        return window_stats(source, seconds, unwatched=True)
    finally:
        for spin in spins:
            spin.kill()
            spin.wait()


def alternate(args) -> int:
    import statistics
    source = start(args, in_process=False)
    rows = []
    try:
        time.sleep(args.warmup)
        for k in range(2 * args.alternate + 1):
            view = args.view if k % 2 else "alone"
            stats = app_window(source, args.seconds) if view == "tui" else \
                burn_window(source, args.seconds, args.burn_cores) if view == "burn" else \
                window_stats(source, args.seconds, unwatched=not args.alone_watches)
            rows.append((view, stats))
            print(f"{k:>3} {view:<6} {stats['tok_s']:10,.0f} tok/s  {stats['steps_s']:6.1f} "
                  f"steps/s  {stats['tok_per_step']:7.1f} tok/step ({stats['decodes_per_step']:5.1f} "
                  f"decodes)  host "
                  f"{100 * stats['host_share']:5.1f}%  snapshots "
                  f"{100 * stats['snapshot_share']:4.1f}%  gc {100 * stats['gc_share']:4.1f}%",
                  flush=True)
    finally:
        source.close()
    if args.view == "alone":
        every = [r["tok_s"] for _, r in rows]
        print(f"closed loop alone: median {statistics.median(every):,.0f} "
              f"({min(every):,.0f}..{max(every):,.0f}) output tok/s over {len(every)} windows "
              f"of {args.seconds:g} s", flush=True)
        return 0
    alone = [r["tok_s"] for v, r in rows if v == "alone"]
    tui = [r["tok_s"] for v, r in rows if v != "alone"]
    ratios = [t / ((alone[i] + alone[i + 1]) / 2) for i, t in enumerate(tui)]
    med = statistics.median(ratios)
    print(f"alternating: alone median {statistics.median(alone):,.0f} "
          f"({min(alone):,.0f}..{max(alone):,.0f}), with the {args.view} median "
          f"{statistics.median(tui):,.0f} ({min(tui):,.0f}..{max(tui):,.0f}); TUI/alone "
          f"median {med:.3f} ({min(ratios):.3f}..{max(ratios):.3f}) over {len(ratios)} "
          f"windows: the {args.view} costs {100 * (1 - med):.1f}% of output tok/s", flush=True)
    return 0


def run_one(args) -> float:
    mode, view = args.one
    source = start(args, mode == "in-process")
    try:
        if view == "alone":
            time.sleep(args.warmup)
            return window_stats(source, args.seconds)["tok_s"]
        return app_window(source, args.seconds, settle=args.warmup)["tok_s"]
    finally:
        source.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.alternate:
        return alternate(args)
    if args.one:
        print(f"RESULT {run_one(args):.1f}", flush=True)
        return 0
    import statistics
    import subprocess
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    for mode in args.modes.split(","):
        ratios, alone_all, tui_all = [], [], []
        for _ in range(args.repeat):
            pair = []
            for view in ("alone", "tui"):
                res = subprocess.run([sys.executable, __file__, *passed, "--one", mode, view],
                                     capture_output=True, text=True)
                line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")]
                if not line:
                    print(res.stdout[-2000:], res.stderr[-3000:], file=sys.stderr)
                    return 1
                pair.append(float(line[0].split()[1]))
                print(f"{mode:>10}  {view:<6} {pair[-1]:10,.0f} output tok/s", flush=True)
            alone_all.append(pair[0])
            tui_all.append(pair[1])
            ratios.append(pair[1] / pair[0])
        med = statistics.median(ratios)
        print(f"{mode:>10}: alone median {statistics.median(alone_all):,.0f} "
              f"({min(alone_all):,.0f}..{max(alone_all):,.0f}), with the TUI median "
              f"{statistics.median(tui_all):,.0f} ({min(tui_all):,.0f}..{max(tui_all):,.0f}); "
              f"TUI/alone median {med:.3f} ({min(ratios):.3f}..{max(ratios):.3f}) over "
              f"{len(ratios)} pairs: the TUI costs {100 * (1 - med):.1f}% of output tok/s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
