"""Unary serving (profile ``unary``: NVIDIA's ``decoupled_mode: false``) on the real server, next to the
default decoupled one: what NVIDIA's non-streaming quick start and tools do (``InferenceServerClient.infer()``,
gRPC ModelInfer, HTTP ``/infer``) works on ``ensemble``, ``tensorrt_llm_bls`` and ``tensorrt_llm``.

Proven here:
- ``infer()`` on ``ensemble`` (gRPC and HTTP) returns exactly the text the decoupled server streams;
- a batch is answered in one response, ``text_output`` ``[batch]``, each row equal to the row alone;
- ``stream=true`` is refused INVALID_ARG with NVIDIA's message, naming the input;
- NVIDIA's stop request works in unary mode too (the stopped request returns early and normally);
- the decoupled-only routers still relay a unary pipeline.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from robustness_helpers import (grpc_inputs, ids_tensors, llm_metrics, stream_request, text_tensors, unary_request,
                                wait_idle)

PROMPTS = ("My name is", "The little dog", "Once upon a time")


def _streamed_text(server, model, prompt, n):
    chunks, err = stream_request(server.grpc_url, model, text_tensors(prompt, n, stream=np.array([[True]])))
    assert err is None, err
    return "".join(c["text_output"][0].decode() for c in chunks if "text_output" in c)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_unary_infer_returns_the_text_the_decoupled_server_streams(triton_server, unary_server, model):
    for prompt in PROMPTS:
        want = _streamed_text(triton_server, model, prompt, 16)
        out, err = unary_request(unary_server.grpc_url, model, text_tensors(prompt, 16))
        assert err is None, err
        assert out["text_output"].shape == (1,) and out["text_output"][0].decode() == want, (model, prompt)
        client = httpclient.InferenceServerClient(unary_server.http_url)
        try:
            inputs = []
            for name, arr in text_tensors(prompt, 16).items():
                t = httpclient.InferInput(name, list(arr.shape), {"object": "BYTES", "int32": "INT32"}[arr.dtype.name])
                t.set_data_from_numpy(arr)
                inputs.append(t)
            assert client.infer(model, inputs).as_numpy("text_output")[0].decode() == want
        finally:
            client.close()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_unary_batch_is_one_response_with_a_row_per_prompt(unary_server, model):
    singles = []
    for prompt in PROMPTS:
        out, err = unary_request(unary_server.grpc_url, model, text_tensors(prompt, 10))
        assert err is None, err
        singles.append(out["text_output"][0].decode())
    out, err = unary_request(unary_server.grpc_url, model, {
        "text_input": np.array([[p.encode()] for p in PROMPTS], dtype=object),
        "max_tokens": np.full((3, 1), 10, np.int32), "return_num_output_tokens": np.full((3, 1), True)})
    assert err is None, err
    assert [t.decode() for t in out["text_output"]] == singles
    assert out["num_output_tokens"].tolist() == [[10]] * 3


@pytest.mark.parametrize("model,name", [("ensemble", "streaming"), ("tensorrt_llm_bls", "stream")])
def test_streaming_is_refused_with_nvidias_message(unary_server, model, name):
    _, err = unary_request(unary_server.grpc_url, model, text_tensors("x", 4, stream=np.array([[True]])))
    assert err is not None and "INVALID_ARG" in err.status(), err
    assert f"{name}: Streaming is only supported if model is deployed using decoupled mode" in err.message(), err


def test_nvidia_stop_request_in_unary_mode(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    done: queue.Queue = queue.Queue()
    try:
        generated = llm_metrics(unary_server.metrics_url).get("llm_generation_tokens_total", 0)
        # as long as the demo's positions allow (2048): a fast machine generates ~1500 tokens a second
        client.async_infer("tensorrt_llm", grpc_inputs(ids_tensors(list(range(20, 32)), 2000)),
                           callback=lambda result, error: done.put((result, error)), request_id="unary-stop")
        deadline = time.monotonic() + 30
        # stop it once it has generated (published every ~0.5 s), not after a fixed sleep; "running" was not enough:
        # under CI load the stop once came between admission and the first token (0 tokens)
        while llm_metrics(unary_server.metrics_url).get("llm_generation_tokens_total", 0) <= generated:
            assert time.monotonic() < deadline, "the request never generated"
            time.sleep(0.05)
        stop = {"input_ids": np.empty([1, 1], np.int32), "input_lengths": np.zeros([1, 1], np.int32),
                "request_output_len": np.array([[0]], np.int32), "stop": np.array([[True]])}
        answer = client.infer("tensorrt_llm", grpc_inputs(stop), request_id="unary-stop")
        assert answer.as_numpy("output_ids") is None  # an empty response: the stop was taken
        result, error = done.get(timeout=60)
        assert error is None, error
        assert 0 < result.as_numpy("output_ids").shape[-1] < 2000
    finally:
        client.close()
    wait_idle(unary_server.metrics_url)


def test_the_routers_still_relay_a_unary_pipeline(unary_server):
    for model in ("moderated_llm", "llm_router"):
        chunks, err = stream_request(unary_server.grpc_url, model, text_tensors("My name is", 8))
        assert err is None, (model, err)
        assert chunks[-1]["text_output"][0] and chunks[-1]["route"].size == 1


def test_concurrent_unary_requests_batch_inside_the_engine(unary_server):
    """execute() never blocks on generation: 8 concurrent unary calls all run in the engine at once."""
    results = [None] * 8

    def one(i):
        # long enough that generation, not per-call overhead, sets the time (32 tokens took 17 ms alone)
        results[i] = unary_request(unary_server.grpc_url, "tensorrt_llm", ids_tensors(list(range(40 + i, 52 + i)), 256))

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    running = 0.0  # the engine's running batch, published about every 0.5 s
    while any(t.is_alive() for t in threads) and time.monotonic() - t0 < 120:
        running = max(running, llm_metrics(unary_server.metrics_url).get("llm_requests_running", 0.0))
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=120)
    together = time.monotonic() - t0
    assert all(r is not None and r[1] is None for r in results), results
    t0 = time.monotonic()
    one(0)
    alone = time.monotonic() - t0
    assert running == 8, running
    # 8 one after another would take 8x; batched, a step of 8 rows costs the real model ~3.3x one row on 2 cores
    assert together < 6 * alone, (together, alone)
