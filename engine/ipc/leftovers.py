"""Files and folders that must not outlive their owner, even one killed with SIGKILL.

Each holds an exclusive flock while its owner runs (the engine's key file; the engine's
socket folder and the server's metrics folder, through a lock file inside). The kernel
drops the lock however the owner ends, so whatever still exists with a free lock is a
leftover: the next start removes this user's (sweep_dirs, remove_if_free). A lock is
taken on a file of a temporary name and the file is then renamed into place, so a sweep
never sees a fresh one unlocked.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from typing import Callable

DIR_LOCK = ".owner.lock"


def lock_into_place(path: str, data: bytes = b"", mode: int = 0o600) -> int:
    """Write `data` to `path` (created with `mode`), locked: returns the descriptor that
    holds the lock (keep it open for the owner's life; it is not inherited)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, data)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd


def remove_if_free(path: str, remove: Callable[[], None] | None = None) -> bool:
    """Call `remove()` (default: unlink `path`) when the file at `path` is this user's
    and nobody holds its lock; True if so."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.getuid():
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:        # held: its owner runs
        return False
    else:
        try:
            if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                return False     # a new owner's file took the name meanwhile
        except FileNotFoundError:
            return False
        if remove is None:
            os.unlink(path)
        else:
            remove()
        return True
    finally:
        os.close(fd)


class OwnedDir:
    """A private temporary folder (0700) whose lock this process holds until remove()."""

    def __init__(self, prefix: str):
        sweep_dirs(prefix)
        self.path = tempfile.mkdtemp(prefix=prefix)
        try:
            self._fd: int | None = lock_into_place(os.path.join(self.path, DIR_LOCK))
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def sweep_dirs(prefix: str) -> list[str]:
    """Remove this user's temporary folders named `prefix`* whose owner is gone (their
    lock file is free); a folder without a lock file is not one of these. Returns them."""
    base, removed = tempfile.gettempdir(), []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if name.startswith(prefix) and os.path.isdir(path) and not os.path.islink(path) \
                and remove_if_free(
                os.path.join(path, DIR_LOCK), lambda p=path: shutil.rmtree(p, ignore_errors=True)):
            removed.append(path)
    return removed
