"""tritonllm.text.llmapi_text: NVIDIA's LLM-API tensors -> one BLS row; tokens -> NVIDIA's responses."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tritonllm import contract as C
from tritonllm import contract_llmapi as L
from tritonllm.text import bls_stream as B
from tritonllm.text import llmapi_text as LT
from tritonllm.text.preprocess import InvalidInput

from test_bls_stream import _responses
from text_helpers import SAMPLES, byte_level


@pytest.fixture(scope="module")
def tok():
    return byte_level()


def _req(text="hello world", **kw):
    arrays = {"text_input": np.array([text.encode()], dtype=object)}
    for name, value in kw.items():
        arrays[name] = np.asarray(value if isinstance(value, (list, np.ndarray)) else [value])
    return arrays


def _run(tok, req, ids, prompt, seed=0):
    gen = LT.LlmapiGeneration(tok, req, prompt)
    chunks = []
    for r in _responses(ids, random.Random(seed)):
        c = gen.on_response(r)
        if c is not None:
            chunks.append(c.arrays())
        if gen.stopped:
            break
    chunks.append(gen.finish().arrays())
    return chunks


def test_inputs_map_to_the_ensembles_and_defaults_are_nvidias():
    req = LT.parse(_req(sampling_param_temperature=np.float32(0.5), sampling_param_top_k=np.int32(3),
                        sampling_param_stop=np.array([b"x", b"y"], dtype=object), streaming=True,
                        sampling_param_seed=np.uint64(7), lora_id=np.uint64(1),
                        lora_name=np.array([b"a"], dtype=object), lora_path=np.array([b"/nowhere"], dtype=object)))
    assert req.max_tokens == L.DEFAULT_MAX_TOKENS == 32 and req.stream and req.echo_prompt
    assert req.stop_strings == ["x", "y"]
    assert {k: v.tolist() for k, v in req.arrays.items() if k in ("temperature", "top_k", "seed", "lora_task_id")} == {
        "temperature": [[0.5]], "top_k": [[3]], "seed": [[7]], "lora_task_id": [[1]]}
    inner = B.llm_inputs(req, {"INPUT_ID": np.array([[5]]), "REQUEST_INPUT_LEN": np.array([[1]])})
    assert inner["runtime_top_k"].tolist() == [[3]] and inner["temperature"].tolist() == [[0.5]]
    assert inner["lora_task_id"].tolist() == [[1]] and inner["lora_path"].reshape(-1).tolist() == [b"/nowhere"]
    # every mapped name is an input of the BLS contract (the engine confines lora_path) and of the LLM-API contract
    assert set(L.TO_TEXT_INPUTS.values()) <= {t.name for t in C.BLS_INPUTS}
    assert set(L.TO_TEXT_INPUTS) <= {t.name for t in L.LLMAPI_INPUTS}
    assert not LT.parse(_req(sampling_param_exclude_input_from_output=True)).echo_prompt


@pytest.mark.parametrize("kw, message", [
    ({"sampling_param_max_tokens": np.int32(0)}, "sampling_param_max_tokens must be a positive integer"),
    ({"sampling_param_best_of": np.int32(3)}, "sampling_param_best_of = 3"),
    ({"lora_id": np.uint64(1)}, "lora_id, lora_name, and lora_path must all be provided together"),
    ({"sampling_param_top_p": np.array([0.1, 0.2], np.float32)}, "sampling_param_top_p"),
    ({"sampling_param_stop": np.array([b"\xff"], dtype=object)}, "sampling_param_stop[0] is not valid UTF-8"),
])
def test_bad_requests_name_the_llmapi_input(kw, message):
    with pytest.raises(InvalidInput) as e:
        LT.parse(_req(**kw))
    assert message in str(e.value)


def test_text_input_shape_and_stop_detection():
    with pytest.raises(InvalidInput, match="text_input is missing"):
        LT.parse({"sampling_param_max_tokens": np.array([3], np.int32)})
    with pytest.raises(InvalidInput, match="1-D"):
        LT.parse({"text_input": np.array([[b"a"]], dtype=object)})
    assert LT.is_stop({"stop": np.array([True])}) and not LT.is_stop({"stop": np.array([False])})
    assert not LT.is_stop({})


def test_names_are_translated_back_in_engine_messages():
    assert LT.client_names("max_tokens must be > 0; stream: no; top_k 3, stop_words[1] bad") == (
        "sampling_param_max_tokens must be > 0; streaming: no; sampling_param_top_k 3, sampling_param_stop[1] bad")
    assert LT.client_names("sampling_param_max_tokens") == "sampling_param_max_tokens"


@pytest.mark.parametrize("text", SAMPLES[:6])
def test_streamed_text_is_cumulative_and_the_final_is_whole(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("hello", add_special_tokens=False)
    req = LT.parse(_req("hello", streaming=True, return_finish_reason=True, sampling_param_max_tokens=np.int32(len(ids))))
    chunks = _run(tok, req, ids, prompt)
    texts = [c["text_output"][0].decode() for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == tok.decode(prompt) + tok.decode(ids)
    assert [c["finish_reason"][0] for c in chunks] == [b"None"] * (len(chunks) - 1) + [b"length"]
    unary = _run(tok, LT.parse(_req("hello", sampling_param_max_tokens=np.int32(len(ids)))), ids, prompt)
    assert len(unary) == 1 and unary[0]["text_output"][0].decode() == texts[-1]
    assert set(unary[0]) == {"text_output"}  # nothing but what was asked


def test_a_stop_string_ends_with_finish_stop_and_its_stop_reason(tok):
    ids = tok.encode("the quick brown fox jumps over", add_special_tokens=False)
    req = LT.parse(_req("x", sampling_param_stop=np.array([b"fox"], dtype=object), return_finish_reason=True,
                        return_stop_reason=True, sampling_param_exclude_input_from_output=True,
                        sampling_param_max_tokens=np.int32(50)))
    final = _run(tok, req, ids, tok.encode("x", add_special_tokens=False))[-1]
    assert final["text_output"][0].decode() == "the quick brown "
    assert (final["finish_reason"][0], final["stop_reason"][0]) == (b"stop", b"fox")
    # EOS before max_tokens: stop, no stop reason
    req = LT.parse(_req("x", return_finish_reason=True, return_stop_reason=True, sampling_param_max_tokens=np.int32(50)))
    final = _run(tok, req, ids[:3], [])[-1]
    assert (final["finish_reason"][0], final["stop_reason"][0]) == (b"stop", b"None")


def test_cumulative_logprob_and_perf_metrics_are_strings(tok):
    ids = tok.encode("hello world again", add_special_tokens=False)
    req = LT.parse(_req("x", return_cumulative_logprob=True, sampling_param_return_perf_metrics=True))
    assert req.arrays["return_log_probs"].tolist() == [[True]]
    gen = LT.LlmapiGeneration(tok, req, [])
    perf = {"kv_cache_reused_blocks": 3, "kv_cache_alloc_new_blocks": 1, "kv_cache_alloc_total_blocks": 4,
            "arrival_time_ns": 10, "first_scheduled_time_ns": 11, "first_token_time_ns": 12,
            "last_token_time_ns": 13, "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0}
    last = None
    for r in _responses(ids, random.Random(0)):
        last = float(r["cum_log_probs"].reshape(-1)[0])
        r.update({k: np.array([[v]], np.float32 if isinstance(v, float) else np.int64) for k, v in perf.items()})
        gen.on_response(r)
    out = gen.finish().arrays()
    assert out["cumulative_logprob"][0] == str(last).encode()  # the last response's cum_log_probs
    assert out["kv_cache_hit_rate"][0] == b"0.75" and out["kv_cache_missed_block"][0] == b"1"
    assert out["kv_cache_reused_block"][0] == b"3" and out["arrival_time_ns"][0] == b"10"
    assert out["acceptance_rate"][0] == b"0.0"
    assert set(out) == {t.name for t in L.LLMAPI_OUTPUTS} - {"finish_reason", "stop_reason"}
