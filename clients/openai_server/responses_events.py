"""Chat completion stream chunks -> OpenAI Responses stream events (the order is in ``responses_api``'s
docstring). One instance per streamed response; not thread-safe."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from clients.openai_server.responses import new_id

_PART = {"message": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
         "reasoning": {"type": "reasoning_text", "text": ""}}
_TEXT_EVENT = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


class ResponseEvents:
    def __init__(self, finish: Callable[[str, list[dict], dict | None], dict]) -> None:
        """``finish(status, output, chat_usage)``: the Response object in a given state."""
        self._response = finish
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self.usage: dict | None = None
        self.finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1}

    def start(self) -> Iterator[dict]:
        yield self._event("response.created", response=self._response("in_progress", [], None))
        yield self._event("response.in_progress", response=self._response("in_progress", [], None))

    def on_chat(self, chunk: dict[str, Any]) -> Iterator[dict]:
        if not chunk.get("choices"):  # the usage chunk (stream_options.include_usage)
            self.usage = chunk.get("usage")
            return
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        for kind, key in (("reasoning", "reasoning_content"), ("message", "content")):
            if delta.get(key):
                yield from self._text(kind, delta[key])
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id"):  # a new call
                yield from self._close("completed")
                yield from self._add({"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                                      "name": fn.get("name", ""), "arguments": "", "status": "in_progress"})
            if fn.get("arguments") and self._open is not None:
                self._open["arguments"] += fn["arguments"]
                yield self._event("response.function_call_arguments.delta", **self._where(), delta=fn["arguments"])
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def finish(self) -> Iterator[dict]:
        """The closing events: the open item done, then response.completed / response.incomplete."""
        status = "incomplete" if self.finish_reason == "length" else "completed"
        yield from self._close(status)
        yield self._event(f"response.{status}", response=self._response(status, self.output, self.usage))

    def failed(self, error: dict[str, Any]) -> Iterator[dict]:
        yield self._event("response.failed", response={**self._response("failed", self.output, self.usage),
                                                       "error": error})

    def _text(self, kind: str, text: str) -> Iterator[dict]:
        if self._open is None or self._open["type"] != kind:
            yield from self._close("completed")
            item = {"type": kind, "id": new_id("msg" if kind == "message" else "rs"), "status": "in_progress",
                    "content": []}
            if kind == "message":
                item["role"] = "assistant"
            else:
                item["summary"] = []
            yield from self._add(item)
            part = dict(_PART[kind])
            item["content"].append(part)
            yield self._event("response.content_part.added", **self._where(), content_index=0, part=dict(part))
        self._open["content"][0]["text"] += text
        extra = {"logprobs": []} if kind == "message" else {}
        yield self._event(f"{_TEXT_EVENT[kind]}.delta", **self._where(), content_index=0, delta=text, **extra)

    def _add(self, item: dict[str, Any]) -> Iterator[dict]:
        self.output.append(item)
        self._open = item
        yield self._event("response.output_item.added", output_index=len(self.output) - 1,
                          item={**item, "content": []} if "content" in item else dict(item))

    def _close(self, status: str) -> Iterator[dict]:
        item = self._open
        if item is None:
            return
        if item["type"] == "function_call":
            yield self._event("response.function_call_arguments.done", **self._where(), arguments=item["arguments"])
        else:
            part = item["content"][0]
            extra = {"logprobs": []} if item["type"] == "message" else {}
            yield self._event(f"{_TEXT_EVENT[item['type']]}.done", **self._where(), content_index=0,
                              text=part["text"], **extra)
            yield self._event("response.content_part.done", **self._where(), content_index=0, part=part)
        item["status"] = status
        yield self._event("response.output_item.done", output_index=len(self.output) - 1, item=item)
        self._open = None
