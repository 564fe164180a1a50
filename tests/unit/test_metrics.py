"""LLMMetrics over a dict-backed exporter: counters move by deltas, histograms from counters are cumulative."""
import pytest

from tritonllm.engine.stats import EngineStats
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


# --------------------------------------------------------------------------- NVIDIA's families

def _native_registry():
    """Like _registry, with native histograms (as Triton 2.51's Python backend has them)."""
    store = {}

    def family(name, desc, kind):
        def make(labels, buckets=None):
            m = _Metric(labels)
            m.buckets, m.observed = buckets, []
            m.observe = m.observed.append
            store[(name, tuple(sorted(labels.items())))] = m
            return m
        return make
    return store, family


def test_iteration_stats_are_tensorrt_llms_json_and_the_gauges_follow_them():
    from datetime import datetime

    from tritonllm.engine.stats import IterationStats
    from tritonllm.metrics import NVIDIA_GAUGES, TIMESTAMP_FORMAT, NvidiaMetrics, iteration_stats

    it = IterationStats(iteration=7, timestamp=1_700_000_000.123456, active_requests=5, scheduled_requests=3,
                        context_requests=1, generation_requests=2, context_tokens=40, paused_requests=1,
                        free_blocks=90)
    stats = iteration_stats(it, max_requests=16, max_blocks=100, tokens_per_block=16, reused_blocks=4,
                            cpu_bytes=1 << 20, gpu_bytes=0)
    keys = {stat for _, _, _, values in NVIDIA_GAUGES.values() for _, stat in values}
    assert set(stats) == keys  # one gauge per JSON key: NVIDIA's custom-metrics test counts them
    assert stats["Waiting Requests"] == 2 and stats["Used KV cache blocks"] == 10
    assert stats["Fraction used KV cache blocks"] == 0.1 and stats["Iteration Counter"] == 7
    assert datetime.strptime(stats["Timestamp"], TIMESTAMP_FORMAT).timestamp() == pytest.approx(it.timestamp, abs=1e-6)
    store, family = _native_registry()
    nv = NvidiaMetrics(family, "tensorrt_llm", 1)
    nv.publish(stats)

    def gauge(name, **label):
        return store[(name, tuple(sorted({"model": "tensorrt_llm", "version": "1", **label}.items())))].value

    assert gauge("nv_trt_llm_request_metrics", request_type="waiting") == 2
    assert gauge("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction") == 0.1
    assert gauge("nv_trt_llm_general_metrics", general_type="timestamp") == pytest.approx(it.timestamp * 1e6, abs=1)
    nv.observe(prompt_tokens=12, output_tokens=30)
    hist = store[("nv_llm_input_token_len", (("model", "tensorrt_llm"), ("response_metric_type", "total_input_tokens"),
                                             ("version", "1")))]
    assert hist.observed == [12] and hist.buckets == [10.0, 50.0, 100.0, 500.0, 1000.0]


def test_nvidia_metrics_refuse_an_exporter_without_native_histograms():
    from tritonllm.metrics import NvidiaMetrics

    _, family = _registry()
    with pytest.raises(RuntimeError, match="native histograms"):
        NvidiaMetrics(family, "m", 1)
