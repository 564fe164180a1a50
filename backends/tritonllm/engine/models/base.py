"""``Architecture``: what sets one HF architecture apart for the engine's single transformer.

Every supported family is a pre-norm decoder with RMSNorm, rotary attention and a SiLU-gated MLP; they
differ in how the checkpoint names and splits the projections and in a few switches. An Architecture
records exactly that, so ``model.Layer`` reads any of them the same way (q/k/v fused into one ``qkv``
matrix, gate/up into one ``gate_up``), LoRA adapters find their targets, and ``hf_config`` knows which
config fields apply. Invariants: ``qkv`` parts concatenate to rows [q; k; v], ``gate_up`` parts to
[gate; up] (a checkpoint that stores them fused lists one part); no architecture imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Architecture:
    hf_name: str                                    # config.json "architectures" entry
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # self_attn.<part>.weight, fused in this order
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")    # mlp.<part>.weight, fused in this order
    attention_bias: bool | None = None              # q/k/v biases; None: the config's attention_bias
    qk_norm: bool = False                           # per-head RMSNorm of q and k before RoPE (Qwen3)
    sliding_window_switch: str | None = None        # config flag that must be true for sliding_window
    norm_offset: float = 0.0                        # RMSNorm scales by (offset + weight) (Gemma: 1)
    embed_scale: bool = False                       # embeddings times sqrt(hidden_size) (Gemma)
    # config.hidden_act values served -> the engine's name for the gated MLP's activation
    activations: tuple[tuple[str, str], ...] = (("silu", "silu"),)

    def lora_targets(self) -> dict[str, tuple[str, ...]]:
        """Fused projection -> the PEFT target module names whose deltas it takes, in row order."""
        return {"qkv": self.qkv, "o": ("o_proj",), "gate_up": self.gate_up, "down": ("down_proj",)}

    def projections(self) -> tuple[str, ...]:
        """The checkpoint's linear module names (attention, then MLP): what a quantized checkpoint may pack."""
        return (*self.qkv, "o_proj", *self.gate_up, "down_proj")

    def has_attention_bias(self, cfg: Any) -> bool:
        return self.attention_bias if self.attention_bias is not None else bool(getattr(cfg, "attention_bias", False))

    def sliding_window(self, cfg: Any) -> int | None:
        window = getattr(cfg, "sliding_window", None)
        if self.sliding_window_switch and not getattr(cfg, self.sliding_window_switch, False):
            return None
        return window

    def activation(self, cfg: Any) -> str | None:
        """The MLP's activation ("silu", "gelu_tanh", "gelu") for this config, None when not served."""
        return dict(self.activations).get(self._hidden_act(cfg))

    def _hidden_act(self, cfg: Any) -> str:
        return getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None) or self.activations[0][0]

    def check(self, cfg: Any) -> str | None:
        """Why the engine cannot serve this config (a feature of the family it lacks), or None."""
        if self.activation(cfg) is None:
            return (f"hidden_act {self._hidden_act(cfg)!r} is not supported for {self.hf_name} "
                    f"(served: {', '.join(a for a, _ in self.activations)})")
        return None
