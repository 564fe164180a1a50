"""The FastAPI application: /v1/models, /v1/completions, /v1/chat/completions (plain JSON or SSE), /v1/responses
(responses_api.py, over the chat path), /v1/embeddings (embeddings.py), /health, /health_generate.

Invariants:
- A streamed response starts only after the first chunk arrived, so an error Triton reports before any
  output (bad argument, unsupported guided decoding, queue full) is an HTTP status with OpenAI's error
  JSON, streaming or not. An error after the stream began is sent as one ``data: {"error": ...}`` event
  and the stream ends without ``[DONE]``.
- Every successful stream ends with ``data: [DONE]``; with ``stream_options.include_usage`` the last
  chunk before it has empty ``choices`` and the usage.
- The request's ``model`` is the served name (-> the configured Triton model, with fallback), a LoRA
  module name (the same, with its ``lora_task_id``), or the name of a Triton text model
  (``tensorrt_llm_bls`` / ``ensemble``) to address it directly; anything else 404.
- Request validation errors are 400 (OpenAI's status), not FastAPI's 422.
- With an API key set, every ``/v1`` route needs ``Authorization: Bearer <key>`` (compared in constant time)
  and answers 401 with OpenAI's error body (code ``invalid_api_key``) otherwise, as vLLM does; the health
  routes stay open for probes. The key is never logged or echoed.
- A client that disconnects cancels its generation, streamed or not (limits.py); bodies are bounded in size and in
  the time they take to arrive (413 / 408).
- ``/health`` says the server and its Triton model are up; ``/health_generate`` (trtllm-serve's idea)
  generates one token through Triton and the engine: 200, or 503 with the reason.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from clients.openai_server.protocol import ApiError, ChatCompletionRequest, CompletionRequest
from clients.openai_server.responses import (Outcome, TextTools, chat_body, chat_logprobs, choices_usage,
                                             completion_body, completion_logprobs, new_id, sum_usage)
from clients.openai_server.chat_answer import ChatAnswer
from clients.openai_server.limits import ApiKey, BodyLimits, CancellingStream, ClientGone, unless_disconnected
from clients.openai_server.tool_calls import PARSERS as TOOL_PARSERS, json_array, named
from clients.openai_server.embeddings import install_embeddings
from clients.openai_server.lora_routes import install_lora_routes
from clients.openai_server.responses_api import install_responses
from clients.openai_server.triton import TritonText
from clients.triton_llm import TEXT_MODELS, Chunk, GenerationParams, OutOfRange


log = logging.getLogger("openai_server")


@dataclass
class Settings:
    triton_url: str = "localhost:8001"
    model: str = "tensorrt_llm"        # the BLS's text steps run here (direct.py), tensorrt_llm in Triton
    fallback: str | None = "tensorrt_llm_bls"
    tokenizer_dir: str | None = None
    served_model_name: str = "tritonllm"
    default_max_tokens: int = 256  # chat requests without max_tokens
    lora_modules: dict[str, int] = field(default_factory=dict)  # model name -> lora_task_id (vLLM's idea)
    lora_paths: dict[str, str] = field(default_factory=dict)  # names loaded at run time -> lora_path (lora_routes)
    enable_lora_loading: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    api_key: str | None = None  # required as a Bearer token on /v1 routes when set
    health_generate_timeout_s: float = 30.0
    tool_call_parser: str | None = None  # tool_calls.PARSERS: tool_choice "auto" needs one
    reasoning_parser: str | None = None  # reasoning.PARSERS: reasoning_content split off
    max_request_bytes: int = 16 * 1024 * 1024  # larger bodies: 413 (limits.BodyLimits)
    request_body_timeout_s: float = 30.0       # a body that stops arriving this long: 408
    responses_store_size: int = 1000           # /v1/responses kept for retrieval / previous_response_id
    responses_ttl_s: float = 3600.0


def sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode("utf-8")


def sequence_of(chunk: Chunk, n: int) -> int:
    """The choice a chunk belongs to (its sequence_index; 0 when the model sent none)."""
    if not 0 <= chunk.sequence_index < n:  # merging it into another choice would hide the fault
        raise ApiError(502, f"Triton sent sequence_index {chunk.sequence_index} for {n} sequences", "server_error")
    return chunk.sequence_index


async def _first(chunks: AsyncIterator[Chunk]) -> Chunk | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


async def dict_events(first: Chunk | None, chunks: AsyncIterator[Chunk], make_event) -> AsyncIterator[dict]:
    """``make_event(chunk)``'s events for every chunk, then ``make_event(None)``'s (the closing ones)."""
    try:
        if first is not None:
            for event in make_event(first):
                yield event
            async for chunk in chunks:
                for event in make_event(chunk):
                    yield event
        for event in make_event(None):
            yield event
    finally:
        await chunks.aclose()  # cancels the Triton request when the client went away


def create_app(settings: Settings) -> FastAPI:
    tools = TextTools.from_dir(settings.tokenizer_dir)
    triton = TritonText(settings.triton_url, settings.model, settings.fallback, tools.tokenizer, settings.tokenizer_dir)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await triton.close()

    app = FastAPI(title="tritonllm OpenAI-compatible API", lifespan=lifespan)
    app.state.settings, app.state.triton, app.state.tools = settings, triton, tools
    app.add_middleware(BodyLimits, max_bytes=settings.max_request_bytes, timeout_s=settings.request_body_timeout_s)
    app.add_middleware(ApiKey, key=settings.api_key)  # outermost: no body is read for a client without the key

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        if err.get("type") == "json_invalid":  # loc is ("body", character offset): not a field
            message = f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))} " \
                      f"(at character {err.get('loc', ('', '?'))[-1]})"
            return JSONResponse(ApiError(400, message).body(), status_code=400)
        param = ".".join(str(p) for p in err.get("loc", ())[1:]) or None
        return JSONResponse(ApiError(400, f"{param}: {err.get('msg', 'invalid request')}", param=param).body(),
                            status_code=400)

    @app.exception_handler(ClientGone)
    async def _client_gone(_req: Request, _e: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody is there to read it

    @app.exception_handler(OutOfRange)
    async def _out_of_range(_req: Request, e: OutOfRange):
        """A value that passed the schema but not the tensor it travels in (the schema's bounds come from the same
        contract: this is the last guard, for options set by the server itself)."""
        param = {"logit_bias_ids": "logit_bias"}.get(e.name, e.name)
        return JSONResponse(ApiError(400, str(e), param=param).body(), status_code=400)

    def triton_model(name: str) -> str | None:
        """None = the configured model (resolved with fallback); else a Triton text model named directly."""
        if name == settings.served_model_name or name in settings.lora_modules:
            return None
        if name in TEXT_MODELS:
            return name
        raise ApiError(404, f"The model `{name}` does not exist", "invalid_request_error", "model",
                       "model_not_found")

    async def start(prompt: str, params: GenerationParams, stream: bool, model: str | None,
                    timeout_us: int | None = None):
        chunks = triton.generate(prompt, params, stream, model, timeout_us)
        return chunks, await _first(chunks)

    async def run_to_end(prompt: str, params: GenerationParams, model: str | None,
                         timeout_us: int | None = None) -> list[Outcome]:
        """One Outcome per sequence (``n``), by the chunks' sequence_index."""
        outcomes = [Outcome() for _ in range(params.num_return_sequences or 1)]
        async for chunk in triton.generate(prompt, params, False, model, timeout_us):
            outcomes[sequence_of(chunk, len(outcomes))].add(chunk)
        return outcomes

    async def stream_events(first: Chunk | None, chunks: AsyncIterator[Chunk], make_event) -> AsyncIterator[bytes]:
        """SSE of ``make_event(chunk)`` for every chunk, then ``make_event(None)`` (the closing events)."""
        try:
            async for event in dict_events(first, chunks, make_event):
                yield sse(event)
            yield sse("[DONE]")
        except ApiError as e:
            yield sse(e.body())

    @app.get("/health")
    async def health():
        return {"status": "ok", "triton_model": await triton.resolve()}

    probe = {"lock": asyncio.Lock(), "at": 0.0, "answer": None}

    @app.get("/health_generate")
    async def health_generate():
        """Open for probes, so one generation at a time and its answer reused for a second: callers cannot
        load the engine through it. Details of a failure go to the log, not to the unauthenticated caller."""
        async with probe["lock"]:
            if probe["answer"] is None or time.monotonic() - probe["at"] > 1.0:
                probe["answer"], probe["at"] = await _generate_one(), time.monotonic()
            status, body = probe["answer"]
        return JSONResponse(body, status_code=status)

    async def _generate_one() -> tuple[int, dict]:
        try:
            (outcome,) = await asyncio.wait_for(run_to_end("Hello", GenerationParams(max_tokens=1), None),
                                                settings.health_generate_timeout_s)
            return 200, {"status": "ok", "triton_model": await triton.resolve(),
                         "completion_tokens": outcome.completion_tokens}
        except asyncio.TimeoutError:
            reason = f"no token in {settings.health_generate_timeout_s} s"
        except Exception as e:  # Triton or the engine down, model not ready: what a probe needs to see
            log.warning("health_generate: %s", e)
            reason = f"generation failed ({type(e).__name__})"
        return 503, {"status": "error", "error": reason}

    @app.get("/v1/models")
    async def models():
        created = int(time.time())
        names = [settings.served_model_name] + await triton.ready_models(TEXT_MODELS)
        data = [{"id": n, "object": "model", "created": created, "owned_by": "tritonllm"} for n in names]
        data += [{"id": n, "object": "model", "created": created, "owned_by": "tritonllm",
                  "parent": settings.served_model_name, **({"root": settings.lora_paths[n]}
                                                           if n in settings.lora_paths else {})}
                 for n in settings.lora_modules]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        model, prompts, n = triton_model(req.model), req.prompts(), req.n
        max_tokens = req.max_tokens or 16
        params = req.generation_params(max_tokens, req.logprobs is not None, req.extra_guide(), req.logprobs or 0)
        params.lora_task_id, params.lora_path = settings.lora_modules.get(req.model), settings.lora_paths.get(req.model)
        rid = new_id("cmpl")
        if not req.stream:
            results = await unless_disconnected(request, asyncio.gather(
                *(run_to_end(p, params, model, req.timeout_us()) for p in prompts)))
            choices = []
            for i, (prompt, outcomes) in enumerate(zip(prompts, results)):
                head = prompt if req.echo else ""
                for j, o in enumerate(outcomes):  # OpenAI's order: prompt by prompt, n choices each
                    lp = (completion_logprobs(tools, o.text, o.log_probs, len(head), o.top, o.token_ids)
                          if req.logprobs is not None else None)
                    choices.append({"index": i * n + j, "text": head + o.text, "logprobs": lp,
                                    "finish_reason": o.finish_reason(max_tokens)})
            usage = sum_usage([choices_usage(tools, p, outs) for p, outs in zip(prompts, results)])
            return completion_body(rid, req.model, choices, usage)

        prompt, outcomes = prompts[0], [Outcome() for _ in range(n)]
        chunks, first = await start(prompt, params, True, model, req.timeout_us())
        usage_field = {"usage": None} if req.include_usage() else {}
        echo = [req.echo] * n

        def body(index: int, text: str, logprobs, finish: str | None) -> dict:
            return {**completion_body(rid, req.model, [{"index": index, "text": text, "logprobs": logprobs,
                                                         "finish_reason": finish}], None), **usage_field}

        def events(chunk: Chunk | None):
            if chunk is None:
                for j, o in enumerate(outcomes):
                    yield body(j, "", None, o.finish_reason(max_tokens))
                if req.include_usage():
                    yield completion_body(rid, req.model, [], choices_usage(tools, prompt, outcomes))
                return
            j = sequence_of(chunk, n)
            outcomes[j].add(chunk)
            head = prompt if echo[j] else ""
            echo[j] = False
            lp = (completion_logprobs(tools, chunk.text, chunk.log_probs or [], top=chunk.top_log_probs,
                                      ids=chunk.token_ids)
                  if req.logprobs is not None else None)
            if chunk.text or head or (lp and lp["tokens"]):  # tokens past a stop string's cut keep their log probs
                yield body(j, head + chunk.text, lp, None)

        return CancellingStream(stream_events(first, chunks, events), media_type="text/event-stream")

    def tool_mode(req: ChatCompletionRequest) -> str | tuple[str, str] | None:
        """The request's tool mode (``ChatCompletionRequest.tool_mode``), refused when this server cannot
        serve it."""
        mode = req.tool_mode()
        if mode == "auto" and not settings.tool_call_parser:
            raise ApiError(400, '"auto" tool choice needs a tool-call parser: start the server with '
                                f"--tool-call-parser ({', '.join(TOOL_PARSERS)})", param="tool_choice")
        return mode

    def new_answer(mode) -> ChatAnswer:
        if mode in (None, "none"):
            return ChatAnswer(settings.reasoning_parser, None)
        if mode == "auto":
            return ChatAnswer(settings.reasoning_parser, TOOL_PARSERS[settings.tool_call_parser])
        return ChatAnswer(None, json_array if mode == "required" else named(mode[1]), guided=True)  # no reasoning

    def chat_finish(mode, called: bool, reason: str) -> str:
        # OpenAI answers a named tool_choice with "stop", a call the model chose with "tool_calls"
        return "tool_calls" if called and reason != "length" and mode in ("auto", "required") else reason

    def chat_plan(req: ChatCompletionRequest):
        """(Triton model, tool mode, prompt, max_tokens, params) of a chat request, or ApiError."""
        req.check_supported()
        model, mode = triton_model(req.model), tool_mode(req)
        # tool_choice "none": the tools are not shown to the model, which then cannot call them
        prompt = tools.chat_prompt(req.chat_messages(), req.tool_dicts() if mode not in (None, "none") else None)
        max_tokens = req.max_new_tokens() or settings.default_max_tokens
        params = req.generation_params(max_tokens, req.logprobs, req.guide(mode), req.top_logprobs_count())
        params.lora_task_id, params.lora_path = settings.lora_modules.get(req.model), settings.lora_paths.get(req.model)
        return model, mode, prompt, max_tokens, params

    async def chat_whole(req: ChatCompletionRequest, request: Request | None) -> dict:
        """The chat completion body of a non-streamed request (``request``: cancelled if its client leaves)."""
        model, mode, prompt, max_tokens, params = chat_plan(req)
        work = run_to_end(prompt, params, model, req.timeout_us())
        outcomes = await (unless_disconnected(request, work) if request is not None else work)
        choices = []
        for j, o in enumerate(outcomes):
            reason = o.finish_reason(max_tokens)
            message = new_answer(mode).message(o.text, cut=reason == "length")
            choices.append({"index": j, "message": message,
                            "logprobs": (chat_logprobs(tools, o.text, o.log_probs, o.top, o.token_ids)
                                         if req.logprobs else None),
                            "finish_reason": chat_finish(mode, bool(message.get("tool_calls")), reason)})
        return chat_body(new_id("chatcmpl"), req.model, choices, choices_usage(tools, prompt, outcomes))

    async def chat_streamed(req: ChatCompletionRequest):
        """(first chunk, chunks, make_event) of a streamed request: ``stream_events`` turns them into chat chunks.
        An error before the first chunk raises here (an HTTP status, not an event)."""
        model, mode, prompt, max_tokens, params = chat_plan(req)
        n, rid = req.n, new_id("chatcmpl")
        outcomes, answers = [Outcome() for _ in range(n)], [new_answer(mode) for _ in range(n)]
        chunks, first = await start(prompt, params, True, model, req.timeout_us())
        usage_field = {"usage": None} if req.include_usage() else {}
        role_sent, pending_lp = [False] * n, [[] for _ in range(n)]

        def choice(j: int, delta: dict, finish: str | None = None, logprobs=None) -> dict:
            return {**chat_body(rid, req.model, [{"index": j, "delta": delta, "logprobs": logprobs,
                                                  "finish_reason": finish}], None, chunk=True), **usage_field}

        def deltas(j: int, text: str, final: bool):
            if not role_sent[j]:  # OpenAI's first chunk of a choice carries the role only
                role_sent[j] = True
                yield choice(j, {"role": "assistant", "content": ""})
            for delta in answers[j].deltas(text, final=final):
                # parsers may hold text back: log probs ride on the next delta sent
                lp = {"content": pending_lp[j][:]} if req.logprobs and pending_lp[j] else None
                pending_lp[j].clear()
                yield choice(j, delta, None, lp)

        def events(chunk: Chunk | None):
            if chunk is None:
                for j in range(n):
                    yield from deltas(j, "", True)
                    # log probs of tokens the parsers swallowed (tags) ride on the finish chunk
                    lp = {"content": pending_lp[j]} if req.logprobs and pending_lp[j] else None
                    yield choice(j, {}, chat_finish(mode, answers[j].called, outcomes[j].finish_reason(max_tokens)),
                                 lp)
                if req.include_usage():
                    yield chat_body(rid, req.model, [], choices_usage(tools, prompt, outcomes), chunk=True)
                return
            j = sequence_of(chunk, n)
            outcomes[j].add(chunk)
            if req.logprobs:
                pending_lp[j].extend(chat_logprobs(tools, chunk.text, chunk.log_probs or [],
                                                   chunk.top_log_probs, chunk.token_ids)["content"])
            yield from deltas(j, chunk.text, False)

        return first, chunks, events

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        if not req.stream:
            return await chat_whole(req, request)
        return CancellingStream(stream_events(*await chat_streamed(req)), media_type="text/event-stream")

    install_responses(app, settings, chat_plan, chat_whole, chat_streamed, dict_events)
    install_embeddings(app, settings, triton, tools, triton_model)
    if settings.enable_lora_loading:
        install_lora_routes(app, settings, triton)
    return app
