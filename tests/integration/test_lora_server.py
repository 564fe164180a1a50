"""Multi-LoRA on the real server: the toy repository (fixture ``toy_server``, tests/toy_repository.py) loads the
test toy's adapter (build_demo_lora.py --steps 0: random A and B over the toy's modules) as lora_task_id 1 of
`tensorrt_llm`. The adapter's output equals our engine run in-process with the same
adapter (which tests/unit/test_lora.py proves equal to HF with the adapter merged), differs from the base
model's, reaches the engine through the ensemble and the BLS, and mixes with base requests in one batch.
The same adapter loaded at run time by lora_path (under the toy's lora_root) answers the same; unknown ids, paths
outside lora_root and malformed in-request weights are INVALID_ARG naming the input."""
from __future__ import annotations

import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from test_engine_server import Stream, _ids_request
from robustness_helpers import wait_idle
from test_llm_pipeline import generate, http_post

ROOT = Path(__file__).resolve().parents[2]
from toy_repository import TOY, TOY_LORA as ADAPTER
PROMPT_TEXT = "def"
N = 16


@pytest.fixture(scope="module")
def expected():
    """{task id or None: greedy ids} from the engine in this process, and the prompt ids."""
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams

    from tritonllm.model_files import load_hf_tokenizer

    prompt = load_hf_tokenizer(TOY)(PROMPT_TEXT).input_ids
    engine = LLMEngine(str(TOY), EngineConfig(max_kv_tokens=1024, lora_adapters={1: str(ADAPTER)}))
    out = {}
    for tid in (None, 1):
        engine.add_request(str(tid), prompt, SamplingParams(max_tokens=N, end_id=-1, lora_task_id=tid))
        ids = []
        while engine.has_work():
            for o in engine.step():
                ids.extend(o.new_token_ids)
        out[tid] = ids
    assert out[None] != out[1], "the toy adapter must change greedy output"
    return prompt, out


def _llm(server, prompt, lora=None, tokens=N, gate=None, **extra):
    """One request's ids and error; ``gate`` (a Barrier) holds it, once connected, until its peers are too."""
    s = Stream(server.grpc_url)
    try:
        if lora is not None:
            extra["lora_task_id"] = np.array([[lora]], np.uint64)
        request = _ids_request(prompt, tokens, **extra)
        if gate is not None:
            gate.wait(60)
        chunks, err = s.run("tensorrt_llm", request)
        return [int(t) for c in chunks for t in c["output_ids"].reshape(-1)], err
    finally:
        s.close()


def test_adapter_and_base_through_tensorrt_llm(toy_server, expected):
    prompt, want = expected
    for tid in (None, 1):
        ids, err = _llm(toy_server, prompt, tid)
        assert err is None, err
        assert ids == want[tid], f"lora_task_id {tid}"


def _iteration_gauge(server) -> float:
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    return float(re.search(r'^nv_trt_llm_general_metrics\{[^}]*general_type="iteration_counter"[^}]*'
                           r'model="tensorrt_llm"[^}]*\} (\S+)$', text, re.M).group(1))


def _iterations(server) -> float:
    """The engine's step count (NVIDIA's iteration_counter gauge) once the model is idle and the gauge settled: the
    same value across a publication period (stats_check_period_ms, ~0.5 s), polled for 30 s at most."""
    wait_idle(server.metrics_url)
    deadline, last = time.monotonic() + 30, _iteration_gauge(server)
    while True:
        time.sleep(0.6)
        now = _iteration_gauge(server)
        if now == last:
            return now
        assert time.monotonic() < deadline, "the iteration gauge did not settle within 30 s"
        last = now


def test_mixed_adapters_in_one_batch(toy_server, expected):
    """Base and adapter requests at once: each gets its own greedy tokens, and they shared engine steps. Six
    requests of ``long`` tokens each, three per adapter, took fewer than 1.5 x ``long`` steps; steps that served
    one adapter at a time would have needed at least 2 x ``long`` (each group decodes ``long`` tokens)."""
    prompt, want = expected
    tids, long = [None, 1, 1, None, 1, None], 96
    before = _iterations(toy_server)
    gate = threading.Barrier(len(tids))  # sent together once every client is connected (connecting is the slow part)
    with ThreadPoolExecutor(len(tids)) as pool:
        results = list(pool.map(lambda t: _llm(toy_server, prompt, t, tokens=long, gate=gate), tids))
    steps = _iterations(toy_server) - before
    for tid, (ids, err) in zip(tids, results):
        assert err is None and len(ids) == long and ids[:N] == want[tid], f"lora_task_id {tid}: {err}"
    assert long <= steps < 1.5 * long, steps


def test_adapter_through_ensemble_and_bls(toy_server, expected):
    from tritonllm.model_files import load_hf_tokenizer

    _, want = expected
    tok = load_hf_tokenizer(TOY)
    texts = {}
    for model in ("ensemble", "tensorrt_llm_bls"):
        for tid in (None, 1):
            payload = dict(text_input=PROMPT_TEXT, max_tokens=N, end_id=-1)
            if tid is not None:
                payload["lora_task_id"] = tid
            texts[model, tid] = generate(toy_server, model, **payload)["text_output"]
    for tid in (None, 1):
        assert texts["ensemble", tid] == texts["tensorrt_llm_bls", tid] == tok.decode(want[tid],
                                                                                      skip_special_tokens=True)
    assert texts["ensemble", 1] != texts["ensemble", None]


def _with(prompt, tid, *extra):
    return _ids_request(prompt, N, lora_task_id=np.array([[tid]], np.uint64)) + list(extra)


def _input(name, value, dtype):
    t = grpcclient.InferInput(name, list(value.shape), dtype)
    t.set_data_from_numpy(value)
    return t


def test_adapter_loaded_at_run_time_by_path(toy_server, expected):
    """lora_path "python" (the toy's lora_root holds it) under a new id: the same tokens as the fixed adapter; then
    the id alone serves it; a path out of lora_root is refused naming lora_path, before anything is opened."""
    prompt, want = expected
    s = Stream(toy_server.grpc_url)
    try:
        path = lambda p: _input("lora_path", np.array([[p.encode()]], dtype=object), "BYTES")  # noqa: E731
        for extra in ((path("python"),), ()):
            chunks, err = s.run("tensorrt_llm", _with(prompt, 77, *extra))
            assert err is None and [int(t) for c in chunks for t in c["output_ids"].reshape(-1)] == want[1]
        for bad in ("../demo", str(TOY), "/etc"):
            _, err = s.run("tensorrt_llm", _with(prompt, 78, path(bad)))
            assert err is not None and "is not a folder inside lora_root" in str(err), bad
    finally:
        s.close()


def test_unknown_adapter_and_bad_inline_weights_are_invalid(toy_server, expected):
    prompt, want = expected
    _, err = _llm(toy_server, prompt, 987654)
    assert err is not None and "lora_task_id 987654 is not a loaded adapter (loaded: [1" in str(err)
    assert "LoRA task 987654 not found in cache. Please send LoRA weights with request" in str(err)
    weights = _input("lora_weights", np.ones((1, 2, 4), np.float16), "FP16")
    s = Stream(toy_server.grpc_url)
    try:
        _, err = s.run("tensorrt_llm", _with(prompt, 5, weights))
        assert err is not None and "lora_weights and lora_config come together" in str(err)
        config = _input("lora_config", np.array([[[1, 0, 8], [9, 0, 8]]], np.int32), "INT32")
        _, err = s.run("tensorrt_llm", _with(prompt, 5, weights, config))
        assert err is not None and "lora_config row 0: rank 8 of q_proj needs" in str(err)
    finally:
        s.close()
    status, body = http_post(toy_server, "/v2/models/ensemble/generate",
                             dict(text_input=PROMPT_TEXT, max_tokens=4, lora_task_id=5))
    assert status == 400 and "lora_task_id 5 is not a loaded adapter" in body  # INVALID_ARG -> 400
    ids, err = _llm(toy_server, prompt)  # still serving
    assert err is None and ids == want[None]
