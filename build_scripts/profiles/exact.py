"""Profile ``exact``: the default deployment with the engine's exact arithmetic, ``activation_quantization: none``.

The default (``auto``) multiplies a GGUF file's quantized weights with int8 activations, as llama.cpp does: faster
(batch-1 decode and prefill), and its perplexity on the default file within 0.2% of the exact mode's (``make eval``,
docs/quantization.md), but its greedy text drifts from transformers' after some tokens. This profile keeps fp32
activations against the weights dequantized in registers: the float model of the file's weights, whose greedy text
equals transformers' on the same file token for token (tests/integration/test_real_model.py). Serve with
``make serve SERVE_ARGS="--model-config-name exact"``.

Invariant: only ``tensorrt_llm``'s ``activation_quantization`` differs from the default configs.
"""
from __future__ import annotations

from pathlib import Path


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict:
    if settings:
        raise ValueError(f"deployment.yaml: profiles.exact takes no settings (got {sorted(settings)})")
    cfg = defaults["tensorrt_llm"]
    cfg.parameters["activation_quantization"].string_value = "none"
    return {"tensorrt_llm": cfg}
