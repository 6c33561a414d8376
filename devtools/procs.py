"""What /proc says of a process and its children (the soaks, the serve tests), and what
an attached client sees left in an idle engine."""
import contextlib
import os


def status_fields(pid: int) -> dict[str, str]:
    """/proc/PID/status as {field: its first word} (VmRSS: kB, SigCgt: a hex mask, ...)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            words = value.split()
            fields[name] = words[0] if words else ""
    return fields


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS in MB, threads) of a process, from /proc/PID/status."""
    fields = status_fields(pid)
    return int(fields.get("VmRSS", 0)) / 1024, int(fields.get("Threads", 0))


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (Z: a zombie), None once it is gone."""
    try:
        return _stat_fields(pid)[0]
    except FileNotFoundError:
        return None


def group_members(pgid: int) -> list[int]:
    """Every process (zombies too) whose process group is `pgid`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(_stat_fields(name)[2]) == pgid:
                    found.append(int(name))
            except OSError:          # gone meanwhile
                pass
    return found


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def descendants(pid: int | None) -> list[int]:
    """pid and every process below it (none for None; one that ends meanwhile is skipped)."""
    out, todo = [], [] if pid is None else [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            todo += children(p)
    return out


def engine_pid(pid: int) -> int:
    """The engine process among `pid`'s descendants (with --api-server-count N the API
    servers are children too)."""
    todo = children(pid)
    while todo:
        child = todo.pop(0)
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"engine.ipc.core_proc" in f.read():
                return child
        todo += children(child)
    raise RuntimeError("no engine process under the server")


def engine_leaks(address: str) -> tuple[int, int]:
    """(live requests, used blocks) of the engine once idle, seen by an attached client."""
    from engine.front.client import EngineClient
    with EngineClient(address=address, label="soak-check") as c:
        assert c.wait_idle(60)
        c.reset_prefix_cache()
        assert c.wait_idle(60)
        snap = c.snapshot()
        live = [r for r in snap.requests if r.state not in ("finished", "cancelled", "error")]
        return len(live), snap.num_blocks - snap.num_free
