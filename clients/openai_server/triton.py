"""Async gRPC access to Triton's text models for the OpenAI front end: one bidirectional stream per request.

Invariants:
- ``generate`` yields ``Chunk``s until Triton's final flag (requested with
  ``triton_enable_empty_final_response``), then returns; closing the generator early (the HTTP client went
  away) cancels the gRPC call, which cancels the request inside Triton.
- Every failure surfaces as ``ApiError`` with an HTTP status. Our models (tensorrt_llm, the BLS) answer this
  server's requests' failures as data (request parameter ``errors_as_data``, outputs ``error_code`` /
  ``error_message``: tritonllm.errors), so the status comes from the code (``errors.HTTP_STATUS``: INVALID_ARG
  400, UNAVAILABLE 503, INTERNAL 500, ...). Errors Triton itself raises inside a gRPC stream carry only its
  message (no status code): its wording for UNAVAILABLE (shutting down, model not ready) -> 503, unknown model
  -> 404, "internal error" -> 500, anything else -> 400 (``status_for``). Transport errors keep their gRPC
  status (UNAVAILABLE -> 503, DEADLINE_EXCEEDED -> 504).
- The Triton model is resolved once per ``MODEL_CHECK_S``: the configured one when ready, else the
  fallback when ready, else 503.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from contextlib import aclosing
from typing import Any, AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from clients.openai_server.direct import Knobs, TextSteps, chunks_of, grpc_request, parameters
from clients.openai_server.protocol import ApiError
from clients.triton_llm import C, Chunk, GenerationParams, chunk_from, grpc_inputs
from tritonllm.errors import ERROR_OUTPUTS, ERRORS_AS_DATA, HTTP_STATUS, error_of
from tritonllm.text.bls_stream import client_message

BLS = C.BLS
BLS_ONLY = tuple(t.name for t in C.BLS_INPUTS if not t.nvidia)  # not NVIDIA's ensemble's

MODEL_CHECK_S = 5.0

_UNAVAILABLE = re.compile(r"queue size|queue limit|queue is full|shutting down|unavailable|not ready|overloaded", re.I)
_NOT_FOUND = re.compile(r"unknown model|model .* (is not found|not found)|failed to find model", re.I)
_INTERNAL = re.compile(r"internal error", re.I)
_GRPC_HTTP = {"UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "INVALID_ARGUMENT": 400,
              "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "UNIMPLEMENTED": 501}


def status_for(message: str, grpc_status: str | None = None) -> int:
    """HTTP status for a Triton error (see the module docstring for the rules)."""
    if grpc_status:
        code = grpc_status.rsplit(".", 1)[-1]
        if code in _GRPC_HTTP:
            return _GRPC_HTTP[code]
    if _UNAVAILABLE.search(message):
        return 503
    if _NOT_FOUND.search(message):
        return 404
    if _INTERNAL.search(message):
        return 500
    return 400


def api_error(message: str, grpc_status: str | None = None) -> ApiError:
    return error_with(status_for(message, grpc_status), message)


def error_with(status: int, message: str) -> ApiError:
    kind = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable",
            504: "timeout"}.get(status, "server_error")
    return ApiError(status, message, kind)


def raise_failure(get) -> None:
    """Raise the ApiError of a response that carries a failure as data (``get(name)``: an output or None)."""
    found = error_of(get)
    if found is not None:
        message, code = found
        raise error_with(HTTP_STATUS.get(code, 500), client_message(message))


def unreachable_message(url: str) -> str:
    return (f"cannot reach Triton at {url} (gRPC): start it with `make serve`, or point this server at its gRPC "
            f"port (make openai GRPC_PORT=..., --triton-url host:port)")


class TritonText:
    """A text model behind Triton's gRPC endpoint: ``tensorrt_llm`` with the BLS's text steps run here
    (``direct.TextSteps``: needs the tokenizer), or ``tensorrt_llm_bls`` / ``ensemble`` doing them in Triton."""

    def __init__(self, url: str, model: str = C.TENSORRT_LLM, fallback: str | None = BLS,
                 tokenizer: Any | None = None, tokenizer_dir: str | None = None):
        """``tokenizer`` (loaded from ``tokenizer_dir``; None: no direct path) serves the text steps."""
        self.url, self.model, self.fallback = url, model, fallback
        self.tokenizer, self.tokenizer_dir = tokenizer, tokenizer_dir
        self._client: grpcaio.InferenceServerClient | None = None
        self._resolved: tuple[float, str] | None = None
        self._steps: TextSteps | None = None
        self._steps_lock = asyncio.Lock()
        self._ids = itertools.count()

    @property
    def client(self) -> grpcaio.InferenceServerClient:
        if self._client is None:  # created inside the running event loop (grpc.aio binds to it)
            self._client = grpcaio.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _ready(self, name: str) -> bool:
        try:
            return bool(await self.client.is_model_ready(name))
        except (InferenceServerException, grpc.RpcError):
            return False

    async def resolve(self) -> str:
        """The Triton model to send requests to (cached for MODEL_CHECK_S)."""
        now = time.monotonic()
        if self._resolved and now - self._resolved[0] < MODEL_CHECK_S:
            return self._resolved[1]
        for name in (self.model, self.fallback):
            if name == C.TENSORRT_LLM and self.tokenizer is None:
                continue  # the text steps need the tokenizer here
            if name and await self._ready(name):
                self._resolved = (now, name)
                return name
        self._resolved = None
        if not await self._live():
            raise ApiError(503, unreachable_message(self.url), "service_unavailable")
        wanted = self.model + (f" or {self.fallback}" if self.fallback else "")
        raise ApiError(503, f"Triton at {self.url} has no ready model {wanted}", "service_unavailable")

    async def _live(self) -> bool:
        try:
            return bool(await self.client.is_server_live())
        except (InferenceServerException, grpc.RpcError):
            return False

    async def ready_models(self, names: tuple[str, ...]) -> list[str]:
        return [n for n in names if await self._ready(n)]

    async def _text_steps(self) -> TextSteps:
        """Made at the first request (the knobs are the served configs'), off the event loop: a tokenizer's
        vocabulary scan takes tens of milliseconds that no other request should wait for."""
        async with self._steps_lock:
            if self._steps is None:
                async def params(name: str) -> dict[str, str]:
                    try:
                        return parameters(await self.client.get_model_config(name, as_json=True))
                    except InferenceServerException:  # not served: the model's defaults
                        return {}

                knobs = Knobs.from_configs(await params(C.PREPROCESSING), await params(BLS))
                self._steps = await asyncio.to_thread(TextSteps, self.tokenizer, self.tokenizer_dir, knobs)
        return self._steps

    async def generate(self, prompt: str, params: GenerationParams, stream: bool,
                       model: str | None = None, timeout_us: int | None = None) -> AsyncIterator[Chunk]:
        """``timeout_us``: Triton's request timeout, which the engine takes as the request's allotted time."""
        model = model or await self.resolve()
        if model == C.TENSORRT_LLM:
            async with aclosing(self._generate_direct(prompt, params, stream, timeout_us)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        inputs, outputs = grpc_inputs(params, prompt, stream, model)
        sent = {i.name() for i in inputs}
        ours = [name for name in BLS_ONLY if name in sent]
        if ours and model != BLS:
            raise ApiError(400, f"{', '.join(ours)}: served by {BLS} only, not by {model}",
                           param=ours[0])
        request = {"model_name": model, "inputs": inputs, "outputs": outputs,
                   "parameters": {"triton_enable_empty_final_response": True}}
        if model == BLS:  # ours: failures as data (the ensemble has no such outputs)
            request["outputs"] = [*outputs, *(grpcaio.InferRequestedOutput(n) for n in ERROR_OUTPUTS)]
            request["parameters"][ERRORS_AS_DATA] = True
        if timeout_us:
            request["timeout"] = timeout_us
        async with aclosing(self._stream(request)) as responses:
            async for result, _ in responses:
                yield chunk_from(result.as_numpy)

    async def _stream(self, request: dict[str, Any], message=lambda text: text) -> AsyncIterator[tuple[Any, set]]:
        """(result, its output names) of each data response of one request on its own gRPC stream, until Triton's
        final flag. Failures (as data, Triton errors, transport errors) raise ApiError, the text through
        ``message``. Closed before the final flag (the caller is done, or its client left), the call is cancelled,
        which cancels the request inside Triton."""
        async def requests():
            yield request

        try:
            call = self.client.stream_infer(requests())
        except InferenceServerException as e:
            raise api_error(message(e.message()), e.status()) from None
        finished = False
        try:
            async for result, error in call:
                if error is not None:
                    raise api_error(message(error.message()), error.status())
                response = result.get_response()
                if response.outputs:
                    got = {o.name for o in response.outputs}
                    raise_failure(lambda name: result.as_numpy(name) if name in got else None)
                    yield result, got
                if response.parameters["triton_final_response"].bool_param:
                    finished = True
                    return
        except grpc.RpcError as e:
            raise api_error(e.details() or str(e), str(e.code())) from None
        finally:
            if not finished:
                call.cancel()

    async def embed(self, ids: list[int], pooling: str, lora_task_id: int | None = None,
                    lora_path: str | None = None) -> list[float]:
        """One prompt's pooled final hidden states from ``tensorrt_llm`` (its ``pooling`` input, ``embedding``
        output: prefill only, batched with generation in the engine)."""
        if not await self._ready(C.TENSORRT_LLM):
            raise ApiError(503, f"embeddings need Triton's {C.TENSORRT_LLM} model, which is not ready at {self.url}",
                           "service_unavailable")
        inputs = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
                  "request_output_len": np.array([[1]], np.int32), "streaming": np.array([[False]]),
                  "pooling": np.array([[pooling.encode()]], dtype=object)}
        if lora_task_id is not None:
            inputs["lora_task_id"] = np.array([[lora_task_id]], np.uint64)
        if lora_path is not None:
            inputs["lora_path"] = np.array([[lora_path.encode()]], dtype=object)
        request = grpc_request(inputs, [C.EMBEDDING_OUTPUT.name, *ERROR_OUTPUTS],
                               f"emb-{os.getpid()}-{next(self._ids)}", None)
        vector = None
        async with aclosing(self._stream(request)) as responses:
            async for result, got in responses:
                if C.EMBEDDING_OUTPUT.name in got:
                    vector = result.as_numpy(C.EMBEDDING_OUTPUT.name).reshape(-1).tolist()
        if vector is None:
            raise ApiError(500, f"{C.TENSORRT_LLM} answered without an embedding", "server_error")
        return vector

    async def _generate_direct(self, prompt: str, params: GenerationParams, stream: bool,
                               timeout_us: int | None) -> AsyncIterator[Chunk]:
        """The BLS's text steps here, tensorrt_llm in Triton (direct.py); the call is cancelled as soon as every
        sequence completed a stop string, or when the caller closes this generator."""
        steps = await self._text_steps()
        inputs, outputs, seqs = steps.request(params, prompt, stream)
        request = grpc_request(inputs, outputs, f"oai-{os.getpid()}-{next(self._ids)}", timeout_us)
        async with aclosing(self._stream(request, client_message)) as responses:
            async for result, got in responses:
                for chunk in chunks_of(seqs, {n: result.as_numpy(n) for n in outputs if n in got}):
                    yield chunk
                if seqs.done:  # every sequence completed a stop string: the engine request can go (cancelled)
                    return
        for chunk in seqs.finish_all():
            if not chunk.empty:
                yield chunk_from(chunk.arrays().get)
