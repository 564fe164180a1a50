"""OpenAI request schemas and their translation to the text models' sampling inputs.

Invariants:
- OpenAI semantics win over TensorRT-LLM defaults: TensorRT-LLM decodes greedily when neither top_k nor
  top_p is set, OpenAI samples the full distribution (temperature 1, top_p 1). So temperature and top_p
  are always sent; ``temperature == 0`` means greedy.
- Unsupported options are refused with a 400 (``ApiError``), never silently ignored: ``n > 1``,
  ``best_of > 1``, streaming several prompts, ``logit_bias``, token-id prompts.
- ``response_format`` json_schema / json_object become ``guided_decoding_guide_type`` json_schema / json
  (+ the schema as ``guided_decoding_guide``); the engine compiles the grammar, and one it cannot compile
  is its INVALID_ARG -> 400.
- Non-OpenAI sampling extras accepted in the body (``extra_body`` in the SDK): top_k, min_tokens,
  repetition_penalty.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clients.triton_llm import GenerationParams


class ApiError(Exception):
    """An error to answer as OpenAI's ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extras (vLLM-style), not part of OpenAI's API.
    top_k: int | None = Field(default=None, ge=0)
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def check_supported(self) -> None:
        if self.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", param="logit_bias")

    def generation_params(self, max_tokens: int, want_log_probs: bool,
                          guide: tuple[str, str] | None = None) -> GenerationParams:
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens,
            return_log_probs=True if want_log_probs else None,
            stop_words=self.stop_list(),
            guided_decoding_guide_type=guide[0] if guide else None,
            guided_decoding_guide=guide[1] if guide else None,
        )


class CompletionRequest(_Common):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ApiError(400, "prompt must be a string or a non-empty list of strings", param="prompt")
        if self.stream and len(prompts) > 1:
            raise ApiError(400, "streaming supports a single prompt", param="prompt")
        if self.best_of not in (None, 1):
            raise ApiError(400, "only best_of=1 is supported", param="best_of")
        if self.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        return prompts


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """Content as text; list content must be text parts only (this server serves a text model)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ApiError(400, f"content part of type {part.get('type')!r} is not supported", param="messages")
            parts.append(part.get("text", ""))
        return "".join(parts)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    def guide(self) -> tuple[str, str] | None:
        """(guided_decoding_guide_type, guided_decoding_guide), or None for plain text."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ("json", "")
        schema = (self.json_schema or {}).get("schema")
        if schema is None:
            raise ApiError(400, "response_format json_schema needs json_schema.schema", param="response_format")
        return ("json_schema", json.dumps(schema))


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        # "developer" is OpenAI's newer name for "system"; templates know "system".
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
