"""What fits in a panel's border: titles and subtitles come in several forms, longest
first, and a border shows the longest one that fits whole (never a cut word)."""
from __future__ import annotations


def fits(text: str, width: int) -> bool:
    """Whether a border title or subtitle fits a border of `width` cells (corners and
    padding spared)."""
    return len(text) + 6 <= width


def border_form(forms, width: int) -> str:
    """The first of `forms` (longest first) that fits a border of `width`, else the last."""
    return next((f for f in forms if fits(f, width)), forms[-1])


class WidthBorders:
    """A widget whose border title or subtitle picks its form by the widget's width:
    set_borders keeps the function of the width that makes them and runs it, and the
    widget's own resize runs it again. So the forms follow the width when no new
    snapshot comes (a paused or replayed session) and when Textual sizes the panel after
    the app's redraw (a loaded machine)."""
    _borders_at = None

    def set_borders(self, borders_at) -> None:
        """borders_at(width) -> (title, subtitle); None keeps that one as it is."""
        self._borders_at = borders_at
        self._write_borders()

    def _write_borders(self) -> None:
        title, subtitle = self._borders_at(self.size.width)
        if title is not None and self.border_title != title:
            self.border_title = title
        if subtitle is not None and self.border_subtitle != subtitle:
            self.border_subtitle = subtitle

    def on_resize(self) -> None:
        if self._borders_at is not None:
            self._write_borders()
