"""OpenAI's Responses API (/v1/responses) through the OpenAI server and the real tritonserver, driven by the
official `openai` SDK unmodified: create (string and item-list input, instructions), streamed events, a function
call and its follow-up through previous_response_id, text.format json_schema, the store (retrieve, delete,
store: false), background responses and cancel, refusals naming the field. The answers are the chat path's: the
same request through /v1/chat/completions gives the same text (greedy).
"""
from __future__ import annotations

import json
import time

import pytest

import openai  # noqa: E402

from openai_helpers import openai_server, sdk_client  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
           "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}


@pytest.fixture(scope="module")
def client(triton_server):
    for url, _ in openai_server(triton_server, args=("--responses-store-size", "3")):
        yield sdk_client(url)


def test_a_response_is_the_chat_answer_of_the_same_messages(client):
    r = client.responses.create(model="tritonllm", input="Name a color.", instructions="Answer in one word.",
                                max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model="tritonllm", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a color."}])
    assert r.object == "response" and r.id.startswith("resp") and r.status in ("completed", "incomplete")
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    items = client.responses.create(model="tritonllm", max_output_tokens=12, temperature=0, input=[
        {"role": "system", "content": "Answer in one word."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert items.output_text == r.output_text  # the item-list form of the same input


def test_max_output_tokens_makes_the_response_incomplete(client):
    r = client.responses.create(model="tritonllm", input="Tell me a long story about a dragon.",
                                max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5


def test_streamed_events_build_the_same_response(client):
    kw = dict(model="tritonllm", input="Tell me a story about a dragon.", max_output_tokens=16, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    short = dict(model="tritonllm", input="Name a color.", instructions="Answer in one word.", max_output_tokens=64,
                 temperature=0)
    done = client.responses.create(**short)
    assert done.status == "completed"  # the SDK's accumulator gives a final response for completed ones only
    with client.responses.stream(**short) as stream:  # it accepts our events as OpenAI's
        assert stream.get_final_response().output_text == done.output_text
    assert client.responses.retrieve(events[-1].response.id).output_text == whole.output_text


def test_a_function_call_and_its_follow_up_through_previous_response_id(client):
    first = client.responses.create(model="tritonllm", input="What is the weather in Paris?", tools=[TOOL],
                                    tool_choice="required", max_output_tokens=60, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert json.loads(calls[0].arguments)["city"] in WEATHER["properties"]["city"]["enum"]
    follow = client.responses.create(
        model="tritonllm", previous_response_id=first.id, max_output_tokens=12, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"celsius": 21}'}])
    assert follow.previous_response_id == first.id and follow.output_text
    assert follow.usage.input_tokens > first.usage.input_tokens  # the first turn and the call are in the prompt
    named = client.responses.create(model="tritonllm", input="Weather?", tools=[TOOL], temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40)
    assert [o.name for o in named.output if o.type == "function_call"] == ["get_weather"]
    events = list(client.responses.create(model="tritonllm", input="What is the weather in Oslo?", tools=[TOOL],
                                          tool_choice="required", max_output_tokens=60, temperature=0, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done and json.loads(done[0].arguments) == json.loads(args)
    assert events[-1].response.output[0].type == "function_call"


def test_text_format_json_schema_guides_the_output(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"],
              "additionalProperties": False}
    r = client.responses.create(model="tritonllm", input="Give a JSON object with a name.", temperature=0,
                                max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
    assert set(json.loads(r.output_text)) == {"name"}


def test_the_store_retrieves_deletes_and_forgets(client):
    kept = client.responses.create(model="tritonllm", input="Hi", max_output_tokens=3)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    unstored = client.responses.create(model="tritonllm", input="Hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model="tritonllm", input="Hi", previous_response_id=unstored.id, max_output_tokens=3)
    ids = [client.responses.create(model="tritonllm", input="Hi", max_output_tokens=2).id for _ in range(4)]
    with pytest.raises(openai.NotFoundError):  # --responses-store-size 3: the oldest went
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]


def test_input_items_list_the_responses_own_input_and_paginate(client):
    given = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a color."}]
    r = client.responses.create(model="tritonllm", input=given, max_output_tokens=4, temperature=0)
    newest_first = client.responses.input_items.list(r.id)
    assert [(i.role, i.content[0].text) for i in newest_first.data] == [(m["role"], m["content"])
                                                                       for m in reversed(given)]
    paged = list(client.responses.input_items.list(r.id, limit=1, order="asc"))  # the SDK follows `after`
    assert [i.content[0].text for i in paged] == [m["content"] for m in given]
    assert len({i.id for i in paged}) == 2
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")


def test_a_background_response_is_polled_and_cancelled(client):
    r = client.responses.create(model="tritonllm", input="Hi", max_output_tokens=4, background=True)
    assert r.status == "in_progress"
    deadline = time.monotonic() + 60
    while client.responses.retrieve(r.id).status == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.responses.retrieve(r.id).status in ("completed", "incomplete")
    long = client.responses.create(model="tritonllm", input="Tell me a long story.", max_output_tokens=4000,
                                   background=True, extra_body={"ignore_eos": True})
    assert client.responses.cancel(long.id).status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    foreground = client.responses.create(model="tritonllm", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(foreground.id)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
    ({"input": "x", "background": True, "stream": True}, "background"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
])
def test_what_it_cannot_serve_is_refused_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tritonllm", **body)
    assert e.value.body["param"] == param, e.value.body


def test_an_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")
