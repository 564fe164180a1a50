"""deploy/grafana/llm_dashboard.json parses, and every metric it queries is one this deployment exports:
an `llm_*` name of tritonllm.metrics.METRICS (histograms also as _bucket/_sum/_count) or one of Triton's
own `nv_*` metrics (the names tritonserver 2.51 exposes on a CPU machine). Also: every LLM metric is on
the dashboard and in docs/observability.md, quantiles are taken over `_bucket` series by `le`, and panels
do not overlap."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tritonllm.metrics import HISTOGRAM, METRICS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "llm_dashboard.json"
DOC = ROOT / "docs" / "observability.md"

# What tritonserver exposes without a GPU (seen on its metrics port); GPU hosts add nv_gpu_* / nv_energy_*.
TRITON_METRICS = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
}
METRIC_NAME = re.compile(r"\b((?:llm|nv)_[a-z0-9_]+)\b")


def _exported_names() -> set[str]:
    names = set(TRITON_METRICS)
    for name, (kind, _) in METRICS.items():
        names.add(name)
        if kind == HISTOGRAM:
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_is_a_grafana_dashboard(dashboard):
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "model"} <= variables
    for expr in _exprs(dashboard):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_every_queried_metric_exists(dashboard):
    exported = _exported_names()
    used = {m for expr in _exprs(dashboard) for m in METRIC_NAME.findall(expr)}
    assert used, "the dashboard queries no metric"
    assert used <= exported, f"unknown metrics: {sorted(used - exported)}"


def test_every_llm_metric_is_on_the_dashboard_and_documented(dashboard):
    used = {m for expr in _exprs(dashboard) for m in METRIC_NAME.findall(expr)}
    doc = DOC.read_text()
    for name, (kind, _) in METRICS.items():
        series = f"{name}_bucket" if kind == HISTOGRAM else name
        assert series in used, f"{series} is not on the dashboard"
        assert f"`{name}`" in doc, f"{name} is not in docs/observability.md"


def test_quantiles_come_from_histogram_buckets(dashboard):
    exprs = [e for e in _exprs(dashboard) if "histogram_quantile" in e]
    assert {"0.5", "0.95", "0.99"} <= {re.search(r"histogram_quantile\(([\d.]+)", e).group(1) for e in exprs}
    for e in exprs:
        assert "_bucket" in e and "by (le" in e, e


def test_panels_do_not_overlap(dashboard):
    cells = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
