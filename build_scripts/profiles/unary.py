"""Profile ``unary``: the LLM pipeline under NVIDIA's names, not decoupled (``decoupled_mode: false``).

Triton (2.51) refuses unary calls (``InferenceServerClient.infer()``, gRPC ModelInfer, HTTP ``/infer``)
on a decoupled model and on an ensemble with a decoupled step, while streaming needs one: one model
name cannot offer both. So the repository carries both: ``config.pbtxt`` follows
``deployment.yaml: llm.decoupled_mode`` (default true, streaming), and this profile renders
``configs/unary.pbtxt`` for the models that mode covers (``tensorrt_llm``, ``tensorrt_llm_bls``) with
``decoupled: false``; the ensemble follows its tensorrt_llm step. Switch with one flag:
``make serve SERVE_ARGS="--model-config-name unary"``. Unary models refuse ``stream=true`` with
NVIDIA's message, answer a batch in one response, and keep every other input and output.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "backends") not in sys.path:
    sys.path.insert(0, str(REPO / "backends"))

from tritonllm.contract import DECOUPLED_MODE_MODELS  # noqa: E402


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict:
    out = {}
    for name in DECOUPLED_MODE_MODELS:
        cfg = defaults[name]
        cfg.model_transaction_policy.decoupled = False
        out[name] = cfg
    return out
