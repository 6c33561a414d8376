"""What both grammar backends share (guidance.py, xgrammar_backend.py); the grammars
themselves are built in engine/grammars.py, which the front's check reads too."""
from __future__ import annotations


class GrammarError(ValueError):
    """The grammar library refused a request's constraint (invalid, unsupported, or over
    its limits): the request ends with a 400."""
