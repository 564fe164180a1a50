"""Phi-3 / Phi-3.5 (``Phi3ForCausalLM``): q/k/v stored fused as ``qkv_proj`` and gate/up as
``gate_up_proj`` (rows [gate; up], as transformers' Phi3MLP chunks them); sliding_window applies whenever
the config sets it. Partial rotary embeddings (Phi-4-mini's partial_rotary_factor < 1) are not served."""
from typing import Any

from .base import Architecture


class _Phi3(Architecture):
    def check(self, cfg: Any) -> str | None:
        rope = getattr(cfg, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
        if factor not in (None, 1.0):
            return f"partial_rotary_factor {factor} (rotary embedding on part of each head) is not supported"
        return super().check(cfg)


PHI3 = _Phi3("Phi3ForCausalLM", qkv=("qkv_proj",), gate_up=("gate_up_proj",))
