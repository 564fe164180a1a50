"""``/v1/embeddings`` from the served decoder model, with vLLM's semantics for a generative model used to embed.

Invariants:
- Each input (a string, a list of strings, a list of token ids, or a list of such lists) is one ``tensorrt_llm``
  request with ``pooling`` (engine/pooling.py): the prompt's final hidden states (after the last norm) pooled,
  ``last`` token (vLLM's default for decoder models) or ``mean``; prefill only, no KV kept afterwards, batched by
  the engine with whatever it is generating. Strings are tokenized here with the served tokenizer
  (``add_special_tokens``, default true, as vLLM's embeddings endpoint).
- ``normalize`` (default true: vLLM's default for embeddings) divides by the L2 norm. ``encoding_format``
  ``float`` or ``base64`` (little-endian float32, what the openai SDK asks for by default and decodes).
- ``dimensions`` is refused unless it equals the model's size: a decoder's hidden states are not trained for
  truncation (vLLM refuses it for models without matryoshka support).
- ``usage`` counts the prompt tokens of every input. Bad input is 400 naming ``input`` (or the field); inputs are
  sent ``MAX_IN_FLIGHT`` at a time so one large request cannot fill the engine's queue by itself.
"""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import Request
from pydantic import Field

from clients.openai_server.limits import unless_disconnected
from clients.openai_server.protocol import INT32_MAX, ApiError, UnicodeChecked

MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_IN_FLIGHT = 16


class EmbeddingRequest(UnicodeChecked):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # extras (vLLM's names)
    normalize: bool = True
    add_special_tokens: bool = True
    pooling: Literal["last", "mean"] = "last"  # ours: vLLM fixes the pooling type per model

    def prompts(self, tokenizer: Any) -> list[list[int]]:
        value = self.input
        items = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
        if not items:
            raise ApiError(400, "input is empty", param="input")
        if len(items) > MAX_INPUTS:
            raise ApiError(400, f"input has {len(items)} items, at most {MAX_INPUTS}", param="input")
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if tokenizer is None:
                    raise ApiError(400, "text input needs the server's tokenizer (--tokenizer-dir); send token ids",
                                   param="input")
                item = tokenizer(item, add_special_tokens=self.add_special_tokens).input_ids
            if not item:
                raise ApiError(400, f"input[{i}] is empty" if len(items) > 1 else "input is empty", param="input")
            if not all(0 <= t <= INT32_MAX for t in item):  # the vocabulary is checked by the engine
                raise ApiError(400, f"input[{i}]: token ids must be in [0, {INT32_MAX}]", param="input")
            out.append([int(t) for t in item])
        return out


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def install_embeddings(app, settings, triton, tools, triton_model) -> None:
    """The route; ``triton_model(name)`` resolves the request's model name (404 for an unknown one)."""

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request):
        if triton_model(req.model) is not None:  # the ensemble and the BLS have no pooling
            raise ApiError(400, f"{req.model} generates text only: embeddings come from {settings.served_model_name}",
                           param="model")
        prompts = req.prompts(tools.tokenizer)
        lora = settings.lora_modules.get(req.model), settings.lora_paths.get(req.model)
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(ids: list[int]) -> np.ndarray:
            async with gate:
                return np.asarray(await triton.embed(ids, req.pooling, *lora), dtype=np.float32)

        vectors = await unless_disconnected(request, asyncio.gather(*(one(p) for p in prompts)))
        size = vectors[0].size
        if req.dimensions is not None and req.dimensions != size:
            raise ApiError(400, f"dimensions {req.dimensions}: this model's embeddings have {size} dimensions and "
                                f"cannot be shortened (no matryoshka training)", param="dimensions")
        data = []
        for i, v in enumerate(vectors):
            if req.normalize:
                v = v / max(float(np.linalg.norm(v)), 1e-12)
            data.append({"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)})
        tokens = sum(len(p) for p in prompts)
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
