"""Profile ``int4``: the ``tensorrt_llm`` slot (our engine) over a pre-quantized INT4 checkpoint.

By default the demo model's AWQ variant, ``build/models/demo-int4-awq``, which ``make build`` writes with
``build_scripts/quantize.py`` (activation-aware scaling calibrated on the demo corpus, AutoAWQ GEMM
packing, groups of 64). Any AWQ / GPTQ / compressed-tensors checkpoint folder the engine reads
(docs/quantization.md) can be named instead. Serve with ``make serve SERVE_ARGS="--model-config-name int4"``;
every other model keeps its ``config.pbtxt`` (the tokenizer is shared: a quantized checkpoint keeps its
base model's).

Invariant: only ``gpt_model_path`` and ``quantization`` differ from the default ``tensorrt_llm`` config, so
the tensor contract, batching and decoupled mode are the default's.
"""
from __future__ import annotations

import os
from pathlib import Path

MODEL_DIR = "model_repository/tensorrt_llm"  # render_configs.MODEL_DIRS[tensorrt_llm]
DEFAULTS = {"model": "build/models/demo-int4-awq"}


def settings_with_defaults(settings: dict) -> dict:
    s = {**DEFAULTS, **(settings or {})}
    unknown = sorted(set(s) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"deployment.yaml: profiles.int4: unknown setting(s) {unknown} (known: {sorted(DEFAULTS)})")
    if not isinstance(s["model"], str) or not s["model"]:
        raise ValueError("deployment.yaml: profiles.int4.model must be a checkpoint folder")
    return s


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict:
    s = settings_with_defaults(settings)
    cfg = defaults["tensorrt_llm"]
    cfg.parameters["gpt_model_path"].string_value = os.path.relpath(repo / s["model"], repo / MODEL_DIR)
    cfg.parameters["quantization"].string_value = "none"  # the checkpoint's own codes, as they are
    return {"tensorrt_llm": cfg}
