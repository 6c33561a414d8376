"""scripts/canned_server.py ends on SIGTERM whatever the moment it arrives: before Python
runs, once the handler is set, while workers are forked, once it serves, twice, with a
client connected, and just before its event loop blocks in epoll_wait (the moment a
signal used to be noticed only when the next one came).
The parent reaps its workers before it exits, so each test checks, as soon as the parent
is gone, that nothing of its process group is left. Each server runs in a session of its
own, and the group is SIGKILLed when a test ends, whatever its outcome. 127.0.0.1 only."""
from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager

import pytest

from devtools.procs import children, group_members, status_fields
from tests.helpers import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SERVER = os.path.join(ROOT, "scripts", "canned_server.py")
BOUND_S = 30            # failure bounds only: a passing run is over long before


def catches_sigterm(pid: int) -> bool:
    return bool(int(status_fields(pid)["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)))


@contextmanager
def canned(workers: int):
    proc = subprocess.Popen([sys.executable, SERVER, "--port", "0", "--workers", str(workers)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield proc
    finally:            # a failure leaves nothing behind: the server, its workers, orphans
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        proc.stdout.close()


def ready_port(proc: subprocess.Popen) -> int:
    line = proc.stdout.readline()
    assert line.startswith("listening "), line
    return int(line.split()[1])


def assert_ended(proc: subprocess.Popen, codes=(0,)) -> None:
    """The parent exits within the bound, with one of `codes`, and leaves no process of its
    group: it reaps its workers before it exits."""
    try:
        code = proc.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {BOUND_S} s of SIGTERM")
    assert code in codes
    assert group_members(proc.pid) == []


@pytest.mark.timeout(120)
def test_canned_server_and_its_workers_exit_on_terminate():
    with canned(3) as proc:
        ready_port(proc)
        assert len(children(proc.pid)) == 2
        proc.terminate()
        assert_ended(proc)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moment", ["exec", "handler set", "first worker"])
def test_sigterm_before_the_server_is_ready_ends_it(moment):
    with canned(8) as proc:
        if moment == "exec":        # the process exists; Python may not have started
            proc.terminate()        # the default action may still end it: -SIGTERM, no workers yet
            assert_ended(proc, codes=(0, -signal.SIGTERM))
            return
        if moment == "handler set":     # workers are forked after this
            wait_for(lambda: catches_sigterm(proc.pid), BOUND_S, "a SIGTERM handler", 0.001)
        else:                           # 7 workers to fork: most are still to come
            wait_for(lambda: children(proc.pid), BOUND_S, "a worker", 0.001)
        proc.terminate()
        assert_ended(proc)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signals", [[signal.SIGTERM, signal.SIGTERM], [signal.SIGINT]],
                         ids=["SIGTERM twice", "SIGINT"])
def test_a_second_signal_or_sigint_ends_it_too(signals):
    with canned(3) as proc:
        ready_port(proc)
        for sig in signals:         # the second one lands during the shutdown, or after it
            proc.send_signal(sig)
        # a signal after the interpreter's own finalisation meets the default action
        assert_ended(proc, codes=(0, -signal.SIGTERM))


@pytest.mark.timeout(120)
def test_a_connected_client_does_not_hold_the_exit():
    with canned(2) as proc:
        port = ready_port(proc)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")   # kept alive, left open
            proc.terminate()
            assert_ended(proc)


GDB_SCRIPT = """set pagination off
handle SIGTERM nostop noprint pass
break epoll_wait if (int)$rcx == -1
continue
delete
shell kill -TERM {pid}
detach
quit
"""


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("gdb") is None or platform.machine() != "x86_64",
                    reason="needs gdb on x86_64 (the timeout argument is read from rcx)")
def test_sigterm_just_before_the_loop_blocks_in_epoll_wait_ends_it(tmp_path):
    """gdb stops the ready, idle parent at the entry of a blocking epoll_wait (timeout -1),
    SIGTERMs it and detaches: the signal is handled before the syscall starts, so it cannot
    interrupt it. Attaching interrupts the running epoll_wait (EINTR after a stop), and the
    retry enters epoll_wait again, at the breakpoint."""
    with canned(3) as proc:
        ready_port(proc)
        script = tmp_path / "cmds.gdb"
        script.write_text(GDB_SCRIPT.format(pid=proc.pid))
        gdb = subprocess.Popen(["gdb", "-q", "-batch", "-nx", "-p", str(proc.pid), "-x", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out = gdb.communicate(timeout=BOUND_S * 2)[0]
        except subprocess.TimeoutExpired:     # gdb itself stuck (a loaded box): no verdict
            out = ""
        finally:
            if gdb.poll() is None:
                gdb.kill()
                gdb.communicate()
        if "Breakpoint 1, epoll_wait" not in out:
            pytest.skip(f"gdb did not stop the server at epoll_wait: {out[-500:]}")
        assert "detached" in out
        assert_ended(proc)
