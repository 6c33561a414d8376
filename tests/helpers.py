"""Small helpers shared by tests that drive the engine directly."""
import importlib.util
import os
import sys
import time

import pytest

from devtools.procs import process_state
from engine import InvalidRequestError
from engine.front.processor import InputProcessor
from engine.outputs import EngineInfo

GREEDY = dict(temperature=0, ignore_eos=True)
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def load_script(name: str):
    """scripts/NAME.py imported as the module NAME (registered in sys.modules, where
    dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def refused(match, fn, *args, **kwargs):
    """fn(...) raises InvalidRequestError (a ValueError) whose message matches."""
    with pytest.raises(InvalidRequestError, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def add_request(eng, prompt, params=None, request_id=None, priority=0):
    """Validate like the front does and queue on the core; returns the core Request."""
    inputs = InputProcessor.of(eng.tokenizer, EngineInfo.of(eng))
    creq, _ = inputs.process(prompt, params, request_id, priority)
    return eng.add(creq)


def wait_for(cond, timeout: float = 60.0, what: str = "condition", interval: float = 0.02):
    """Poll cond() until it returns something true and return that; fail the test if it
    has not within `timeout` seconds (a bound for failures only: a passing run is over
    long before)."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(interval)
    return value


def engines_owned_by(pid: int) -> list[int]:
    """Live engine-core processes started by (with the command-line owner) `pid`."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"engine.ipc.core_proc" in cmd and str(pid).encode() in cmd \
                and process_state(int(d)) not in (None, "Z"):     # None: gone meanwhile
            found.append(int(d))
    return found


def free_port_block(span: int = 5) -> int:
    """A port P with P..P+span-1 free on 127.0.0.1 (an engine at tcp://127.0.0.1:P binds
    three: its sockets; five with its KV events' two). Drawn at random below the kernel's
    ephemeral range where there is room: bind(0) draws from that range, and so does every
    outgoing connection, which could take one of the ports between this check and the
    engine's bind (parallel test workers open many)."""
    import random
    import socket
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(100):
        if low - span > 10000:
            base = rng.randrange(10000, low - span)
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                base = probe.getsockname()[1]
        if base + span > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + span):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports on 127.0.0.1")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
