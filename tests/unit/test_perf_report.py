"""benchmarks/perf_report.py: LLM metrics from perf_analyzer's profile export (timestamps in ns)."""
from __future__ import annotations

import csv
import json

import pytest


from benchmarks.perf_report import FIELDS, experiment_metrics, perf_analyzer_rows, write_summary  # noqa: E402

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
    rows = perf_analyzer_rows(path, "ensemble", 2)
    assert [r["concurrency"] for r in rows] == [1, 4]  # sorted by concurrency
    assert rows[1]["requests"] == 1
    csv_path, json_path = write_summary(rows, tmp_path / "out")
    header = next(csv.reader(csv_path.open()))
    assert header == FIELDS
    assert json.loads(json_path.read_text())[0]["model"] == "ensemble"
