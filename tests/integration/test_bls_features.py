"""tensorrt_llm_bls beyond NVIDIA's BLS, on the real tritonserver (fixture ``triton_server``, the demo model):

- ``num_return_sequences``: n sequences of one prompt stream on their own responses (``sequence_index``),
  each exactly (its deltas concatenated equal its non-streamed text, same seed), and only the request's
  last response carries the final flag; greedy sequences are identical;
- ``top_logprobs``: ``top_log_probs`` / ``top_log_prob_ids`` [1, T, k] cover every generated token once;
  greedy, their first column is the generated token: its log prob equals ``output_log_probs`` and its
  ids decode to the greedy text;
- ``logit_bias_ids`` / ``_weights``: +100 on one id makes greedy generation repeat that token; an id
  outside the vocabulary is INVALID_ARG naming logit_bias_ids;
- the client's Triton timeout ends a long generation early, normally (a final response with the text
  so far), and the engine's KV blocks are all freed;
- unary BLS (fixture ``unary_server``): n > 1 is INVALID_ARG naming num_return_sequences; a batch whose
  rows generate different token counts stacks its top log probs, padded with id -1 / log prob -inf.
"""
from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from robustness_helpers import grpc_inputs, text_tensors, unary_request, wait_idle
from test_llm_pipeline import generate, http_post, tokenizer  # noqa: F401  (tokenizer: a fixture)

BLS = "tensorrt_llm_bls"
PROMPT = "Once upon a time"
TIMEOUT_S = 120


def _i32(*v):
    return np.array([list(v)], dtype=np.int32)


def _f32(*v):
    return np.array([list(v)], dtype=np.float32)


def _flag(v: bool):
    return np.array([[v]], dtype=np.bool_)


def stream(server, tensors: dict, timeout_us: int | None = None):
    """One request on its own gRPC stream: ([(outputs dict, final flag)] of every response, error or None)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    responses, done = [], False
    try:
        client.async_stream_infer(BLS, grpc_inputs(tensors), enable_empty_final_response=True, timeout=timeout_us)
        while True:
            result, error = q.get(timeout=TIMEOUT_S)
            if error is not None:
                done = True
                return responses, error
            resp = result.get_response()
            final = resp.parameters["triton_final_response"].bool_param
            responses.append(({o.name: result.as_numpy(o.name) for o in resp.outputs}, final))
            if final:
                done = True
                return responses, None
    finally:
        client.stop_stream(cancel_requests=not done)
        client.close()


def _text(outputs: dict) -> str:
    return outputs["text_output"].reshape(-1)[0].decode("utf-8")


def by_sequence(responses) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for outputs, _ in responses:
        if "text_output" in outputs:
            out.setdefault(int(outputs["sequence_index"].reshape(-1)[0]), []).append(outputs)
    return out


def _final_only_at_the_end(responses) -> bool:
    return [final for _, final in responses] == [False] * (len(responses) - 1) + [True]


# --------------------------------------------------------------------------- num_return_sequences

def test_sampled_sequences_stream_each_exactly(triton_server):
    params = dict(num_return_sequences=_i32(3), temperature=_f32(1.0), top_p=_f32(1.0),
                  seed=np.array([[7]], dtype=np.uint64))
    streamed, error = stream(triton_server, text_tensors(PROMPT, 24, stream=_flag(True), **params))
    assert error is None, error
    assert _final_only_at_the_end(streamed)
    deltas = by_sequence(streamed)
    assert set(deltas) == {0, 1, 2}
    texts = {s: "".join(_text(o) for o in chunks) for s, chunks in deltas.items()}
    assert len(set(texts.values())) == 3, texts  # three independent samples

    whole, error = stream(triton_server, text_tensors(PROMPT, 24, stream=_flag(False), **params))
    assert error is None, error
    assert _final_only_at_the_end(whole)
    answers = by_sequence(whole)
    assert {s: len(chunks) for s, chunks in answers.items()} == {0: 1, 1: 1, 2: 1}  # one whole text each
    assert {s: _text(chunks[0]) for s, chunks in answers.items()} == texts


def test_greedy_sequences_are_identical(triton_server):
    expected = generate(triton_server, "ensemble", text_input=PROMPT, max_tokens=24)["text_output"]
    responses, error = stream(triton_server, text_tensors(PROMPT, 24, stream=_flag(True), num_return_sequences=_i32(2)))
    assert error is None, error
    texts = {s: "".join(_text(o) for o in chunks) for s, chunks in by_sequence(responses).items()}
    assert texts == {0: expected, 1: expected}


def test_one_sequence_carries_no_sequence_index(triton_server):
    responses, error = stream(triton_server, text_tensors(PROMPT, 8, stream=_flag(True), num_return_sequences=_i32(1)))
    assert error is None, error
    assert responses and all("sequence_index" not in o for o, _ in responses)


@pytest.mark.parametrize("value, message", [(17, "num_return_sequences must be an integer in [1, 16], got 17"),
                                            (0, "num_return_sequences must be an integer in [1, 16], got 0")])
def test_bad_num_return_sequences_is_invalid_arg(triton_server, value, message):
    status, body = http_post(triton_server, f"/v2/models/{BLS}/generate",
                             {"text_input": PROMPT, "max_tokens": 8, "num_return_sequences": value})
    assert status == 400 and message in json.loads(body)["error"], (status, body)


# --------------------------------------------------------------------------- top log probs

def test_top_log_probs_cover_every_token_and_lead_with_the_greedy_token(triton_server, tokenizer):  # noqa: F811
    expected = generate(triton_server, "ensemble", text_input=PROMPT, max_tokens=24)["text_output"]
    responses, error = stream(triton_server, text_tensors(PROMPT, 24, stream=_flag(True), top_logprobs=_i32(3),
                                                          return_log_probs=_flag(True)))
    assert error is None, error
    chunks = [o for o, _ in responses if "text_output" in o]
    assert "".join(_text(o) for o in chunks) == expected
    lps = np.concatenate([o["top_log_probs"] for o in chunks if "top_log_probs" in o], axis=1)
    ids = np.concatenate([o["top_log_prob_ids"] for o in chunks if "top_log_prob_ids" in o], axis=1)
    out_lps = np.concatenate([o["output_log_probs"].reshape(-1) for o in chunks if "output_log_probs" in o])
    assert lps.dtype == np.float32 and ids.dtype == np.int32
    assert lps.shape == ids.shape == (1, len(out_lps), 3)
    assert (np.diff(lps[0], axis=1) <= 0).all()  # alternatives by descending log prob
    assert lps[0, :, 0].tolist() == out_lps.tolist()  # greedy: the top-1 is the generated token
    assert tokenizer.decode(ids[0, :, 0].tolist(), skip_special_tokens=True) == expected


# --------------------------------------------------------------------------- logit_bias

def test_logit_bias_forces_a_token(triton_server, tokenizer):  # noqa: F811
    forced = tokenizer.encode(" the", add_special_tokens=False)
    assert len(forced) == 1, forced
    responses, error = stream(triton_server, text_tensors(PROMPT, 12, stream=_flag(False),
                                                          logit_bias_ids=_i32(forced[0]), logit_bias_weights=_f32(100.0)))
    assert error is None, error
    (outputs, final), = responses
    assert final and _text(outputs) == tokenizer.decode(forced * 12, skip_special_tokens=True)


def test_a_logit_bias_id_outside_the_vocabulary_is_invalid_arg(triton_server, tokenizer):  # noqa: F811
    vocab = len(tokenizer)
    status, body = http_post(triton_server, f"/v2/models/{BLS}/generate",
                             {"text_input": PROMPT, "max_tokens": 8, "logit_bias_ids": [vocab],
                              "logit_bias_weights": [1.0]})
    assert status == 400, (status, body)
    assert json.loads(body)["error"] == f"logit_bias_ids must be token ids in [0, {vocab}), got {vocab}"
    responses, error = stream(triton_server, text_tensors(PROMPT, 8, logit_bias_ids=_i32(3, vocab + 5),
                                                          logit_bias_weights=_f32(1.0, 1.0)))
    assert error is not None and not responses
    assert f"logit_bias_ids must be token ids in [0, {vocab}), got {vocab + 5}" in str(error)


# --------------------------------------------------------------------------- timeout

def test_a_triton_timeout_ends_generation_early_and_frees_the_kv_cache(triton_server):
    tensors = text_tensors(PROMPT, 2000, stream=_flag(True), return_num_output_tokens=_flag(True))
    start = time.monotonic()
    responses, error = stream(triton_server, tensors, timeout_us=300_000)
    elapsed = time.monotonic() - start
    assert error is None, error  # a normal end, not an error: the text so far
    assert _final_only_at_the_end(responses)
    tokens = sum(int(o["num_output_tokens"].reshape(-1)[0]) for o, _ in responses if "num_output_tokens" in o)
    assert 0 < tokens < 2000, tokens
    assert "".join(_text(o) for o, _ in responses if "text_output" in o)
    assert elapsed < 10.0, elapsed
    m = wait_idle(triton_server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0.0 and m["llm_requests_running"] == 0, m


# --------------------------------------------------------------------------- unary BLS

def test_unary_bls_refuses_several_sequences(unary_server):
    _, err = unary_request(unary_server.grpc_url, BLS, text_tensors(PROMPT, 8, num_return_sequences=_i32(2)))
    assert err is not None and "INVALID_ARG" in err.status(), err
    assert "num_return_sequences 2 needs decoupled mode" in err.message(), err


def test_unary_batch_stacks_top_log_probs_of_different_lengths(unary_server):
    out, err = unary_request(unary_server.grpc_url, BLS, {
        "text_input": np.array([[PROMPT.encode()], [b"The little dog"]], dtype=object),
        "max_tokens": np.array([[4], [7]], np.int32), "top_logprobs": np.array([[2], [2]], np.int32),
        "return_num_output_tokens": np.full((2, 1), True)})
    assert err is None, err
    counts = out["num_output_tokens"].reshape(-1).tolist()
    assert counts == [4, 7], counts
    lps, ids = out["top_log_probs"], out["top_log_prob_ids"]
    assert lps.shape == ids.shape == (2, 7, 2)
    assert np.isfinite(lps[0, :4]).all() and (ids[0, :4] >= 0).all() and np.isfinite(lps[1]).all()
    assert (lps[0, 4:] == -np.inf).all() and (ids[0, 4:] == -1).all()  # row 0's 3 missing tokens, padded
