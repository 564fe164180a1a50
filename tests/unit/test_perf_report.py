"""benchmarks/perf_report.py: LLM metrics from perf_analyzer's profile export (timestamps in ns)."""
from __future__ import annotations

import csv
import json

import pytest


from benchmarks.perf_report import FIELDS, experiment_metrics, perf_analyzer_experiments, ratios, write_summary

MS = 1_000_000


def _request(sent_ms: float, first_ms: float, gap_ms: float, n: int) -> dict:
    return {"timestamp": int(sent_ms * MS),
            "response_timestamps": [int((first_ms + i * gap_ms) * MS) for i in range(n)]}


def test_ttft_itl_and_throughput_are_computed_per_request():
    # Two requests of 5 tokens: TTFT 10 and 30 ms, gaps 2 and 4 ms; span 0 .. 1036 ms.
    exp = {"experiment": {"mode": "concurrency", "value": 2},
           "requests": [_request(0, 10, 2, 5), _request(1000, 1030, 1.5, 5)]}
    row = experiment_metrics(exp, tokens_per_request=5)
    assert row["concurrency"] == 2 and row["requests"] == 2
    assert row["ttft_p50_ms"] == pytest.approx(20.0)
    assert row["ttft_p99_ms"] == pytest.approx(29.8)
    assert row["itl_p50_ms"] == pytest.approx(1.75)
    assert row["latency_p50_ms"] == pytest.approx((18 + 36) / 2)
    assert row["request_throughput_per_s"] == pytest.approx(2 / 1.036)
    assert row["output_tokens_per_s"] == pytest.approx(10 / 1.036)


def test_tokens_per_request_overrides_the_response_count():
    # A response may carry several tokens: with 9 tokens over 3 responses the ITL is span / 8.
    exp = {"experiment": {"value": 1}, "requests": [_request(0, 5, 8, 3)]}
    assert experiment_metrics(exp, 9)["itl_p50_ms"] == pytest.approx(16 / 8)
    assert experiment_metrics(exp, None)["itl_p50_ms"] == pytest.approx(16 / 2)


def test_requests_without_responses_are_not_counted(tmp_path):
    export = {"experiments": [{"experiment": {"value": 4}, "requests": [_request(0, 3, 1, 2),
                                                                         {"timestamp": 0, "response_timestamps": []}]},
                              {"experiment": {"value": 1}, "requests": [_request(0, 3, 1, 2)]}]}
    path = tmp_path / "pa.json"
    path.write_text(json.dumps(export))
    rows = sorted(({"source": "perf_analyzer", "model": "ensemble", **experiment_metrics(e, 2)}
                   for e in perf_analyzer_experiments(path)), key=lambda r: r["concurrency"])
    assert [r["concurrency"] for r in rows] == [1, 4]
    assert rows[1]["requests"] == 1
    csv_path, json_path = write_summary(rows, tmp_path / "out")
    header = next(csv.reader(csv_path.open()))
    assert header == FIELDS
    assert json.loads(json_path.read_text())[0]["model"] == "ensemble"


def test_rounds_of_one_level_add_their_spans():
    # Two rounds run apart (an hour between them): throughput is over the two spans, not the gap.
    one = {"experiment": {"value": 1}, "requests": [_request(0, 10, 10, 10)]}           # span 100 ms
    two = {"experiment": {"value": 1}, "requests": [_request(3.6e6, 3.6e6 + 10, 30, 10)]}  # span 280 ms
    row = experiment_metrics([one, two], 10)
    assert row["requests"] == 2
    assert row["output_tokens_per_s"] == pytest.approx(20 / 0.380)
    assert row["ttft_p50_ms"] == pytest.approx(10.0)


def test_an_export_cut_short_keeps_its_complete_requests(tmp_path):
    export = {"experiments": [{"experiment": {"mode": "concurrency", "value": 2},
                               "requests": [_request(0, 3, 1, 2), _request(1, 5, 1, 2), _request(2, 6, 1, 2)]}]}
    text = json.dumps(export, separators=(",", ":"))
    path = tmp_path / "pa.json"
    path.write_text(text[: text.index('{"timestamp":2000000') + 25])  # ends inside the third request
    (exp,) = perf_analyzer_experiments(path)
    assert exp["truncated"] and exp["experiment"]["value"] == 2
    assert [r["timestamp"] for r in exp["requests"]] == [0, MS]
    row = experiment_metrics([exp], 2)
    assert row["requests"] == 2 and row["ttft_p50_ms"] is not None and row["output_tokens_per_s"] is None
    assert row["request_throughput_per_s"] is None
    whole = {"experiment": {"value": 2}, "requests": [_request(0, 10, 10, 2)]}     # 1 request over 20 ms
    assert experiment_metrics([whole, exp], 2)["request_throughput_per_s"] == pytest.approx(1 / 0.020)
    path.write_text(text)
    assert "truncated" not in perf_analyzer_experiments(path)[0]


def test_ratios_pair_the_models_per_level():
    rows = [{"source": "perf_analyzer", "model": m, "concurrency": c, "output_tokens_per_s": t, "ttft_p50_ms": f}
            for m, c, t, f in (("ensemble", 1, 80.0, 12.0), ("tensorrt_llm", 1, 100.0, 8.0),
                               ("ensemble", 8, 300.0, 20.0))]
    assert ratios(rows, "ensemble", "tensorrt_llm") == [
        {"concurrency": 1, "tok_s_ratio": pytest.approx(0.8), "ttft_p50_ratio": pytest.approx(1.5)}]
