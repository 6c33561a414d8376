"""Panels whose drawing is built in show() for their size: they draw again at their new
size by themselves."""
from __future__ import annotations


class ReshownOnResize:
    """A panel that builds its drawing for its own size keeps how to draw it again
    (`redraw_on_resize`: show with its last arguments) and does so when that size
    changes. A paused or replayed session sends no new snapshot, and on a loaded machine
    Textual may size the panel after the app's redraw, so the panel cannot wait for
    either. The redraw must only draw (no feeding of history) for this to be safe."""
    _redraw = None

    def redraw_on_resize(self, redraw) -> None:
        """redraw(): draws the panel again for the size it has then."""
        self._redraw = redraw

    def on_resize(self) -> None:
        if self._redraw is not None:
            self._redraw()
