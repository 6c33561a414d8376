"""roseplay: a terminal playground on a real LLM inference engine (its own process).

`roseplay` (no arguments) opens the Textual app on the bundled default model;
`roseplay bench ...` benchmarks the engine. See docs/TUI.md for the app.
"""
__version__ = "0.1.0"
