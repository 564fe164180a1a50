"""clients/openai_server: OpenAI requests -> the text models' inputs, and Triton errors -> HTTP statuses."""
from __future__ import annotations

import json

import numpy as np
import pytest



from clients.openai_server.protocol import ApiError, ChatCompletionRequest, CompletionRequest  # noqa: E402
from clients.openai_server.responses import Outcome, TextTools  # noqa: E402
from clients.openai_server.triton import raise_failure, status_for  # noqa: E402
from tritonllm.errors import error_arrays  # noqa: E402
from clients.triton_llm import Chunk  # noqa: E402


def test_openai_defaults_sample_the_full_distribution():
    # TensorRT-LLM decodes greedily without top_k/top_p; OpenAI's defaults (T=1, top_p=1) must not.
    req = CompletionRequest(model="m", prompt="hi")
    arrays = req.generation_params(16, False).arrays("hi", stream=False)
    assert arrays["temperature"][0].tolist() == [[1.0]] and arrays["top_p"][0].tolist() == [[1.0]]
    assert arrays["max_tokens"][0].dtype == np.int32 and arrays["max_tokens"][0].shape == (1, 1)
    assert "return_log_probs" not in arrays and "stop_words" not in arrays


def test_options_become_ensemble_inputs():
    req = CompletionRequest(model="m", prompt="hi", stop=["\n", "END"], seed=7, temperature=0,
                            presence_penalty=0.5, top_k=3, min_tokens=2, repetition_penalty=1.1)
    arrays = req.generation_params(8, True).arrays("hi", stream=True)
    assert arrays["stop_words"][0].tolist() == [[b"\n", b"END"]] and arrays["stop_words"][1] == "BYTES"
    assert arrays["seed"][0].dtype == np.uint64 and arrays["seed"][0].item() == 7
    assert arrays["temperature"][0].item() == 0.0 and arrays["top_k"][0].item() == 3
    assert arrays["return_log_probs"][0].item() is True and arrays["stream"][0].item() is True
    assert arrays["min_tokens"][0].item() == 2 and arrays["presence_penalty"][0].item() == 0.5
    assert "end_id" not in arrays  # the model's own end token


def test_ignore_eos_sends_end_id_minus_one():
    """vLLM's ignore_eos: the engine's "no end token" (end_id -1), not a field silently dropped."""
    arrays = CompletionRequest(model="m", prompt="hi", ignore_eos=True).generation_params(8, False).arrays("hi", True)
    assert arrays["end_id"][0].dtype == np.int32 and arrays["end_id"][0].tolist() == [[-1]]


def test_response_format_json_schema_is_a_guided_decoding_guide():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    guide = req.response_format.guide()
    assert guide[0] == "json_schema" and json.loads(guide[1]) == schema
    arrays = req.generation_params(4, False, guide).arrays("x", stream=False)
    assert arrays["guided_decoding_guide_type"][0].item() == b"json_schema"
    with pytest.raises(ApiError) as e:
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                              response_format={"type": "json_schema", "json_schema": {"name": "n"}}).response_format.guide()
    assert e.value.status == 400


def test_unsupported_options_are_refused_not_ignored():
    with pytest.raises(ApiError, match="best_of"):
        CompletionRequest(model="m", prompt="x", best_of=2).prompts()
    for bias in ({"x": 1.0}, {"-1": 1.0}, {"5": 101.0}):
        with pytest.raises(ApiError, match="logit_bias"):
            CompletionRequest(model="m", prompt="x", logit_bias=bias).token_bias()
    with pytest.raises(ApiError, match="top_logprobs needs logprobs"):
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], top_logprobs=2).top_logprobs_count()
    with pytest.raises(ApiError, match="single prompt"):
        CompletionRequest(model="m", prompt=["a", "b"], stream=True).prompts()
    params = CompletionRequest(model="m", prompt="x", n=3, logit_bias={"7": -100}, priority=0.9,
                               allotted_time_ms=250).generation_params(4, True, None, 2)
    assert (params.num_return_sequences, params.logit_bias, params.priority, params.top_logprobs) == (3, {7: -100.0}, 0.9, 2)
    arrays = params.arrays("x", False)
    assert arrays["logit_bias_ids"][0].tolist() == [[7]] and arrays["num_return_sequences"][0].tolist() == [[3]]
    msg = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ApiError, match="image_url"):
        msg.chat_messages()


@pytest.mark.parametrize("message,grpc_status,status", [
    ("in ensemble 'ensemble', guided_decoding_guide_type is not supported yet by this engine", None, 400),
    ("input length 2 + max_tokens 100000 exceeds max_seq_len 2048", None, 400),
    ("Maximum queue size of 256 has been reached, please try again later (Exceeds maximum queue size: 272 requests in flight, 16 running at most)", None, 503),
    ("the engine is shutting down", None, 503),
    ("internal error: boom", None, 500),
    ("Request for unknown model: 'x' is not found", None, 404),
    ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", 503),
    ("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED", 504),
])
def test_triton_errors_map_to_http_statuses(message, grpc_status, status):
    assert status_for(message, grpc_status) == status


@pytest.mark.parametrize("code,status", [("INVALID_ARG", 400), ("UNAVAILABLE", 503), ("INTERNAL", 500),
                                         ("CANCELLED", 499), ("NOT_FOUND", 404)])
def test_a_failure_as_data_answers_its_code_whatever_the_message_says(code, status):
    """The status comes from the code our model sent, never from its text: an engine fault whose message reads like
    a refusal is still 500 (before, the message decided: anything unmarked was 400)."""
    arrays = error_arrays("request_output_len (max_tokens): bad", code)
    with pytest.raises(ApiError) as e:
        raise_failure(arrays.get)
    assert e.value.status == status and e.value.message == "max_tokens: bad"
    assert raise_failure({"text_output": np.array([b"x"], dtype=object)}.get) is None


def test_usage_and_finish_reason_from_the_engine_counts():
    o = Outcome()
    for c in (Chunk(" a", 5, 1, [-0.5]), Chunk(" b", 5, 1, [-0.25]), Chunk("", 5, 0, [])):  # per response
        o.add(c)
    assert o.text == " a b" and o.log_probs == [-0.5, -0.25]
    assert o.usage(TextTools(None), "ignored") == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert o.finish_reason(2) == "length" and o.finish_reason(3) == "stop"
    assert TextTools(None).tokens("abc", 2) == ["", ""]  # no tokenizer: token strings are not guessed


def test_every_client_input_is_the_contracts():
    """clients/triton_llm.py sends each option under a BLS input of the contract with the contract's
    dtype, and asks only for outputs the contract declares (one table: contract.py)."""
    import dataclasses

    from tritonllm import contract as C
    from clients.triton_llm import GenerationParams

    full = GenerationParams(max_tokens=4, temperature=0.5, top_k=3, top_p=0.9, seed=1, repetition_penalty=1.1,
                            presence_penalty=0.1, frequency_penalty=0.1, min_tokens=1, end_id=2, pad_id=0,
                            return_log_probs=True, exclude_input_in_output=False, stop_words=["a"],
                            bad_words=["b"], guided_decoding_guide_type="json", guided_decoding_guide="{}",
                            lora_task_id=1, lora_path="sql", num_return_sequences=2, top_logprobs=2, priority=0.7,
                            logit_bias={3: 1.0})
    assert all(getattr(full, f.name) not in (None, [], {}) for f in dataclasses.fields(full))
    inputs = C.by_name(C.BLS_INPUTS)
    triton = {"TYPE_STRING": "BYTES"}
    for name, (array, dtype) in full.arrays("hello", True).items():
        t = inputs[name]
        assert dtype == triton.get(t.dtype, t.dtype[len("TYPE_"):]), name
        assert array.dtype == np.dtype(C.numpy_dtype(t.dtype)), name
    outputs = C.by_name(C.BLS_OUTPUTS)
    assert all(name in outputs for name in full.requested_outputs())
