"""OpenAI request schemas and their translation to the text models' sampling inputs.

Invariants:
- OpenAI semantics win over TensorRT-LLM defaults: TensorRT-LLM decodes greedily when neither top_k nor
  top_p is set, OpenAI samples the full distribution (temperature 1, top_p 1). So temperature and top_p
  are always sent; ``temperature == 0`` means greedy.
- Unsupported options are refused with a 400 (``ApiError``), never silently ignored: ``best_of > 1``,
  streaming several prompts, token-id prompts, ``suffix``.
- ``n`` > 1 is NVIDIA's ``num_return_sequences`` (one Triton request; sequences told apart by
  ``sequence_index``); ``logit_bias`` goes by token id to the BLS (``logit_bias_ids`` / ``_weights``),
  ``top_logprobs`` / completions' ``logprobs`` count to its ``top_logprobs``.
- ``response_format`` json_schema / json_object become ``guided_decoding_guide_type`` json_schema / json
  (+ the schema as ``guided_decoding_guide``); the engine compiles the grammar, and one it cannot compile
  is its INVALID_ARG -> 400.
- Non-OpenAI extras accepted in the body (``extra_body`` in the SDK): top_k, min_tokens, ignore_eos (end_id -1),
  repetition_penalty, priority and allotted_time_ms (TensorRT-LLM's), guided_json / guided_regex /
  guided_choice / guided_grammar (vLLM's).
- Strict where Triton's own HTTP front is not: every integer is bounded by the tensor it travels in (the
  contract's dtype: max_tokens and token ids int32, seed uint64; ``integer_bounds``), so nothing wraps around;
  every string, key included, must be valid Unicode (a lone UTF-16 surrogate escape is refused naming the field);
  tool calls of assistant turns are typed. Each is a 400 naming the field, never a 500.
- ``response_format: json_object`` is JSON mode as OpenAI defines it: an object (the schema ``{"type":
  "object"}``), not any JSON value (TensorRT-LLM's ``json`` guide, which raw clients still get).
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from clients.triton_llm import C, GenerationParams, integer_bounds

INT32_MAX = integer_bounds("max_tokens")[1]      # max_tokens, top_k, min_tokens, token ids: int32 tensors
SEED_MAX = integer_bounds("seed")[1]             # uint64
TIMEOUT_MS_MAX = (2 ** 64 - 1) // 1000           # Triton's request timeout: uint64 microseconds


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


def _check_unicode(value: Any, path: str) -> None:
    """Raises a 400 naming the field when a string (or a key) of the request holds a lone UTF-16 surrogate, which
    JSON's \\ud800 escapes can carry but UTF-8 cannot."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(400, f"{path or 'body'}: not valid Unicode (a lone surrogate at character {e.start})",
                           param=path or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, path)
            _check_unicode(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{path}.{i}")


class UnicodeChecked(BaseModel):
    """A request body whose strings must encode as UTF-8 (400 naming the field otherwise)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        _check_unicode(data, "")
        return data


class _Common(UnicodeChecked):

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=C.MAX_RETURN_SEQUENCES)  # NVIDIA's num_return_sequences
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)  # the engine's uint64 seed
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extras (vLLM-style), not part of OpenAI's API.
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    ignore_eos: bool = False  # vLLM's: generate through the end-of-sequence token (end_id -1)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # TensorRT-LLM's request priority ([0, 1], higher admitted first; trtllm-serve's extra) and allotted
    # time (sent as Triton's request timeout; the request then ends with the text so far).
    priority: float | None = Field(default=None, ge=0.0, le=1.0)
    allotted_time_ms: int | None = Field(default=None, ge=1, le=TIMEOUT_MS_MAX)
    # vLLM's guided-decoding extras: the engine's guide types (json_schema, regex, choice as a regex, ebnf)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def extra_guide(self) -> tuple[str, str] | None:
        """(guided_decoding_guide_type, guide) from the guided_* extras (vLLM's; the engine's own conversion,
        which Dynamo's worker uses too); at most one may be given."""
        from tritonllm.guides import vllm_guide
        from tritonllm.errors import InvalidInput

        given = {k: getattr(self, f"guided_{k}") for k in ("json", "regex", "choice", "grammar")}
        try:
            return vllm_guide(**given)
        except InvalidInput as e:
            field = next((f"guided_{k}" for k, v in reversed(given.items()) if v is not None), None)
            raise ApiError(400, str(e), param=field) from None

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def token_bias(self) -> dict[int, float]:
        """``logit_bias`` as token id -> bias (OpenAI's: ids as strings, bias in [-100, 100])."""
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
            if not 0 <= token <= INT32_MAX or not -100.0 <= value <= 100.0:
                raise ApiError(400, f"logit_bias: token ids must be in [0, {INT32_MAX}] and biases in [-100, 100], "
                                    f"got {key}: {value}", param="logit_bias")
            out[token] = float(value)
        return out

    def generation_params(self, max_tokens: int, want_log_probs: bool,
                          guide: tuple[str, str] | None = None, top_logprobs: int = 0) -> GenerationParams:
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens,
            end_id=-1 if self.ignore_eos else None,
            return_log_probs=True if want_log_probs else None,
            stop_words=self.stop_list(),
            guided_decoding_guide_type=guide[0] if guide else None,
            guided_decoding_guide=guide[1] if guide else None,
            num_return_sequences=self.n if self.n > 1 else None,
            top_logprobs=top_logprobs or None, priority=self.priority, logit_bias=self.token_bias(),
        )

    def timeout_us(self) -> int | None:
        return self.allotted_time_ms * 1000 if self.allotted_time_ms else None


class CompletionRequest(_Common):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1, le=INT32_MAX)  # OpenAI's default for completions
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


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; an object is accepted as well


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None                 # a tool turn: which call it answers

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

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it: "developer" is OpenAI's newer "system"; tool-call
        arguments as objects (templates write them with ``tojson``), as transformers documents."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name:
            out["name"] = self.name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            calls = []
            for call in self.tool_calls:
                call = call.model_dump(exclude_none=True)
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        raise ApiError(400, "messages: tool_calls arguments must be JSON", param="messages") from None
                calls.append({**call, "function": fn})
            out["tool_calls"] = calls
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    def guide(self) -> tuple[str, str] | None:
        """(guided_decoding_guide_type, guided_decoding_guide), or None for plain text."""
        if self.type == "text":
            return None
        if self.type == "json_object":  # JSON mode: an object (TensorRT-LLM's "json" would allow any value)
            return ("json_schema", json.dumps({"type": "object"}))
        schema = (self.json_schema or {}).get("schema")
        if schema is None:
            raise ApiError(400, "response_format json_schema needs json_schema.schema", param="response_format")
        return ("json_schema", json.dumps(schema))


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # OpenAI fields this text server cannot honour: refused when given, not ignored
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    def check_supported(self) -> None:
        for name in ("audio", "prediction", "web_search_options"):
            if getattr(self, name) is not None:
                raise ApiError(400, f"{name} is not supported by this server", param=name)
        if self.modalities not in (None, ["text"]):
            raise ApiError(400, "only the text modality is supported", param="modalities")

    def top_logprobs_count(self) -> int:
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return self.top_logprobs or 0

    def chat_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_mode(self) -> str | tuple[str, str] | None:
        """None (no tools), "none", "auto", "required", or ("function", name) for the function the model
        must call (tagged: a function may itself be called "auto")."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none"):
                raise ApiError(400, "tool_choice needs tools", param="tool_choice")
            return None
        if choice is None:
            return "auto"
        if isinstance(choice, str):
            return choice
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not name:
            raise ApiError(400, 'tool_choice must be "none", "auto", "required" or '
                                '{"type": "function", "function": {"name": ...}}', param="tool_choice")
        if name not in {t.function.name for t in self.tools}:
            raise ApiError(400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return ("function", name)

    def guide(self, mode: str | None) -> tuple[str, str] | None:
        """The request's one guide: a forced tool_choice's, response_format's or a guided_* extra's."""
        guides = [(name, g) for name, g in (("tool_choice", self.tool_guide(mode)),
                                            ("response_format", self.response_format.guide()
                                             if self.response_format else None),
                                            ("guided_*", self.extra_guide())) if g is not None]
        if len(guides) > 1:
            raise ApiError(400, f"{guides[0][0]} and {guides[1][0]} both constrain the output: give one",
                           param=guides[1][0])
        return guides[0][1] if guides else None

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def tool_guide(self, mode: str | None) -> tuple[str, str] | None:
        """Guided decoding that makes ``required`` / a named tool_choice produce calls whose arguments
        parse against the function's schema: a JSON array of {"name", "parameters"} (vLLM's form), or the
        named function's arguments alone."""
        if mode in (None, "none", "auto"):
            return None
        schema = {t.function.name: t.function.parameters or {"type": "object"} for t in self.tools}
        if mode != "required":
            return ("json_schema", json.dumps(schema[mode[1]]))
        item = {"anyOf": [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                             "parameters": params},
                           "required": ["name", "parameters"], "additionalProperties": False}
                          for name, params in schema.items()]}
        array = {"type": "array", "items": item, "minItems": 1}
        if not self.parallel_tool_calls:
            array["maxItems"] = 1
        return ("json_schema", json.dumps(array))
