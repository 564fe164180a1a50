"""Tool calling and reasoning through the OpenAI server and the real tritonserver, with the `openai` SDK.

``tool_choice`` required / named go through guided decoding, so the arguments parse against the function's
schema. ``auto`` and the reasoning split need the model to write a call or a ``<think>`` block, which a 135M model
would not do reliably: those tests make it write canned text through vLLM's ``guided_regex`` extra (the engine's
regex guide), so the text still comes from the real stack and the server's parsers read it as they would a real
model's. The default model (SmolLM2-135M-Instruct) has no tools section in its chat template: the two tests of how
a template renders tools and tool results run on the demo toy's, which has one (fixture ``toy_client``).
"""
from __future__ import annotations

import json

import pytest

import openai  # noqa: E402
import jsonschema  # noqa: E402

from openai_helpers import openai_server, sdk_client, tokenizer  # noqa: E402,F401  (tokenizer: a fixture)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                            "metric": {"type": "boolean"}},
           "required": ["city", "metric"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(triton_server):
    for url, _ in openai_server(triton_server, args=("--tool-call-parser", "hermes",
                                                     "--reasoning-parser", "deepseek_r1")):
        yield sdk_client(url)


@pytest.fixture(scope="module")
def toy_client(toy_server):
    from toy_repository import TOY

    for url, _ in openai_server(toy_server, args=("--tokenizer-dir", str(TOY), "--tool-call-parser", "hermes")):
        yield sdk_client(url)


@pytest.fixture(scope="module")
def toy_tokenizer():
    from toy_repository import TOY
    from tritonllm.model_files import load_hf_tokenizer

    return load_hf_tokenizer(TOY)


def _streamed(stream):
    """(content, reasoning, {index: (id, name, arguments)}, finish_reason) of a streamed chat answer."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            cid, name, args = calls.get(call.index, (None, None, ""))
            if call.id:
                assert cid is None, "a call's id and name come once"
                cid, name = call.id, call.function.name
            calls[call.index] = (cid, name, args + (call.function.arguments or ""))
        finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


def test_required_tool_call_has_arguments_valid_against_the_schema(client):
    kw = dict(model="tritonllm", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              temperature=0, max_tokens=96)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])

    content, _, calls, finish = _streamed(client.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and content == ""
    assert [(n, a) for _, n, a in calls.values()] == [(call.function.name, call.function.arguments)]


def test_required_tool_call_cut_by_max_tokens_is_still_a_call(client):
    """OpenAI's contract for ``required`` is tool calls: one cut by max_tokens comes back as a call whose arguments
    stop where the model stopped (finish_reason "length"), never as its raw JSON in ``content``; streamed alike."""
    kw = dict(model="tritonllm", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              temperature=0)
    full = client.chat.completions.create(max_tokens=96, **kw)
    (whole_call,) = full.choices[0].message.tool_calls
    cut = client.chat.completions.create(max_tokens=full.usage.completion_tokens - 3, **kw).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None, cut
    (call,) = cut.message.tool_calls
    assert call.function.name == whole_call.function.name and call.id.startswith("call_")
    assert whole_call.function.arguments.startswith(call.function.arguments) \
        and call.function.arguments != whole_call.function.arguments
    content, _, calls, finish = _streamed(client.chat.completions.create(
        stream=True, max_tokens=full.usage.completion_tokens - 3, **kw))
    assert finish == "length" and content == ""
    assert [(n, a) for _, n, a in calls.values()] == [(call.function.name, call.function.arguments)]


def test_named_tool_choice_calls_that_function(client):
    kw = dict(model="tritonllm", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's for a named function
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])
    _, _, calls, _ = _streamed(client.chat.completions.create(stream=True, **kw))
    assert [(n, a) for _, n, a in calls.values()] == [("get_time", call.function.arguments)]


CANNED_CALL = ('<think>the user asks for weather</think>Checking.<tool_call>\n'
               '{"name": "get_weather", "arguments": {"city": "Oslo", "metric": true}}\n</tool_call>')


def _regex(text: str) -> str:
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else ("\\n" if c == "\n" else c) for c in text)


def test_auto_tool_choice_parses_the_models_call_and_reasoning(client):
    kw = dict(model="tritonllm", messages=ASK, tools=TOOLS, temperature=0, max_tokens=128,
              extra_body={"guided_regex": _regex(CANNED_CALL)})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert choice.message.reasoning_content == "the user asks for weather"
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo", "metric": True})

    content, reasoning, calls, finish = _streamed(client.chat.completions.create(stream=True, **kw))
    assert (content, reasoning, finish) == ("Checking.", "the user asks for weather", "tool_calls")
    assert [(n, a) for _, n, a in calls.values()] == [("get_weather", call.function.arguments)]


def test_reasoning_is_split_from_the_answer(client):
    kw = dict(model="tritonllm", messages=[{"role": "user", "content": "Capital of France?"}], temperature=0,
              max_tokens=64, extra_body={"guided_regex": _regex("<think>\nrecall it\n</think>\n\nParis")})
    message = client.chat.completions.create(**kw).choices[0].message
    assert (message.reasoning_content, message.content) == ("\nrecall it\n", "Paris")
    assert message.tool_calls is None
    content, reasoning, calls, finish = _streamed(client.chat.completions.create(stream=True, **kw))
    assert (reasoning, content, calls, finish) == ("\nrecall it\n", "Paris", {}, "stop")


def _count(tokenizer, rendered: str) -> int:
    return len(tokenizer(rendered, add_special_tokens=False).input_ids)  # the template wrote the BOS


def test_a_tool_conversation_is_rendered_by_the_models_template(toy_client, toy_tokenizer):
    client, tokenizer = toy_client, toy_tokenizer
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"metric\": true}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    reply = client.chat.completions.create(model="tritonllm", messages=messages, tools=TOOLS, temperature=0,
                                           max_tokens=4)
    rendered = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
    text = tokenizer.apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text and '"name": "get_weather"' in text
    assert reply.usage.prompt_tokens == _count(tokenizer, text)


def test_tool_choice_none_hides_the_tools(toy_client, toy_tokenizer):
    client, tokenizer = toy_client, toy_tokenizer
    reply = client.chat.completions.create(model="tritonllm", messages=ASK, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=4)
    text = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    with_tools = tokenizer.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert _count(tokenizer, with_tools) > _count(tokenizer, text)  # so the count below tells them apart
    assert reply.usage.prompt_tokens == _count(tokenizer, text)
    assert reply.choices[0].message.tool_calls is None


def test_bad_tool_requests_are_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tritonllm", messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "missing"}})
    assert "missing" in str(e.value)
    with pytest.raises(openai.BadRequestError):  # a schema the grammar compiler refuses is the engine's 400
        client.chat.completions.create(model="tritonllm", messages=ASK, max_tokens=4, tool_choice="required",
                                       tools=[{"type": "function", "function": {
                                           "name": "f", "parameters": {"type": "object", "minProperties": "x"}}}])
