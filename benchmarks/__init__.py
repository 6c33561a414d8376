"""Hooks that benchmarks and tests hand to the engine through its Python API (not
shipped with the package, not reachable from a flag or the HTTP server)."""
