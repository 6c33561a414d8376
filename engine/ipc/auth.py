"""The engine key: the secret a client shows in its Hello before the core serves it.

Why: the engine address carries other users' prompt previews and output tails (in the
snapshots), the pause, the live knobs and raw generation. Whoever can reach the address
must also hold the key. The owner (the process that starts the engine) takes the key
given by `--engine-key` / $ROSEPLAY_ENGINE_KEY, or generates a random one and writes it,
mode 0600, to the key file of the address: next to the socket for ipc:// addresses, in
the user's runtime directory for tcp:// ones. A client of the same user finds it there;
anyone else needs it given. Snapshots are published under a topic derived from the key,
and the core applies only that subscription (XPUB_MANUAL), so a stranger's SUB socket
receives no byte. The key travels in clear text: on a non-loopback address use it only
on a trusted network (or tunnel), and such a bind is refused unless a key was given.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import tempfile

from engine.config import InvalidRequestError

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


def write_key(address: str, key: str) -> str:
    """Write the key 0600 (created with that mode: never readable by others, even briefly)."""
    path = key_file(address)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return path


def remove_key(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
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


def same_key(expected: str, shown: str) -> bool:
    return hmac.compare_digest(expected.encode(), shown.encode())


def snapshot_topic(key: str) -> bytes:
    """The subscription topic of the snapshots: derived from the key, so only a key
    holder can subscribe, and the key itself never goes out on the publish socket."""
    return hmac.new(key.encode(), b"roseplay-snapshots", hashlib.sha256).digest()[:16]
