"""Prometheus metrics with vLLM's names, on a registry of the app's own.

Gauges and engine counters are read at scrape time (a collector) from the latest
EngineStats, which the engine sends to every client whether or not anyone watches
snapshots, so they are true on the default engine-process path too. Latency
histograms and per-request counters are observed in the front from the stream events
(token_times are the engine's emit timestamps, on the perf_counter clock of arrival).
Names and buckets follow vLLM's v1 metrics (vllm/v1/metrics/loggers.py).

With several API-server processes (multiproc.py sets $PROMETHEUS_MULTIPROC_DIR) the
front's histograms and counters live in prometheus_client's per-process files and
/metrics sums every process's (MultiProcessCollector); the engine's figures come from
this process's EngineStats, which every client of the engine receives alike.
"""
from __future__ import annotations

import os

from prometheus_client import (GCCollector, PlatformCollector, ProcessCollector,
                               CollectorRegistry, Counter, Histogram, generate_latest)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from engine.codes import REASON_CANCELLED, REASON_ERROR, REASON_LENGTH, REASON_STOP
from engine.engine_stats import TRANSFER_TYPES
from engine.kv_metrics import BLOCK_METRICS

BLOCK_DOCS = {"lifetime": "KV cache block lifetime from allocation to eviction.",
              "idle_before_evict": "Idle time before KV cache block eviction (since its last "
                                   "prefix-cache hit, or its allocation).",
              "reuse_gap": "Time gaps between consecutive prefix-cache hits of a KV cache "
                           "block (its last 4 hits, recorded at eviction)."}

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# vLLM's inter-token (and per-request time-per-output-token) buckets
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM's request_latency_buckets (vllm/v1/metrics/loggers.py: its e2e and request-phase
# histograms)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"         # prometheus_client's own variable
API_SERVER_INDEX_ENV = "ROSEPLAY_API_SERVER_INDEX"  # which process observed a request
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
N_BUCKETS = (1, 2, 5, 10, 20)     # vLLM's request_params_n
# vLLM's request-phase histograms: vllm:request_<phase>_time_seconds, each observing a
# RequestMetrics property (engine/request_output.py)
PHASES = {"queue": ("queued_time", "Histogram of time spent in WAITING phase for request."),
          "prefill": ("prefill_time", "Histogram of time spent in PREFILL phase for request."),
          "inference": ("inference_time", "Histogram of time spent in RUNNING phase for "
                        "request."),
          "decode": ("decode_time", "Histogram of time spent in DECODE phase for request.")}


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to limit (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


def spec_decode_metrics(stats: list, labels: list[str], keys: list[list[str]]):
    """vLLM's speculative-decoding counters (docs/SPECULATIVE.md), per position too: one
    sample per engine (stats[i] under the label values keys[i])."""
    def family(kind, name, doc, value, extra=()):
        fam = kind(name, doc, labels=labels + list(extra))
        for st, key in zip(stats, keys):
            for more, v in value(st):
                fam.add_metric(key + more, v)
        return fam
    for name, doc in (("num_drafts", "Requests verified with drafts (one per step each)."),
                      ("num_draft_tokens", "Draft tokens proposed."),
                      ("num_accepted_tokens", "Draft tokens accepted.")):
        yield family(CounterMetricFamily, f"vllm:spec_decode_{name}", doc,
                     lambda st, n=name: [([], getattr(st, f"spec_decode_{n}"))])
    yield family(CounterMetricFamily, "vllm:spec_decode_num_accepted_tokens_per_pos",
                 "Draft tokens accepted, by position in the draft.",
                 lambda st: [([str(pos)], n) for pos, n in
                             enumerate(st.spec_decode_num_accepted_tokens_per_pos)],
                 ["position"])
    yield family(CounterMetricFamily, "roseplay:spec_draft_faults", "Proposals whose draft "
                 "model forward raised (their requests decoded without drafts).",
                 lambda st: [([], st.spec_draft_faults)])
    yield family(GaugeMetricFamily, "roseplay:spec_draft_disabled", "1 once the draft model "
                 "is turned off after consecutive faults.",
                 lambda st: [([], float(st.spec_draft_disabled))])


def _buckets(h) -> list[tuple[str, int]]:
    """A Histogram (engine/kv_metrics.py) as prometheus' cumulative (bound, count) pairs,
    the bounds written as prometheus_client's Histogram writes them (vLLM's: le="8.0")."""
    cumulative = [sum(h.counts[:i + 1]) for i in range(len(h.counts))]
    return list(zip([floatToGoString(b) for b in h.buckets] + ["+Inf"], cumulative))


def kv_offload_metrics(stats: list, labels: list[str], keys: list[list[str]]):
    """vLLM's KV offloading metrics by transfer_type (GPU_to_CPU: offloads and swap-outs
    to the host tier; CPU_to_GPU: reloads and swap-ins), one sample per engine with a host
    tier (stats[i] under the label values keys[i]); none without one."""
    tiers = [(st, key) for st, key in zip(stats, keys) if st.host_num_blocks]
    if not tiers:
        return
    lab = labels + ["transfer_type"]
    for name, doc, field in (
            ("vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV connector",
             "kv_offload_bytes"),
            ("vllm:kv_offload_total_time", "Total time measured by all KV offloading "
             "operations", "kv_offload_seconds")):
        c = CounterMetricFamily(name, doc, labels=lab)
        for st, key in tiers:
            for kind, value in zip(TRANSFER_TYPES, getattr(st, field)):
                c.add_metric(key + [kind], value)
        yield c
    fam = HistogramMetricFamily("vllm:kv_offload_size", "Histogram of KV offload transfer "
                                "size, in bytes.", labels=lab)
    for st, key in tiers:
        for kind, h in zip(TRANSFER_TYPES, st.kv_offload_sizes):
            fam.add_metric(key + [kind], _buckets(h), h.sum)
    yield fam
    g = GaugeMetricFamily("roseplay:kv_host_usage_perc", "Host-tier KV blocks held by "
                          "swapped-out requests / all host blocks.", labels=labels)
    for st, key in tiers:
        g.add_metric(key, st.host_num_used_blocks / st.host_num_blocks)
    yield g


class EngineStatsCollector:
    """Engine state at scrape time: the latest EngineStats (engine/core/stats.py) the engine
    sent, on every path (its own process or a thread here), whether or not anyone
    watches snapshots. One reference read, no lock, no engine call."""

    def __init__(self, loop, model_name: str):
        self.loop, self.model = loop, model_name

    def collect(self):
        """One sample per engine (label `engine`, as vLLM's): a data-parallel front's
        replicas each (DPClient.replica_stats), else the one engine as "0"."""
        per = getattr(self.loop, "replica_stats", None)
        stats = per() if per is not None else [self.loop.engine_stats()]
        labels = ["model_name", "engine"]
        keys = [[self.model, str(i)] for i in range(len(stats))]

        def family(kind, name, doc, value):
            fam = kind(name, doc, labels=labels)
            for key, st in zip(keys, stats):
                fam.add_metric(key, value(st))
            return fam

        def gauge(name, doc, value):
            return family(GaugeMetricFamily, name, doc, value)

        def counter(name, doc, value):
            return family(CounterMetricFamily, name, doc, value)

        yield gauge("vllm:num_requests_running", "Requests admitted (prefilling or decoding).",
                    lambda st: st.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting (queued or preempted).",
                    lambda st: st.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV blocks in use / all blocks (1 = full; "
                    "cached evictable blocks count as free, as in vLLM).",
                    lambda st: st.num_used_blocks / st.num_blocks if st.num_blocks else 0.0)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      lambda st: st.prefix_queried_tokens)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens served by the prefix cache.",
                      lambda st: st.prefix_hit_tokens)
        yield counter("vllm:num_preemptions", "Preemptions (requests sent back to wait).",
                      lambda st: st.preemptions)
        yield counter("vllm:generation_tokens", "Tokens generated by the engine.",
                      lambda st: st.generation_tokens)
        yield from spec_decode_metrics(stats, labels, keys)
        yield from kv_offload_metrics(stats, labels, keys)
        fam = HistogramMetricFamily("vllm:iteration_tokens_total", "Histogram of number "
                                    "of tokens per engine_step.", labels=labels)
        for key, st in zip(keys, stats):
            fam.add_metric(key, _buckets(st.iteration_tokens), st.iteration_tokens.sum)
        yield fam
        for name in BLOCK_METRICS:      # every block is tracked (vLLM samples 1%)
            fam = HistogramMetricFamily(f"vllm:kv_block_{name}_seconds", BLOCK_DOCS[name],
                                        labels=labels)
            for key, st in zip(keys, stats):
                h = getattr(st.kv_block_metrics, name)
                fam.add_metric(key, _buckets(h), h.sum)
            yield fam


class ServerMetrics:
    """The front's metrics; `render()` is the /metrics body. Each series carries the
    engine that served the request (label `engine`: a data-parallel replica's rank, "0"
    for one engine), as vLLM's do."""

    def __init__(self, loop, model_name: str, max_model_len: int | None = None):
        """max_model_len: the top of vLLM's token-count buckets (TOKEN_BUCKETS without)."""
        self.model = model_name
        engines = [str(e) for e in range(getattr(loop, "size", 1))]
        self.registry = CollectorRegistry()
        self.registry.register(EngineStatsCollector(loop, model_name))
        # the process_* and python_* series of prometheus_client's default registry,
        # which vLLM serves (memory, CPU, open fds); not with several API-server
        # processes, whose /metrics (as vLLM's) is the multiprocess sum alone
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        lab = ["model_name", "engine"]
        reg = self.registry

        def per_engine(metric) -> list:
            return [metric.labels(model_name, e) for e in engines]

        def histogram(name: str, doc: str, buckets) -> list:
            return per_engine(Histogram(name, doc, lab, buckets=buckets, registry=reg))
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gap between tokens.",
                             ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Per-request (last - first) / (n - 1).", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.",
                             REQUEST_LATENCY_BUCKETS)
        # vLLM's request phases, on the engine's clock: by RequestMetrics property
        self.phases = {prop: histogram(f"vllm:request_{phase}_time_seconds", doc,
                                       REQUEST_LATENCY_BUCKETS)
                       for phase, (prop, doc) in PHASES.items()}
        # vLLM's token-count histograms: 1-2-5 buckets up to max_model_len
        per_model_len = buckets_1_2_5(max_model_len) if max_model_len else TOKEN_BUCKETS
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.",
                                    per_model_len)
        self.output_len = histogram("vllm:request_generation_tokens",
                                    "Generated tokens per request.", per_model_len)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request "
                                  "parameter.", N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens", "Histogram of "
                                           "the max_tokens request parameter.", per_model_len)
        self.max_generation = histogram("vllm:request_max_num_generation_tokens",
                                        "Histogram of maximum number of requested generation "
                                        "tokens.", per_model_len)
        self.prompt_tokens = per_engine(Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests.", lab, registry=reg))
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                lab + ["finished_reason"], registry=reg)
        for e in engines:
            for reason in (REASON_STOP, REASON_LENGTH, "abort", REASON_ERROR):
                self._success.labels(model_name, e, reason)   # 0 from the start, as vLLM
        self._served = None
        multiproc_dir = os.environ.get(MULTIPROC_ENV)
        if multiproc_dir:     # a registry that reads every process's files
            self.registry = CollectorRegistry()
            self.registry.register(EngineStatsCollector(loop, model_name))
            MultiProcessCollector(self.registry, multiproc_dir)
            self._served = Counter("roseplay:api_server_requests", "Finished requests "
                                   "(choices) by API-server process (--api-server-count).",
                                   ["model_name", "api_server"], registry=None).labels(
                model_name, os.environ.get(API_SERVER_INDEX_ENV, "0"))

    def observe_tokens(self, arrival: float, prev_time: float | None, times,
                       engine: int = 0) -> None:
        """One stream event's token timestamps (prev_time: the request's last token)."""
        ttft, itl = self.ttft[engine], self.itl[engine]
        for t in times:
            if prev_time is None:
                ttft.observe(max(0.0, t - arrival))
            else:
                itl.observe(max(0.0, t - prev_time))
            prev_time = t

    def observe_finish(self, output, finish_reason: str | None, finish_time: float,
                       arrival: float, counts_prompt: bool = True, engine: int = 0) -> None:
        """counts_prompt: False for the 2nd..nth choice of a prompt (n > 1): its tokens
        are counted once, with the first."""
        reason = "abort" if finish_reason == REASON_CANCELLED else finish_reason or "unknown"
        self._success.labels(self.model, str(engine), reason).inc()
        if self._served is not None:
            self._served.inc()
        self.e2e[engine].observe(max(0.0, finish_time - arrival))
        if output is None:
            return
        if counts_prompt:
            self.prompt_tokens[engine].inc(len(output.prompt_token_ids))
            self.prompt_len[engine].observe(len(output.prompt_token_ids))
        self.output_len[engine].observe(len(output.outputs[0].token_ids))
        if output.metrics.tpot is not None:
            self.tpot[engine].observe(output.metrics.tpot)
        for prop, hist in self.phases.items():
            seconds = getattr(output.metrics, prop)
            if seconds is not None:     # (None: a phase the request never reached)
                hist[engine].observe(max(0.0, seconds))

    def observe_request(self, n: int, max_tokens: int, max_generated: int,
                        engine: int = 0) -> None:
        """One prompt once its n choices have finished (however they ended, as vLLM):
        its n, its max_tokens, and the most tokens a choice generated."""
        self.params_n[engine].observe(n)
        self.params_max_tokens[engine].observe(max_tokens)
        self.max_generation[engine].observe(max_generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
