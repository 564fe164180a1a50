"""Tool-call parsers: generated text -> OpenAI ``tool_calls``, whole or streamed.

A parser reads the text generated so far and returns ``Parsed``: the content that is surely not part of a
tool call, and the calls seen so far (a call's name once its JSON string has closed; its arguments as
the raw JSON text generated so far). Parses are monotone: the parse of a prefix is a prefix of the parse
of the whole (content and argument texts only grow, a name appears once, complete). So a stream is the
difference between consecutive parses (``ToolCallStream``), and the streamed fragments join to exactly
the arguments of the final answer. Content that might begin a marker (``"<tool_ca"``) is held back until
the next text decides, or the end.

Families, by vLLM's parser names (the model's chat template decides which one fits):
- ``hermes`` (Hermes, Qwen 2.5 / 3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, repeated;
- ``llama3_json`` (Llama 3.1+): the whole answer is ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``), several separated by ``;``;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (or v11's ``[TOOL_CALLS]name[ARGS]{...}``).
``json_array`` reads what ``tool_choice: required`` makes the model write under guided decoding (a bare
JSON array of ``{"name", "parameters"}``); ``named(fn)`` reads a named tool_choice's bare arguments.
Malformed text is not a tool call: ``final_calls`` returns None and the text stays content.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Callable

from .reasoning import held


class _Malformed(ValueError):
    pass


def _loads(raw: str):
    """json.loads for text the model wrote: anything that is not JSON is _Malformed (not a tool call)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise _Malformed(str(e)) from None


@dataclass
class Call:
    name: str | None = None   # None until the name's JSON string has closed
    arguments: str = ""       # raw JSON text of the arguments so far ("" before they start)
    complete: bool = False    # the call's object has closed
    quoted: bool = False      # arguments given as a JSON string (decoded once complete)


@dataclass
class Parsed:
    content: str
    calls: list[Call] = field(default_factory=list)


Parser = Callable[[str, bool], Parsed]  # (text so far, text is final) -> Parsed


# ---- a scanner for JSON prefixes ------------------------------------------------------------------
def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _string_end(s: str, i: int) -> int | None:
    """Index after the JSON string starting at s[i] == '"', or None when s ends inside it."""
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
        elif s[j] == '"':
            return j + 1
        else:
            j += 1
    return None


def _value_end(s: str, i: int) -> int | None:
    """Index after the JSON value starting at s[i], or None when s ends inside it."""
    if s[i] == '"':
        return _string_end(s, i)
    if s[i] in "{[":
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                end = _string_end(s, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(s) and s[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(s) else None  # a number at the very end may still grow


def _scan_call(s: str, i: int, name_keys=("name",), arg_keys=("arguments", "parameters")) -> tuple[Call, int | None]:
    """The call object starting at s[i] == '{': (Call so far, index after it or None if unfinished)."""
    call, j = Call(), _ws(s, i + 1)
    while j < len(s):
        if s[j] == "}":
            call.complete = True
            return call, j + 1
        if s[j] == ",":
            j = _ws(s, j + 1)
            continue
        if s[j] != '"':
            raise _Malformed(f"expected a key at {j}")
        key_end = _string_end(s, j)
        if key_end is None:
            break
        key = _loads(s[j:key_end])
        j = _ws(s, key_end)
        if j >= len(s):
            break
        if s[j] != ":":
            raise _Malformed(f"expected ':' at {j}")
        j = _ws(s, j + 1)
        if j >= len(s):
            break
        end = _value_end(s, j)
        raw = s[j:end] if end is not None else s[j:]
        if key in name_keys and end is not None:
            name = _loads(raw)
            if not isinstance(name, str):
                raise _Malformed("the function name is not a string")
            call.name = name
        elif key in arg_keys:
            call.arguments, call.quoted = raw, raw.startswith('"')
        if end is None:
            break
        j = _ws(s, end)
    return call, None


def _array_calls(s: str, i: int, arg_keys=("arguments", "parameters")) -> list[Call]:
    """Calls of the JSON array starting at s[i] == '['."""
    calls, j = [], _ws(s, i + 1)
    while j < len(s):
        if s[j] == "]":
            break
        if s[j] == ",":
            j = _ws(s, j + 1)
            continue
        if s[j] != "{":
            raise _Malformed(f"expected an object at {j}")
        call, end = _scan_call(s, j, arg_keys=arg_keys)
        calls.append(call)
        if end is None:
            break
        j = _ws(s, end)
    return calls


# ---- the families ---------------------------------------------------------------------------------
def hermes(text: str, final: bool) -> Parsed:
    start = "<tool_call>"
    k = text.find(start)
    if k < 0:
        return Parsed(held(text, start, final))
    calls, i = [], k
    while True:
        j = _ws(text, i + len(start))
        if j >= len(text):
            break
        if text[j] != "{":
            raise _Malformed("<tool_call> is not followed by a JSON object")
        call, end = _scan_call(text, j)
        calls.append(call)
        if end is None:
            break
        i = text.find(start, end)
        if i < 0:
            break
    return Parsed(text[:k], calls)


def llama3_json(text: str, final: bool) -> Parsed:
    tag = "<|python_tag|>"
    body = text.lstrip()
    if body.startswith(tag):
        body = body[len(tag):].lstrip()
    elif not final and (not body or tag.startswith(body)):
        return Parsed("")  # not yet decided
    if not body:
        return Parsed(text if final else "")
    if body[0] != "{":
        return Parsed(text)
    base = len(text) - len(body)
    calls, j = [], base
    while j < len(text):
        call, end = _scan_call(text, j)
        calls.append(call)
        if end is None:
            break
        j = _ws(text, end)
        if j < len(text) and text[j] == ";":
            j = _ws(text, j + 1)
        elif j < len(text):
            raise _Malformed(f"unexpected text after a call at {j}")
        if j < len(text) and text[j] != "{":
            raise _Malformed(f"expected a call at {j}")
    return Parsed("", calls)


def mistral(text: str, final: bool) -> Parsed:
    marker = "[TOOL_CALLS]"
    k = text.find(marker)
    if k < 0:
        return Parsed(held(text, marker, final))
    j = _ws(text, k + len(marker))
    if j >= len(text):
        return Parsed(text[:k])
    if text[j] == "[":
        return Parsed(text[:k], _array_calls(text, j))
    calls = []  # v11: name[ARGS]{...}, repeated after further [TOOL_CALLS] markers
    for part in text[k + len(marker):].split(marker):
        name, sep, args = part.partition("[ARGS]")
        if not sep:
            break
        a = _ws(args, 0)
        end = _value_end(args, a) if a < len(args) else None
        calls.append(Call(name.strip(), args[a:end] if end else args[a:], end is not None))
    return Parsed(text[:k], calls)


def json_array(text: str, final: bool) -> Parsed:
    j = _ws(text, 0)
    if j >= len(text):
        return Parsed("")
    if text[j] != "[":
        raise _Malformed("expected a JSON array of calls")
    return Parsed("", _array_calls(text, j))


def named(function: str) -> Parser:
    def parse(text: str, final: bool) -> Parsed:
        j = _ws(text, 0)
        end = _value_end(text, j) if j < len(text) else None
        return Parsed("", [Call(function, text[j:end] if end else text[j:], end is not None)])
    return parse


PARSERS: dict[str, Parser] = {"hermes": hermes, "llama3_json": llama3_json, "mistral": mistral}


# ---- whole answers and streams --------------------------------------------------------------------
def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _arguments(call: Call) -> str:
    if call.quoted:
        return _loads(call.arguments)
    return call.arguments or "{}"


def final_calls(parser: Parser, text: str, cut: bool = False) -> tuple[str | None, list[dict]] | None:
    """(content or None, OpenAI tool_calls) for a finished text, or None when it holds no well-formed call
    (then the text is plain content). ``cut``: the text was guided to be calls and max_tokens ended it
    (``tool_choice`` required or named): every call that has its name is a call, the last one with its
    arguments as far as they were written, exactly what a stream of the same text sent (OpenAI's answer to a
    cut call: ``finish_reason`` "length" tells the client the arguments may be incomplete)."""
    try:
        parsed = parser(text, True)
        calls = [c for c in parsed.calls if c.name is not None] if cut else parsed.calls
        if not calls or (not cut and any(not c.complete or c.name is None for c in calls)):
            return None  # (cut before any name: the text is content, as a stream of it released it)
        out = []
        for c in calls:
            if c.complete:
                args = _arguments(c)
                _loads(args)  # arguments must be JSON
            else:  # cut: a stream sends quoted arguments only once whole
                args = "" if c.quoted else c.arguments
            out.append({"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": args}})
    except (_Malformed, ValueError):
        return None
    return (parsed.content or None), out


class ToolCallStream:
    """Text deltas in, (content delta, tool_calls deltas as OpenAI's stream chunks carry them) out.

    What was sent cannot be taken back, so where the whole answer would differ, the stream keeps as close
    as it can: text that never became a call is released as content when the text ends (or when it stops
    parsing before any call was sent); once a call was sent, text that stops parsing is dropped."""

    def __init__(self, parser: Parser):
        self.parser = parser
        self.text = ""
        self._content = 0           # content characters sent
        self._sent: list[int] = []  # per call sent: its argument characters sent
        self.broken = False         # stopped parsing: the rest is content (no call sent) or dropped

    @property
    def called(self) -> bool:
        return bool(self._sent)

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[dict]]:
        self.text += delta
        if self.broken:
            return ("" if self._sent else delta), []
        try:
            parsed = self.parser(self.text, final)
        except _Malformed:
            self.broken = True
            return ("" if self._sent else self.text[self._content:]), []
        if final and not self._sent and final_calls(self.parser, self.text) is None:
            rest = self.text[self._content:]  # it looked like a call and never was one: plain content
            self._content = len(self.text)
            return rest, []
        content = parsed.content[self._content:]
        self._content = len(parsed.content)
        deltas = []
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break  # calls stream in order: a later one waits for this one's name
            if index == len(self._sent):
                self._sent.append(0)
                deltas.append({"index": index, "id": new_call_id(), "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            if call.quoted or not call.arguments:  # known only once whole: decoded, or "{}" when absent
                try:
                    args = _arguments(call) if call.complete and not self._sent[index] else ""
                except _Malformed:  # a quoted arguments string that is not JSON: the format broke here
                    self.broken = True
                    break
                if args:
                    self._sent[index] = len(args)
            else:
                args = call.arguments[self._sent[index]:]
                self._sent[index] = len(call.arguments)
            if args:
                deltas.append({"index": index, "function": {"arguments": args}})
        return content, deltas
