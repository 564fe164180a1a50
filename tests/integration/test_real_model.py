"""The default deployment serves a real model: SmolLM2-135M-Instruct from its own GGUF (Q4_1 blocks, Q8_0 embedding).

Profile ``exact`` (activation_quantization none) serves its greedy text equal to transformers' on the same file
(transformers' GGUF loader, dequantized to fp32), through the ensemble, the BLS and the OpenAI chat endpoint; the
default (``auto``: int8 activations on the file's quantized tensors, as llama.cpp computes them) serves what our
engine computes in this process with the same settings, at a perplexity within 1% of the exact mode's; every KV
block is back afterwards.

The reference runs in this process: transformers' generate, greedy, stopping at the model's end-of-turn token, on
the ids our own preprocessing makes (the prompts are plain text, the chat goes through the model's ChatML template).
"""
from __future__ import annotations

import functools
import json
import os
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from openai_helpers import openai_server, sdk_client
from robustness_helpers import served_parameters, stream_request, text_of, text_tensors, wait_idle

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "The three primary colors are", "Photosynthesis is the process by which"]
CHAT = [{"role": "user", "content": "What is the capital of Germany?"}]
NEW = 24


def _all_blocks_back(server) -> None:
    m = wait_idle(server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0 and m["llm_requests_running"] == 0, m


@pytest.fixture(scope="module")
def reference(default_model_reference):
    """(tokenizer, greedy(ids) -> generated ids) of transformers on the served file (each prompt's run kept)."""
    from tritonllm.model_files import load_hf_tokenizer

    tok = load_hf_tokenizer(GGUF)
    model = default_model_reference

    @functools.lru_cache(maxsize=None)
    def greedy_of(ids: tuple[int, ...]) -> tuple[int, ...]:
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        return tuple(t for t in out[0, len(ids):].tolist() if t != tok.eos_token_id)

    def greedy(ids: list[int]) -> list[int]:
        return list(greedy_of(tuple(ids)))

    return tok, greedy


def test_the_default_deployment_names_the_real_model(triton_server, exact_server):
    path = served_parameters(triton_server, "tensorrt_llm")["gpt_model_path"]
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.samefile(GGUF, ROOT / "model_repository" / "tensorrt_llm" / path)
    assert served_parameters(triton_server, "tensorrt_llm")["activation_quantization"] == "auto"
    assert served_parameters(exact_server, "tensorrt_llm")["activation_quantization"] == "none"


def _engine_greedy(engine, ids: list[int], eos: int) -> list[int]:
    from tritonllm.engine.request import SamplingParams

    engine.add_request("r", ids, SamplingParams(max_tokens=NEW, end_id=eos))
    out = []
    while engine.has_work():
        for o in engine.step():
            out += o.new_token_ids
    return [t for t in out if t != eos]


def test_the_default_serves_int8_activations_as_the_engine_computes_them(triton_server, reference):
    """auto resolves to int8 activations on this file; the served greedy ids equal the engine's in this process with
    the default settings (each output row is one thread's, in one order, whatever the batch: bit for bit), and
    differ from the exact mode's on at least one prompt (the int8 path really runs)."""
    from robustness_helpers import ids_of, ids_tensors
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine

    tok, greedy = reference
    engine = LLMEngine(str(GGUF), EngineConfig(max_kv_tokens=1024))
    assert engine.model.activation_quantization == "int8"
    drifted = 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        chunks, err = stream_request(triton_server.grpc_url, "tensorrt_llm", {
            **ids_tensors(ids, NEW, stream=True), "end_id": np.array([[tok.eos_token_id]], np.int32)})
        assert err is None, err.message()
        served = [t for t in ids_of(chunks) if t != tok.eos_token_id]
        assert served == _engine_greedy(engine, ids, tok.eos_token_id), prompt
        drifted += served != greedy(ids)
    assert drifted > 0
    _all_blocks_back(triton_server)


def test_int8_activations_cost_under_one_percent_of_perplexity(reference):
    """The bound that makes int8 the default on quantized files (make eval's measure, smaller): perplexity of
    the default file over 4 chunks of 256 tokens of the demo corpus, each chunk's second half scored, int8 within 1%
    of the exact mode's (measured: docs/quantization.md)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "build_scripts"))
    import demo_corpus
    from eval_ppl import chunks, ours

    tok, _ = reference
    ids = tok(demo_corpus.load_corpus(max_chars=8000)).input_ids
    parts = chunks(ids, 256, 4, add_bos=False, bos=None)
    assert len(parts) == 4
    exact, fast = (ours(GGUF, parts, mode, threads=torch.get_num_threads())["ppl"] for mode in ("none", "int8"))
    print(f"perplexity: none {exact:.4f}, int8 {fast:.4f} ({fast / exact:.4f}x)")
    assert abs(fast / exact - 1) < 0.01 and fast != exact, (exact, fast)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_served_greedy_text_equals_transformers(exact_server, reference, model):
    tok, greedy = reference
    for prompt in PROMPTS:
        chunks, err = stream_request(exact_server.grpc_url, model, text_tensors(prompt, NEW, stream=np.array([[True]])))
        assert err is None, err.message()
        expected = tok.decode(greedy(tok.encode(prompt)), skip_special_tokens=True)
        assert text_of(chunks) == expected, (model, prompt)
    _all_blocks_back(exact_server)


def test_served_chat_equals_transformers_through_the_openai_api(exact_server, reference):
    tok, greedy = reference
    ids = tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))  # as preprocessing
    expected = tok.decode(greedy(ids), skip_special_tokens=True)
    assert "Berlin" in expected  # a real answer, not a toy's
    for url, _ in openai_server(exact_server):
        client = sdk_client(url)
        r = client.chat.completions.create(model="tritonllm", messages=CHAT, max_tokens=NEW, temperature=0)
        assert r.choices[0].message.content == expected
        assert r.usage.prompt_tokens == len(ids)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tritonllm", messages=CHAT, max_tokens=NEW, temperature=0, stream=True) if c.choices)
        assert streamed == expected
    _all_blocks_back(exact_server)


def test_ids_through_tensorrt_llm_equal_transformers(exact_server, reference):
    """The token-level slot on its own: the same ids, the same greedy ids."""
    from robustness_helpers import ids_of, ids_tensors

    tok, greedy = reference
    ids = tok.encode(PROMPTS[1])
    chunks, err = stream_request(exact_server.grpc_url, "tensorrt_llm",
                                 {**ids_tensors(ids, NEW, stream=True), "end_id": np.array([[tok.eos_token_id]], np.int32)})
    assert err is None, err.message()
    assert [t for t in ids_of(chunks) if t != tok.eos_token_id] == greedy(ids)
    _all_blocks_back(exact_server)


def _served_itl_ms(grpc_url: str, ids: list[int], n: int) -> list[float]:
    """Gaps (ms) between the streamed responses of one tensorrt_llm request, after the first."""
    import tritonclient.grpc as grpcclient

    from robustness_helpers import grpc_inputs, ids_tensors

    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error, time.perf_counter())))
    stamps = []
    try:
        client.async_stream_infer("tensorrt_llm", grpc_inputs(ids_tensors(ids, n, stream=True)),
                                  enable_empty_final_response=True)
        while True:
            result, error, at = q.get(timeout=120)
            assert error is None, error.message()
            response = result.get_response()
            if response.outputs:
                stamps.append(at)
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert len(stamps) == n
    return [1e3 * (b - a) for a, b in zip(stamps[1:], stamps[2:])]


def test_a_served_token_costs_about_what_the_engine_spends_on_it(triton_server, reference):
    """The raw tensorrt_llm path at one stream against the engine in its own process on the same file and knobs
    (benchmarks/bench_serving.py --engine-only: built and stepped on one runner thread, as served). Within 1.5x:
    the engine built on another thread than it steps on (two OpenMP teams on 2 cores) made it 2.1x."""
    tok, _ = reference
    engine = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serving.py"), "--engine-only",
                             "--max-tokens", "64"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "backends")})
    assert engine.returncode == 0, engine.stderr[-2000:]
    engine_ms = json.loads(engine.stdout.strip().splitlines()[-1])["engine_itl_p50_ms"]
    gaps = [g for prompt in PROMPTS[:3] for g in _served_itl_ms(triton_server.grpc_url, tok.encode(prompt * 8), 64)]
    served_ms = statistics.median(gaps)
    print(f"ITL p50: engine in process {engine_ms:.2f} ms, served through tensorrt_llm {served_ms:.2f} ms "
          f"({served_ms / engine_ms:.2f}x)")
    assert served_ms <= 1.5 * engine_ms, (served_ms, engine_ms)
    _all_blocks_back(triton_server)
