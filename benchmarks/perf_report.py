"""Turn perf_analyzer / genai-perf exports into per-concurrency LLM metrics, CSV/JSON and a plot.

perf_analyzer's ``--profile-export-file`` (streaming mode) records, per request, its send timestamp and
the timestamp of every response. From it, per concurrency level:
- TTFT = first response - send; ITL (inter-token latency) = (last - first response) / (responses - 1),
  per request; percentiles p50 / p95 / p99 over the requests;
- request throughput = requests / (last response - first send) over the measured requests, and output
  token throughput = generated tokens / that span.

Invariants:
- A response is counted as one token only when the run fixes one token per response; ``tokens_per_request``
  (the run's max_tokens with EOS disabled, end_id = -1) makes token counts exact instead, and is what
  perf_llm.py passes. Empty final responses (the final flag alone) have no timestamp in the export.
- Nothing here talks to a server; inputs are files, outputs are files.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

PCTS = (50, 95, 99)
FIELDS = ["source", "model", "concurrency", "requests", "request_throughput_per_s", "output_tokens_per_s",
          *[f"ttft_p{p}_ms" for p in PCTS], *[f"itl_p{p}_ms" for p in PCTS],
          *[f"latency_p{p}_ms" for p in PCTS]]


def _pct(values: list[float], p: int) -> float | None:
    return float(np.percentile(values, p)) if values else None


def experiment_metrics(experiment: dict[str, Any] | list[dict[str, Any]], tokens_per_request: int | None) -> dict[str, Any]:
    """Metrics of one perf_analyzer experiment (one concurrency level), or of several rounds of the same
    level run apart (their spans add up; percentiles are over all their requests). A ``truncated`` export's
    requests count for the latencies only: the requests it lost ran in its span too."""
    rounds = experiment if isinstance(experiment, list) else [experiment]
    ttft, itl, latency, tokens, counted, span_s = [], [], [], 0, 0, 0.0
    for exp in rounds:
        first_send, last_response = None, None
        for r in exp.get("requests", []):
            stamps = sorted(r.get("response_timestamps") or [])
            if not stamps:
                continue
            sent = r["timestamp"]
            ttft.append((stamps[0] - sent) / 1e6)
            latency.append((stamps[-1] - sent) / 1e6)
            n = tokens_per_request if tokens_per_request else len(stamps)
            if not exp.get("truncated"):  # throughput counts only requests whose round is whole
                tokens, counted = tokens + n, counted + 1
            if len(stamps) > 1 and n > 1:
                itl.append((stamps[-1] - stamps[0]) / 1e6 / (n - 1))
            first_send = sent if first_send is None else min(first_send, sent)
            last_response = stamps[-1] if last_response is None else max(last_response, stamps[-1])
        if first_send is not None and last_response > first_send and not exp.get("truncated"):
            span_s += (last_response - first_send) / 1e9
    row: dict[str, Any] = {
        "concurrency": rounds[0]["experiment"]["value"],
        "requests": len(ttft),
        "request_throughput_per_s": counted / span_s if span_s else None,
        "output_tokens_per_s": tokens / span_s if span_s else None,
    }
    for p in PCTS:
        row[f"ttft_p{p}_ms"] = _pct(ttft, p)
        row[f"itl_p{p}_ms"] = _pct(itl, p)
        row[f"latency_p{p}_ms"] = _pct(latency, p)
    return row


def perf_analyzer_experiments(export_path: str | Path) -> list[dict]:
    """The export's experiments. perf_analyzer 2.49 sometimes stops writing an export part way (seen at
    1.1 to 4 MiB, exit code 0; the file ends mid-record): then the first experiment's complete requests
    are kept and the experiment is marked ``truncated``."""
    text = Path(export_path).read_text()
    try:
        return json.loads(text).get("experiments", [])
    except json.JSONDecodeError:
        return _salvaged(text)


def _salvaged(text: str) -> list[dict]:
    decoder = json.JSONDecoder()
    head = text.find('"experiment":')
    start = text.find('"requests":[', head)
    if head < 0 or start < 0:
        raise ValueError("export holds no experiment")
    experiment, _ = decoder.raw_decode(text, head + len('"experiment":'))
    requests, pos = [], start + len('"requests":[')
    while True:
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        requests.append(record)
        if end >= len(text) or text[end] != ",":
            break
        pos = end + 1
    return [{"experiment": experiment, "requests": requests, "truncated": True}]


def ratios(rows: list[dict], model: str, base: str) -> list[dict]:
    """Per concurrency level measured for both: model / base output tok/s and TTFT p50 (same invocation,
    same server: the comparison that survives a noisy machine). Rows measured from stamps (perf_analyzer's
    exports, the OpenAI client's), not genai-perf's own statistics."""
    by = {(r["model"], r["concurrency"]): r for r in rows if r["source"] != "genai-perf"}
    out = []
    for (m, c), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        b = by.get((base, c))
        if m != model or b is None or not r["output_tokens_per_s"] or not b["output_tokens_per_s"]:
            continue
        out.append({"concurrency": c, "tok_s_ratio": r["output_tokens_per_s"] / b["output_tokens_per_s"],
                    "ttft_p50_ratio": (r["ttft_p50_ms"] / b["ttft_p50_ms"]) if b["ttft_p50_ms"] else None})
    return out


def genai_perf_row(export_path: str | Path, model: str, concurrency: int) -> dict[str, Any]:
    """One row from genai-perf's ``profile_export_genai_perf.json`` (its own statistics, in ms)."""
    data = json.loads(Path(export_path).read_text())

    def stat(metric: str, key: str) -> float | None:
        value = data.get(metric, {}).get(key)
        return float(value) if value is not None else None

    row = {"source": "genai-perf", "model": model, "concurrency": concurrency,
           "requests": None,
           "request_throughput_per_s": stat("request_throughput", "avg"),
           "output_tokens_per_s": stat("output_token_throughput", "avg")}
    for p in PCTS:
        row[f"ttft_p{p}_ms"] = stat("time_to_first_token", f"p{p}")
        row[f"itl_p{p}_ms"] = stat("inter_token_latency", f"p{p}")
        row[f"latency_p{p}_ms"] = stat("request_latency", f"p{p}")
    return row


def write_summary(rows: list[dict], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "summary.csv", out / "summary.json"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    json_path.write_text(json.dumps(rows, indent=2) + "\n")
    return csv_path, json_path


def plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Three panels: output tokens/s vs concurrency; TTFT p50/p95/p99; inter-token latency p50/p95/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["source"], r["model"]), []).append(r)
    styles = {50: "-", 95: "--", 99: ":"}
    levels = sorted({r["concurrency"] for r in rows})
    for (source, model), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["concurrency"])
        c = [r["concurrency"] for r in rs]
        line = axes[0].plot(c, [r["output_tokens_per_s"] for r in rs], marker="o", label=f"{model} ({source})")[0]
        for p in PCTS:
            for ax, key in ((axes[1], "ttft"), (axes[2], "itl")):
                ax.plot(c, [r[f"{key}_p{p}_ms"] for r in rs], styles[p], color=line.get_color(), marker=".")
    for ax, ylabel in zip(axes, ("output tokens/s", "time to first token (ms)", "inter-token latency (ms)")):
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_xticks(levels)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    # Colors name the series (left panel); line styles the percentiles.
    axes[1].legend(handles=[plt.Line2D([], [], color="gray", linestyle=styles[p], label=f"p{p}") for p in PCTS],
                   fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
