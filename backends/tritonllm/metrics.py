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
