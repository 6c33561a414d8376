"""The engine key: the secret a client must hold before the engine serves it.

Why: the engine address carries other users' prompt previews and output tails (in the
snapshots), the pause, the live knobs and raw generation. Whoever can reach the address
must also hold the key. The owner (the process that starts the engine) takes the key
given by `--engine-key` / $ROSEPLAY_ENGINE_KEY, or generates a random one and the engine
writes it, mode 0600, to the key file of the address: next to the socket for ipc://
addresses, in the user's runtime directory for tcp:// ones. A client of the same user
finds it there; anyone else needs it given. The key itself never travels: the engine's
sockets are CURVE servers whose keys derive from it (engine/ipc/curve.py), so a peer
without it never gets past the handshake and the traffic is encrypted. Snapshots are
published under a topic derived from the key as well. A key file holds a lock while its
engine runs, so one that a killed engine left is removed by the next start
(engine/ipc/leftovers.py). A non-loopback bind is refused unless a key was given (a
generated key is only in a local file).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import tempfile

from engine.config import InvalidRequestError
from engine.ipc import leftovers

ENGINE_KEY_ENV = "ROSEPLAY_ENGINE_KEY"
KEY_FILE_SUFFIX = ".key"


def new_key() -> str:
    return secrets.token_hex(32)


def _runtime_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(tempfile.gettempdir(),
                                                             f"roseplay-{os.getuid()}")
    path = os.path.join(base, "roseplay") if os.environ.get("XDG_RUNTIME_DIR") else base
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:    # planted by someone else
        raise InvalidRequestError(f"{path} must be a directory of this user's, mode 0700, "
                                  "to hold engine key files")
    return path


def _tcp_host_port(address: str) -> tuple[str, str]:
    host, _, port = address[len("tcp://"):].rpartition(":")
    return host.strip("[]"), port


def key_file(address: str) -> str:
    """Where the owner writes a generated key for `address` (and clients look for it)."""
    if address.startswith("ipc://"):
        return address[len("ipc://"):] + KEY_FILE_SUFFIX
    host, port = _tcp_host_port(address)
    return os.path.join(_runtime_dir(), f"engine-{host.replace(':', '_')}-{port}{KEY_FILE_SUFFIX}")


def write_key(address: str, key: str) -> tuple[str, int]:
    """Write the key 0600 (created with that mode: never readable by others, even
    briefly), locked while this process runs: (path, the descriptor holding the lock).
    Key files that killed engines left in the runtime directory go first."""
    if address.startswith("tcp://"):
        sweep_keys()
    path = key_file(address)
    return path, leftovers.lock_into_place(path, key.encode())


def remove_key(path: str | None, fd: int | None = None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass
    if fd is not None:
        os.close(fd)


def sweep_keys() -> None:
    """Remove the key files of tcp addresses whose engine is gone (killed: its lock is free)."""
    base = _runtime_dir()
    for name in os.listdir(base):
        if name.startswith("engine-") and name.endswith(KEY_FILE_SUFFIX):
            leftovers.remove_if_free(os.path.join(base, name))


def remove_stale_key(address: str) -> None:
    """The owner, once its engine is gone: its key file, if the engine could not remove it."""
    try:
        leftovers.remove_if_free(key_file(address))
    except InvalidRequestError:     # no usable runtime directory: nothing was written there
        pass


def given_key(key: str | None = None) -> str | None:
    """The key given explicitly: the argument (a flag), else $ROSEPLAY_ENGINE_KEY. "@PATH"
    means the key is in the file PATH (a flag's value is visible to others in ps)."""
    key = key or os.environ.get(ENGINE_KEY_ENV) or None
    if key and key.startswith("@"):
        try:
            with open(key[1:]) as f:
                key = f.read().strip()
        except OSError as exc:
            raise InvalidRequestError(f"cannot read the engine key file {key[1:]}: "
                                      f"{exc.strerror}") from None
        if not key:
            raise InvalidRequestError("the engine key file is empty")
    return key


def read_key(address: str, key: str | None = None) -> str | None:
    """A client's key for `address`: given (flag, env), else the address's key file."""
    key = given_key(key)
    if key:
        return key
    try:
        with open(key_file(address)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    if not address.startswith("tcp://"):
        return True          # ipc: a file, guarded by its directory's permissions
    host, _ = _tcp_host_port(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False         # a name or a wildcard (*): may be reachable from elsewhere


def check_bind(address: str, key_given: bool) -> None:
    """A non-loopback address is refused unless the key was given (a generated key is
    only in a local file, so a remote client could never attach anyway)."""
    if not is_loopback(address) and not key_given:
        raise InvalidRequestError(
            f"refusing to serve the engine at {address} (not a loopback address) without an "
            f"engine key: pass --engine-key KEY or set ${ENGINE_KEY_ENV} (clients need the "
            "same key), or bind tcp://127.0.0.1:PORT")


def snapshot_topic(key: str) -> bytes:
    """The subscription topic of the snapshots: derived from the key, so only a key
    holder can subscribe, and the key itself never goes out on the publish socket."""
    return hmac.new(key.encode(), b"roseplay-snapshots", hashlib.sha256).digest()[:16]
