"""`make perf` end to end, tiny, as the README runs it: its own tritonserver over the default deployment (the real
default model, from its GGUF), perf_analyzer (gRPC streaming, input-data JSON) against `ensemble`,
`tensorrt_llm_bls` and `tensorrt_llm`, the OpenAI front over the same server, and genai-perf `--backend tensorrtllm`
from the virtualenv `make perf` creates. The summary it writes is checked row by row. A user's HF folder is
`test_own_checkpoint.py`'s (the same script against a server of that folder)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("ensemble", "tensorrt_llm_bls", "tensorrt_llm", "openai")


def check_summary(out: Path, max_tokens: int, requests: int, genai: bool) -> list[dict]:
    """Every model's row is there, measured (non-zero throughput, ordered latencies), none an error; the files
    `make perf` names are written."""
    rows = json.loads((out / "summary.json").read_text())
    measured = {r["model"]: r for r in rows if r["source"] != "genai-perf"}
    assert set(measured) == set(MODELS), rows
    for r in measured.values():
        assert r["concurrency"] == 1 and r["requests"] == requests, r
        assert r["output_tokens_per_s"] > 0 and r["request_throughput_per_s"] > 0, r
        assert 0 < r["ttft_p50_ms"] <= r["latency_p50_ms"] and r["itl_p50_ms"] > 0, r
    # end_id = -1 (ignore_eos for the OpenAI front): every request streamed exactly max_tokens one-token responses.
    export = json.loads((out / "pa_tensorrt_llm_c1.json").read_text())
    assert all(len(q["response_timestamps"]) == max_tokens for q in export["experiments"][0]["requests"])
    genai_rows = [r for r in rows if r["source"] == "genai-perf"]
    if genai:
        assert [r["model"] for r in genai_rows] == ["ensemble"], genai_rows
        assert genai_rows[0]["output_tokens_per_s"] > 0 and genai_rows[0]["ttft_p50_ms"] > 0, genai_rows
    assert (out / "summary.csv").read_text().startswith("source,model,concurrency")
    assert (out / "perf.png").stat().st_size > 10_000
    return rows


def test_make_perf_on_the_default_model(built_repository, tmp_path):
    max_tokens, requests = 6, 3
    args = (f"--concurrency 1 --requests {requests} --rounds 1 --max-tokens {max_tokens} --prompt-tokens 16 "
            f"--genai-concurrency 1 --genai-perf require --out {tmp_path}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not this make's -j / flags
    proc = subprocess.run(["make", "--no-print-directory", "perf", f"PERF_ARGS={args}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    check_summary(tmp_path, max_tokens, requests, genai=True)
    for model in MODELS[:2] + MODELS[3:]:  # each one's ratio to tensorrt_llm is printed
        assert f"==> {model} / tensorrt_llm at concurrency 1: output tok/s" in proc.stdout, proc.stdout[-3000:]
