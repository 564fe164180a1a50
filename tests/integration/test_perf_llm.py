"""`make perf`'s script end to end, tiny: perf_analyzer (gRPC streaming, input-data JSON) at concurrency 1
against `ensemble` and `tensorrt_llm` on the real server, plus genai-perf when its virtualenv exists
(`make perf` creates build/perf/genai-venv). Marked slow: run with --run-slow."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENAI = ROOT / "build" / "perf" / "genai-venv" / "bin" / "genai-perf"


@pytest.mark.slow
def test_perf_llm_smoke(triton_server, tmp_path):
    max_tokens = 8
    cmd = [sys.executable, str(ROOT / "benchmarks" / "perf_llm.py"), "--url", triton_server.grpc_url,
           "--concurrency", "1", "--requests", "3", "--rounds", "1", "--max-tokens", str(max_tokens),
           "--prompt-tokens", "16",
           "--genai-concurrency", "1", "--genai-perf", "auto" if GENAI.exists() else "skip", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "summary.json").read_text())
    pa = {r["model"]: r for r in rows if r["source"] == "perf_analyzer"}
    assert set(pa) == {"ensemble", "tensorrt_llm"}
    for r in pa.values():
        assert r["concurrency"] == 1 and r["requests"] == 3
        assert r["output_tokens_per_s"] > 0 and 0 < r["ttft_p50_ms"] <= r["latency_p50_ms"]
        assert r["itl_p50_ms"] > 0
    # end_id = -1: every request streamed exactly max_tokens responses of one token each.
    export = json.loads((tmp_path / "pa_tensorrt_llm_c1.json").read_text())
    assert all(len(q["response_timestamps"]) >= max_tokens for q in export["experiments"][0]["requests"])
    if GENAI.exists():
        genai = [r for r in rows if r["source"] == "genai-perf"]
        assert genai and genai[0]["output_tokens_per_s"] > 0 and genai[0]["ttft_p50_ms"] > 0
    assert (tmp_path / "summary.csv").read_text().startswith("source,model,concurrency")
    assert (tmp_path / "perf.png").stat().st_size > 10_000
