"""Tool-call and reasoning parsers of the OpenAI server on canned model text: every family, whole and
streamed in pieces of every size (the streamed fragments must join to exactly the whole answer), held-back
partial markers, malformed text staying content, and the guides that force calls."""
from __future__ import annotations

import json

import pytest

from clients.openai_server import reasoning as R  # noqa: E402
from clients.openai_server import tool_calls as T  # noqa: E402
from clients.openai_server.chat_answer import ChatAnswer  # noqa: E402
from clients.openai_server.protocol import ApiError, ChatCompletionRequest  # noqa: E402

WEATHER = {"city": "Paris", "days": [1, 2], "note": "a \"quoted\" }"}
CANNED = {
    "hermes": ("Let me check.\n<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": WEATHER})
               + "\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
               "Let me check.\n"),
    "llama3_json": ("<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": WEATHER})
                    + "; {\"name\": \"now\", \"parameters\": {}}", None),
    "mistral": ("[TOOL_CALLS][" + json.dumps({"name": "get_weather", "arguments": WEATHER})
                + ", {\"name\": \"now\", \"arguments\": \"{}\"}]", None),
}


def _stream(parser, text: str, step: int):
    """Feed ``text`` in pieces of ``step`` characters; returns (content, {index: name}, {index: arguments})."""
    s, content, names, args = T.ToolCallStream(parser), "", {}, {}
    pieces = [text[i:i + step] for i in range(0, len(text), step)] + [""]
    for n, piece in enumerate(pieces):
        c, deltas = s.feed(piece, final=n == len(pieces) - 1)
        content += c
        for d in deltas:
            fn = d["function"]
            if "name" in fn:
                assert d["id"].startswith("call_") and d["type"] == "function" and d["index"] not in names
                names[d["index"]] = fn["name"]
            args[d["index"]] = args.get(d["index"], "") + fn.get("arguments", "")
    return content, names, args


@pytest.mark.parametrize("family", sorted(CANNED))
def test_each_family_parses_two_calls_whole_and_streamed(family):
    text, content = CANNED[family]
    parser = T.PARSERS[family]
    got_content, calls = T.final_calls(parser, text)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [WEATHER, {}]
    for step in (1, 2, 5, 13, len(text)):
        s_content, names, args = _stream(parser, text, step)
        assert s_content == (content or "")
        assert [names[i] for i in sorted(names)] == ["get_weather", "now"]
        assert [args[i] for i in sorted(args)] == [c["function"]["arguments"] for c in calls]


def test_a_partial_marker_is_held_back_until_the_text_decides():
    assert T.hermes("Sure <tool_ca", False).content == "Sure "
    assert T.hermes("Sure <tool_ca", True).content == "Sure <tool_ca"
    content, names, _ = _stream(T.hermes, "a <tool_cart> b", 1)
    assert content == "a <tool_cart> b" and not names


@pytest.mark.parametrize("text", ["no call here", "<tool_call>not json</tool_call>",
                                  "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",  # cut by length
                                  "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>"])
def test_text_without_a_well_formed_call_stays_content(text):
    assert T.final_calls(T.hermes, text) is None
    message = ChatAnswer(None, T.hermes).message(text)
    assert message == {"role": "assistant", "content": text}


def test_llama3_plain_answers_are_content():
    assert T.final_calls(T.llama3_json, "  The weather is fine.") is None
    assert _stream(T.llama3_json, "  The weather is fine.", 3)[0] == "  The weather is fine."


def test_required_and_named_outputs_parse_as_calls():
    required = json.dumps([{"name": "get_weather", "parameters": WEATHER}])
    content, calls = T.final_calls(T.json_array, required)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == WEATHER
    content, calls = T.final_calls(T.named("get_weather"), json.dumps(WEATHER))
    assert calls[0]["function"] == {"name": "get_weather", "arguments": json.dumps(WEATHER)}
    _, names, args = _stream(T.named("get_weather"), json.dumps(WEATHER), 4)
    assert names == {0: "get_weather"} and args == {0: json.dumps(WEATHER)}


@pytest.mark.parametrize("parser,text,want", [
    ("deepseek_r1", "<think>\nweigh it\n</think>\n\nParis", ("\nweigh it\n", "Paris")),
    ("deepseek_r1", "weigh it</think>Paris", ("weigh it", "Paris")),  # <think> opened by the template
    ("deepseek_r1", "still thinking", ("still thinking", "")),
    ("qwen3", "<think>weigh it</think>Paris", ("weigh it", "Paris")),
    ("qwen3", "Paris</think>", ("", "Paris</think>")),
])
def test_reasoning_split_whole_and_streamed(parser, text, want):
    assert R.split(parser, text, True) == want
    for step in (1, 3, 7):
        stream, got = R.ReasoningStream(parser), ["", ""]
        pieces = [text[i:i + step] for i in range(0, len(text), step)] + [""]
        for n, piece in enumerate(pieces):
            for k, part in enumerate(stream.feed(piece, final=n == len(pieces) - 1)):
                got[k] += part
        assert tuple(got) == want


def test_reasoning_then_tool_call_in_one_answer():
    text = "<think>the user wants weather</think>" + CANNED["hermes"][0]
    answer = ChatAnswer("deepseek_r1", T.hermes)
    message = answer.message(text)
    assert message["reasoning_content"] == "the user wants weather"
    assert message["content"] == "Let me check.\n" and len(message["tool_calls"]) == 2
    deltas = [d for ch in text for d in answer.deltas(ch)] + answer.deltas("", final=True)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "the user wants weather"
    assert "".join(d.get("content", "") for d in deltas) == "Let me check.\n"
    assert answer.called


def _chat(**kw) -> ChatCompletionRequest:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}]
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools, **kw)


def test_tool_choice_modes_and_their_guides():
    assert _chat().tool_mode() == "auto"
    none = _chat(tool_choice="none")
    assert none.tool_mode() == "none" and none.guide(none.tool_mode()) is None
    kind, schema = _chat(tool_choice="required", parallel_tool_calls=False).guide("required")
    schema = json.loads(schema)
    assert kind == "json_schema" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [o["properties"]["name"]["enum"] for o in schema["items"]["anyOf"]] == [["get_weather"], ["now"]]
    req = _chat(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert req.tool_mode() == ("function", "get_weather")
    assert json.loads(req.guide(req.tool_mode())[1])["required"] == ["city"]
    now = _chat(tool_choice={"type": "function", "function": {"name": "now"}})
    assert json.loads(now.guide(now.tool_mode())[1]) == {"type": "object"}
    auto_fn = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                    tools=[{"type": "function", "function": {"name": "auto"}}],
                                    tool_choice={"type": "function", "function": {"name": "auto"}})
    assert auto_fn.tool_mode() == ("function", "auto")  # a function named like a mode is still a function


@pytest.mark.parametrize("kw,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_regex": "a+", "guided_choice": ["x"]}, "guided_choice"),
])
def test_conflicting_or_unknown_tool_choices_are_400(kw, param):
    req = _chat(**kw)
    with pytest.raises(ApiError) as e:
        req.guide(req.tool_mode())
    assert e.value.status == 400 and e.value.param == param


def test_assistant_tool_calls_reach_the_template_as_objects():
    req = ChatCompletionRequest(model="m", messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
    msgs = req.chat_messages()
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert msgs[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


@pytest.mark.parametrize("parser,text", [(T.llama3_json, '{"answer": 1}'),
                                         (T.hermes, '<tool_call>{"foo": 1}</tool_call>'),
                                         (T.hermes, '<tool_call>{"name": tru, "arguments": {}}</tool_call>')])
def test_text_that_only_looked_like_a_call_streams_as_content(parser, text):
    assert T.final_calls(parser, text) is None
    for step in (1, 3, len(text)):
        assert _stream(parser, text, step) == (text, {}, {})


def test_a_call_without_arguments_streams_the_same_arguments_as_the_whole_answer():
    text = '<tool_call>{"name": "now"}</tool_call>'
    _, calls = T.final_calls(T.hermes, text)
    assert calls[0]["function"]["arguments"] == "{}"
    for step in (1, 4, len(text)):
        assert _stream(T.hermes, text, step) == ("", {0: "now"}, {0: "{}"})


def test_text_breaking_the_format_after_a_call_is_dropped_not_garbled():
    text = '{"name": "f", "parameters": {"a": 1}} trailing'
    assert _stream(T.llama3_json, text, 3) == ("", {0: "f"}, {0: '{"a": 1}'})


def test_quoted_arguments_that_are_not_json_end_the_stream_cleanly():
    text = '<tool_call>{"name": "f", "arguments": "\\q"}</tool_call>'   # a bad escape in a JSON string
    assert T.final_calls(T.hermes, text) is None
    for step in (1, 5, len(text)):
        assert _stream(T.hermes, text, step) == ("", {0: "f"}, {0: ""})   # the name was sent; nothing raises


@pytest.mark.parametrize("parser,text", [
    (T.json_array, '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_weather", "parameters'),
    (T.json_array, '[{"name": "get_weather", "parameters": {"city": "Par'),
    (T.named("get_weather"), '{"city": "Par'),
])
def test_a_guided_answer_cut_by_max_tokens_is_calls_as_far_as_written_whole_and_streamed(parser, text):
    """tool_choice required / named cut by max_tokens: tool calls (finish_reason "length" says they may be
    incomplete), never the raw JSON as content; the whole message equals what the stream sent."""
    answer = ChatAnswer(None, parser, guided=True)
    message = answer.message(text, cut=True)
    _, names, args = _stream(parser, text, 5)
    assert message["content"] is None and message["tool_calls"]
    assert {i: c["function"]["name"] for i, c in enumerate(message["tool_calls"])} == names
    assert {i: c["function"]["arguments"] for i, c in enumerate(message["tool_calls"])} == args
    if parser is T.json_array and text.endswith("parameters"):
        assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
        assert message["tool_calls"][1]["function"]["arguments"] == ""
    # not cut (a text that ended otherwise) keeps the old rule: no well-formed calls -> content
    assert ChatAnswer(None, parser, guided=True).message(text)["content"] == text
    # cut before any call had its name: content, as the stream released it
    assert ChatAnswer(None, T.json_array, guided=True).message('[{"na', cut=True)["content"] == '[{"na'
