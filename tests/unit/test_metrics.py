"""LLMMetrics over a dict-backed exporter: counters move by deltas, histograms from counters are cumulative."""
from tritonllm.engine.engine import EngineStats
from tritonllm.metrics import HISTOGRAM, METRICS, LLMMetrics


class _Metric:
    def __init__(self, labels):
        self.labels, self.value = labels, 0.0

    def increment(self, v):
        assert v >= 0
        self.value += v

    def set(self, v):
        self.value = v


def _registry():
    store = {}

    def family(name, desc, kind):
        if kind == HISTOGRAM:
            return None

        def make(labels):
            m = _Metric(labels)
            store[(name, tuple(sorted(labels.items())))] = m
            return m
        return make
    return store, family


def _get(store, name, **extra):
    return store[(name, tuple(sorted({"model": "m", **extra}.items())))].value


def test_publish_moves_counters_by_delta_and_sets_gauges():
    store, family = _registry()
    metrics = LLMMetrics(family, "m", cost_per_hour=36.0)
    stats = EngineStats(prompt_tokens=10, generation_tokens=5, preemptions=1, busy_seconds=2.0)
    metrics.publish(stats, running=3, waiting=1, kv_usage=0.25)
    stats.generation_tokens, stats.busy_seconds = 9, 3.0
    metrics.publish(stats, running=0, waiting=0, kv_usage=0.0)
    assert _get(store, "llm_prompt_tokens_total") == 10
    assert _get(store, "llm_generation_tokens_total") == 9
    assert _get(store, "llm_preemptions_total") == 1
    assert abs(_get(store, "llm_cost_usd_total") - 3.0 * 36.0 / 3600) < 1e-12
    assert _get(store, "llm_requests_running") == 0


def test_counter_histogram_is_cumulative():
    store, family = _registry()
    metrics = LLMMetrics(family, "m")
    metrics.observe_request(0.03, 0.002)
    metrics.observe_request(0.3, None)
    name = "llm_time_to_first_token_seconds"
    assert _get(store, f"{name}_count") == 2 and abs(_get(store, f"{name}_sum") - 0.33) < 1e-12
    assert _get(store, f"{name}_bucket", le="0.025") == 0
    assert _get(store, f"{name}_bucket", le="0.05") == 1
    assert _get(store, f"{name}_bucket", le="0.5") == 2
    assert _get(store, f"{name}_bucket", le="+Inf") == 2
    assert _get(store, "llm_time_per_output_token_seconds_count") == 1
    assert set(METRICS) >= {"llm_kv_cache_usage_ratio", "llm_spec_decode_acceptance_ratio"}
