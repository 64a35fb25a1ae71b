"""/metrics in Prometheus text format (prometheus_client), one registry per app.

Counters and histograms are fed by the request handlers; the gauges (queue, running sequences, KV blocks,
prefix-cache hit rate) read the worker's live numbers when scraped.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily

from attnlab.kernels import paths

disable_created_metrics()  # the *_created series only double the scrape's size

# Buckets: TTFT spans a cached one-token prefill (~ms) to a long prompt on a CPU (seconds); TPOT a small model's
# decode step (~ms) to a large batch's (~0.5 s).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class Metrics:
    def __init__(self, worker):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("attnlab_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("attnlab_prompt_tokens", "prompt tokens received", registry=r)
        self.generation_tokens = Counter("attnlab_generation_tokens", "tokens generated and sent", registry=r)
        self.ttft = Histogram("attnlab_time_to_first_token_seconds", "submission to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("attnlab_time_per_output_token_seconds", "mean gap between a request's tokens",
                              buckets=TPOT_BUCKETS, registry=r)
        self.cancelled = Counter("attnlab_cancelled_requests", "requests stopped before their end (disconnect, "
                                 "shutdown)", registry=r)
        gauges = {
            "attnlab_queue_length": ("requests waiting for a batch slot", lambda: worker.queued),
            "attnlab_running_sequences": ("sequences prefilling or decoding", lambda: worker.running),
            "attnlab_prefix_cache_hit_rate": ("prompt tokens served from the prefix cache / prompt tokens",
                                              lambda: worker.snapshot()["prefix_hit_rate"]),
        }
        if "kv_blocks_total" in worker.engine.stats():
            gauges["attnlab_kv_blocks_used"] = ("KV-cache blocks held by sequences",
                                                lambda: worker.engine.stats()["kv_blocks_used"])
            gauges["attnlab_kv_blocks_free"] = ("KV-cache blocks free (including evictable cached prefixes)",
                                                lambda: worker.engine.stats()["kv_blocks_free"])
        for name, (doc, fn) in gauges.items():
            Gauge(name, doc, registry=r).set_function(fn)
        r.register(_EngineCounters(worker))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCounters:
    """The engine thread's own counts, read at scrape time: they only grow, so they are counters (a rate of
    preemptions or failures is what an alert watches)."""

    def __init__(self, worker):
        self.worker = worker

    def collect(self):
        t = self.worker.totals
        for name, doc, value in (
                ("attnlab_preemptions", "sequences preempted (recomputed later) since start", t.preemptions),
                ("attnlab_engine_step_errors", "engine forwards that failed (their sequences ended with an error)",
                 t.step_errors),
                ("attnlab_engine_sequence_errors", "sequences ended alone by a fault of their own (non-finite "
                 "logits, sampling)", t.sequence_errors)):
            yield CounterMetricFamily(name, doc, value=value)
        kernel_paths = CounterMetricFamily(
            "attnlab_kernel_path_calls", "calls of each compiled path and of each fallback, with its reason "
            "(kernels.paths; process-wide)", labels=["path"])
        for path, n in paths.snapshot().items():
            kernel_paths.add_metric([path], n)
        yield kernel_paths
