"""OpenAI's Responses API (``/v1/responses``) as a thin adapter over the chat path: a request becomes a
``ChatCompletionRequest`` (one request lifecycle for every front: the same prompt rendering, tool modes, guided
decoding, cancellation and errors), the chat answer becomes a Response object, and the chat stream's chunks
become Responses events.

Invariants:
- Input: a string (one user message) or a list of items: messages (roles user / assistant / system / developer,
  text or ``input_text`` / ``output_text`` parts), ``function_call`` and ``function_call_output`` items.
  ``instructions`` lead as a system message and, as OpenAI documents, are not carried to a follow-up.
  Anything else (images, files, item references, hosted tools, reasoning options) is refused with 400 naming it.
- ``previous_response_id``: the stored conversation of that response (its input and output, as chat messages)
  precedes this input. The store keeps at most ``size`` responses for ``ttl_s`` seconds each (oldest dropped
  first); ``store: false`` keeps nothing, so such a response cannot be retrieved or continued (404).
- Output items: a ``reasoning`` item (with a reasoning parser), a ``message`` with one ``output_text`` part,
  and one ``function_call`` item per tool call. A response cut by ``max_output_tokens`` has status
  ``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` (event ``response.incomplete``).
- Streaming: ``response.created``, ``response.in_progress``, then per item ``output_item.added`` ->
  (``content_part.added`` -> ``output_text.delta``* -> ``output_text.done`` -> ``content_part.done``) or
  ``function_call_arguments.delta``* -> ``function_call_arguments.done``, ``output_item.done``; last
  ``response.completed`` / ``response.incomplete`` (or ``response.failed`` on an error after the start).
  ``sequence_number`` counts from 0. Errors before the first token are HTTP statuses, as on the chat route.
- ``background: true`` answers at once (status ``in_progress``) and generates in a task; GET polls it;
  ``POST /v1/responses/{id}/cancel`` cancels that task (its Triton request too): status ``cancelled``.
  Only background responses can be cancelled (400 otherwise), as OpenAI's API says.
- ``GET /v1/responses/{id}/input_items`` lists the response's own input (not its predecessors'), as items with
  ids, newest first by default (``order``, ``limit`` 1..100, ``after`` cursor: the SDK's auto-pagination).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from typing import Any, Literal

from fastapi import Query, Request
from pydantic import Field, ValidationError

from clients.openai_server.limits import CancellingStream
from clients.openai_server.protocol import INT32_MAX, ApiError, ChatCompletionRequest, UnicodeChecked
from clients.openai_server.responses import new_id
from clients.openai_server.responses_events import ResponseEvents

UNSUPPORTED = ("reasoning", "include", "conversation", "prompt", "max_tool_calls", "prompt_cache_key")


class ResponsesRequest(UnicodeChecked):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    # refused when given (UNSUPPORTED): this server has no hosted reasoning options, conversations or prompts
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    prompt_cache_key: str | None = None

    def check_supported(self) -> None:
        for name in UNSUPPORTED:
            if getattr(self, name) not in (None, []):
                raise ApiError(400, f"{name} is not supported by this server", param=name)
        if self.truncation == "auto":
            raise ApiError(400, 'truncation "auto" is not supported: a prompt past the context is refused',
                           param="truncation")
        if self.background and (self.stream or not self.store):
            raise ApiError(400, "background needs store: true and no streaming", param="background")


def _text_of(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for i, part in enumerate(content if isinstance(content, list) else [content]):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(400, f"{where}.content[{i}]: a part of type {kind!r} is not supported (text only)",
                           param=f"{where}.content")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as chat messages (see the module docstring)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where, kind = f"input[{i}]", item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(400, f"{where}.role: {role!r} is not a message role", param=f"{where}.role")
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id") or new_id("call"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text_of(item.get("output"),
                                                                                                 where)})
        else:
            raise ApiError(400, f"{where}: items of type {kind!r} are not supported", param=f"{where}.type")
    return out


def _chat_tools(req: ResponsesRequest) -> tuple[list[dict] | None, Any]:
    tools = []
    for i, tool in enumerate(req.tools or []):
        if tool.get("type") != "function":
            raise ApiError(400, f"tools[{i}]: tools of type {tool.get('type')!r} are not supported (function only)",
                           param=f"tools[{i}].type")
        tools.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters",
                                                                             "strict") if k in tool}})
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not choice.get("name"):
            raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                           param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools or None, choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise ApiError(400, "text.format must be an object with a type", param="text.format")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    if fmt.get("type") in ("text", "json_object"):
        return {"type": fmt["type"]}
    raise ApiError(400, f"text.format: type {fmt.get('type')!r} is not supported", param="text.format")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that answers ``req`` after ``history`` (the previous responses' messages)."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history \
        + input_messages(req.input)
    if not messages:
        raise ApiError(400, "input is empty", param="input")
    tools, choice = _chat_tools(req)
    body = {"model": req.model, "messages": messages, "max_completion_tokens": req.max_output_tokens,
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": _response_format(req.text), "user": req.user, "stream": req.stream,
            "stream_options": {"include_usage": True} if req.stream else None,
            **{k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p)) if v is not None}}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        raise ApiError(400, f"{param}: {err.get('msg', 'invalid request')}", param=param) from None


class ResponseStore:
    """Responses by id, with the conversation a follow-up continues; bounded in count and age."""

    def __init__(self, size: int, ttl_s: float) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def put(self, rid: str, entry: dict[str, Any]) -> None:
        if self.size <= 0:
            return
        self._entries[rid] = {**entry, "expires": time.monotonic() + self.ttl_s}
        self._entries.move_to_end(rid)
        while len(self._entries) > self.size:
            _, old = self._entries.popitem(last=False)
            if old.get("task") is not None:
                old["task"].cancel()

    def get(self, rid: str) -> dict[str, Any]:
        entry = self._entries.get(rid)
        if entry is not None and entry["expires"] < time.monotonic() and entry.get("task") is None:
            del self._entries[rid]
            entry = None
        if entry is None:
            raise ApiError(404, f"Response with id {rid!r} not found.", "invalid_request_error")
        return entry

    def pop(self, rid: str) -> dict[str, Any]:
        entry = self.get(rid)
        del self._entries[rid]
        return entry


def response_object(rid: str, req: ResponsesRequest, created: int, status: str, output: list[dict],
                    usage: dict | None = None, incomplete: str | None = None, error: dict | None = None) -> dict:
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": req.model,
            "output": output, "usage": usage, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "top_p": req.top_p if req.top_p is not None else 1.0, "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}}, "store": req.store,
            "background": req.background, "metadata": req.metadata or {}, "user": req.user,
            "truncation": req.truncation or "disabled"}


def usage_of(chat_usage: dict | None) -> dict | None:
    if not chat_usage:
        return None
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def output_items(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """A chat answer's message as Responses output items."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append({"type": "reasoning", "id": new_id("rs"), "summary": [], "status": status,
                      "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    if message.get("content"):
        items.append({"type": "message", "id": new_id("msg"), "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": message["content"], "annotations": [],
                                   "logprobs": []}]})
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "status": status,
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    return items


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's own input as Responses items with ids (GET /v1/responses/{id}/input_items), oldest first."""
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value
    out = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            out.append({"type": "message", "id": new_id("msg"), "role": item.get("role"), "status": "completed",
                        "content": [{"type": part, "text": content}] if isinstance(content, str) else content})
        else:
            out.append({**item, "id": item.get("id") or new_id("fc" if kind == "function_call" else "fco"),
                        "status": "completed"})
    return out


def history_of(chat: ChatCompletionRequest, output: list[dict[str, Any]], instructions: bool) -> list[dict]:
    """The conversation a follow-up continues: this request's messages (without its instructions) and its output."""
    messages = [m.model_dump(exclude_none=True) for m in chat.messages][1 if instructions else 0:]
    reply: dict[str, Any] = {"role": "assistant", "content": None}
    for item in output:
        if item["type"] == "message":
            reply["content"] = item["content"][0]["text"]
        elif item["type"] == "function_call":
            reply.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
    return messages + ([reply] if reply["content"] is not None or reply.get("tool_calls") else [])


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode("utf-8")


def install_responses(app, settings, chat_plan, chat_whole, chat_streamed, dict_events) -> None:
    """The /v1/responses routes over the chat path's ``chat_whole(chat, request)`` (a chat completion body) and
    ``chat_streamed(chat)`` (first chunk, chunks, make_event) with ``dict_events`` (the chat chunks);
    ``chat_plan(chat)`` checks a chat request (model, template, options) without running it."""
    store = ResponseStore(settings.responses_store_size, settings.responses_ttl_s)
    app.state.responses = store

    def begin(req: ResponsesRequest) -> ChatCompletionRequest:
        req.check_supported()
        history: list[dict] = []
        if req.previous_response_id:
            try:
                prev = store.get(req.previous_response_id)
            except ApiError as e:
                raise ApiError(404, f"previous_response_id: {e.message}", e.type, "previous_response_id") from None
            if prev["response"]["status"] not in ("completed", "incomplete"):
                raise ApiError(400, f"previous_response_id: response {req.previous_response_id!r} is "
                                    f"{prev['response']['status']}", param="previous_response_id")
            history = prev["history"]
        return chat_request(req, history)

    def answered(rid: str, req: ResponsesRequest, created: int, body: dict) -> dict:
        choice = body["choices"][0]
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        return response_object(rid, req, created, status, output_items(choice["message"], status),
                               usage_of(body.get("usage")), "max_output_tokens" if status == "incomplete" else None)

    def keep(rid: str, req: ResponsesRequest, chat: ChatCompletionRequest, resp: dict, task=None) -> None:
        if req.store:
            store.put(rid, {"response": resp, "task": task, "input_items": input_items(req.input),
                            "history": history_of(chat, resp["output"], bool(req.instructions))})

    def failure(e: ApiError) -> dict:
        return {"code": e.code or e.type, "message": e.message}

    @app.post("/v1/responses")
    async def create_response(req: ResponsesRequest, request: Request):
        chat = begin(req)
        rid, created = new_id("resp"), int(time.time())
        if req.background:
            chat_plan(chat)  # a refusal is the client's answer now, not a failed background response

            async def run() -> None:
                try:
                    resp = answered(rid, req, created, await chat_whole(chat, None))
                except ApiError as e:
                    resp = response_object(rid, req, created, "failed", [], error=failure(e))
                except Exception as e:  # ours: the response must not stay in_progress forever
                    resp = response_object(rid, req, created, "failed", [],
                                           error={"code": "server_error", "message": f"{type(e).__name__}: {e}"})
                keep(rid, req, chat, resp)

            pending = response_object(rid, req, created, "in_progress", [])
            keep(rid, req, chat, pending, asyncio.create_task(run()))
            return pending
        if not req.stream:
            resp = answered(rid, req, created, await chat_whole(chat, request))
            keep(rid, req, chat, resp)
            return resp
        first, chunks, make_event = await chat_streamed(chat)
        events = ResponseEvents(lambda status, output, usage: response_object(
            rid, req, created, status, output, usage_of(usage),
            "max_output_tokens" if status == "incomplete" else None))

        async def stream():
            for event in events.start():
                yield _sse(event)
            try:
                async for chunk in dict_events(first, chunks, make_event):
                    for event in events.on_chat(chunk):
                        yield _sse(event)
            except ApiError as e:
                for event in events.failed(failure(e)):
                    yield _sse(event)
                return
            for event in events.finish():
                yield _sse(event)
                if "response" in event and event["response"]["status"] in ("completed", "incomplete"):
                    keep(rid, req, chat, event["response"])

        return CancellingStream(stream(), media_type="text/event-stream")

    @app.get("/v1/responses/{rid}")
    async def retrieve_response(rid: str):
        return store.get(rid)["response"]

    @app.get("/v1/responses/{rid}/input_items")
    async def list_input_items(rid: str, limit: int = Query(20, ge=1, le=100),
                               order: Literal["asc", "desc"] = "desc", after: str | None = None):
        items = store.get(rid)["input_items"]
        items = items[::-1] if order == "desc" else items
        start = 0
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise ApiError(400, f"after: no input item {after!r} in response {rid!r}", param="after")
            start = ids.index(after) + 1
        page = items[start:start + limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(items)}

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str):
        entry = store.pop(rid)
        if entry.get("task") is not None:
            entry["task"].cancel()
        return {"id": rid, "object": "response", "deleted": True}

    @app.post("/v1/responses/{rid}/cancel")
    async def cancel_response(rid: str):
        entry = store.get(rid)
        resp = entry["response"]
        if not resp["background"]:
            raise ApiError(400, "Only responses created with background: true can be cancelled.")
        task = entry.get("task")
        if task is not None and not task.done():
            task.cancel()  # its Triton request is cancelled with it
            entry["task"], entry["response"] = None, {**resp, "status": "cancelled"}
        elif resp["status"] != "cancelled":
            raise ApiError(400, f"Cannot cancel a response that is {resp['status']}.")
        return entry["response"]
