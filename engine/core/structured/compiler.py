"""Grammars compiled off the step loop, kept in a cache, bounded in time.

`GrammarCompiler.request(params)` returns the compiled grammar when the cache has it, else
a Future from a small thread pool (the library drops the GIL while it builds; the first
mask is computed there too, so a grammar that admits nothing, or whose first mask is
over the library's limits, fails here, not in a step). Requests for the same grammar
share one compile. The cache (least recently used out, `grammar_cache_size` entries) is
touched only on the engine thread (`take`), so it needs no lock. A compile that outlives
`compile_timeout` cannot be stopped (a thread), but the request it was for ends then;
the library's fuel limits bound how long the thread itself goes on.

The backend itself (the tokenizer's vocabulary as the library reads it: ~1 s for a
150k-token vocabulary) is built by the first compile, on the pool, not at start: an
engine that never sees a constraint never pays for it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from engine.structured_outputs import StructuredOutputsParams

COMPILE_THREADS = 2      # concurrent compiles (each drops the GIL in the library)


class LazyBackend:
    """The grammar backend, built on first use by whichever thread needs it first."""

    def __init__(self, build):
        self._build, self._backend, self._error = build, None, None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._backend is None and self._error is None:
                try:
                    self._backend = self._build()
                except Exception as exc:    # e.g. a tokenizer the library cannot read
                    self._error = exc
            if self._error is not None:
                raise self._error
            return self._backend

    @property
    def ready(self):
        """The backend if built (the engine thread never builds it)."""
        return self._backend


class GrammarCompiler:
    def __init__(self, backend: LazyBackend, cache_size: int, counters):
        self.backend = backend
        self.counters = counters
        self.cache: OrderedDict[tuple, object] = OrderedDict()
        self.cache_size = cache_size
        self.inflight: dict[tuple, Future] = {}
        self.pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self.cache_hits = 0

    def request(self, params: StructuredOutputsParams):
        """The compiled grammar if cached, else the Future of its compile."""
        key = params.key
        compiled = self.cache.get(key)
        if compiled is not None:
            self.cache.move_to_end(key)
            self.cache_hits += 1
            return compiled
        future = self.inflight.get(key)
        if future is None:
            future = self.inflight[key] = self.pool.submit(self._compile, params)
        return future

    def _compile(self, params: StructuredOutputsParams):
        backend = self.backend.get()
        return backend.compile(params)

    def take(self, params: StructuredOutputsParams, future: Future):
        """A finished compile's result into the cache (engine thread); raises its error."""
        key = params.key
        first = self.inflight.get(key) is future      # (requests may share one compile)
        if first:
            del self.inflight[key]
        compiled = future.result()
        if first:
            self.counters.grammar_compiles += 1
        if self.cache_size:
            self.cache[key] = compiled
            self.cache.move_to_end(key)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return compiled

    def forget(self, params: StructuredOutputsParams, future: Future) -> None:
        """A compile nobody waits for any more (timed out): the next request starts its own."""
        if self.inflight.get(params.key) is future:
            del self.inflight[params.key]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
