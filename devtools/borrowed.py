"""A snapshot source lent to one app: the app's exit closes its source, and a borrowed
one stays open for the next app (tests and scripts that run several apps on one engine)."""
from __future__ import annotations


class Borrowed:
    def __init__(self, source):
        self._source = source

    def __getattr__(self, name):
        return getattr(self._source, name)

    def close(self) -> None:
        pass
