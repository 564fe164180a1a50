"""vLLM's run-time LoRA routes: ``POST /v1/load_lora_adapter`` ({lora_name, lora_path}) and
``/v1/unload_lora_adapter`` ({lora_name}), with vLLM's answers (200 "Success: ...", 400 for a missing field or a name
already served, 404 for an unknown one). Off unless ``--enable-lora-loading`` (or vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING): anyone who may call them may load adapters and evict others.

A loaded name is a model name whose requests carry ``lora_task_id`` and ``lora_path``; Triton's ``tensorrt_llm``
opens the path under its own ``lora_root`` (the server's disk and its confinement: engine/lora_loader.py) and keeps
the adapter cached under the id, loading it again after an eviction. The id is a hash of name and path, so the same
pair maps to the same id across restarts of this server and a reloaded name with another path never meets the old
adapter's cache. Loading is checked at once: an embedding request of one token with the adapter (its failure is the
route's answer). Unloading forgets the name; the engine evicts the adapter when another needs its slot.
"""
from __future__ import annotations

import hashlib

from fastapi import Request
from fastapi.responses import PlainTextResponse

from clients.openai_server.protocol import ApiError


def task_id_of(name: str, path: str) -> int:
    """A lora_task_id for a run-time name: in [2^62, 2^63), apart from the small ids of lora_adapters."""
    h = int.from_bytes(hashlib.blake2b(f"{name}\0{path}".encode(), digest_size=8).digest(), "little")
    return (1 << 62) | (h & ((1 << 62) - 1))


async def _body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def install_lora_routes(app, settings, triton) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await _body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name == settings.served_model_name or name in settings.lora_modules:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        tid = task_id_of(name, path)
        await triton.embed([0], "last", tid, path)  # the engine loads it now: a bad path or adapter answers here
        settings.lora_modules[name] = tid
        settings.lora_paths[name] = path
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        name = (await _body(request)).get("lora_name")
        if not (isinstance(name, str) and name):
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        if name not in settings.lora_paths:  # --lora-modules names are the deployment's, not a client's to drop
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "not_found_error", "lora_name")
        del settings.lora_paths[name], settings.lora_modules[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
