"""Panels whose drawing is built in show() for their size: they draw again at their new
size by themselves."""
from __future__ import annotations


class ReshownOnResize:
    """A panel that builds its text in show() for its own size keeps show's last
    arguments (`shown_with`) and calls show again when that size changes. A paused or
    replayed session sends no new snapshot, and on a loaded machine Textual may size the
    panel after the app's redraw, so the panel cannot wait for either. show() must only
    draw (no feeding of history) for this to be safe."""
    _last_show: tuple | None = None

    def shown_with(self, *args) -> None:
        self._last_show = args

    def on_resize(self) -> None:
        if self._last_show is not None:
            self.show(*self._last_show)
