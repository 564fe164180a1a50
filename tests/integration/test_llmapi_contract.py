"""NVIDIA's LLM-API text contract (model ``llmapi``) on the real server, decoupled and unary.

What NVIDIA's ``all_models/llmapi/tensorrt_llm`` model answers (read from their source, see
tritonllm/contract_llmapi.py), checked against our own BLS for the same greedy request: the text is
exact, cumulative when streamed, the prompt echoed by default; reasons and perf metrics as strings;
bad input refused by the LLM-API input's name; ``stop`` cancels by request id and frees the KV blocks.
"""
from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from robustness_helpers import grpc_inputs, llm_metrics, stream_request, text_tensors, unary_request, wait_idle

PROMPT = "The future of AI is"
LONG_PROMPT = "List the numbers from 1 to 300, separated by commas:"  # the default model counts on past 1500 tokens


def _generate(server, body: dict, model: str = "llmapi") -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/generate",
                                 data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _bls_text(server, prompt: str, n: int, **extra) -> str:
    chunks, err = stream_request(server.grpc_url, "tensorrt_llm_bls", text_tensors(prompt, n, **extra))
    assert err is None, err
    return chunks[-1]["text_output"][0].decode()


def _llmapi(prompt: str, **kw) -> dict:
    tensors = {"text_input": np.array([prompt.encode()], dtype=object)}
    for name, value in kw.items():
        dtype = {bool: np.bool_, int: np.int32, float: np.float32}.get(type(value), object)
        tensors[name] = np.array(value if isinstance(value, list) else [value], dtype=dtype)
    return tensors


def test_nvidias_quick_start_curl_answers_prompt_plus_exact_text(triton_server):
    status, body = _generate(triton_server, {"text_input": PROMPT, "sampling_param_max_tokens": 10})
    assert status == 200, body
    generated = _bls_text(triton_server, PROMPT, 10)
    assert body["model_name"] == "llmapi" and body["text_output"] == PROMPT + generated
    # exclude_input_from_output: just the generated text, the BLS's exactly; default max_tokens is 32
    status, body = _generate(triton_server, {"text_input": PROMPT, "sampling_param_exclude_input_from_output": True})
    assert status == 200 and body["text_output"] == _bls_text(triton_server, PROMPT, 32)


def test_reasons_and_perf_metrics_are_nvidias_strings(triton_server):
    status, body = _generate(triton_server, {
        "text_input": PROMPT, "sampling_param_max_tokens": 6, "return_finish_reason": True,
        "return_stop_reason": True, "return_cumulative_logprob": True, "sampling_param_return_perf_metrics": True})
    assert status == 200, body
    assert body["finish_reason"] == "length" and body["stop_reason"] == "None"
    chunks, err = stream_request(triton_server.grpc_url, "tensorrt_llm_bls",
                                 text_tensors(PROMPT, 6, return_log_probs=np.array([[True]])))
    assert err is None
    logprobs = np.concatenate([c["output_log_probs"].reshape(-1) for c in chunks if "output_log_probs" in c])
    assert float(body["cumulative_logprob"]) == pytest.approx(float(logprobs.sum()), abs=1e-4)
    for name in ("kv_cache_reused_block", "kv_cache_missed_block", "kv_cache_alloc_new_blocks",
                 "kv_cache_alloc_total_blocks", "total_accepted_draft_tokens", "total_draft_tokens"):
        assert isinstance(body[name], str) and int(body[name]) >= 0, name
    arrival, first, last = (int(body[k]) for k in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"))
    assert 0 < arrival <= first <= last
    assert int(body["kv_cache_missed_block"]) == int(body["kv_cache_alloc_new_blocks"])
    assert 0.0 <= float(body["kv_cache_hit_rate"]) <= 1.0 and float(body["acceptance_rate"]) == 0.0
    # a stop string: finish "stop", stop_reason the string, text cut before it (include_stop_words: false)
    text = _bls_text(triton_server, PROMPT, 24)
    word = text.split()[2]
    status, body = _generate(triton_server, {"text_input": PROMPT, "sampling_param_max_tokens": 24,
                                             "sampling_param_stop": [word], "return_finish_reason": True,
                                             "return_stop_reason": True,
                                             "sampling_param_exclude_input_from_output": True})
    assert (body["finish_reason"], body["stop_reason"]) == ("stop", word)
    assert body["text_output"] == text[:text.index(word)]


def test_streamed_text_is_cumulative_and_ends_with_the_unary_text(triton_server, unary_server):
    chunks, err = stream_request(triton_server.grpc_url, "llmapi",
                                 _llmapi(PROMPT, streaming=True, sampling_param_max_tokens=12, return_finish_reason=True))
    assert err is None, err
    texts = [c["text_output"][0].decode() for c in chunks]
    assert len(texts) > 3 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert [c["finish_reason"][0] for c in chunks[:-1]] == [b"None"] * (len(chunks) - 1)
    assert chunks[-1]["finish_reason"][0] == b"length"
    out, err = unary_request(unary_server.grpc_url, "llmapi", _llmapi(PROMPT, sampling_param_max_tokens=12))
    assert err is None, err
    assert out["text_output"][0].decode() == texts[-1] == PROMPT + _bls_text(triton_server, PROMPT, 12)


@pytest.mark.parametrize("inputs, name", [
    ({"sampling_param_max_tokens": -2}, "sampling_param_max_tokens"),
    ({"sampling_param_best_of": 2}, "sampling_param_best_of"),
    ({"sampling_param_temperature": -1.0}, "sampling_param_temperature"),
    ({"lora_id": np.array([1], np.uint64)}, "lora_id, lora_name, and lora_path"),
    ({"sampling_param_top_k": [1, 2]}, "sampling_param_top_k"),
])
def test_bad_input_is_refused_by_its_llmapi_name(triton_server, inputs, name):
    tensors = _llmapi(PROMPT, **{k: v for k, v in inputs.items() if not isinstance(v, np.ndarray)})
    tensors.update({k: v for k, v in inputs.items() if isinstance(v, np.ndarray)})
    chunks, err = stream_request(triton_server.grpc_url, "llmapi", tensors)
    assert err is not None and name in err.message(), (inputs, err)
    assert "max_tokens must" not in err.message().replace("sampling_param_max_tokens", "")


def test_streaming_on_the_unary_server_is_refused_by_name(unary_server):
    _, err = unary_request(unary_server.grpc_url, "llmapi", _llmapi(PROMPT, streaming=True))
    assert err is not None and "INVALID_ARG" in err.status()
    assert err.message().startswith("streaming: Streaming is only supported"), err.message()


def _stop_once(server, mode: str, rid: str) -> tuple[list, list]:
    """One long request, then NVIDIA's stop request with its id: (errors, results) received."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done: queue.Queue = queue.Queue()
    stop = {"text_input": np.empty([1], dtype=np.bytes_).astype(object), "stop": np.array([True])}
    long = _llmapi(LONG_PROMPT, sampling_param_max_tokens=1500, streaming=mode == "decoupled")
    errors, results = [], []
    try:
        if mode == "unary":
            generated = llm_metrics(server.metrics_url).get("llm_generation_tokens_total", 0)
            client.async_infer("llmapi", grpc_inputs(long), callback=lambda result, error: done.put((result, error)),
                               request_id=rid)
            deadline = time.monotonic() + 30  # no response until the end: the engine's token count says it runs
            while llm_metrics(server.metrics_url).get("llm_generation_tokens_total", 0) <= generated:
                assert time.monotonic() < deadline and done.empty(), "the long request never started generating"
                time.sleep(0.05)
            client.async_infer("llmapi", grpc_inputs(stop), callback=lambda result, error: done.put((result, error)),
                               request_id=rid)
        else:
            client.start_stream(callback=lambda result, error: done.put((result, error)))
            client.async_stream_infer("llmapi", grpc_inputs(long), request_id=rid, enable_empty_final_response=True)
            result, error = done.get(timeout=60)  # the first token is out: the request is running
            assert error is None, error
            client.async_stream_infer("llmapi", grpc_inputs(stop), request_id=rid)
        while len(errors) + len(results) < 2:  # each request's final answer
            result, error = done.get(timeout=60)
            if error is not None:
                errors.append(error)
            elif mode == "unary" or result.get_response().parameters["triton_final_response"].bool_param:
                results.append(result)
    finally:
        if mode == "decoupled":
            client.stop_stream(cancel_requests=True)
        client.close()
    return errors, results


@pytest.mark.parametrize("mode", ["unary", "decoupled"])
def test_stop_by_request_id_cancels_both_and_frees_the_kv_blocks(triton_server, unary_server, mode):
    """The stop is sent once the long request generates (its first streamed response; unary: the engine's token
    counter moved), so it always finds its target running: both end cancelled, and every KV block is back."""
    server = unary_server if mode == "unary" else triton_server
    errors, results = _stop_once(server, mode, f"llmapi-stop-{mode}")
    assert len(errors) == 2 and not results, (errors, results)
    assert all("cancelled" in e.message().lower() for e in errors), errors
    if mode == "unary":
        assert all(e.status() == "StatusCode.CANCELLED" for e in errors), errors
    assert wait_idle(server.metrics_url).get("llm_kv_cache_usage_ratio") == 0.0


def test_a_stop_without_request_id_is_refused(unary_server):
    _, err = unary_request(unary_server.grpc_url, "llmapi", {"text_input": np.array([b""], dtype=object),
                                                              "stop": np.array([True])})
    assert err is not None and "request id must be provided" in err.message()
