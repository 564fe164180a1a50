"""Property-based fuzzing (hypothesis) of the OpenAI request schema against `make serve` + `make openai`.

Each example is one request to /v1/completions, /v1/chat/completions, /v1/responses or /v1/embeddings: a plausible
body whose fields are each kept, dropped, or replaced by a wild value (numbers past every tensor's range, NaN and
infinities, lone surrogates, wrong JSON types, nested junk), streamed or not. Generation is kept short (max_tokens
and min_tokens wild or at most 4, a 3 s allotted time; max_output_tokens at most 4 or invalid), so the run is
bounded.

Properties: no 5xx, ever (a refusal is 400 / 404 with OpenAI's error body naming what it can); no hang (30 s per
request); afterwards nothing is running, every KV block is free, and the engine stub's resident memory grew by less
than a bound. `make test` runs a derandomized set of examples (the count is in settings below).
"""
from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from openai_helpers import openai_url  # noqa: F401  (fixture)
from robustness_helpers import rss_kib, stub_pids, wait_idle

EXAMPLES = 80
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00\ud800"])
WILD = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([-1, 0, 2**31 - 1, 2**31, 2**32 + 3, 2**63, 2**64, 2**70, -(2**70)]),
    st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), SURROGATES,
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
SMALL = st.one_of(st.integers(1, 4), WILD)  # lengths: short when valid
FIELDS = {
    "model": st.one_of(st.just("tritonllm"), st.just("ensemble"), WILD),
    "max_tokens": SMALL, "max_completion_tokens": SMALL, "min_tokens": st.one_of(st.integers(0, 3), WILD),
    "temperature": st.one_of(st.floats(0, 2), WILD), "top_p": st.one_of(st.floats(0.01, 1), WILD),
    "n": st.one_of(st.integers(1, 3), WILD), "stream": st.one_of(st.booleans(), WILD),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=2), WILD),
    "seed": st.one_of(st.integers(0, 2**64 - 1), WILD), "presence_penalty": WILD, "frequency_penalty": WILD,
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "7", "-1", "99999999999", "x", "\ud800"]),
                                            st.one_of(st.floats(-100, 100), WILD), max_size=2), WILD),
    "top_k": SMALL, "repetition_penalty": WILD, "priority": WILD, "allotted_time_ms": st.one_of(st.just(3000), WILD),
    "logprobs": WILD, "top_logprobs": WILD, "echo": WILD, "user": WILD,
    "guided_regex": st.one_of(st.sampled_from(["[ab]+", "(", "a{2,3}"]), WILD),
    "guided_choice": st.one_of(st.lists(st.text(max_size=3), max_size=3), WILD),
    "response_format": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema",
                                                                                "xml"])}), WILD),
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required"]), WILD),
    "tools": st.one_of(st.just([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
                       WILD),
}
MESSAGES = st.one_of(
    st.just([{"role": "user", "content": "Hi"}]),
    st.lists(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), WILD),
                                    "content": st.one_of(st.text(max_size=6), SURROGATES, WILD)}), max_size=3),
    st.lists(st.just({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}), max_size=1),
    WILD)


@st.composite
def requests_(draw):
    chat = draw(st.booleans())
    body = {"model": "tritonllm", "max_tokens": 2, "allotted_time_ms": 3000}
    body["messages" if chat else "prompt"] = draw(MESSAGES) if chat else draw(
        st.one_of(st.just("Once upon a time"), st.lists(st.text(max_size=5), max_size=2), SURROGATES, WILD))
    return ("chat/completions" if chat else "completions"), _vary(draw, body, FIELDS)


def _vary(draw, body: dict, fields: dict) -> dict:
    """Up to 4 of ``fields`` each set to a drawn value or dropped."""
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)):
        if draw(st.booleans()):
            body[name] = draw(fields[name])
        else:
            body.pop(name, None)
    return body


@pytest.fixture(scope="module")
def stub_rss(triton_server):
    pid = stub_pids(triton_server.process.pid, "tensorrt_llm")[0]
    return pid, rss_kib(pid)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=requests_())
def test_no_request_body_gets_a_5xx_or_hangs(openai_url, stub_rss, case):  # noqa: F811  (stub_rss: taken before)
    _post_and_check(openai_url, *case)


def _post_and_check(openai_url, path: str, body: dict) -> None:  # noqa: F811
    data = json.dumps(body, allow_nan=True)
    with requests.post(f"{openai_url}/v1/{path}", data=data, headers={"Content-Type": "application/json"},
                       stream=True, timeout=30) as r:
        content = b"".join(r.iter_content(chunk_size=None))  # a stream too is read to its end
        event(f"{path} {r.status_code}")  # pytest --hypothesis-show-statistics: the mix of answers
        assert r.status_code < 500, (r.status_code, data, content[:300])
        if r.status_code != 200:
            assert "error" in json.loads(content), content[:300]


# /v1/responses and /v1/embeddings. Lengths stay short or invalid (no allotted time here: a valid huge
# max_output_tokens would generate for minutes); background responses are tested on their own.
BOUNDED = st.one_of(st.integers(1, 4), st.sampled_from([0, -1, 2**31, 2**64, 1.5, "4", None]))
ITEM = st.one_of(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "tool"]), WILD),
                                        "content": st.one_of(st.text(max_size=6), SURROGATES, WILD,
                                                             st.just([{"type": "input_image"}]))}),
                 st.fixed_dictionaries({"type": st.sampled_from(["function_call", "function_call_output", "reasoning"]),
                                        "call_id": WILD, "name": WILD, "arguments": WILD, "output": WILD}), WILD)
RESPONSE_FIELDS = {
    "input": st.one_of(st.just("Hi"), SURROGATES, st.lists(ITEM, max_size=3), WILD),
    "instructions": st.one_of(st.text(max_size=5), WILD), "max_output_tokens": BOUNDED,
    "temperature": st.one_of(st.floats(0, 2), WILD), "top_p": WILD, "stream": st.one_of(st.booleans(), WILD),
    "tools": st.one_of(st.just([{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
                       st.lists(st.dictionaries(st.sampled_from(["type", "name", "parameters"]), WILD), max_size=2),
                       WILD),
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required"]), WILD,
                             st.just({"type": "function", "name": "f"})),
    "text": st.one_of(st.fixed_dictionaries({"format": st.one_of(WILD, st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"]), "schema": WILD}))}), WILD),
    "previous_response_id": WILD, "store": WILD, "metadata": WILD, "truncation": WILD, "reasoning": WILD,
}
EMBEDDING_FIELDS = {
    "input": st.one_of(st.just("Hi"), SURROGATES, st.lists(st.text(max_size=5), max_size=3),
                       st.lists(st.sampled_from([-1, 0, 5, 2**31, 2**70, 49151, 49152]), max_size=4),
                       st.lists(st.lists(st.integers(-2, 60000), max_size=3), max_size=2), WILD),
    "encoding_format": st.one_of(st.sampled_from(["float", "base64"]), WILD), "dimensions": WILD,
    "normalize": WILD, "pooling": st.one_of(st.sampled_from(["last", "mean"]), WILD), "add_special_tokens": WILD,
    "model": st.one_of(st.just("tritonllm"), st.just("ensemble"), WILD),
}


@st.composite
def other_requests(draw):
    responses = draw(st.booleans())
    fields = RESPONSE_FIELDS if responses else EMBEDDING_FIELDS
    body = {"model": "tritonllm", "input": "Hi"} | ({"max_output_tokens": 2} if responses else {})
    return ("responses" if responses else "embeddings"), _vary(draw, body, fields)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=other_requests())
def test_no_responses_or_embeddings_body_gets_a_5xx_or_hangs(openai_url, stub_rss, case):  # noqa: F811
    _post_and_check(openai_url, *case)


def test_after_the_fuzz_nothing_runs_no_block_is_held_and_memory_is_bounded(triton_server, stub_rss):
    m = wait_idle(triton_server.metrics_url)
    assert m["llm_requests_running"] == 0 and m["llm_kv_cache_usage_ratio"] == 0, m
    pid, before = stub_rss
    grown_mib = (rss_kib(pid) - before) / 1024
    assert grown_mib < 96, grown_mib
