"""The hard timeout of GPU tensor-parallel runs (devtools/tp_timeout.py): a run stuck
in a rank prints the stacks of this process and of its workers, then exits non-zero,
instead of hanging until an outer timeout kills it with nothing to show."""
import os
import subprocess
import sys
import textwrap

STUCK = textwrap.dedent("""
    import faulthandler, multiprocessing as mp, signal, time
    from devtools.tp_timeout import exit_with_stacks_after

    def stuck_worker(inside):
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # as worker_main does
        inside.set()
        time.sleep(60)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        inside = ctx.Event()
        worker = ctx.Process(target=stuck_worker, args=(inside,), daemon=True)
        worker.start()
        assert inside.wait(60)          # the worker is inside stuck_worker
        exit_with_stacks_after(4.0)
        time.sleep(60)                  # rank 0 stuck too
""")


def test_stuck_run_prints_every_rank_stack_and_exits(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode != 0
    err = proc.stderr
    assert "hard timeout (4 s)" in err
    assert 'in stuck_worker' in err          # the worker's stack (SIGUSR1)
    assert 'File "' + str(script) + '", line' in err.split("stuck_worker")[-1]  # rank 0's
    assert "Timeout (0:00:04)!" in err       # faulthandler's exit
