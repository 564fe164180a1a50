"""LLM serving metrics (Prometheus conventions), independent of how they are exported.

The Triton adapter passes a `family(name, description, kind)` factory backed by pb_utils.MetricFamily;
tests can pass a dict-backed one. Names are the single source for dashboards and docs.
Cost: engine busy seconds x `cost_per_instance_hour_usd` / 3600, so cost per token is
llm_cost_usd_total / llm_generation_tokens_total.
"""
from __future__ import annotations

from typing import Callable

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

METRICS = {
    "llm_prompt_tokens_total": (COUNTER, "Prompt tokens admitted"),
    "llm_generation_tokens_total": (COUNTER, "Generated tokens returned"),
    "llm_time_to_first_token_seconds": (HISTOGRAM, "Arrival to first generated token"),
    "llm_time_per_output_token_seconds": (HISTOGRAM, "Mean time between generated tokens of a request"),
    "llm_requests_running": (GAUGE, "Requests in the running batch"),
    "llm_requests_waiting": (GAUGE, "Requests waiting for admission"),
    "llm_kv_cache_usage_ratio": (GAUGE, "Fraction of KV cache blocks in use"),
    "llm_prefix_cache_hit_ratio": (GAUGE, "Prompt tokens served from the prefix cache / prompt tokens looked up"),
    "llm_spec_decode_acceptance_ratio": (GAUGE, "Accepted draft tokens / proposed draft tokens"),
    "llm_preemptions_total": (COUNTER, "Requests preempted (KV blocks reclaimed, recomputed later)"),
    "llm_cost_usd_total": (COUNTER, "Engine busy time priced at cost_per_instance_hour_usd"),
}

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]


class CounterHistogram:
    """A Prometheus histogram built from counters (`<name>_bucket{le=...}`, `<name>_sum`, `<name>_count`),
    for exporters without a native histogram kind (Triton 2.51's Python backend has none).
    histogram_quantile() works on it exactly as on a native histogram."""

    def __init__(self, family, name: str, desc: str, labels: dict, buckets: list[float]) -> None:
        make_bucket = family(f"{name}_bucket", f"{desc} (cumulative buckets)", COUNTER)
        make_sum = family(f"{name}_sum", f"{desc} (sum)", COUNTER)
        make_count = family(f"{name}_count", f"{desc} (count)", COUNTER)
        self._families = (make_bucket, make_sum, make_count)  # see LLMMetrics._families
        self.buckets = [(b, make_bucket(labels={**labels, "le": repr(float(b))})) for b in buckets]
        self.buckets.append((float("inf"), make_bucket(labels={**labels, "le": "+Inf"})))
        self.sum = make_sum(labels=labels)
        self.count = make_count(labels=labels)

    def observe(self, value: float) -> None:
        for bound, metric in self.buckets:
            if value <= bound:
                metric.increment(1)
        self.sum.increment(value)
        self.count.increment(1)


class LLMMetrics:
    """Holds one metric per name for a model; `publish` turns engine counters into metric updates.

    Invariant: counters only ever increase (deltas since the last publish are added)."""

    def __init__(self, family: Callable[[str, str, str], Callable[..., object] | None], model: str,
                 cost_per_hour: float = 0.0) -> None:
        """`family` returns a metric constructor, or None for a kind the exporter lacks (histograms)."""
        labels = {"model": model}
        self.cost_per_hour = cost_per_hour
        self.m = {}
        # The constructors (bound to their families) are kept: Triton rejects updates of a metric whose
        # MetricFamily was garbage-collected.
        self._families = []
        for name, (kind, desc) in METRICS.items():
            make = family(name, desc, kind)
            self._families.append(make)
            if kind == HISTOGRAM:
                buckets = TTFT_BUCKETS if "first_token" in name else TPOT_BUCKETS
                self.m[name] = (make(labels=labels, buckets=buckets) if make is not None
                                else CounterHistogram(family, name, desc, labels, buckets))
            else:
                self.m[name] = make(labels=labels)
        self._last = {"prompt": 0, "gen": 0, "preempt": 0, "busy": 0.0}

    def publish(self, stats, running: int, waiting: int, kv_usage: float) -> None:
        d_prompt = stats.prompt_tokens - self._last["prompt"]
        d_gen = stats.generation_tokens - self._last["gen"]
        d_pre = stats.preemptions - self._last["preempt"]
        d_busy = stats.busy_seconds - self._last["busy"]
        self._last = {"prompt": stats.prompt_tokens, "gen": stats.generation_tokens,
                      "preempt": stats.preemptions, "busy": stats.busy_seconds}
        if d_prompt:
            self.m["llm_prompt_tokens_total"].increment(d_prompt)
        if d_gen:
            self.m["llm_generation_tokens_total"].increment(d_gen)
        if d_pre:
            self.m["llm_preemptions_total"].increment(d_pre)
        if d_busy > 0 and self.cost_per_hour > 0:
            self.m["llm_cost_usd_total"].increment(d_busy * self.cost_per_hour / 3600.0)
        self.m["llm_requests_running"].set(running)
        self.m["llm_requests_waiting"].set(waiting)
        self.m["llm_kv_cache_usage_ratio"].set(kv_usage)
        if stats.draft_tokens:
            self.m["llm_spec_decode_acceptance_ratio"].set(stats.accepted_draft_tokens / stats.draft_tokens)
        if stats.prefix_query_tokens:
            self.m["llm_prefix_cache_hit_ratio"].set(stats.prefix_hit_tokens / stats.prefix_query_tokens)

    def observe_request(self, ttft: float | None, tpot: float | None) -> None:
        if ttft is not None:
            self.m["llm_time_to_first_token_seconds"].observe(ttft)
        if tpot is not None:
            self.m["llm_time_per_output_token_seconds"].observe(tpot)


# --------------------------------------------------------------------------- NVIDIA's metric families
# The families NVIDIA's tensorrtllm backend reports (TensorRT-LLM triton_backend/inflight_batcher_llm/src/
# custom_metrics_reporter/custom_metrics_reporter.cc, read from their source), so dashboards and gateways
# built for it read ours: the Gateway API Inference Extension takes queue depth from
# nv_trt_llm_request_metrics{request_type="waiting"} and KV use from
# nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}. Every metric is labelled model and
# version plus one category label. family -> (kind, description, label key, ((label value, stat key), ...)).
# The stat keys are those of the iteration-stats JSON TensorRT-LLM logs (``iteration_stats`` below).
NVIDIA_GAUGES: dict[str, tuple[str, str, str, tuple[tuple[str, str], ...]]] = {
    "nv_trt_llm_request_metrics": (GAUGE, "TRT LLM request metrics", "request_type", (
        ("active", "Active Request Count"), ("max", "Max Request Count"), ("scheduled", "Scheduled Requests"),
        ("context", "Context Requests"), ("waiting", "Waiting Requests"))),
    "nv_trt_llm_runtime_memory_metrics": (GAUGE, "TRT LLM runtime memory metrics", "memory_type", (
        ("cpu", "Runtime CPU Memory Usage"), ("gpu", "Runtime GPU Memory Usage"),
        ("pinned", "Runtime Pinned Memory Usage"))),
    "nv_trt_llm_kv_cache_block_metrics": (GAUGE, "TRT LLM KV cache block metrics", "kv_cache_block_type", (
        ("max", "Max KV cache blocks"), ("free", "Free KV cache blocks"), ("used", "Used KV cache blocks"),
        ("tokens_per", "Tokens per KV cache block"), ("reused", "Reused KV cache blocks"),
        ("fraction", "Fraction used KV cache blocks"))),
    "nv_trt_llm_inflight_batcher_metrics": (GAUGE, "TRT LLM inflight_batcher-specific metrics",
                                            "inflight_batcher_specific_metric", (
        ("total_context_tokens", "Total Context Tokens"), ("generation_requests", "Generation Requests"),
        ("micro_batch_id", "MicroBatch ID"), ("paused_requests", "Paused Requests"))),
    "nv_trt_llm_general_metrics": (GAUGE, "General TRT LLM metrics", "general_type", (
        ("timestamp", "Timestamp"), ("iteration_counter", "Iteration Counter"))),
}
# Per finished request: family -> (description, response_metric_type, observed quantity).
NVIDIA_TOKEN_HISTOGRAMS = {
    "nv_llm_input_token_len": ("TRT LLM response metrics", "total_input_tokens", "prompt"),
    "nv_llm_output_token_len": ("TRT LLM response metrics", "total_output_tokens", "output"),
}
TOKEN_LEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"  # TensorRT-LLM's IterationStats timestamp (local time)


def iteration_stats(it, max_requests: int, max_blocks: int, tokens_per_block: int, reused_blocks: int,
                    cpu_bytes: int, gpu_bytes: int) -> dict[str, object]:
    """One step (an engine.stats.IterationStats) as TensorRT-LLM's iteration-stats JSON. As in NVIDIA's
    backend, "Waiting Requests" is active minus scheduled and the fraction is used / max."""
    from datetime import datetime

    used = max_blocks - it.free_blocks
    return {
        "Active Request Count": it.active_requests, "Max Request Count": max_requests,
        "Scheduled Requests": it.scheduled_requests, "Context Requests": it.context_requests,
        "Waiting Requests": max(it.active_requests - it.scheduled_requests, 0),
        "Runtime CPU Memory Usage": cpu_bytes, "Runtime GPU Memory Usage": gpu_bytes,
        "Runtime Pinned Memory Usage": 0,
        "Max KV cache blocks": max_blocks, "Free KV cache blocks": it.free_blocks, "Used KV cache blocks": used,
        "Tokens per KV cache block": tokens_per_block, "Reused KV cache blocks": reused_blocks,
        "Fraction used KV cache blocks": used / max_blocks if max_blocks else 0.0,
        "Total Context Tokens": it.context_tokens, "Generation Requests": it.generation_requests,
        "MicroBatch ID": 0, "Paused Requests": it.paused_requests,
        "Timestamp": datetime.fromtimestamp(it.timestamp).strftime(TIMESTAMP_FORMAT),
        "Iteration Counter": it.iteration,
    }


class NvidiaMetrics:
    """NVIDIA's families for one model: ``publish(stats)`` sets the gauges from one iteration-stats dict
    (the timestamp as microseconds since the epoch, as NVIDIA's reporter converts it); ``observe`` feeds
    the token-length histograms. ``family`` as for LLMMetrics, but histograms must be native here: the
    exposition must read ``nv_llm_input_token_len_bucket{model=...,le=...}`` (NVIDIA's label order)."""

    def __init__(self, family, model: str, version: str) -> None:
        base = {"model": model, "version": str(version)}
        self._families = []  # kept alive (see LLMMetrics)
        self.gauges: dict[str, object] = {}
        for name, (kind, desc, label, values) in NVIDIA_GAUGES.items():
            make = family(name, desc, kind)
            self._families.append(make)
            for value, stat in values:
                self.gauges[stat] = make(labels={**base, label: value})
        self.histograms = {}
        for name, (desc, kind, what) in NVIDIA_TOKEN_HISTOGRAMS.items():
            make = family(name, desc, HISTOGRAM)
            if make is None:
                raise RuntimeError(f"{name} needs native histograms (Triton >= 2.50 Python backend)")
            self._families.append(make)
            self.histograms[what] = make(labels={**base, "response_metric_type": kind}, buckets=TOKEN_LEN_BUCKETS)

    def publish(self, stats: dict[str, object]) -> None:
        from datetime import datetime

        for key, metric in self.gauges.items():
            value = stats[key]
            if key == "Timestamp":
                value = round(datetime.strptime(str(value), TIMESTAMP_FORMAT).timestamp() * 1e6)
            metric.set(float(value))

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        self.histograms["prompt"].observe(prompt_tokens)
        self.histograms["output"].observe(output_tokens)
