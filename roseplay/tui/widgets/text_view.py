"""A widget that draws one rich Text it is handed, and refreshes only when it changes."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextView(Widget):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = Text()

    def show(self, text: Text) -> None:
        if text != self._text:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        return self._text
