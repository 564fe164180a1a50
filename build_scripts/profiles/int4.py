"""Profile ``int4``: the ``tensorrt_llm`` slot (our engine) over a pre-quantized INT4 HF checkpoint, with its tokenizer.

By default the demo toy's AWQ variant, ``build/models/demo-int4-awq``, which ``make demo`` writes with
``build_scripts/quantize.py`` (activation-aware scaling calibrated on the demo corpus, AutoAWQ GEMM packing, groups
of 64), and the toy's tokenizer. Any AWQ / GPTQ / compressed-tensors checkpoint folder the engine reads
(docs/quantization.md) can be named instead, with its base model's tokenizer. Serve with
``make serve SERVE_ARGS="--model-config-name int4"``. (The default model, SmolLM2's Q4_1 GGUF, is already served
from its own 4-bit blocks by the default configs.)

Invariant: only ``gpt_model_path``, ``quantization`` and the text models' ``tokenizer_dir`` differ from the default
configs, so the tensor contract, batching and decoupled mode are the default's.
"""
from __future__ import annotations

import os
from pathlib import Path

MODEL_DIR = "model_repository/tensorrt_llm"  # render_configs.MODEL_DIRS[tensorrt_llm]
DEFAULTS = {"model": "build/models/demo-int4-awq", "tokenizer": "build/models/demo"}
# the models that tokenize or decode (render_configs.MODEL_DIRS), each given the profile's tokenizer
TEXT_MODELS = {"preprocessing": "model_repository/preprocessing", "postprocessing": "model_repository/postprocessing",
               "tensorrt_llm": MODEL_DIR, "tensorrt_llm_bls": "model_repository/tensorrt_llm_bls",
               "llmapi": "model_repository/llmapi"}


def settings_with_defaults(settings: dict) -> dict:
    s = {**DEFAULTS, **(settings or {})}
    unknown = sorted(set(s) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"deployment.yaml: profiles.int4: unknown setting(s) {unknown} (known: {sorted(DEFAULTS)})")
    for key in ("model", "tokenizer"):
        if not isinstance(s[key], str) or not s[key]:
            raise ValueError(f"deployment.yaml: profiles.int4.{key} must be a folder (the checkpoint, its tokenizer)")
    return s


def _path(value: str, repo: Path, model_dir: str) -> str:
    """As the renderer writes path parameters: absolute stays, relative becomes relative to the model's folder."""
    return value if Path(value).is_absolute() else os.path.relpath(repo / value, repo / model_dir)


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict:
    s = settings_with_defaults(settings)
    out = {}
    for name, folder in TEXT_MODELS.items():
        cfg = defaults[name]
        cfg.parameters["tokenizer_dir"].string_value = _path(s["tokenizer"], repo, folder)
        out[name] = cfg
    out["tensorrt_llm"].parameters["gpt_model_path"].string_value = _path(s["model"], repo, MODEL_DIR)
    out["tensorrt_llm"].parameters["quantization"].string_value = "none"  # the checkpoint's own codes, as they are
    return out
